// RoIPool on the CPU, Caffe and mmdetection conventions (design.md section 5).
// Forward in parallel over boxes; backward in parallel over channels, boxes in order.
#include <ATen/Parallel.h>

#include "ops.h"
#include "sampling.h"

namespace roiops {
namespace {

template <typename scalar_t>
void forward_impl(const at::Tensor& input, const at::Tensor& rois, double spatial_scale, int64_t ph, int64_t pw,
                  bool continuous, at::Tensor& out, at::Tensor& argmax) {
  using T = at::opmath_type<scalar_t>;
  const int64_t K = rois.size(0), C = input.size(1), H = input.size(2), W = input.size(3);
  const int64_t sN = input.stride(0), sC = input.stride(1), sH = input.stride(2), sW = input.stride(3);
  const int64_t oK = out.stride(0), oC = out.stride(1), oH = out.stride(2), oW = out.stride(3);
  const scalar_t* in = input.const_data_ptr<scalar_t>();
  const T* roi = rois.const_data_ptr<T>();
  scalar_t* o = out.data_ptr<scalar_t>();
  int32_t* am = argmax.data_ptr<int32_t>();
  const T scale = static_cast<T>(spatial_scale);

  at::parallel_for(0, K, 1, [&](int64_t k0, int64_t k1) {
    PoolPlan<T> plan;
    std::vector<T> best(C);
    std::vector<int32_t> where(C);
    for (int64_t k = k0; k < k1; ++k) {
      plan.build(roi + 5 * k, scale, ph, pw, continuous, H, W);
      const scalar_t* base = in + plan.batch * sN;
      for (int64_t i = 0; i < ph; ++i) {
        for (int64_t j = 0; j < pw; ++j) {
          std::fill(where.begin(), where.end(), -1);
          std::fill(best.begin(), best.end(), T(0));
          // Rows and columns outermost so channels_last input is read contiguously.
          for (int64_t h = plan.h0[i]; h < plan.h1[i]; ++h) {
            for (int64_t w = plan.w0[j]; w < plan.w1[j]; ++w) {
              const scalar_t* p = base + h * sH + w * sW;
              const int32_t idx = static_cast<int32_t>(h * W + w);
              for (int64_t c = 0; c < C; ++c) {
                const T v = static_cast<T>(p[c * sC]);
                if (where[c] < 0 || beats(v, best[c])) {
                  best[c] = v;
                  where[c] = idx;
                }
              }
            }
          }
          const int64_t ob = k * oK + i * oH + j * oW;
          for (int64_t c = 0; c < C; ++c) {
            o[ob + c * oC] = static_cast<scalar_t>(best[c]);
            am[ob + c * oC] = where[c];
          }
        }
      }
    }
  });
}

template <typename scalar_t>
void backward_impl(const at::Tensor& grad, const at::Tensor& argmax, const at::Tensor& rois, at::Tensor& gi) {
  using T = at::opmath_type<scalar_t>;
  const int64_t K = rois.size(0), C = gi.size(1), W = gi.size(3);
  const int64_t ph = grad.size(2), pw = grad.size(3);
  const int64_t sN = gi.stride(0), sC = gi.stride(1), sH = gi.stride(2), sW = gi.stride(3);
  const int64_t gK = grad.stride(0), gC = grad.stride(1), gH = grad.stride(2), gW = grad.stride(3);
  const scalar_t* g = grad.const_data_ptr<scalar_t>();
  const int32_t* am = argmax.const_data_ptr<int32_t>();
  const T* roi = rois.const_data_ptr<T>();
  T* out = gi.data_ptr<T>();

  at::parallel_for(0, C, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t k = 0; k < K; ++k) {
      T* base = out + static_cast<int64_t>(roi[5 * k]) * sN;
      for (int64_t c = c0; c < c1; ++c) {
        for (int64_t i = 0; i < ph; ++i) {
          for (int64_t j = 0; j < pw; ++j) {
            const int64_t go = k * gK + c * gC + i * gH + j * gW;
            const int64_t a = am[go];
            if (a >= 0) base[c * sC + (a / W) * sH + (a % W) * sW] += static_cast<T>(g[go]);
          }
        }
      }
    }
  });
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> roi_pool_forward(const at::Tensor& input_, const at::Tensor& rois_,
                                                    double spatial_scale, int64_t ph, int64_t pw, bool continuous) {
  check_input(input_);
  check_args(rois_, input_.scalar_type(), input_.size(2), input_.size(3), spatial_scale, ph, pw);
  TORCH_CHECK_VALUE(input_.size(2) * input_.size(3) <= INT32_MAX, "roiops: roi_pool needs H * W < 2^31");
  const bool channels_last = is_channels_last(input_);
  const at::Tensor input = input_.contiguous(format_of(channels_last));
  const at::Tensor rois = rois_.contiguous();
  check_rois(rois, input.size(0), spatial_scale);
  const auto opts = input.options().memory_format(format_of(channels_last));
  at::Tensor out = at::empty({rois.size(0), input.size(1), ph, pw}, opts);
  at::Tensor argmax = at::empty({rois.size(0), input.size(1), ph, pw}, opts.dtype(at::kInt));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, input.scalar_type(), "roiops_roi_pool_forward", [&] {
    forward_impl<scalar_t>(input, rois, spatial_scale, ph, pw, continuous, out, argmax);
  });
  return {out, argmax};
}

at::Tensor roi_pool_backward(const at::Tensor& grad_, const at::Tensor& argmax_, const at::Tensor& rois_, int64_t N,
                             int64_t C, int64_t H, int64_t W, bool channels_last) {
  check_input(grad_);
  TORCH_CHECK_VALUE(grad_.size(0) == rois_.size(0) && grad_.size(1) == C && argmax_.sizes() == grad_.sizes() &&
                        argmax_.scalar_type() == at::kInt,
                    "roiops: grad [K, C, ph, pw] and int32 argmax of the same shape expected");
  check_args(rois_, grad_.scalar_type(), H, W, 1.0, grad_.size(2), grad_.size(3));
  const at::Tensor rois = rois_.contiguous();
  check_rois(rois, N, 1.0);
  const at::Tensor grad = grad_.contiguous(format_of(channels_last));
  const at::Tensor argmax = argmax_.contiguous(format_of(channels_last));
  TORCH_CHECK_VALUE(argmax.numel() == 0 || (argmax.min().item<int32_t>() >= -1 && argmax.max().item<int64_t>() < H * W),
                    "roiops: argmax holds an index outside the map");
  const auto acc_type = grad.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  at::Tensor gi = at::empty({N, C, H, W}, grad.options().dtype(acc_type).memory_format(format_of(channels_last))).zero_();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, grad.scalar_type(), "roiops_roi_pool_backward",
                                  [&] { backward_impl<scalar_t>(grad, argmax, rois, gi); });
  return gi.scalar_type() == grad.scalar_type() ? gi : gi.to(grad.scalar_type());
}

}  // namespace roiops
