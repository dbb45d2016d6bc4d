// RoIAlign on the CPU, "avg" and "max" modes (design.md sections 3 and 4).
//
// Each box gets a sampling plan (offsets and bilinear weights of every sample inside the
// map) shared by all channels. Forward runs in parallel over boxes; backward in parallel
// over channels, each thread owning its channels of grad_input and visiting boxes in
// order, so gradients are deterministic and need no atomics.
#include <ATen/Parallel.h>

#include "ops.h"
#include "sampling.h"

namespace roiops {
namespace {

template <typename T>
struct MaxPick {
  T value;
  int64_t index;
};

// Design.md sec. 4: the first largest sample of the bin, points outside the map being 0.
template <typename T, typename Load>
inline MaxPick<T> pick_max(const AlignPlan<T>& plan, int64_t i, int64_t j, int64_t bin, const Load& load) {
  MaxPick<T> best{T(0), -1};
  for (int64_t s = plan.begin[bin]; s < plan.begin[bin + 1]; ++s) {
    const T v = load(plan.samples[s]);
    if (best.index < 0 || beats(v, best.value)) best = {v, plan.samples[s].index};
  }
  const int64_t out = plan.first_outside(i, j);
  if (out >= 0 && (best.index < 0 || (!std::isnan(best.value) && (T(0) > best.value ||
                                                                   (T(0) == best.value && out < best.index))))) {
    best = {T(0), out};
  }
  return best;
}

template <typename scalar_t, bool kMax>
void forward_impl(const at::Tensor& input, const at::Tensor& rois, double spatial_scale, int64_t ph, int64_t pw,
                  int64_t sampling_ratio, bool aligned, at::Tensor& out, at::Tensor& argmax) {
  using T = at::opmath_type<scalar_t>;
  const int64_t K = rois.size(0), C = input.size(1), H = input.size(2), W = input.size(3);
  const int64_t sN = input.stride(0), sC = input.stride(1), sH = input.stride(2), sW = input.stride(3);
  const int64_t oK = out.stride(0), oC = out.stride(1), oH = out.stride(2), oW = out.stride(3);
  const bool channels_last = is_channels_last(input);
  const scalar_t* in = input.const_data_ptr<scalar_t>();
  const T* roi = rois.const_data_ptr<T>();
  scalar_t* o = out.data_ptr<scalar_t>();
  int32_t* am = kMax ? argmax.data_ptr<int32_t>() : nullptr;
  const T scale = static_cast<T>(spatial_scale);

  at::parallel_for(0, K, 1, [&](int64_t k0, int64_t k1) {
    AlignPlan<T> plan;
    std::vector<T> acc(C);
    std::vector<int64_t> best(C);
    for (int64_t k = k0; k < k1; ++k) {
      plan.build(roi + 5 * k, scale, ph, pw, sampling_ratio, aligned, H, W, sH, sW);
      const scalar_t* base = in + plan.batch * sN;
      for (int64_t i = 0; i < ph; ++i) {
        for (int64_t j = 0; j < pw; ++j) {
          const int64_t bin = i * pw + j;
          const Sample<T>* s0 = plan.samples.data() + plan.begin[bin];
          const Sample<T>* s1 = plan.samples.data() + plan.begin[bin + 1];
          scalar_t* ob = o + k * oK + i * oH + j * oW;
          if (!kMax && channels_last) {
            // Channels are contiguous: one vectorisable pass per sample.
            std::fill(acc.begin(), acc.end(), T(0));
            for (const Sample<T>* s = s0; s != s1; ++s) {
              const scalar_t *p1 = base + s->o1, *p2 = base + s->o2, *p3 = base + s->o3, *p4 = base + s->o4;
              for (int64_t c = 0; c < C; ++c) {
                acc[c] += s->w1 * static_cast<T>(p1[c]) + s->w2 * static_cast<T>(p2[c]) +
                          s->w3 * static_cast<T>(p3[c]) + s->w4 * static_cast<T>(p4[c]);
              }
            }
            for (int64_t c = 0; c < C; ++c) ob[c * oC] = static_cast<scalar_t>(acc[c] / plan.count);
            continue;
          }
          for (int64_t c = 0; c < C; ++c) {
            const scalar_t* plane = base + c * sC;
            auto load = [plane](const Sample<T>& s) {
              return s.w1 * static_cast<T>(plane[s.o1]) + s.w2 * static_cast<T>(plane[s.o2]) +
                     s.w3 * static_cast<T>(plane[s.o3]) + s.w4 * static_cast<T>(plane[s.o4]);
            };
            if constexpr (kMax) {
              const MaxPick<T> m = pick_max(plan, i, j, bin, load);
              ob[c * oC] = static_cast<scalar_t>(m.value);
              am[k * oK + c * oC + i * oH + j * oW] = static_cast<int32_t>(m.index);
            } else {
              T sum = 0;
              for (const Sample<T>* s = s0; s != s1; ++s) sum += load(*s);
              ob[c * oC] = static_cast<scalar_t>(sum / plan.count);
            }
          }
        }
      }
    }
  });
}

// grad_input accumulates in the opmath type; each thread owns channels [c0, c1).
template <typename scalar_t, bool kMax>
void backward_impl(const at::Tensor& grad, const at::Tensor& argmax, const at::Tensor& rois, double spatial_scale,
                   int64_t ph, int64_t pw, int64_t sampling_ratio, bool aligned, at::Tensor& gi) {
  using T = at::opmath_type<scalar_t>;
  const int64_t K = rois.size(0), C = gi.size(1), H = gi.size(2), W = gi.size(3);
  const int64_t sN = gi.stride(0), sC = gi.stride(1), sH = gi.stride(2), sW = gi.stride(3);
  const int64_t gK = grad.stride(0), gC = grad.stride(1), gH = grad.stride(2), gW = grad.stride(3);
  const scalar_t* g = grad.const_data_ptr<scalar_t>();
  const int32_t* am = kMax ? argmax.const_data_ptr<int32_t>() : nullptr;
  const T* roi = rois.const_data_ptr<T>();
  T* out = gi.data_ptr<T>();
  const T scale = static_cast<T>(spatial_scale);

  at::parallel_for(0, C, 1, [&](int64_t c0, int64_t c1) {
    AlignPlan<T> plan;
    for (int64_t k = 0; k < K; ++k) {
      plan.build(roi + 5 * k, scale, ph, pw, sampling_ratio, aligned, H, W, sH, sW);
      T* base = out + plan.batch * sN;
      for (int64_t i = 0; i < ph; ++i) {
        for (int64_t j = 0; j < pw; ++j) {
          const int64_t bin = i * pw + j;
          const Sample<T>* s0 = plan.samples.data() + plan.begin[bin];
          const Sample<T>* s1 = plan.samples.data() + plan.begin[bin + 1];
          for (int64_t c = c0; c < c1; ++c) {
            const int64_t go = k * gK + c * gC + i * gH + j * gW;
            const T gv = static_cast<T>(g[go]);
            T* plane = base + c * sC;
            for (const Sample<T>* s = s0; s != s1; ++s) {
              if constexpr (kMax) {
                if (s->index != am[go]) continue;
                plane[s->o1] += gv * s->w1;
                plane[s->o2] += gv * s->w2;
                plane[s->o3] += gv * s->w3;
                plane[s->o4] += gv * s->w4;
              } else {
                plane[s->o1] += gv * s->w1 / plan.count;
                plane[s->o2] += gv * s->w2 / plan.count;
                plane[s->o3] += gv * s->w3 / plan.count;
                plane[s->o4] += gv * s->w4 / plan.count;
              }
            }
          }
        }
      }
    }
  });
}

std::tuple<at::Tensor, at::Tensor> forward(const at::Tensor& input_, const at::Tensor& rois_, double spatial_scale,
                                           int64_t ph, int64_t pw, int64_t sampling_ratio, bool aligned, bool max_mode) {
  check_input(input_);
  check_args(rois_, input_.scalar_type(), input_.size(2), input_.size(3), spatial_scale, ph, pw);
  const bool channels_last = is_channels_last(input_);
  const at::Tensor input = input_.contiguous(format_of(channels_last));
  const at::Tensor rois = rois_.contiguous();
  check_rois(rois, input.size(0), spatial_scale);
  const auto opts = input.options().memory_format(format_of(channels_last));
  at::Tensor out = at::empty({rois.size(0), input.size(1), ph, pw}, opts);
  at::Tensor argmax = max_mode ? at::empty({rois.size(0), input.size(1), ph, pw}, opts.dtype(at::kInt)) : at::Tensor();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, input.scalar_type(), "roiops_roi_align_forward", [&] {
    if (max_mode) {
      forward_impl<scalar_t, true>(input, rois, spatial_scale, ph, pw, sampling_ratio, aligned, out, argmax);
    } else {
      forward_impl<scalar_t, false>(input, rois, spatial_scale, ph, pw, sampling_ratio, aligned, out, argmax);
    }
  });
  return {out, argmax};
}

at::Tensor backward(const at::Tensor& grad_, const at::Tensor& argmax_, const at::Tensor& rois_, double spatial_scale,
                    int64_t ph, int64_t pw, int64_t N, int64_t C, int64_t H, int64_t W, int64_t sampling_ratio,
                    bool aligned, bool channels_last, bool max_mode) {
  TORCH_CHECK_VALUE(grad_.dim() == 4 && grad_.size(0) == rois_.size(0) && grad_.size(1) == C &&
                        grad_.size(2) == ph && grad_.size(3) == pw,
                    "roiops: grad must be [K, C, pooled_height, pooled_width], got ", grad_.sizes());
  TORCH_CHECK_VALUE(!max_mode || argmax_.sizes() == grad_.sizes(), "roiops: argmax must have the shape of grad");
  check_input(grad_);
  check_args(rois_, grad_.scalar_type(), H, W, spatial_scale, ph, pw);
  const at::Tensor rois = rois_.contiguous();
  check_rois(rois, N, spatial_scale);
  const at::Tensor grad = grad_.contiguous(format_of(channels_last));
  const at::Tensor argmax = max_mode ? argmax_.contiguous(format_of(channels_last)) : at::Tensor();
  const auto acc_type = grad.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  at::Tensor gi = at::empty({N, C, H, W}, grad.options().dtype(acc_type).memory_format(format_of(channels_last))).zero_();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, grad.scalar_type(), "roiops_roi_align_backward", [&] {
    if (max_mode) {
      backward_impl<scalar_t, true>(grad, argmax, rois, spatial_scale, ph, pw, sampling_ratio, aligned, gi);
    } else {
      backward_impl<scalar_t, false>(grad, argmax, rois, spatial_scale, ph, pw, sampling_ratio, aligned, gi);
    }
  });
  return gi.scalar_type() == grad.scalar_type() ? gi : gi.to(grad.scalar_type());
}

}  // namespace

