// Position-sensitive RoIAlign on the CPU (docs/semantics.md, "ps_roi_align").
//
// Each box's sample plan (roi_align's AlignPlan with the half-cell shift) is built once
// and shared by all channels; the kernels run position_sensitive.h's tasks. Sums are
// torchvision's, in its order: per sample w1*v1 + w2*v2 + w3*v3 + w4*v4, samples added in
// row-major order from 0 (a sample outside the map adds 0, which changes no sum that
// starts from +0), then divided by the count; backward adds (grad * w) / count to each
// neighbour, boxes in increasing k. So float32 and float64 results equal torchvision's
// bit for bit where the semantics agree.

#include <algorithm>
#include <climits>
#include <cmath>
#include <utility>
#include <vector>

#include "args.h"
#include "memory.h"
#include "plans.h"
#include "position_sensitive.h"
#include "ps_lanes.h"
#include "simd.h"

namespace roiops {
namespace {

template <typename T>
BoxPlans<AlignPlan<T>> build_plans(const Tensor& rois, double spatial_scale, int64_t ph, int64_t pw,
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
ROIOPS_SIMD void add_band_terms(const PsBand& band, const BoxPlans<AlignPlan<T>>& plans,
                                const std::vector<int64_t>& boxes, const scalar_t* grad_p, const Strides& gs,
                                int64_t ph, int64_t pw, T* __restrict__ buf, T* __restrict__ g) {
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

// PSRoIAlign's parts for position_sensitive.h's drivers: a bin's mean is the sum of its
// samples divided by their count; backward adds (grad * w) / count to each sample's four
// neighbours (a power-of-2 count on a tile's lanes: times its exact reciprocal).
template <typename scalar_t>
struct AlignParts {
  using T = opmath_type<scalar_t>;
  // A band adds the samples whose y_low is among its rows; their y_high may be the next row.
  static constexpr int64_t kReach = 1;
  const BoxPlans<AlignPlan<T>> plans;
  const int64_t ph, pw;

  AlignParts(const Tensor& rois, double spatial_scale, int64_t ph_, int64_t pw_, int64_t H, int64_t W,
             int64_t sampling_ratio)
      : plans(build_plans<T>(rois, spatial_scale, ph_, pw_, sampling_ratio, H, W)), ph(ph_), pw(pw_) {}

  int64_t reads() const { return total_reads(plans, ph, pw); }
  int64_t cover(const std::vector<int64_t>& boxes, int64_t i, int64_t j, PsTile& t) const {
    return cover_bin(plans, boxes, i, j, t);
  }

  // A bin row that spans bands is summed top band first, which is its samples' order only
  // where their rows never decrease: a box upside down (y2 < y1 with a fixed sampling
  // ratio) has its samples run bottom to top, and such a call takes the per-bin path.
  bool may_use_bands() const {
    const auto upside_down = [](const AlignPlan<T>& p) { return !p.empty() && p.ys.bin < T(0); };
    return std::none_of(plans.begin(), plans.end(), upside_down);
  }
  std::pair<int64_t, int64_t> bin_rows(int64_t k, int64_t i) const { return plans[k].bin_rows(i); }
  void sum_row(const PsBand& band, const T* buf, int64_t k, int64_t i, const PsRowPart<T>& part,
               const PsOutput<scalar_t>& out) const {
    align_bins_lanes<T, scalar_t>(pw, band.nc, [&](int64_t j) {
      return LanesBin<T, scalar_t>{&plans[k], i, j, band.view(buf, i * pw + j), out.row(i * pw + j, k) + band.c0,
                                   part.ya, part.yb, part.carry_of(j, band.lanes), part.first, part.last};
    });
  }
  void tile_bins(const PsLanes<const T>& v, const std::vector<int64_t>& boxes, int64_t i, int64_t j, int64_t c0,
                 int64_t nc, const PsOutput<scalar_t>& out) const {
    align_bins_lanes<T, scalar_t>(static_cast<int64_t>(boxes.size()), nc, [&](int64_t m) {
      const int64_t k = boxes[m];
      return LanesBin<T, scalar_t>{&plans[k], i, j, v, out.row(i * pw + j, k) + c0};
    });
  }
  void bin_means(int64_t k, int64_t i, int64_t j, const scalar_t* base, int64_t cs, const Strides& s, int64_t nc,
                 T* acc, scalar_t* r) const {
    const AlignPlan<T>& p = plans[k];
    if (p.empty()) {
      for (int64_t c = 0; c < nc; ++c) r[c] = static_cast<scalar_t>(T(0) / p.count);
      return;
    }
    align_bin(p, i, j, base, cs, s.h, s.w, nc, acc);
    for (int64_t c = 0; c < nc; ++c) r[c] = static_cast<scalar_t>(acc[c] / p.count);
  }

  std::pair<int64_t, int64_t> row_span(int64_t k) const { return plans[k].row_span(); }
  void add_band(const PsBand& band, const std::vector<int64_t>& boxes, const PsGradRows<scalar_t>& grad, T* buf,
                T* g) const {
    add_band_terms(band, plans, boxes, grad.data, grad.s, ph, pw, buf, g);
  }
  int64_t scratch(int64_t nc) const { return 5 * nc; }  // g, then align_bin_backward's 4 * nc
  void add_bin(int64_t k, int64_t i, int64_t j, const scalar_t* gk, int64_t gc, int64_t nc, T* g,
               const PsLanes<T>& v, T* base, int64_t cs, const Strides& a) const {
    const AlignPlan<T>& p = plans[k];
    if (p.empty()) return;
    for (int64_t c = 0; c < nc; ++c) g[c] = static_cast<T>(gk[c * gc]);
    int exp;
    if (!v.data) {
      align_bin_backward(p, i, j, g, base, cs, a.h, a.w, nc, g + nc);
    } else if (std::frexp(p.count, &exp) == T(0.5)) {
      align_bin_lanes_backward<true>(p, i, j, g, v);
    } else {
      align_bin_lanes_backward<false>(p, i, j, g, v);
    }
  }
};

}  // namespace

ROIOPS_ENTRY
Tensor ps_roi_align_forward(const Tensor& input, const Tensor& rois, double spatial_scale, int64_t ph,
                            int64_t pw, int64_t sampling_ratio) {
  return ps_forward<AlignParts>(input, rois, spatial_scale, ph, pw, sampling_ratio, sampling_ratio);
}

ROIOPS_ENTRY
Tensor ps_roi_align_backward(const Tensor& grad, const Tensor& rois, double spatial_scale, int64_t ph,
                             int64_t pw, int64_t N, int64_t C, int64_t H, int64_t W, int64_t sampling_ratio,
                             bool channels_last) {
  return ps_backward<AlignParts>(grad, rois, spatial_scale, ph, pw, N, C, H, W, channels_last, sampling_ratio,
                                 sampling_ratio);
}

}  // namespace roiops

// The CPU kernels (the schemas are defined from the ops' declarations: setup.py).
STABLE_TORCH_LIBRARY_IMPL(roiops, CPU, m) {
  m.impl("ps_roi_align", TORCH_BOX(&roiops::ps_roi_align_forward));
  m.impl("_ps_roi_align_backward", TORCH_BOX(&roiops::ps_roi_align_backward));
}
