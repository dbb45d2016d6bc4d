// RoIAlign on the CPU, "avg" and "max" modes (docs/semantics.md, "roi_align avg" and "roi_align max").
//
// Every box's sampling plan is built once per call, in parallel, and shared by all
// channels (plans.h). Work is split into tasks of (image, block of channels), and for
// backward also bands of map rows, so that a task's slice of the map stays in cache while
// all the image's boxes use it; kernels loop along the block's contiguous channels and
// vectorise:
//  - channels_last input is read in place;
//  - NCHW input: the block is first transposed into a channels-last tile (cache-resident,
//    never the whole map), unless the boxes cover too little of the map for that to pay;
//    then per-plane kernels run instead.
// Both modes evaluate each sample in torchvision's arithmetic and order: "avg" equals it
// bit for bit, "max" finds the same winner as the reference.
// Backward tasks own disjoint slices of grad_input and add boxes in increasing k:
// deterministic, no atomics.
//
// The plans and the forward kernels of one box are roi_align.h's; the gradient with
// respect to the boxes is roi_align_box_grad.cpp's.

#include <algorithm>
#include <cmath>
#include <tuple>
#include <utility>

#include "align_kernels.h"
#include "args.h"
#include "checks.h"
#include "layout.h"
#include "memory.h"
#include "plans.h"
#include "roi_align.h"
#include "simd.h"
#include "torch_api.h"

