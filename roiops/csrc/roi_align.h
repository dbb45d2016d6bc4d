// RoIAlign's plans and its forward kernels of one box, "avg" and "max" modes
// (docs/semantics.md, "roi_align avg" and "roi_align max"). roi_align.cpp's forward runs
// them; roi_align_box_grad.cpp's box gradient builds the same plans and finds max mode's
// winners with the same kernels; mask_targets.cpp runs the "avg" plane kernel on masks.
// Included by those files only, and internal to each (an unnamed namespace), as the rest
// of an op's kernels are.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "bounds.h"
#include "geometry.h"
#include "memory.h"
#include "plans.h"
#include "simd.h"
#include "torch_api.h"

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

// Sample rows of an NCHW plane at the box's inside sample columns. A sample row reads two
// map rows, each at the columns' lo and hi taps; those are gathered with scalar loads into
// one of two slots, then the samples are evaluated (a vector loop). Consecutive sample rows
// share map rows (one's hi row is the next one's lo row, and both when the box is finer
// than the map), so a map row is gathered once per run of sample rows that read it.
// scratch: 4 * (inside sample columns).
template <typename scalar_t, typename T>
class SampleRows {
 public:
  SampleRows(const AlignPlan<T>& p, const scalar_t* plane, int64_t W, T* scratch)
      : p_(p), plane_(plane), W_(W), nx_(static_cast<int64_t>(p.xs.lo.size())), taps_{scratch, scratch + 2 * nx_} {}

  // v[s] <- sample row a's value at inside sample column s. Inlined, as the gathers and the
  // vector loop then compile for the calling kernel's instruction set (ROIOPS_SIMD).
  __attribute__((always_inline)) void eval(int64_t a, T* v) {
    const int64_t lo = p_.ys.lo[a], hi = p_.ys.hi[a];
    const int a_slot = slot(lo, hi);
    const int b_slot = slot(hi, lo);
    const T* a_taps = taps_[a_slot];
    const T* b_taps = taps_[b_slot];
    sample_row(v, p_.ys.h[a], p_.ys.l[a], p_.xs.h.data(), p_.xs.l.data(), a_taps, a_taps + nx_, b_taps,
               b_taps + nx_, nx_);
  }

 private:
  // The slot holding map row r, gathering it into the slot that does not hold row `keep`.
  __attribute__((always_inline)) int slot(int64_t r, int64_t keep) {
    if (rows_[0] == r) return 0;
    if (rows_[1] == r) return 1;
    const int s = rows_[0] == keep ? 1 : 0;
    rows_[s] = r;
    const scalar_t* row = plane_ + r * W_;
    const int32_t* xlo = p_.xs.lo.data();
    const int32_t* xhi = p_.xs.hi.data();
    T* lo = taps_[s];
    T* hi = lo + nx_;
    for (int64_t c = 0; c < nx_; ++c) {
      lo[c] = static_cast<T>(row[xlo[c]]);
      hi[c] = static_cast<T>(row[xhi[c]]);
    }
    return s;
  }

  const AlignPlan<T>& p_;
  const scalar_t* plane_;
  int64_t W_, nx_;
  T* taps_[2];  // per slot: nx lo taps, then nx hi taps
  int64_t rows_[2] = {-1, -1};
};

// NCHW, one channel plane (rows contiguous, row stride W): a bin row's samples are
// evaluated a sample row at a time, then each bin adds its samples of that row.
// scratch: 5 * (inside sample columns) + pw.
// The output may be of another type than the plane (mask targets read bool and uint8 masks).
template <typename scalar_t, typename T, typename O>
ROIOPS_SIMD void avg_forward_plane(const AlignPlan<T>& p, const scalar_t* plane, int64_t W, int64_t ph, int64_t pw,
                                   T* scratch, O* out, int64_t oH, int64_t oW) {
  const int64_t nx = static_cast<int64_t>(p.xs.lo.size());
  T* v = scratch + 4 * nx;
  T* sums = v + nx;
  SampleRows<scalar_t, T> rows(p, plane, W, scratch);
  for (int64_t i = 0; i < ph; ++i) {
    std::fill(sums, sums + pw, T(0));
    for (int64_t a = p.ys.begin[i]; nx > 0 && a < p.ys.begin[i + 1]; ++a) {
      rows.eval(a, v);
      for (int64_t j = 0; j < pw; ++j) {
        T s = sums[j];
        for (int64_t b = p.xs.begin[j]; b < p.xs.begin[j + 1]; ++b) s += v[b];
        sums[j] = s;
      }
    }
    for (int64_t j = 0; j < pw; ++j) out[i * oH + j * oW] = static_cast<O>(sums[j] / p.count);
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
  SampleRows<scalar_t, T> rows(p, plane, W, scratch);
  for (int64_t i = 0; i < ph; ++i) {
    const bool any = nx > 0 && p.ys.begin[i] < p.ys.begin[i + 1];
    for (int64_t a = p.ys.begin[i]; any && a < p.ys.begin[i + 1]; ++a) {
      const T iy = static_cast<T>(a - p.ys.begin[i]);
      const bool first = a == p.ys.begin[i];
      rows.eval(a, first ? best : v);
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

}  // namespace
}  // namespace roiops
