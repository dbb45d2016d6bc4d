// Position-sensitive RoIAlign on the CPU (docs/semantics.md, "ps_roi_align").
//
// Each box's sample plan (roi_align's AlignPlan with the half-cell shift) is built once
// and shared by all channels; the kernels run position_sensitive.h's tasks. Sums are
// torchvision's, in its order: per sample w1*v1 + w2*v2 + w3*v3 + w4*v4, samples added in
// row-major order from 0 (a sample outside the map adds 0, which changes no sum that
// starts from +0), then divided by the count; backward adds (grad * w) / count to each
// neighbour, boxes in increasing k. So float32 and float64 results equal torchvision's
// bit for bit where the semantics agree.
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <vector>

#include "geometry.h"
#include "memory.h"
#include "plans.h"
#include "position_sensitive.h"
#include "registry.h"
#include "simd.h"

namespace roiops {
namespace {

template <typename T>
BoxPlans<AlignPlan<T>> build_plans(const at::Tensor& rois, double spatial_scale, int64_t ph, int64_t pw,
                                   int64_t sampling_ratio, int64_t H, int64_t W) {
  const T* roi = rois.const_data_ptr<T>();
  const T scale = static_cast<T>(spatial_scale);
  return BoxPlans<AlignPlan<T>>(rois.size(0), [&](AlignPlan<T>& p, int64_t k) {
    p.build(roi + 5 * k, scale, ph, pw, sampling_ratio, /*aligned=*/true, H, W, /*max_mode=*/false);
  });
}

// f(o1, o2, o3, o4, w1, w2, w3, w4) for each sample of bin (i, j) inside the map, in
// row-major order: the offsets (rows sH, columns sW apart) of its four neighbours and their
// weights w1 = hy*hx, w2 = hy*lx, w3 = ly*hx, w4 = ly*lx. Only the samples whose first
// neighbours' row (y_low) lies in [ya, yb), by default all.
template <typename T, typename F>
inline void for_each_sample(const AlignPlan<T>& p, int64_t i, int64_t j, int64_t sH, int64_t sW, const F& f,
                            int64_t ya = INT64_MIN, int64_t yb = INT64_MAX) {
  const AxisPlan<T>&ys = p.ys, &xs = p.xs;
  for (int64_t ty = ys.begin[i]; ty < ys.begin[i + 1]; ++ty) {
    if (ys.lo[ty] < ya) continue;  // y_low never decreases along a bin of an upright box
    if (ys.lo[ty] >= yb) break;
    const int64_t ylo = ys.lo[ty] * sH, yhi = ys.hi[ty] * sH;
    const T ly = ys.l[ty], hy = ys.h[ty];
    for (int64_t tx = xs.begin[j]; tx < xs.begin[j + 1]; ++tx) {
      const int64_t xlo = xs.lo[tx] * sW, xhi = xs.hi[tx] * sW;
      const T lx = xs.l[tx], hx = xs.h[tx];
      f(ylo + xlo, ylo + xhi, yhi + xlo, yhi + xhi, hy * hx, hy * lx, ly * hx, ly * lx);
    }
  }
}

// Bin (i, j) of one box for nc output channels: acc[c] = sum of the bin's samples of the
// channel at base + c * cs.
template <typename scalar_t, typename T>
ROIOPS_SIMD void align_bin(const AlignPlan<T>& p, int64_t i, int64_t j, const scalar_t* __restrict__ base,
                           int64_t cs, int64_t sH, int64_t sW, int64_t nc, T* __restrict__ acc) {
  for (int64_t c = 0; c < nc; ++c) acc[c] = T(0);
  for_each_sample(p, i, j, sH, sW, [&](int64_t o1, int64_t o2, int64_t o3, int64_t o4, T w1, T w2, T w3, T w4) {
    for (int64_t c = 0; c < nc; ++c) {
      const scalar_t* q = base + c * cs;
      acc[c] += w1 * static_cast<T>(q[o1]) + w2 * static_cast<T>(q[o2]) + w3 * static_cast<T>(q[o3]) +
                w4 * static_cast<T>(q[o4]);
    }
  });
}

// Backward of bin (i, j) of one box: g[c] (the bin's gradient of nc output channels) spread
// to the channel at base + c * cs. d holds 4 * nc scratch values.
template <typename T>
ROIOPS_SIMD void align_bin_backward(const AlignPlan<T>& p, int64_t i, int64_t j, const T* __restrict__ g,
                                    T* __restrict__ base, int64_t cs, int64_t sH, int64_t sW, int64_t nc,
                                    T* __restrict__ d) {
  const T count = p.count;
  T *d1 = d, *d2 = d + nc, *d3 = d + 2 * nc, *d4 = d + 3 * nc;
  for_each_sample(p, i, j, sH, sW, [&](int64_t o1, int64_t o2, int64_t o3, int64_t o4, T w1, T w2, T w3, T w4) {
    for (int64_t c = 0; c < nc; ++c) {
      d1[c] = g[c] * w1 / count;
      d2[c] = g[c] * w2 / count;
      d3[c] = g[c] * w3 / count;
      d4[c] = g[c] * w4 / count;
    }
    for (int64_t c = 0; c < nc; ++c) {  // in this order: neighbours may coincide at the border
      T* q = base + c * cs;
      q[o1] += d1[c];
      q[o2] += d2[c];
      q[o3] += d3[c];
      q[o4] += d4[c];
    }
  });
}

// The cells that bin (i, j) of `boxes` reads, in tile t, and how many taps read them.
template <typename T>
int64_t cover_bin(const BoxPlans<AlignPlan<T>>& plans, const std::vector<int64_t>& boxes, int64_t i, int64_t j,
                  PsTile& t) {
  int64_t reads = 0;
  for (const int64_t k : boxes) {
    const AlignPlan<T>& p = plans[k];
    const auto [r0, r1] = p.bin_rows(i);
    if (r0 > r1 || p.xs.begin[j] == p.xs.begin[j + 1]) continue;
    t.cover(r0, r1 + 1);
    reads += 4 * (p.ys.begin[i + 1] - p.ys.begin[i]) * (p.xs.begin[j + 1] - p.xs.begin[j]);
  }
  return reads;
}

// One bin for align_bins_lanes: box plan p's bin (i, j), the lanes it reads, where its nc
// means go, and which of its samples to add now with its running sums (PsRowPart: those
// whose y_low lies in rows [ya, yb); by default all, from zero to the mean).
template <typename T, typename scalar_t>
struct LanesBin {
  const AlignPlan<T>* p;
  int64_t i, j;
  PsLanes<const T> v;
  scalar_t* r;
  int64_t ya = INT64_MIN, yb = INT64_MAX;
  T* carry = nullptr;
  bool first = true, last = true;
};

// n bins, at(m) the m-th (a LanesBin): r[c] = the mean of lane c over the bin's samples, c <
// nc (0 / count for an empty box). A whole task's (or bin row's) bins per call, so that the
// loop over them is compiled for the ROIOPS_SIMD instruction set too and the sums stay in
// registers.
template <typename T, typename scalar_t, typename At>
ROIOPS_SIMD void align_bins_lanes(int64_t n, int64_t nc, const At& at) {
  for (int64_t m = 0; m < n; ++m) {
    const LanesBin<T, scalar_t> e = at(m);
    const AlignPlan<T>& p = *e.p;
    if (p.empty()) {
      if (e.last) {
        for (int64_t c = 0; c < nc; ++c) e.r[c] = static_cast<scalar_t>(T(0) / p.count);
      }
      continue;
    }
    const PsLanes<const T>& v = e.v;
    ps_lane_blocks(nc, [&](auto V, int64_t c) __attribute__((always_inline)) {
      lanes8<T> sum[V] = {};
      if (!e.first) {
        for (int u = 0; u < V; ++u) sum[u] = load8(e.carry + c + 8 * u);
      }
      const T* q = v.data + c - v.org;
      for_each_sample(
          p, e.i, e.j, v.sH, v.sW,
          [&](int64_t o1, int64_t o2, int64_t o3, int64_t o4, T w1, T w2, T w3, T w4) {
            for (int u = 0; u < V; ++u) {
              sum[u] += w1 * load8(q + o1 + 8 * u) + w2 * load8(q + o2 + 8 * u) + w3 * load8(q + o3 + 8 * u) +
                        w4 * load8(q + o4 + 8 * u);
            }
          },
          e.ya, e.yb);
      if (!e.last) {
        for (int u = 0; u < V; ++u) store8(e.carry + c + 8 * u, sum[u]);
        return;
      }
      for (int u = 0; u < V; ++u) ps_store_lanes<T>(sum[u] / p.count, nc - c - 8 * u, e.r + c + 8 * u);
    });
  }
}

// align_bin_backward on a task's lanes; g has v.L lanes. kPow2: the count is a power of 2,
// and dividing by it is multiplying by its exact reciprocal.
template <bool kPow2, typename T>
ROIOPS_SIMD void align_bin_lanes_backward(const AlignPlan<T>& p, int64_t i, int64_t j, const T* __restrict__ g,
                                          const PsLanes<T>& v) {
  const T count = p.count, inv = T(1) / count;
  const int64_t L = v.L;
  for_each_sample(p, i, j, v.sH, v.sW, [&](int64_t o1, int64_t o2, int64_t o3, int64_t o4, T w1, T w2, T w3, T w4) {
    T *q1 = v.data + (o1 - v.org), *q2 = v.data + (o2 - v.org), *q3 = v.data + (o3 - v.org),
      *q4 = v.data + (o4 - v.org);
    for (int64_t c = 0; c < L; c += 8) {
      const lanes8<T> gc = load8(g + c);
      const lanes8<T> d1 = kPow2 ? gc * w1 * inv : gc * w1 / count, d2 = kPow2 ? gc * w2 * inv : gc * w2 / count,
                      d3 = kPow2 ? gc * w3 * inv : gc * w3 / count, d4 = kPow2 ? gc * w4 * inv : gc * w4 / count;
      // One neighbour at a time: neighbours may coincide at the border.
      store8(q1 + c, load8(q1 + c) + d1);
      store8(q2 + c, load8(q2 + c) + d2);
      store8(q3 + c, load8(q3 + c) + d3);
      store8(q4 + c, load8(q4 + c) + d4);
    }
  });
}

// A band's terms (ps_backward_bands): each sample of each bin of `boxes` (in increasing k)
// adds (grad * w) / count to those of its four neighbours in the band's rows, in the order
// of align_bin_lanes_backward (a power-of-2 count: times its exact reciprocal).
template <typename scalar_t, typename T>
ROIOPS_SIMD void add_band(const PsBand& band, const BoxPlans<AlignPlan<T>>& plans,
                          const std::vector<int64_t>& boxes, const scalar_t* grad_p, const Strides& gs, int64_t ph,
                          int64_t pw, T* __restrict__ buf, T* __restrict__ g) {
  const int64_t L = band.lanes, cell = band.cell();
  for (const int64_t k : boxes) {
    const AlignPlan<T>& p = plans[k];
    if (p.empty()) continue;
    const T count = p.count, inv = T(1) / count;
    int exp;
    const bool pow2 = std::frexp(count, &exp) == T(0.5);
    const AxisPlan<T>&ys = p.ys, &xs = p.xs;
    for (int64_t i = 0; i < ph; ++i) {
      const int64_t ya = ys.begin[i], yb = ys.begin[i + 1];
      const auto [r0, r1] = p.bin_rows(i);
      if (r0 > r1 || r1 < band.r0 || r0 >= band.r1) continue;
      for (int64_t j = 0; j < pw; ++j) {
        if (xs.begin[j] == xs.begin[j + 1]) continue;
        const scalar_t* gk = grad_p + k * gs.n + band.c0 * gs.c + i * gs.h + j * gs.w;
        for (int64_t c = 0; c < band.nc; ++c) g[c] = static_cast<T>(gk[c * gs.c]);
        for (int64_t ty = ya; ty < yb; ++ty) {
          const int64_t ylo = ys.lo[ty], yhi = ys.hi[ty];
          const bool in_lo = ylo >= band.r0 && ylo < band.r1, in_hi = yhi >= band.r0 && yhi < band.r1;
          if (!in_lo && !in_hi) continue;
          const T ly = ys.l[ty], hy = ys.h[ty];
          T* rlo = band.at(buf, in_lo ? ylo : band.r0, 0, i * pw + j);
          T* rhi = band.at(buf, in_hi ? yhi : band.r0, 0, i * pw + j);
          for (int64_t tx = xs.begin[j]; tx < xs.begin[j + 1]; ++tx) {
            const int64_t xlo = xs.lo[tx] * cell, xhi = xs.hi[tx] * cell;
            const T lx = xs.l[tx], hx = xs.h[tx];
            const T w1 = hy * hx, w2 = hy * lx, w3 = ly * hx, w4 = ly * lx;
            for (int64_t c = 0; c < L; c += 8) {
              const lanes8<T> gc = load8(g + c);
              if (in_lo) {  // one neighbour at a time: neighbours may coincide at the border
                const lanes8<T> d1 = pow2 ? gc * w1 * inv : gc * w1 / count;
                store8(rlo + xlo + c, load8(rlo + xlo + c) + d1);
                const lanes8<T> d2 = pow2 ? gc * w2 * inv : gc * w2 / count;
                store8(rlo + xhi + c, load8(rlo + xhi + c) + d2);
              }
              if (in_hi) {
                const lanes8<T> d3 = pow2 ? gc * w3 * inv : gc * w3 / count;
                store8(rhi + xlo + c, load8(rhi + xlo + c) + d3);
                const lanes8<T> d4 = pow2 ? gc * w4 * inv : gc * w4 / count;
                store8(rhi + xhi + c, load8(rhi + xhi + c) + d4);
              }
            }
          }
        }
      }
    }
  }
}

// Taps of all boxes of `plans` over all bins (the reads of a forward).
template <typename T>
int64_t total_reads(const BoxPlans<AlignPlan<T>>& plans, int64_t ph, int64_t pw) {
  int64_t reads = 0;
  for (const AlignPlan<T>& p : plans) {
    if (!p.empty()) reads += 4 * (p.ys.begin[ph] - p.ys.begin[0]) * (p.xs.begin[pw] - p.xs.begin[0]);
  }
  return reads;
}

template <typename scalar_t>
void forward_impl(const at::Tensor& input, const at::Tensor& rois, double spatial_scale, int64_t ph, int64_t pw,
                  int64_t sampling_ratio, int64_t C_out, at::Tensor& out) {
  using T = at::opmath_type<scalar_t>;
  const int64_t N = input.size(0), H = input.size(2), W = input.size(3), bins = ph * pw;
  const BoxPlans<AlignPlan<T>> plans = build_plans<T>(rois, spatial_scale, ph, pw, sampling_ratio, H, W);
  const Strides s(input);
  const scalar_t* in = input.const_data_ptr<scalar_t>();
  PsOutput<scalar_t> result(out);
  const std::vector<int64_t> batch = ps_batch(rois);
  const auto rows = [&](int64_t k, int64_t i) { return plans[k].bin_rows(i); };
  const auto sum_row = [&](const PsBand& band, const T* buf, int64_t k, int64_t i, const PsRowPart<T>& part) {
    align_bins_lanes<T, scalar_t>(pw, band.nc, [&](int64_t j) {
      return LanesBin<T, scalar_t>{&plans[k], i, j, band.view(buf, i * pw + j), result.row(i * pw + j, k) + band.c0,
                                   part.ya, part.yb, part.carry_of(j, band.lanes), part.first, part.last};
    });
  };
  // A band adds the samples whose y_low is among its rows; their y_high may be the next row.
  // A bin row that spans bands is summed top band first, which is its samples' order only
  // where their rows never decrease: a box upside down (y2 < y1 with a fixed sampling ratio)
  // has its samples run bottom to top, and such a call takes the per-bin path below.
  const bool upright = std::none_of(plans.begin(), plans.end(),
                                    [](const AlignPlan<T>& p) { return !p.empty() && p.ys.bin < T(0); });
  if (s.w != 1 && upright &&
      ps_forward_bands<T, scalar_t>(input, batch, C_out, ph, pw, total_reads(plans, ph, pw), 1, rows, sum_row)) {
    return;
  }
  Scratch<T> scratch;
  const auto task = [&](int64_t n, int64_t bin, int64_t c0, int64_t nc, const std::vector<int64_t>& boxes) {
    const int64_t i = bin / pw, j = bin % pw;
    const scalar_t* base = in + n * s.n + (c0 * bins + bin) * s.c;
    PsTile t(nc, W);
    if (s.w == 1 && ps_use_tile<T>(t, cover_bin(plans, boxes, i, j, t), nc)) {
      const PsLanes<const T> v = ps_forward_tile(t, base, bins * s.c, nc, scratch);
      align_bins_lanes<T, scalar_t>(static_cast<int64_t>(boxes.size()), nc, [&](int64_t m) {
        const int64_t k = boxes[m];
        return LanesBin<T, scalar_t>{&plans[k], i, j, v, result.row(bin, k) + c0};
      });
      return;
    }
    T* acc = scratch.get(nc);
    for (const int64_t k : boxes) {
      const AlignPlan<T>& p = plans[k];
      scalar_t* r = result.row(bin, k) + c0;
      if (p.empty()) {
        for (int64_t c = 0; c < nc; ++c) r[c] = static_cast<scalar_t>(T(0) / p.count);
      } else {
        align_bin(p, i, j, base, bins * s.c, s.h, s.w, nc, acc);
        for (int64_t c = 0; c < nc; ++c) r[c] = static_cast<scalar_t>(acc[c] / p.count);
      }
    }
  };
  ps_tasks(batch, N, C_out, bins, task);
  result.finish();
}

template <typename scalar_t>
void backward_impl(const at::Tensor& grad, const at::Tensor& rois, double spatial_scale, int64_t ph, int64_t pw,
                   int64_t sampling_ratio, int64_t N, int64_t H, int64_t W, const PsBackward& args) {
  using T = at::opmath_type<scalar_t>;
  const int64_t C_out = grad.size(1), bins = ph * pw;
  const BoxPlans<AlignPlan<T>> plans = build_plans<T>(rois, spatial_scale, ph, pw, sampling_ratio, H, W);
  const PsGradRows<scalar_t> grad_rows(grad);
  const scalar_t* grad_p = grad_rows.data;
  const Strides& gs = grad_rows.s;
  if (ps_use_bands(args.acc, total_reads(plans, ph, pw), C_out, bins)) {
    std::vector<std::pair<int64_t, int64_t>> spans(plans.size());
    for (size_t k = 0; k < plans.size(); ++k) spans[k] = plans[k].row_span();
    ps_backward_bands<T>(ps_batch(rois), spans, C_out, bins, args.acc,
                         [&](const PsBand& band, const std::vector<int64_t>& boxes, T* buf, T* g) {
                           add_band(band, plans, boxes, grad_p, gs, ph, pw, buf, g);
                         });
    return;
  }
  args.clear();
  const Strides a(args.acc);
  T* acc_p = args.acc.data_ptr<T>();
  Scratch<T> scratch;
  const auto task = [&](int64_t n, int64_t bin, int64_t c0, int64_t nc, const std::vector<int64_t>& boxes) {
    const int64_t i = bin / pw, j = bin % pw;
    T* base = acc_p + n * a.n + (c0 * bins + bin) * a.c;
    PsTile t(nc, W);
    PsLanes<T> v{};
    const bool lanes = a.w == 1 && ps_use_tile<T>(t, cover_bin(plans, boxes, i, j, t), nc);
    T* gv = args.storage(lanes, t, base, bins * a.c, nc, 5 * nc, scratch, v);
    for (const int64_t k : boxes) {
      const AlignPlan<T>& p = plans[k];
      if (p.empty()) continue;
      const scalar_t* gk = grad_p + k * gs.n + c0 * gs.c + i * gs.h + j * gs.w;
      for (int64_t c = 0; c < nc; ++c) gv[c] = static_cast<T>(gk[c * gs.c]);
      int exp;
      if (!lanes) {
        align_bin_backward(p, i, j, gv, base, bins * a.c, a.h, a.w, nc, gv + nc);
      } else if (std::frexp(p.count, &exp) == T(0.5)) {
        align_bin_lanes_backward<true>(p, i, j, gv, v);
      } else {
        align_bin_lanes_backward<false>(p, i, j, gv, v);
      }
    }
    if (lanes) args.store(v.data, t, base, bins * a.c, nc);
  };
  ps_tasks(ps_batch(rois), N, C_out, bins, task);
}

}  // namespace

at::Tensor ps_roi_align_forward(const at::Tensor& input, const at::Tensor& rois, double spatial_scale, int64_t ph,
                                int64_t pw, int64_t sampling_ratio) {
  check_sampling_ratio(sampling_ratio);
  PsForward a(input, rois, spatial_scale, ph, pw);
  if (a.out.numel() == 0) return a.out;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, a.input.scalar_type(), "roiops_ps_roi_align_forward", [&] {
    forward_impl<scalar_t>(a.input, a.rois, spatial_scale, ph, pw, sampling_ratio, a.C_out, a.out);
  });
  return a.out;
}

at::Tensor ps_roi_align_backward(const at::Tensor& grad, const at::Tensor& rois, double spatial_scale, int64_t ph,
                                 int64_t pw, int64_t N, int64_t C, int64_t H, int64_t W, int64_t sampling_ratio,
                                 bool channels_last) {
  check_sampling_ratio(sampling_ratio);
  PsBackward a(grad, rois, spatial_scale, ph, pw, N, C, H, W, channels_last);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, a.grad.scalar_type(), "roiops_ps_align_backward", [&] {
    backward_impl<scalar_t>(a.grad, a.rois, spatial_scale, ph, pw, sampling_ratio, N, H, W, a);
  });
  return a.result();
}

namespace {

// The Python entry points, in roiops._C (registry.h).
const Registrar registrar([](pybind11::module_& m) {
  m.def("ps_roi_align_forward", &ps_roi_align_forward);
  m.def("ps_roi_align_backward", &ps_roi_align_backward);
});

}  // namespace

}  // namespace roiops