namespace roiops {
namespace {

// ---- max backward, one box ----------------------------------------------------------

// Max backward of one box, one channel: the winner's four neighbours get grad * weight.
// `row(y)` returns the start of map row y, or nullptr to skip it (outside a band).
template <typename T, typename Row>
inline void max_backward_bin(const AlignPlan<T>& p, int64_t i, int64_t j, int64_t a, double inv_gw, T gv, int64_t sW,
                             const Row& row) {
  if (!p.samples.empty()) {
    const int64_t gg = p.grid_h * p.grid_w;
    if (a < 0 || a >= gg) return;
    const MaxSample<T>& s = p.samples[(i * p.pw() + j) * gg + a];
    if (s.y0 < 0) return;
    if (T* r = row(s.y0)) {
      r[s.x0 * sW] += gv * s.w1;
      r[s.x1 * sW] += gv * s.w2;
    }
    if (T* r = row(s.y1)) {
      r[s.x0 * sW] += gv * s.w3;
      r[s.x1 * sW] += gv * s.w4;
    }
    return;
  }
  int64_t ty, tx;
  if (!argmax_taps(p, i, j, a, inv_gw, ty, tx)) return;
  const T hy = p.ys.h[ty], ly = p.ys.l[ty], hx = p.xs.h[tx], lx = p.xs.l[tx];
  const int64_t xl = p.xs.lo[tx] * sW, xh = p.xs.hi[tx] * sW;
  if (T* r = row(p.ys.lo[ty])) {
    r[xl] += gv * (hy * hx);
    r[xh] += gv * (hy * lx);
  }
  if (T* r = row(p.ys.hi[ty])) {
    r[xl] += gv * (ly * hx);
    r[xh] += gv * (ly * lx);
  }
}

// Grids of at most this many samples per bin take the masked loop of max_backward_cl.
constexpr int64_t kMaskedGrid = 16;

// Backward of one box for n contiguous channels (as avg_backward_cl; am holds the argmax
// at the offsets of g). Each channel's gradient goes to its winning sample's neighbours.
// Small grids visit a bin's inside samples in turn: sel[c] = the channel's gradient if it
// picked the sample, else 0, then sel * weight is added to each tap, all channels at once
// (vector loops). A channel's sums are unchanged in bits by the exact zeros it adds for
// the samples it did not pick (accumulators start at +0 and never become -0). Larger
// grids go channel by channel. sel: scratch for n values.
template <typename G, typename T>
ROIOPS_SIMD void max_backward_cl(const AlignPlan<T>& p, const G* g, const int32_t* am, int64_t gH, int64_t gW,
                                 int64_t n, int64_t i0, int64_t i1, int64_t pw, T* band, int64_t y0, int64_t y1,
                                 int64_t bH, int64_t sW, T* __restrict__ sel) {
  auto row = [&](int64_t y) { return y >= y0 && y < y1 ? band + (y - y0) * bH : nullptr; };
  if (p.grid_h * p.grid_w > kMaskedGrid) {
    const double inv_gw = p.grid_w > 0 ? 1.0 / static_cast<double>(p.grid_w) : 0.0;
    for (int64_t i = i0; i < i1; ++i) {
      for (int64_t j = 0; j < pw; ++j) {
        for (int64_t c = 0; c < n; ++c) {
          const int64_t e = i * gH + j * gW + c;
          max_backward_bin(p, i, j, am[e], inv_gw, static_cast<T>(g[e]), sW, [&](int64_t y) {
            T* r = row(y);
            return r ? r + c : nullptr;
          });
        }
      }
    }
    return;
  }
  for (int64_t i = i0; i < i1; ++i) {
    for (int64_t j = 0; j < pw; ++j) {
      const G* __restrict__ gb = g + i * gH + j * gW;
      const int32_t* __restrict__ ab = am + i * gH + j * gW;
      if (j + 1 < pw || i + 1 < i1) {
        const int64_t next = j + 1 < pw ? i * gH + (j + 1) * gW : (i + 1) * gH;
        prefetch_run(g + next, n);
        prefetch_run(am + next, n);
      }
      for (int64_t a = p.ys.begin[i]; a < p.ys.begin[i + 1]; ++a) {
        T* rlo = row(p.ys.lo[a]);
        T* rhi = row(p.ys.hi[a]);
        if (!rlo && !rhi) continue;
        const T hy = p.ys.h[a], ly = p.ys.l[a];
        const int64_t iy = p.ys.first_in[i] + a - p.ys.begin[i];
        for (int64_t b = p.xs.begin[j]; b < p.xs.begin[j + 1]; ++b) {
          const int32_t s = static_cast<int32_t>(iy * p.grid_w + p.xs.first_in[j] + b - p.xs.begin[j]);
          const T hx = p.xs.h[b], lx = p.xs.l[b];
          const int64_t xl = p.xs.lo[b] * sW, xh = p.xs.hi[b] * sW;
          for (int64_t c = 0; c < n; ++c) {
            const T gv = static_cast<T>(gb[c]);  // loaded for every channel, so the select vectorises
            sel[c] = ab[c] == s ? gv : T(0);
          }
          auto add = [&](T* __restrict__ dst, T w) {
            for (int64_t c = 0; c < n; ++c) dst[c] += sel[c] * w;
          };
          if (rlo) {
            add(rlo + xl, hy * hx);
            add(rlo + xh, hy * lx);
          }
          if (rhi) {
            add(rhi + xl, ly * hx);
            add(rhi + xh, ly * lx);
          }
        }
      }
    }
  }
}

// ---- drivers ------------------------------------------------------------------------

template <typename scalar_t, bool kMax>
void forward_impl(const Tensor& input, const Tensor& rois, double spatial_scale, int64_t ph, int64_t pw,
                  int64_t sampling_ratio, bool aligned, Tensor& out, Tensor& argmax, int64_t row0) {
  using T = opmath_type<scalar_t>;
  const int64_t K = rois.size(0), C = input.size(1), H = input.size(2), W = input.size(3);
  const int64_t oK = out.stride(0), oC = out.stride(1), oH = out.stride(2), oW = out.stride(3);
  scalar_t* o = out.mutable_data_ptr<scalar_t>();
  int32_t* am = kMax ? argmax.mutable_data_ptr<int32_t>() : nullptr;
  if (K == 0 || C == 0) return;
  const Plans<T> plans = build_plans<T>(rois, spatial_scale, ph, pw, sampling_ratio, aligned, H, W, kMax, false, row0);
  Scratch<T> acc;
  Scratch<int32_t> idx;
  // Box k on channels [c0, c0 + nc) of a channels-last view of its image (cell stride vW).
  auto box = [&](auto kN, int64_t k, int64_t c0, int64_t nc, const auto* img, int64_t vH, int64_t vW) {
    const AlignPlan<T>& p = plans[k];
    scalar_t* ok = o + k * oK + c0 * oC;
    if constexpr (kMax) {
      max_forward_cl<kN>(p, img, vH, vW, nc, ph, pw, acc.get(nc), idx.get(nc), ok, am + k * oK + c0 * oC, oH, oW, oC);
    } else {
      avg_forward_cl<kN>(p, img, vH, vW, nc, ph, pw, acc.get(nc), ok, oH, oW, oC);
    }
  };
  auto plane = [&](int64_t k, int64_t c, const scalar_t* plane) {
    const AlignPlan<T>& p = plans[k];
    if constexpr (kMax) {
      max_forward_plane(p, plane, W, ph, pw, acc.get(7 * static_cast<int64_t>(p.xs.lo.size())), o + k * oK + c * oC,
                        am + k * oK + c * oC, oH, oW);
    } else {
      avg_forward_plane(p, plane, W, ph, pw, acc.get(5 * static_cast<int64_t>(p.xs.lo.size()) + pw), o + k * oK + c * oC, oH, oW);
    }
  };
  forward_tasks<T, scalar_t>(plans, input, box, plane);
}


// The input gradient of rois' boxes (backward_bands) into gi (of scalar type out_t),
// fresh or holding the sums of the boxes before rois (row0 on).
template <typename scalar_t, typename out_t, bool kMax>
void backward_impl(const Tensor& grad, const Tensor& argmax, const Tensor& rois, double spatial_scale,
                   int64_t ph, int64_t pw, int64_t sampling_ratio, bool aligned, Tensor& gi, int64_t row0,
                   bool fresh) {
  using T = opmath_type<scalar_t>;
  const int64_t H = gi.size(2), W = gi.size(3);
  if (gi.numel() == 0) return;
  const Plans<T> plans = build_plans<T>(rois, spatial_scale, ph, pw, sampling_ratio, aligned, H, W, kMax, kMax, row0);
  Scratch<T> sel;
  backward_bands<T, scalar_t, out_t>(
      plans, grad, kMax ? argmax.const_data_ptr<int32_t>() : nullptr, gi, fresh, ph, pw,
      [&](auto kN, const AlignPlan<T>& p, const auto* g, const int32_t* am, int64_t gH, int64_t gW, int64_t nc,
          int64_t i0, int64_t i1, T* acc, int64_t y0, int64_t y1, int64_t bH, int64_t aW) {
        if constexpr (kMax) {
          max_backward_cl(p, g, am, gH, gW, nc, i0, i1, pw, acc, y0, y1, bH, aW, sel.get(nc));
        } else {
          avg_backward_cl<kN>(p, g, gH, gW, nc, i0, i1, pw, acc, y0, y1, bH, aW);
        }
      });
}


std::tuple<Tensor, Tensor> forward(const Tensor& input_, const Tensor& rois_, double spatial_scale,
                                   int64_t ph, int64_t pw, int64_t sampling_ratio, bool aligned, bool max_mode) {
  check_forward_args(input_, rois_, 5, spatial_scale, ph, pw);
  check_sampling_ratio(sampling_ratio);
  const ForwardArgs a(input_, rois_, spatial_scale);
  const Tensor &input = a.input, &rois = a.rois;
  Tensor out = empty_output({rois.size(0), input.size(1), ph, pw}, a.out_options);
  Tensor argmax =
      max_mode ? empty_output({rois.size(0), input.size(1), ph, pw}, a.out_options.dtype(kInt)) : Tensor();
  const int64_t K = rois.size(0);
  ROIOPS_DISPATCH(input.scalar_type(), [&] {
    for (int64_t k0 = 0; k0 < K; k0 += kBoxChunk) {
      const int64_t n = std::min(kBoxChunk, K - k0);
      Tensor o = narrow_view(out, 0, k0, n), a = max_mode ? narrow_view(argmax, 0, k0, n) : argmax;
      const Tensor r = narrow_view(rois, 0, k0, n);
      if (max_mode) {
        forward_impl<scalar_t, true>(input, r, spatial_scale, ph, pw, sampling_ratio, aligned, o, a, k0);
      } else {
        forward_impl<scalar_t, false>(input, r, spatial_scale, ph, pw, sampling_ratio, aligned, o, a, k0);
      }
    }
  });
  return {out, argmax};
}

Tensor backward(const Tensor& grad_, const Tensor& argmax_, const Tensor& rois_, double spatial_scale,
                int64_t ph, int64_t pw, int64_t N, int64_t C, int64_t H, int64_t W, int64_t sampling_ratio,
                bool aligned, bool channels_last, bool max_mode) {
  check_backward_args(grad_, rois_, 5, N, C, H, W, spatial_scale, ph, pw);
  check_sampling_ratio(sampling_ratio);
  check_grad_shape(grad_, rois_.size(0), C, ph, pw);
  if (max_mode) check_argmax(argmax_, grad_);
  const BackwardArgs a(grad_, rois_, N, spatial_scale, channels_last);
  const Tensor &grad = a.grad, &rois = a.rois;
  // grad and argmax share strides, so one offset serves both.
  const Tensor argmax = max_mode ? in_layout(argmax_, channels_last) : Tensor();
  Tensor gi = empty_output({N, C, H, W}, a.grad_options);
  const int64_t K = rois.size(0);
  ROIOPS_DISPATCH(grad.scalar_type(), [&] {
    backward_chunks<scalar_t>(
        gi, K, [&](int64_t k0) { return std::min(K, k0 + kBoxChunk); },
        [&](auto out_type, Tensor& out, int64_t k0, int64_t k1, bool fresh) {
          using out_t = decltype(out_type);
          const Tensor g = narrow_view(grad, 0, k0, k1 - k0), r = narrow_view(rois, 0, k0, k1 - k0);
          if (max_mode) {
            backward_impl<scalar_t, out_t, true>(g, narrow_view(argmax, 0, k0, k1 - k0), r, spatial_scale, ph, pw,
                                                 sampling_ratio, aligned, out, k0, fresh);
          } else {
            backward_impl<scalar_t, out_t, false>(g, argmax, r, spatial_scale, ph, pw, sampling_ratio, aligned, out,
                                                  k0, fresh);
          }
        });
  });
  return gi;
}

}  // namespace

ROIOPS_ENTRY
Tensor roi_align_forward(const Tensor& input, const Tensor& rois, double spatial_scale, int64_t ph,
                         int64_t pw, int64_t sampling_ratio, bool aligned) {
  return std::get<0>(forward(input, rois, spatial_scale, ph, pw, sampling_ratio, aligned, false));
}

ROIOPS_ENTRY
Tensor roi_align_backward(const Tensor& grad, const Tensor& rois, double spatial_scale, int64_t ph,
                          int64_t pw, int64_t N, int64_t C, int64_t H, int64_t W, int64_t sampling_ratio,
                          bool aligned, bool channels_last) {
  return backward(grad, Tensor(), rois, spatial_scale, ph, pw, N, C, H, W, sampling_ratio, aligned,
                  channels_last, false);
}

ROIOPS_ENTRY
std::tuple<Tensor, Tensor> roi_align_max_forward(const Tensor& input, const Tensor& rois,
                                                 double spatial_scale, int64_t ph, int64_t pw,
                                                 int64_t sampling_ratio, bool aligned) {
  return forward(input, rois, spatial_scale, ph, pw, sampling_ratio, aligned, true);
}

ROIOPS_ENTRY
Tensor roi_align_max_backward(const Tensor& grad, const Tensor& argmax, const Tensor& rois,
                              double spatial_scale, int64_t ph, int64_t pw, int64_t N, int64_t C, int64_t H,
                              int64_t W, int64_t sampling_ratio, bool aligned, bool channels_last) {
  return backward(grad, argmax, rois, spatial_scale, ph, pw, N, C, H, W, sampling_ratio, aligned, channels_last,
                  true);
}

}  // namespace roiops

// The CPU kernels (the schemas are defined from the ops' declarations: setup.py).
STABLE_TORCH_LIBRARY_IMPL(roiops, CPU, m) {
  m.impl("roi_align", TORCH_BOX(&roiops::roi_align_forward));
  m.impl("_roi_align_backward", TORCH_BOX(&roiops::roi_align_backward));
  m.impl("roi_align_max", TORCH_BOX(&roiops::roi_align_max_forward));
  m.impl("_roi_align_max_backward", TORCH_BOX(&roiops::roi_align_max_backward));
}
