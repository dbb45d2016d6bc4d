// Mask targets on the CPU (docs/semantics.md, "mask_targets"): each proposal's ground-truth
// mask, RoIAlign-ed ("avg") onto an output grid straight from the masks as they are stored
// (bool, uint8 or floating), with no float copy of the [G, H, W] masks. Every output value
// is RoIAlign's, in torchvision's arithmetic, on the mask's values read as the compute type,
// so it equals roi_align over the masks converted to float bit for bit; a threshold makes
// it a bool. Proposals are independent tasks: deterministic, no atomics.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "align_kernels.h"
#include "args.h"
#include "checks.h"
#include "layout.h"
#include "memory.h"
#include "plans.h"
#include "roi_align.h"
#include "torch_api.h"

namespace roiops {
namespace {

// The masks: 3-D [G, H, W], bool, uint8 or a floating type the kernels have.
void check_masks(const Tensor& masks) {
  ROIOPS_CHECK(masks.dim() == 3, "roiops: masks must be 3-D [G, H, W], got ", masks.dim(), "-D");
  const ScalarType s = masks.scalar_type();
  ROIOPS_CHECK(s == ScalarType::Bool || s == ScalarType::Byte || kernel_dtype(s),
               "roiops: masks must be bool, uint8, float16, bfloat16, float32 or float64, got ", dtype_name(s));
}

template <typename scalar_t, typename T, typename O>
void targets_impl(const Tensor& masks, const Tensor& rois, int64_t ph, int64_t pw, int64_t sampling_ratio,
                  bool aligned, double threshold, bool binary, Tensor& out, int64_t row0) {
  const int64_t K = rois.size(0), H = masks.size(1), W = masks.size(2);
  if (K == 0) return;
  const Plans<T> plans = build_plans<T>(rois, 1.0, ph, pw, sampling_ratio, aligned, H, W, false, false, row0);
  const scalar_t* m = masks.const_data_ptr<scalar_t>();
  O* o = out.mutable_data_ptr<O>();
  const T cut = static_cast<T>(threshold);
  Scratch<T> scratch;
  parallel_tasks(K, [&](int64_t k) {
    const AlignPlan<T>& p = plans[k];
    O* ok = o + k * ph * pw;
    if (p.empty()) {  // no sample (an empty box, aligned): 0
      std::fill(ok, ok + ph * pw, O(0));
      return;
    }
    const int64_t nx = static_cast<int64_t>(p.xs.lo.size());
    const scalar_t* plane = m + p.batch * H * W;
    if constexpr (std::is_same_v<O, bool>) {
      T* s = scratch.get(5 * nx + pw + ph * pw);
      T* values = s + 5 * nx + pw;
      avg_forward_plane(p, plane, W, ph, pw, s, values, pw, 1);
      for (int64_t e = 0; e < ph * pw; ++e) ok[e] = values[e] >= cut;
    } else {
      avg_forward_plane(p, plane, W, ph, pw, scratch.get(5 * nx + pw), ok, pw, 1);
    }
  });
}

// Floating masks give their own dtype, bool and uint8 masks float32; bool with binary.
ScalarType output_type(ScalarType masks, bool binary) {
  if (binary) return ScalarType::Bool;
  return is_floating(masks) ? masks : kFloat;
}

}  // namespace

ROIOPS_ENTRY
Tensor mask_targets_forward(const Tensor& masks_, const Tensor& rois_, int64_t ph, int64_t pw, int64_t sampling_ratio,
                            bool aligned, double threshold, bool binary) {
  check_masks(masks_);
  check_rois_arg(rois_, 5, masks_, "masks");
  ROIOPS_CHECK(masks_.size(1) <= kMaxMapSide && masks_.size(2) <= kMaxMapSide,
               "roiops: masks height and width must be at most 2^24, got ", masks_.size(1), " x ", masks_.size(2));
  check_pooled(ph, pw);
  check_sampling_ratio(sampling_ratio);
  ROIOPS_CHECK(!binary || std::isfinite(threshold), "roiops: threshold must be finite, got ", format_g(threshold));
  check_cpu(masks_);
  const Tensor masks = in_format(masks_);
  const Tensor rois = opmath_rois(rois_, masks.scalar_type());
  check_rois(rois, masks.size(0), 1.0);
  const int64_t K = rois.size(0);
  Tensor out = empty_output({K, ph, pw}, Options{output_type(masks.scalar_type(), binary)});
  if (masks.size(1) == 0 || masks.size(2) == 0) {
    torch::stable::zero_(out);  // no cell to sample: every sample is outside, 0
    return out;
  }
  auto run = [&](auto mask_type, auto compute_type, auto out_type) {
    using S = decltype(mask_type);
    using T = decltype(compute_type);
    using O = decltype(out_type);
    for (int64_t k0 = 0; k0 < K; k0 += kBoxChunk) {
      const int64_t n = std::min(kBoxChunk, K - k0);
      Tensor o = narrow_view(out, 0, k0, n);
      targets_impl<S, T, O>(masks, narrow_view(rois, 0, k0, n), ph, pw, sampling_ratio, aligned, threshold, binary,
                            o, k0);
    }
  };
  const ScalarType s = masks.scalar_type();
  auto with_output = [&](auto mask_type, auto compute_type) {
    using S = decltype(mask_type);
    using T = decltype(compute_type);
    if (binary) {
      run(S{}, T{}, bool{});
    } else if constexpr (std::is_floating_point_v<S> || std::is_same_v<S, Half> || std::is_same_v<S, BFloat16>) {
      run(S{}, T{}, S{});
    } else {
      run(S{}, T{}, float{});
    }
  };
  if (s == ScalarType::Bool) {
    with_output(bool{}, float{});
  } else if (s == ScalarType::Byte) {
    with_output(uint8_t{}, float{});
  } else {
    ROIOPS_DISPATCH(s, [&] { with_output(scalar_t{}, opmath_type<scalar_t>{}); });
  }
  return out;
}

}  // namespace roiops

STABLE_TORCH_LIBRARY_FRAGMENT(roiops, m) {
  m.def("mask_targets(Tensor masks, Tensor rois, int pooled_height, int pooled_width, int sampling_ratio, "
        "bool aligned, float threshold, bool binary) -> Tensor");
}

STABLE_TORCH_LIBRARY_IMPL(roiops, CPU, m) { m.impl("mask_targets", TORCH_BOX(&roiops::mask_targets_forward)); }
