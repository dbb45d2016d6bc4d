// RoIAlign's gradient with respect to the boxes on the CPU, "avg" and "max" modes
// (docs/semantics.md, "roi_align box gradient"). Plans come from roi_align.h, as the
// forward's; max mode first finds each bin's winner with the forward's kernels.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "align_kernels.h"
#include "args.h"
#include "memory.h"
#include "plans.h"
#include "roi_align.h"
#include "simd.h"
#include "torch_api.h"

namespace roiops {
namespace {

// semantics.md "roi_align box gradient". A sample's value moves with its position at
// dv/dy = dl_y * (hx * (v3 - v1) + lx * (v4 - v2)) and dv/dx = dl_x * (hy * (v2 - v1) + ly * (v4 - v3))
// (v1..v4 at (lo, lo), (lo, hi), (hi, lo), (hi, hi)), and the position with the start of
// the bins (rate 1) and the bin size (AxisPlan::slopes). A box's gradient needs four sums
// over its samples and channels: grad * dv/dy and grad * dv/dy * dy/d bin, and the same in
// x (BoxSums); box_gradient turns them into the corners' gradient.
template <typename T>
struct BoxSums {
  T y = 0, y_bin = 0, x = 0, x_bin = 0;
};

// The slopes of a box's inside samples along both axes.
template <typename T>
struct BoxSlopes {
  std::vector<T> dy, dy_bin, dx, dx_bin;
  explicit BoxSlopes(const AlignPlan<T>& p) {
    p.ys.slopes(dy, dy_bin);
    p.xs.slopes(dx, dx_bin);
  }
};

// start = c1 * s - o and bin = (c2 - c1) * s / pooled: d/dc1 = s * (sum - sum_bin / pooled),
// d/dc2 = s * sum_bin / pooled; a box widened to 1 cell has a constant bin size: only its
// start moves. out: {d/dx1, d/dy1, d/dx2, d/dy2}.
template <typename T, typename R>
void box_gradient(const AlignPlan<T>& p, const BoxSums<T>& sums, T scale, int64_t ph, int64_t pw, R* out) {
  const T x2 = p.clamped_w ? T(0) : scale * sums.x_bin / static_cast<T>(pw);
  const T y2 = p.clamped_h ? T(0) : scale * sums.y_bin / static_cast<T>(ph);
  out[0] = static_cast<R>(scale * sums.x - x2);
  out[1] = static_cast<R>(scale * sums.y - y2);
  out[2] = static_cast<R>(x2);
  out[3] = static_cast<R>(y2);
}

// avg, one box, n channels at img + c * sC (kContig: sC == 1, vectorised along them);
// g: the box's gradient, bin (i, j) channel c at g + i * gH + j * gW + c * gC. Per bin,
// per-channel sums of dv/dy (times the slopes) over its samples, then times the bin's
// gradient. acc: scratch for 8 * n values.
template <bool kContig, typename S, typename G, typename T>
ROIOPS_SIMD BoxSums<T> avg_rois_box(const AlignPlan<T>& p, const BoxSlopes<T>& d, const S* img, int64_t sC,
                                    int64_t sH, int64_t sW, int64_t n, const G* g, int64_t gC, int64_t gH, int64_t gW,
                                    int64_t ph, int64_t pw, T* acc) {
  const int64_t cs = kContig ? 1 : sC;
  T* __restrict__ by = acc;
  T* __restrict__ by_bin = by + n;
  T* __restrict__ bx = by_bin + n;
  T* __restrict__ bx_bin = bx + n;
  T* __restrict__ ty = bx_bin + n;
  T* __restrict__ ty_bin = ty + n;
  T* __restrict__ tx = ty_bin + n;
  T* __restrict__ tx_bin = tx + n;
  std::fill(ty, ty + 4 * n, T(0));
  for (int64_t i = 0; i < ph; ++i) {
    for (int64_t j = 0; j < pw; ++j) {
      if (p.ys.begin[i] == p.ys.begin[i + 1] || p.xs.begin[j] == p.xs.begin[j + 1]) continue;  // all outside
      std::fill(by, by + 4 * n, T(0));
      for (int64_t a = p.ys.begin[i]; a < p.ys.begin[i + 1]; ++a) {
        const T hy = p.ys.h[a], ly = p.ys.l[a], wy = d.dy[a], wy_bin = d.dy_bin[a];
        const S* rlo = img + p.ys.lo[a] * sH;
        const S* rhi = img + p.ys.hi[a] * sH;
        for (int64_t b = p.xs.begin[j]; b < p.xs.begin[j + 1]; ++b) {
          const T hx = p.xs.h[b], lx = p.xs.l[b], wx = d.dx[b], wx_bin = d.dx_bin[b];
          const S* __restrict__ p1 = rlo + p.xs.lo[b] * sW;
          const S* __restrict__ p2 = rlo + p.xs.hi[b] * sW;
          const S* __restrict__ p3 = rhi + p.xs.lo[b] * sW;
          const S* __restrict__ p4 = rhi + p.xs.hi[b] * sW;
          for (int64_t c = 0; c < n; ++c) {
            const T v1 = static_cast<T>(p1[c * cs]), v2 = static_cast<T>(p2[c * cs]);
            const T v3 = static_cast<T>(p3[c * cs]), v4 = static_cast<T>(p4[c * cs]);
            const T dy = hx * (v3 - v1) + lx * (v4 - v2);
            const T dx = hy * (v2 - v1) + ly * (v4 - v3);
            by[c] += dy * wy;
            by_bin[c] += dy * wy_bin;
            bx[c] += dx * wx;
            bx_bin[c] += dx * wx_bin;
          }
        }
      }
      const G* __restrict__ gb = g + i * gH + j * gW;
      for (int64_t c = 0; c < n; ++c) {
        const T gv = static_cast<T>(gb[c * gC]);
        ty[c] += gv * by[c];
        ty_bin[c] += gv * by_bin[c];
        tx[c] += gv * bx[c];
        tx_bin[c] += gv * bx_bin[c];
      }
    }
  }
  BoxSums<T> sums;
  for (int64_t c = 0; c < n; ++c) {
    sums.y += ty[c];
    sums.y_bin += ty_bin[c];
    sums.x += tx[c];
    sums.x_bin += tx_bin[c];
  }
  sums.y /= p.count, sums.y_bin /= p.count, sums.x /= p.count, sums.x_bin /= p.count;
  return sums;
}

// max, one box: each bin's winner per channel (am, bin-major with channels contiguous,
// and its value `best`, as the forward computes them), then its slopes times the gradient.
// A winner outside the map (value 0) or with a NaN value adds nothing.
template <typename S, typename G, typename B, typename T>
BoxSums<T> max_rois_box(const AlignPlan<T>& p, const BoxSlopes<T>& d, const S* img, int64_t sC, int64_t sH,
                        int64_t sW, int64_t n, const G* g, int64_t gC, int64_t gH, int64_t gW, int64_t ph, int64_t pw,
                        const B* best, const int32_t* am) {
  BoxSums<T> sums;
  const double inv_gw = p.grid_w > 0 ? 1.0 / static_cast<double>(p.grid_w) : 0.0;
  for (int64_t i = 0; i < ph; ++i) {
    for (int64_t j = 0; j < pw; ++j) {
      for (int64_t c = 0; c < n; ++c) {
        const int64_t e = (i * pw + j) * n + c;
        int64_t a, b;
        if (std::isnan(static_cast<T>(best[e])) || !argmax_taps(p, i, j, am[e], inv_gw, a, b)) continue;
        const S* cell = img + c * sC;
        const S* rlo = cell + p.ys.lo[a] * sH;
        const S* rhi = cell + p.ys.hi[a] * sH;
        const T v1 = static_cast<T>(rlo[p.xs.lo[b] * sW]), v2 = static_cast<T>(rlo[p.xs.hi[b] * sW]);
        const T v3 = static_cast<T>(rhi[p.xs.lo[b] * sW]), v4 = static_cast<T>(rhi[p.xs.hi[b] * sW]);
        const T gv = static_cast<T>(g[i * gH + j * gW + c * gC]);
        const T dy = gv * (p.xs.h[b] * (v3 - v1) + p.xs.l[b] * (v4 - v2));
        const T dx = gv * (p.ys.h[a] * (v2 - v1) + p.ys.l[a] * (v4 - v3));
        sums.y += dy * d.dy[a];
        sums.y_bin += dy * d.dy_bin[a];
        sums.x += dx * d.dx[b];
        sums.x_bin += dx * d.dx_bin[b];
      }
    }
  }
  return sums;
}

// Gradient with respect to rois: each box's sums per channel block (box_tasks), then
// added in block order, which does not depend on the number of threads. Plans are built
// per chunk of boxes, as forward.
template <typename scalar_t, bool kMax>
void rois_backward_impl(const Tensor& grad, const Tensor& input, const Tensor& rois, double spatial_scale,
                        int64_t ph, int64_t pw, int64_t sampling_ratio, bool aligned, Tensor& out, int64_t row0) {
  using T = opmath_type<scalar_t>;
  const int64_t K = rois.size(0), C = input.size(1), H = input.size(2), W = input.size(3);
  if (K == 0 || C == 0) return;
  const Plans<T> plans = build_plans<T>(rois, spatial_scale, ph, pw, sampling_ratio, aligned, H, W, kMax, false, row0);
  const int64_t sN = input.stride(0), sC = input.stride(1);
  const int64_t gK = grad.stride(0), gC = grad.stride(1), gH = grad.stride(2), gW = grad.stride(3);
  const scalar_t* in = input.const_data_ptr<scalar_t>();
  const scalar_t* grad_p = grad.const_data_ptr<scalar_t>();
  Scratch<T> acc, best;
  Scratch<scalar_t> plane_best;
  Scratch<int32_t> am;
  // Box k on channels [c0, c0 + nc) of img (box_tasks).
  auto box = [&](int64_t k, int64_t c0, int64_t nc, const auto* img, int64_t vC, int64_t vH, int64_t vW,
                 bool planes) {
    const AlignPlan<T>& p = plans[k];
    const BoxSlopes<T> d(p);
    const scalar_t* g = grad_p + k * gK + c0 * gC;
    if constexpr (kMax) {
      // The forward's winners, bin-major with channels contiguous.
      int32_t* a = am.get(ph * pw * nc + nc);  // then nc for max_forward_cl's running indices
      if (planes) {
        scalar_t* b = plane_best.get(ph * pw * nc);
        for (int64_t c = 0; c < nc; ++c) {
          max_forward_plane(p, in + p.batch * sN + (c0 + c) * sC, W, ph, pw,
                            acc.get(7 * static_cast<int64_t>(p.xs.lo.size())), b + c, a + c, pw * nc, nc);
        }
        return max_rois_box(p, d, img, vC, vH, vW, nc, g, gC, gH, gW, ph, pw, static_cast<const scalar_t*>(b),
                            static_cast<const int32_t*>(a));
      }
      T* b = best.get(ph * pw * nc);
      max_forward_cl<0>(p, img, vH, vW, nc, ph, pw, acc.get(nc), a + ph * pw * nc, b, a, pw * nc, nc, 1);
      return max_rois_box(p, d, img, vC, vH, vW, nc, g, gC, gH, gW, ph, pw, static_cast<const T*>(b),
                          static_cast<const int32_t*>(a));
    } else {
      if (planes) return avg_rois_box<false>(p, d, img, vC, vH, vW, nc, g, gC, gH, gW, ph, pw, acc.get(8 * nc));
      return avg_rois_box<true>(p, d, img, vC, vH, vW, nc, g, gC, gH, gW, ph, pw, acc.get(8 * nc));
    }
  };
  const int64_t blocks = (C + box_task_block(input) - 1) / box_task_block(input);
  std::vector<BoxSums<T>> part(static_cast<size_t>(K * blocks)), sums(static_cast<size_t>(K));
  box_tasks<T, scalar_t>(plans, input, [&](int64_t k, int64_t blk, int64_t c0, int64_t nc, const auto* img, int64_t vC,
                                           int64_t vH, int64_t vW, bool planes) {
    part[k * blocks + blk] = box(k, c0, nc, img, vC, vH, vW, planes);
  });
  for (int64_t k = 0; k < K; ++k) {
    for (int64_t blk = 0; blk < blocks; ++blk) {
      const BoxSums<T>& q = part[k * blocks + blk];
      sums[k].y += q.y, sums[k].y_bin += q.y_bin, sums[k].x += q.x, sums[k].x_bin += q.x_bin;
    }
  }
  T* o = out.mutable_data_ptr<T>();
  const T scale = static_cast<T>(spatial_scale);
  for (int64_t k = 0; k < K; ++k) box_gradient(plans[k], sums[k], scale, ph, pw, o + 5 * k + 1);
}

Tensor rois_backward(const Tensor& grad_, const Tensor& input_, const Tensor& rois_, double spatial_scale,
                     int64_t ph, int64_t pw, int64_t sampling_ratio, bool aligned, bool max_mode) {
  const RoisBackwardArgs a(grad_, input_, rois_, spatial_scale, ph, pw, sampling_ratio);
  const Tensor &grad = a.grad, &input = a.input, &rois = a.rois;
  Tensor out = zeros({rois.size(0), 5}, Options{rois.scalar_type()});
  const int64_t K = rois.size(0);
  ROIOPS_DISPATCH(input.scalar_type(), [&] {
    for (int64_t k0 = 0; k0 < K; k0 += kBoxChunk) {
      const int64_t n = std::min(kBoxChunk, K - k0);
      Tensor o = narrow_view(out, 0, k0, n);
      const Tensor g = narrow_view(grad, 0, k0, n), r = narrow_view(rois, 0, k0, n);
      if (max_mode) {
        rois_backward_impl<scalar_t, true>(g, input, r, spatial_scale, ph, pw, sampling_ratio, aligned, o, k0);
      } else {
        rois_backward_impl<scalar_t, false>(g, input, r, spatial_scale, ph, pw, sampling_ratio, aligned, o, k0);
      }
    }
  });
  return to_dtype(out, rois_.scalar_type());  // in rois' dtype (a no-op for rois of the opmath type)
}

}  // namespace

ROIOPS_ENTRY
Tensor roi_align_rois_backward(const Tensor& grad, const Tensor& input, const Tensor& rois,
                               double spatial_scale, int64_t ph, int64_t pw, int64_t sampling_ratio, bool aligned) {
  return rois_backward(grad, input, rois, spatial_scale, ph, pw, sampling_ratio, aligned, false);
}

ROIOPS_ENTRY
Tensor roi_align_max_rois_backward(const Tensor& grad, const Tensor& input, const Tensor& rois,
                                   double spatial_scale, int64_t ph, int64_t pw, int64_t sampling_ratio,
                                   bool aligned) {
  return rois_backward(grad, input, rois, spatial_scale, ph, pw, sampling_ratio, aligned, true);
}

}  // namespace roiops

// The CPU kernels (the schemas are defined from the ops' declarations: setup.py).
STABLE_TORCH_LIBRARY_IMPL(roiops, CPU, m) {
  m.impl("_roi_align_rois_backward", TORCH_BOX(&roiops::roi_align_rois_backward));
  m.impl("_roi_align_max_rois_backward", TORCH_BOX(&roiops::roi_align_max_rois_backward));
}