at::Tensor roi_align_forward(const at::Tensor& input, const at::Tensor& rois, double spatial_scale, int64_t ph,
                             int64_t pw, int64_t sampling_ratio, bool aligned) {
  return std::get<0>(forward(input, rois, spatial_scale, ph, pw, sampling_ratio, aligned, false));
}

at::Tensor roi_align_backward(const at::Tensor& grad, const at::Tensor& rois, double spatial_scale, int64_t ph,
                              int64_t pw, int64_t N, int64_t C, int64_t H, int64_t W, int64_t sampling_ratio,
                              bool aligned, bool channels_last) {
  return backward(grad, at::Tensor(), rois, spatial_scale, ph, pw, N, C, H, W, sampling_ratio, aligned,
                  channels_last, false);
}

std::tuple<at::Tensor, at::Tensor> roi_align_max_forward(const at::Tensor& input, const at::Tensor& rois,
                                                         double spatial_scale, int64_t ph, int64_t pw,
                                                         int64_t sampling_ratio, bool aligned) {
  return forward(input, rois, spatial_scale, ph, pw, sampling_ratio, aligned, true);
}

at::Tensor roi_align_max_backward(const at::Tensor& grad, const at::Tensor& argmax, const at::Tensor& rois,
                                  double spatial_scale, int64_t ph, int64_t pw, int64_t N, int64_t C, int64_t H,
                                  int64_t W, int64_t sampling_ratio, bool aligned, bool channels_last) {
  return backward(grad, argmax, rois, spatial_scale, ph, pw, N, C, H, W, sampling_ratio, aligned, channels_last,
                  true);
}

}  // namespace roiops
