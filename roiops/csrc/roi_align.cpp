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

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "align_kernels.h"
#include "geometry.h"
#include "memory.h"
#include "parallel.h"
#include "plans.h"
#include "simd.h"
#include "tiles.h"

namespace roiops {
namespace {

template <typename T>
using Plans = BoxPlans<AlignPlan<T>>;

// Plans of rois' rows; row0 numbers the first one in error messages (rois may be a chunk);
// sample_table: also the per-sample tables of the max backward.
template <typename T>
Plans<T> build_plans(const Tensor& rois, double spatial_scale, int64_t ph, int64_t pw, int64_t sampling_ratio,
                     bool aligned, int64_t H, int64_t W, bool max_mode, bool sample_table, int64_t row0) {
  const int64_t K = rois.size(0);
  const T* roi = rois.const_data_ptr<T>();
  const T scale = static_cast<T>(spatial_scale);
  Plans<T> plans(K, [&](AlignPlan<T>& p, int64_t k) {
    p.build(roi + 5 * k, scale, ph, pw, sampling_ratio, aligned, H, W, max_mode);
  });
  if (sample_table) {
    // The max backward's per-sample tables (one lookup per argmax) for the first boxes up to
    // a budget, so that memory does not grow with K; the others find their taps from the
    // axis plans, with the same products, hence the same bits.
    int64_t left = kSampleTableBudget, last = 0;
    for (; last < K && plans[last].sample_table_size(ph, pw) <= left; ++last) left -= plans[last].sample_table_size(ph, pw);
    parallel_for(0, last, 16, [&](int64_t k0, int64_t k1) {
      for (int64_t k = k0; k < k1; ++k) {
        if (plans[k].sample_table_size(ph, pw) > 0) plans[k].build_samples(ph, pw);
      }
    });
  }
  for (int64_t k = 0; max_mode && k < K; ++k) {
    ROIOPS_CHECK(!plans[k].grid_too_large, "roiops: rois row ", row0 + k, ": the adaptive sampling grid of a bin ",
                      "exceeds 2^31 - 1 samples, beyond the int32 argmax of mode \"max\"; use a larger output_size ",
                      "or a positive sampling_ratio");
    // max_forward_plane holds a sample row's position in its bin as T.
    constexpr bool kFloat = std::is_same_v<T, float>;
    ROIOPS_CHECK(!kFloat || plans[k].ys.widest_bin() <= kFloatExact,
                      "roiops: rois row ", row0 + k, ": more than 2^24 sample rows of one bin inside the map");
  }
  return plans;
}

// ---- avg, one box -------------------------------------------------------------------

// Values of one sample row at the box's inside sample columns, from their gathered
// neighbours (a = lo row, b = hi row; 1 = lo column, 2 = hi column).
template <typename T>
inline void sample_row(T* __restrict__ v, T hy, T ly, const T* __restrict__ hx, const T* __restrict__ lx,
                       const T* __restrict__ a1, const T* __restrict__ a2, const T* __restrict__ b1,
                       const T* __restrict__ b2, int64_t n) {
  for (int64_t s = 0; s < n; ++s) v[s] = hy * hx[s] * a1[s] + hy * lx[s] * a2[s] + ly * hx[s] * b1[s] + ly * lx[s] * b2[s];
}

// Gathers the four neighbours of every inside sample column of the box on sample row a
// of an NCHW plane (scalar loads), and evaluates the samples (a vector loop).
template <typename scalar_t, typename T>
inline void gather_sample_row(const AlignPlan<T>& p, const scalar_t* plane, int64_t W, int64_t a, T* scratch, T* v) {
  const int64_t nx = static_cast<int64_t>(p.xs.lo.size());
  T* a1 = scratch;
  T* a2 = a1 + nx;
  T* b1 = a2 + nx;
  T* b2 = b1 + nx;
  const int32_t* xlo = p.xs.lo.data();
  const int32_t* xhi = p.xs.hi.data();
  const scalar_t* rlo = plane + p.ys.lo[a] * W;
  const scalar_t* rhi = plane + p.ys.hi[a] * W;
  for (int64_t s = 0; s < nx; ++s) {
    a1[s] = static_cast<T>(rlo[xlo[s]]);
    a2[s] = static_cast<T>(rlo[xhi[s]]);
    b1[s] = static_cast<T>(rhi[xlo[s]]);
    b2[s] = static_cast<T>(rhi[xhi[s]]);
  }
  sample_row(v, p.ys.h[a], p.ys.l[a], p.xs.h.data(), p.xs.l.data(), a1, a2, b1, b2, nx);
}

// NCHW, one channel plane (rows contiguous, row stride W): a bin row's samples are
// evaluated a sample row at a time, then each bin adds its samples of that row.
// scratch: 5 * (inside sample columns) + pw.
template <typename scalar_t, typename T>
ROIOPS_SIMD void avg_forward_plane(const AlignPlan<T>& p, const scalar_t* plane, int64_t W, int64_t ph, int64_t pw,
                                   T* scratch, scalar_t* out, int64_t oH, int64_t oW) {
  const int64_t nx = static_cast<int64_t>(p.xs.lo.size());
  T* v = scratch + 4 * nx;
  T* sums = v + nx;
  for (int64_t i = 0; i < ph; ++i) {
    std::fill(sums, sums + pw, T(0));
    for (int64_t a = p.ys.begin[i]; nx > 0 && a < p.ys.begin[i + 1]; ++a) {
      gather_sample_row(p, plane, W, a, scratch, v);
      for (int64_t j = 0; j < pw; ++j) {
        T s = sums[j];
        for (int64_t b = p.xs.begin[j]; b < p.xs.begin[j + 1]; ++b) s += v[b];
        sums[j] = s;
      }
    }
    for (int64_t j = 0; j < pw; ++j) out[i * oH + j * oW] = static_cast<scalar_t>(sums[j] / p.count);
  }
}

// ---- max, one box -------------------------------------------------------------------

// semantics.md "roi_align max", each sample in the reference's arithmetic: w1*v1 + w2*v2 + w3*v3 +
// w4*v4 with w1 = hy*hx, w2 = hy*lx, w3 = ly*hx, w4 = ly*lx. The winner is the first
// largest sample in row-major order; NaN wins, the first NaN first. Inside samples are
// compared first; the first outside sample (value 0) is then merged by its index.
template <typename T>
inline bool take_outside(T best, int64_t idx, int64_t out) {
  return idx < 0 || (!std::isnan(best) && (T(0) > best || (T(0) == best && out < idx)));
}

// best/row <- the first maximum of (best, v) per sample column, v coming from sample row iy.
template <typename T>
inline void running_max(T* __restrict__ best, T* __restrict__ row, const T* __restrict__ v, T iy, int64_t n) {
  for (int64_t s = 0; s < n; ++s) take_first_max(v[s], iy, best[s], row[s]);
}

// NCHW, one plane. Sample rows are evaluated as in avg_forward_plane, and a column-wise
// running maximum over the bin row's sample rows kept (vector loops); each bin finally
// picks among its sample columns. scratch: 7 * (inside sample columns).
template <typename scalar_t, typename T>
ROIOPS_SIMD void max_forward_plane(const AlignPlan<T>& p, const scalar_t* plane, int64_t W, int64_t ph, int64_t pw,
                                   T* scratch, scalar_t* out, int32_t* am, int64_t oH, int64_t oW) {
  const int64_t nx = static_cast<int64_t>(p.xs.lo.size());
  T* v = scratch + 4 * nx;
  T* best = v + nx;
  // Position of best's sample row among the bin's inside rows, held as T to vectorise with
  // it (exact: build_plans refuses bins of more than 2^24 inside rows).
  T* brow = best + nx;
  for (int64_t i = 0; i < ph; ++i) {
    const bool any = nx > 0 && p.ys.begin[i] < p.ys.begin[i + 1];
    for (int64_t a = p.ys.begin[i]; any && a < p.ys.begin[i + 1]; ++a) {
      const T iy = static_cast<T>(a - p.ys.begin[i]);
      const bool first = a == p.ys.begin[i];
      gather_sample_row(p, plane, W, a, scratch, first ? best : v);
      if (first) {
        std::fill(brow, brow + nx, iy);
      } else {
        running_max(best, brow, v, iy, nx);
      }
    }
    for (int64_t j = 0; j < pw; ++j) {
      T m = 0;
      int64_t idx = -1;
      for (int64_t s = p.xs.begin[j]; any && s < p.xs.begin[j + 1]; ++s) {
        const int64_t at =
            (p.ys.first_in[i] + static_cast<int64_t>(brow[s])) * p.grid_w + p.xs.first_in[j] + s - p.xs.begin[j];
        if (first_max(best[s], at, m, idx)) {
          m = best[s];
          idx = at;
        }
      }
      const int64_t outside = p.first_outside(i, j);
      if (outside >= 0 && take_outside(m, idx, outside)) {
        m = 0;
        idx = outside;
      }
      out[i * oH + j * oW] = static_cast<scalar_t>(m);
      am[i * oH + j * oW] = static_cast<int32_t>(idx);
    }
  }
}

// n contiguous channels: samples one by one, in row-major order, vectorised along channels.
// kN > 0: n == kN is known at compile time, and the running maximum stays in registers.
template <int64_t kN, typename S, typename T, typename scalar_t>
ROIOPS_SIMD void max_forward_cl(const AlignPlan<T>& p, const S* img, int64_t sH, int64_t sW, int64_t n_, int64_t ph,
                                int64_t pw, T* best_, int32_t* idx_, scalar_t* out, int32_t* am, int64_t oH, int64_t oW,
                                int64_t oC) {
  const auto scan = [&](int64_t i, int64_t j, const int64_t n, T* __restrict__ best, int32_t* __restrict__ idx)
                        __attribute__((always_inline)) {
    bool first = true;
    for (int64_t a = p.ys.begin[i]; a < p.ys.begin[i + 1]; ++a) {
      const T hy = p.ys.h[a], ly = p.ys.l[a];
      const int64_t iy = p.ys.first_in[i] + a - p.ys.begin[i];
      for (int64_t b = p.xs.begin[j]; b < p.xs.begin[j + 1]; ++b) {
        const T hx = p.xs.h[b], lx = p.xs.l[b];
        const T w1 = hy * hx, w2 = hy * lx, w3 = ly * hx, w4 = ly * lx;
        const S* __restrict__ p1 = img + p.ys.lo[a] * sH + p.xs.lo[b] * sW;
        const S* __restrict__ p2 = img + p.ys.lo[a] * sH + p.xs.hi[b] * sW;
        const S* __restrict__ p3 = img + p.ys.hi[a] * sH + p.xs.lo[b] * sW;
        const S* __restrict__ p4 = img + p.ys.hi[a] * sH + p.xs.hi[b] * sW;
        const int32_t s = static_cast<int32_t>(iy * p.grid_w + p.xs.first_in[j] + b - p.xs.begin[j]);
        if (first) {
          for (int64_t c = 0; c < n; ++c) {
            best[c] = w1 * static_cast<T>(p1[c]) + w2 * static_cast<T>(p2[c]) + w3 * static_cast<T>(p3[c]) +
                      w4 * static_cast<T>(p4[c]);
            idx[c] = s;
          }
          first = false;
          continue;
        }
        for (int64_t c = 0; c < n; ++c) {
          const T v = w1 * static_cast<T>(p1[c]) + w2 * static_cast<T>(p2[c]) + w3 * static_cast<T>(p3[c]) +
                      w4 * static_cast<T>(p4[c]);
          take_first_max(v, s, best[c], idx[c]);
        }
      }
    }
    const int64_t outside = p.first_outside(i, j);
    if (first) {  // no sample inside the map
      std::fill(best, best + n, T(0));
      std::fill(idx, idx + n, static_cast<int32_t>(outside));
    } else if (outside >= 0) {
      const int32_t o32 = static_cast<int32_t>(outside);
      for (int64_t c = 0; c < n; ++c) {
        const T bc = best[c];
        const bool take = (bc == bc) & ((T(0) > bc) | ((T(0) == bc) & (o32 < idx[c])));
        best[c] = take ? T(0) : bc;
        idx[c] = take ? o32 : idx[c];
      }
    }
  };
  max_bins<kN>(n_, ph, pw, best_, idx_, out, am, oH, oW, oC, scan);
}

// The positions in the tap arrays of sample `a` (the argmax) of bin (i, j); false when it
// lies outside the map or `a` is not a sample index (a direct op call may pass anything).
// inv_gw = 1.0 / grid_w replaces a division per (bin, channel) by a multiplication.
template <typename T>
inline bool argmax_taps(const AlignPlan<T>& p, int64_t i, int64_t j, int64_t a, double inv_gw, int64_t& ty,
                        int64_t& tx) {
  if (a < 0 || p.grid_w <= 0 || a >= p.grid_h * p.grid_w) return false;
  int64_t iy = static_cast<int64_t>((static_cast<double>(a) + 0.5) * inv_gw);
  iy -= iy * p.grid_w > a;  // exact for any practical grid; corrected otherwise
  iy += (iy + 1) * p.grid_w <= a;
  ty = p.ys.find(i, iy);
  tx = p.xs.find(j, a - iy * p.grid_w);
  return ty >= 0 && tx >= 0;
}

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

// ---- gradient with respect to the boxes ---------------------------------------------

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
  m.impl("roi_align", TORCH_BOX(&roiops::roi_align_forward));
  m.impl("_roi_align_backward", TORCH_BOX(&roiops::roi_align_backward));
  m.impl("roi_align_max", TORCH_BOX(&roiops::roi_align_max_forward));
  m.impl("_roi_align_max_backward", TORCH_BOX(&roiops::roi_align_max_backward));
  m.impl("_roi_align_rois_backward", TORCH_BOX(&roiops::roi_align_rois_backward));
  m.impl("_roi_align_max_rois_backward", TORCH_BOX(&roiops::roi_align_max_rois_backward));
}
