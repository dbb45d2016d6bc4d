// An entry point (ROIOPS_ENTRY) and its tensors once the op's argument checks have
// passed (checks.h): in the kernels' layouts (layout.h), rows of rois checked, and the
// options of what it returns.
#pragma once

#include <cstdint>
#include <optional>

#include "checks.h"
#include "layout.h"
#include "torch_api.h"

namespace roiops {

// An entry point, registered as a kernel: never inlined into the dispatcher's wrapper, so
// that profilers and benchmarks/callgrind.py find each one by name.
#define ROIOPS_ENTRY __attribute__((noinline))

// A forward's tensors once the op's argument checks have passed: the input in its layout,
// rois contiguous in the opmath type with their rows checked, and the options of an output
// in the input's dtype and layout.
struct ForwardArgs {
  bool channels_last;
  Tensor input, rois;
  Options out_options;

  ForwardArgs(const Tensor& input_, const Tensor& rois_, double spatial_scale)
      : channels_last((check_cpu(input_), is_channels_last(input_))),
        input(in_layout(input_, channels_last)),
        rois(opmath_rois(rois_, input_.scalar_type())),
        out_options(options_of(input_, channels_last)) {
    check_rois(rois, input.size(0), spatial_scale);
  }
};

// A backward's, likewise: grad in the gradient's layout, rois (check_coords as
// check_rois's), and the options of the [N, C, H, W] gradient in grad's dtype.
struct BackwardArgs {
  Tensor rois, grad;
  Options grad_options;

  BackwardArgs(const Tensor& grad_, const Tensor& rois_, int64_t N, double spatial_scale, bool channels_last,
               bool check_coords = true)
      : rois((check_cpu(grad_), opmath_rois(rois_, grad_.scalar_type()))),
        grad((check_rois(rois, N, spatial_scale, check_coords), in_layout(grad_, channels_last))),
        grad_options(options_of(grad_, channels_last)) {}
};

// A box-gradient kernel's checked arguments (grad [K, C, ph, pw] of the input's dtype,
// the input, rois [K, 5]; sampling_ratio when the op has one), grad and input in the
// input's layout, rois contiguous in the opmath type.
struct RoisBackwardArgs {
  Tensor grad, input, rois;

  RoisBackwardArgs(const Tensor& grad_, const Tensor& input_, const Tensor& rois_, double spatial_scale,
                   int64_t ph, int64_t pw, std::optional<int64_t> sampling_ratio = std::nullopt)
      : RoisBackwardArgs(grad_, checked(grad_, input_, rois_, spatial_scale, ph, pw, sampling_ratio)) {}

 private:
  RoisBackwardArgs(const Tensor& grad_, const ForwardArgs& f)
      : grad(in_layout(grad_, f.channels_last)), input(f.input), rois(f.rois) {}

  static ForwardArgs checked(const Tensor& grad, const Tensor& input, const Tensor& rois, double spatial_scale,
                             int64_t ph, int64_t pw, std::optional<int64_t> sampling_ratio) {
    check_forward_args(input, rois, 5, spatial_scale, ph, pw);
    if (sampling_ratio) check_sampling_ratio(*sampling_ratio);
    check_grad_shape(grad, rois.size(0), input.size(1), ph, pw);
    check_grad_like(grad, input);
    return ForwardArgs(input, rois, spatial_scale);
  }
};

}  // namespace roiops
