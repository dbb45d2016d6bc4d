// Rotated RoIAlign on the CPU (docs/semantics.md, "roi_align_rotated").
//
// A rotated box's samples do not separate into rows and columns, so each box gets a plan
// of its samples that lie on the map: per sample the offsets of its four bilinear
// neighbours and their weights (geometry.h's sample_position and make_tap), grouped by
// bin in row-major sample order. Only candidates are visited: per bin, the sample rows and
// columns whose box coordinate falls within the map's extent seen along the box's axes
// (widened to cover rounding), so the cost follows the covered map, not the box size.
//
// Plans are built once per call, in chunks of boxes whose samples stay within a budget,
// and shared by all channels. Channels are innermost, in vectors of 8 lanes, each lane
// the scalar arithmetic of its channel. Forward: channels_last input is read in place, a
// task per box (all channels); NCHW tasks are (image, block of 16 channels), the block
// first copied into a channels-last tile of the rectangle the image's boxes touch (per
// plane in place when that tile would be too large). Backward tasks own (image, band of
// rows), all channels in place for channels_last, a 16-channel channels-last tile for
// NCHW, and add the image's boxes in increasing index: the same sums for any thread
// count, no atomics.

#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

#include "args.h"
#include "checks.h"
#include "geometry.h"
#include "layout.h"
#include "memory.h"
#include "parallel.h"
#include "rotated.h"
#include "simd.h"
#include "tiles.h"

namespace roiops {
namespace {

template <typename T>
struct RotatedPlan {
  std::vector<int32_t> cell;  // 4 per sample: the neighbours' rows y_lo, y_hi and columns x_lo, x_hi
  std::vector<T> w;           // 4 per sample: w1..w4 (y_lo x_lo, y_lo x_hi, y_hi x_lo, y_hi x_hi)
  std::vector<int64_t> bin;   // ph * pw + 1: bin b's samples are [bin[b], bin[b + 1])
  T count = 1;                // samples per bin, the divisor
  int64_t batch = 0;
  // Rows and columns the samples touch, [y0, y1) x [x0, x1); empty when y0 >= y1.
  int64_t y0 = 0, y1 = 0, x0 = 0, x1 = 0;

  int64_t samples() const { return static_cast<int64_t>(w.size() / 4); }
};

// Candidate sample indices [first, last] of bin b along one box axis: those whose position
// start + b*bin + (s + 0.5)*bin/grid may lie in [lo, hi] (two samples wider than exact).
inline void candidates(double start, double bin, int64_t b, int64_t grid, double lo, double hi, int64_t& first,
                       int64_t& last) {
  const double step = bin / static_cast<double>(grid);
  if (step == 0) {  // every sample of the bin at one place; grid is a fixed sampling ratio
    first = 0;
    last = grid - 1;
    return;
  }
  const double base = start + static_cast<double>(b) * bin;
  const double e0 = (lo - base) / step - 0.5, e1 = (hi - base) / step - 0.5;
  const double g = static_cast<double>(grid);
  first = static_cast<int64_t>(std::floor(std::clamp(std::min(e0, e1), -2.0, g))) - 2;
  last = static_cast<int64_t>(std::ceil(std::clamp(std::max(e0, e1), -1.0, g + 1))) + 2;
  first = std::max<int64_t>(first, 0);
  last = std::min(last, grid - 1);
}

// The plan of one row (batch, cx, cy, w, h, theta) of rois (semantics.md "roi_align_rotated").
template <typename T>
void build_plan(const T* roi, double spatial_scale, int64_t ph, int64_t pw, int64_t sampling_ratio, bool aligned,
                int64_t H, int64_t W, RotatedPlan<T>& p) {
  const T scale = static_cast<T>(spatial_scale);
  const T offset = aligned ? T(0.5) : T(0);
  // Scale first, then shift by the offset.
  const T cx = roi[1] * scale - offset, cy = roi[2] * scale - offset;
  T roi_w = roi[3] * scale, roi_h = roi[4] * scale;
  if (!aligned) {
    roi_w = std::max(roi_w, T(1));
    roi_h = std::max(roi_h, T(1));
  }
  // cos and sin computed in double and rounded once.
  const T cos_t = static_cast<T>(std::cos(static_cast<double>(roi[5])));
  const T sin_t = static_cast<T>(std::sin(static_cast<double>(roi[5])));
  const T bin_h = roi_h / static_cast<T>(ph), bin_w = roi_w / static_cast<T>(pw);
  const int64_t gh = sampling_ratio > 0 ? sampling_ratio : static_cast<int64_t>(std::ceil(roi_h / static_cast<T>(ph)));
  const int64_t gw = sampling_ratio > 0 ? sampling_ratio : static_cast<int64_t>(std::ceil(roi_w / static_cast<T>(pw)));
  p.batch = static_cast<int64_t>(roi[0]);
  p.count = static_cast<T>(std::max<int64_t>(gh * gw, 1));
  p.cell.clear();
  p.w.clear();
  p.bin.assign(static_cast<size_t>(ph * pw + 1), 0);
  p.y0 = p.x0 = INT64_MAX;
  p.y1 = p.x1 = INT64_MIN;
  if (gh > 0 && gw > 0) {
    const T start_h = -roi_h / T(2), start_w = -roi_w / T(2);
    // The map [-1, H] x [-1, W] seen from the centre along the box's axes, plus a margin
    // above the rounding of the coordinate type (2^-20 of the magnitudes involved).
    const double c = cos_t, s = sin_t, dcx = cx, dcy = cy;
    double ylo = INFINITY, yhi = -INFINITY, xlo = INFINITY, xhi = -INFINITY;
    for (const double a : {-1.0 - dcy, static_cast<double>(H) - dcy}) {
      for (const double b : {-1.0 - dcx, static_cast<double>(W) - dcx}) {
        const double along_y = a * c + b * s, along_x = -a * s + b * c;
        ylo = std::min(ylo, along_y), yhi = std::max(yhi, along_y);
        xlo = std::min(xlo, along_x), xhi = std::max(xhi, along_x);
      }
    }
    const double margin = 2.0 + 0x1p-20 * (std::abs(dcx) + std::abs(dcy) + std::abs(static_cast<double>(roi_w)) +
                                           std::abs(static_cast<double>(roi_h)) + static_cast<double>(H + W));
    // Candidate positions along each box axis, once per box: bin i's rows yy[yo[i] ..
    // yo[i + 1]), bin j's columns xx[xo[j] .. xo[j + 1]).
    std::vector<T> yy, xx;
    std::vector<int64_t> yo(static_cast<size_t>(ph + 1), 0), xo(static_cast<size_t>(pw + 1), 0);
    for (int64_t i = 0; i < ph; ++i) {
      int64_t f, l;
      candidates(start_h, bin_h, i, gh, ylo - margin, yhi + margin, f, l);
      for (int64_t iy = f; iy <= l; ++iy) yy.push_back(sample_position(start_h, bin_h, i, iy, gh));
      yo[i + 1] = static_cast<int64_t>(yy.size());
    }
    for (int64_t j = 0; j < pw; ++j) {
      int64_t f, l;
      candidates(start_w, bin_w, j, gw, xlo - margin, xhi + margin, f, l);
      for (int64_t ix = f; ix <= l; ++ix) xx.push_back(sample_position(start_w, bin_w, j, ix, gw));
      xo[j + 1] = static_cast<int64_t>(xx.size());
    }
    const size_t most = 4 * yy.size() * xx.size();  // every candidate of every bin
    p.cell.resize(most);
    p.w.resize(most);
    int32_t* cell = p.cell.data();
    T* wt = p.w.data();
    int64_t n = 0, y0 = INT64_MAX, y1 = INT64_MIN, x0 = INT64_MAX, x1 = INT64_MIN;
    for (int64_t i = 0; i < ph; ++i) {
      for (int64_t j = 0; j < pw; ++j) {
        for (int64_t a = yo[i]; a < yo[i + 1]; ++a) {
          const T yc = yy[a] * cos_t, ys = yy[a] * sin_t;
          for (int64_t b = xo[j]; b < xo[j + 1]; ++b) {
            const T y = yc - xx[b] * sin_t + cy;
            const T x = ys + xx[b] * cos_t + cx;
            Tap<T> ty, tx;
            if (!make_tap(y, H, ty) || !make_tap(x, W, tx)) continue;  // value 0, no gradient
            int32_t* c = cell + 4 * n;
            c[0] = static_cast<int32_t>(ty.lo), c[1] = static_cast<int32_t>(ty.hi);
            c[2] = static_cast<int32_t>(tx.lo), c[3] = static_cast<int32_t>(tx.hi);
            T* w = wt + 4 * n;
            w[0] = ty.h * tx.h, w[1] = ty.h * tx.l, w[2] = ty.l * tx.h, w[3] = ty.l * tx.l;
            y0 = std::min(y0, ty.lo), y1 = std::max(y1, ty.hi + 1);
            x0 = std::min(x0, tx.lo), x1 = std::max(x1, tx.hi + 1);
            ++n;
          }
        }
        p.bin[i * pw + j + 1] = n;
      }
    }
    p.cell.resize(static_cast<size_t>(4 * n));
    p.w.resize(static_cast<size_t>(4 * n));
    p.y0 = y0, p.y1 = y1, p.x0 = x0, p.x1 = x1;
  }
  if (p.samples() == 0) p.y0 = p.y1 = p.x0 = p.x1 = 0;
}

// Where a kernel finds cell (y, x): base + (y - y0) * rs + (x - x0) * cs, its channels at
// unit stride (channels_last input, or a tile) or at stride sC (NCHW planes, read in place).
template <typename S>
struct Cells {
  S* base;
  int64_t rs, cs, y0, x0;
  // The four neighbours of sample s of p. Always inlined: the kernels call it per sample.
  template <typename T>
  __attribute__((always_inline)) inline void taps(const RotatedPlan<T>& p, int64_t s, int64_t (&o)[4]) const {
    const int32_t* c = &p.cell[4 * s];
    const int64_t r0 = (c[0] - y0) * rs, r1 = (c[1] - y0) * rs, c0 = (c[2] - x0) * cs, c1 = (c[3] - x0) * cs;
    o[0] = r0 + c0, o[1] = r0 + c1, o[2] = r1 + c0, o[3] = r1 + c1;
  }
};

// Asks for the cache lines of sample s's four taps (n channels at unit stride each) ahead
// of use: each tap is a run of channels the hardware would only start fetching at its
// first miss, and a rotated box's taps do not follow one another in memory. (Forward only:
// measured no faster, or slower, in the backward, whose taps are written.)
template <typename T, typename S>
__attribute__((always_inline)) inline void prefetch_taps(const RotatedPlan<T>& p, const Cells<S>& m, int64_t s,
                                                         int64_t n) {
  int64_t o[4];
  m.taps(p, s, o);
  for (int k = 0; k < 4; ++k) prefetch_run(m.base + o[k], n);
}

// Vector lanes of channels [c, c + 8) of src as T (converted lane by lane when S is not T).
template <typename T, typename S>
__attribute__((always_inline)) inline lanes8<T> load8_as(const S* src) {
  if constexpr (std::is_same_v<S, T>) {
    return load8(src);
  } else {
    lanes8<T> v;
    for (int l = 0; l < 8; ++l) v[l] = static_cast<T>(src[l]);
    return v;
  }
}

// Samples [s0, s1) of p summed for the one channel whose cells lie at ch + offset (a tap's
// offset in m), in sample order.
template <typename T, typename M, typename S>
inline T channel_sum(const RotatedPlan<T>& p, const Cells<M>& m, const S* ch, int64_t s0, int64_t s1) {
  T sum = 0;
  for (int64_t s = s0; s < s1; ++s) {
    int64_t o[4];
    m.taps(p, s, o);
    const T* w = &p.w[4 * s];
    sum += w[0] * static_cast<T>(ch[o[0]]) + w[1] * static_cast<T>(ch[o[1]]) + w[2] * static_cast<T>(ch[o[2]]) +
           w[3] * static_cast<T>(ch[o[3]]);
  }
  return sum;
}

// Samples [s0, s1) of p summed for channels [c, c + 8 * kV), kV vectors of sums kept in
// registers; out[l * oC] = sum of channel c + l, divided by the count. Each lane computes
// the scalar expression of its channel, so the bits are the scalar loop's.
template <int kV, typename scalar_t, typename S, typename T>
__attribute__((always_inline)) inline void bin_lanes(const RotatedPlan<T>& p, const Cells<const S>& m, int64_t s0,
                                                     int64_t s1, int64_t c, scalar_t* out, int64_t oC) {
  lanes8<T> acc[kV] = {};
  for (int64_t s = s0; s < s1; ++s) {
    int64_t o[4];
    m.taps(p, s, o);
    const T* w = &p.w[4 * s];
    const T w1 = w[0], w2 = w[1], w3 = w[2], w4 = w[3];
    const S *v1 = m.base + o[0] + c, *v2 = m.base + o[1] + c, *v3 = m.base + o[2] + c, *v4 = m.base + o[3] + c;
#pragma GCC unroll 4
    for (int v = 0; v < kV; ++v) {
      acc[v] += w1 * load8_as<T>(v1 + 8 * v) + w2 * load8_as<T>(v2 + 8 * v) + w3 * load8_as<T>(v3 + 8 * v) +
                w4 * load8_as<T>(v4 + 8 * v);
    }
  }
  for (int v = 0; v < kV; ++v) {
    const lanes8<T> r = acc[v] / p.count;
    for (int l = 0; l < 8; ++l) out[(8 * v + l) * oC] = static_cast<scalar_t>(r[l]);
  }
}

// One box, n channels; output channel c at out + c * oC, bin (i, j) at i * oH + j * oW. Per
// sample w1*v1 + w2*v2 + w3*v3 + w4*v4, summed in sample order, divided by the count.
// Channels at unit stride. Up to 32 (NCHW tiles): sums in registers, one pass over a bin's
// samples per 32, 16 or 8 of them. More (channels_last): sums in acc (n), sample by
// sample, each tap one long contiguous run, the next sample's taps prefetched.
template <typename scalar_t, typename S, typename T>
ROIOPS_SIMD void forward_cells(const RotatedPlan<T>& p, const Cells<const S>& m, int64_t n, int64_t ph, int64_t pw,
                               T* __restrict__ acc, scalar_t* out, int64_t oC, int64_t oH, int64_t oW) {
  const int64_t nv = n > 32 ? n / 8 * 8 : 0;  // channels summed in acc by whole vectors
  for (int64_t b = 0; b < ph * pw; ++b) {
    const int64_t s0 = p.bin[b], s1 = p.bin[b + 1];
    scalar_t* o = out + (b / pw) * oH + (b % pw) * oW;
    int64_t c = 0;
    if (nv > 0) {
      for (int64_t e = 0; e < nv; e += 8) store8(acc + e, lanes8<T>{});
      for (int64_t s = s0; s < s1; ++s) {
        if (s + 1 < p.samples()) prefetch_taps(p, m, s + 1, nv);
        int64_t t[4];
        m.taps(p, s, t);
        const T* w = &p.w[4 * s];
        const T w1 = w[0], w2 = w[1], w3 = w[2], w4 = w[3];
        const S *v1 = m.base + t[0], *v2 = m.base + t[1], *v3 = m.base + t[2], *v4 = m.base + t[3];
        for (int64_t e = 0; e < nv; e += 8) {
          store8(acc + e, load8(acc + e) + (w1 * load8_as<T>(v1 + e) + w2 * load8_as<T>(v2 + e) +
                                            w3 * load8_as<T>(v3 + e) + w4 * load8_as<T>(v4 + e)));
        }
      }
      for (int64_t e = 0; e < nv; ++e) o[e * oC] = static_cast<scalar_t>(acc[e] / p.count);
      c = nv;
    } else {
      if (c + 32 <= n) bin_lanes<4>(p, m, s0, s1, c, o + c * oC, oC), c += 32;
      if (c + 16 <= n) bin_lanes<2>(p, m, s0, s1, c, o + c * oC, oC), c += 16;
      if (c + 8 <= n) bin_lanes<1>(p, m, s0, s1, c, o + c * oC, oC), c += 8;
    }
    for (; c < n; ++c) o[c * oC] = static_cast<scalar_t>(channel_sum(p, m, m.base + c, s0, s1) / p.count);
  }
}

// The same on NCHW planes read in place, channel c at m.base + c * sC (the boxes cover too
// much of a large map for a tile).
template <typename scalar_t, typename T>
void forward_planes(const RotatedPlan<T>& p, const Cells<const scalar_t>& m, int64_t sC, int64_t n, int64_t ph,
                    int64_t pw, scalar_t* out, int64_t oC, int64_t oH, int64_t oW) {
  for (int64_t c = 0; c < n; ++c) {
    for (int64_t b = 0; b < ph * pw; ++b) {
      const T sum = channel_sum(p, m, m.base + c * sC, p.bin[b], p.bin[b + 1]);
      out[c * oC + (b / pw) * oH + (b % pw) * oW] = static_cast<scalar_t>(sum / p.count);
    }
  }
}

// Which taps [k0, k1) of sample s of p have their row in the band [r0, r1) (none: k0 == k1).
template <typename T>
__attribute__((always_inline)) inline void taps_in_band(const RotatedPlan<T>& p, int64_t s, int64_t r0, int64_t r1,
                                                        int& k0, int& k1) {
  const int32_t* cell = &p.cell[4 * s];
  const bool lo_in = cell[0] >= r0 && cell[0] < r1, hi_in = cell[1] >= r0 && cell[1] < r1;
  k0 = lo_in ? 0 : 2;
  k1 = hi_in ? 4 : (lo_in ? 2 : 0);
}

// Samples [s0, s1) of p add q * w to channels of their taps in the band: kV > 0, the
// 8 * kV channels from c at unit stride, q held in registers; kV == 0, channels [c, n) at
// stride mC.
template <int kV, typename T>
__attribute__((always_inline)) inline void add_band(const RotatedPlan<T>& p, int64_t s0, int64_t s1,
                                                    const T* __restrict__ q, const Cells<T>& m, int64_t mC, int64_t c,
                                                    int64_t n, int64_t r0, int64_t r1) {
  lanes8<T> qv[kV > 0 ? kV : 1];
  if constexpr (kV > 0) {
    for (int v = 0; v < kV; ++v) qv[v] = load8(q + c + 8 * v);
  }
  for (int64_t s = s0; s < s1; ++s) {
    int k0, k1;
    taps_in_band(p, s, r0, r1, k0, k1);
    if (k0 >= k1) continue;
    int64_t o[4];
    m.taps(p, s, o);
    for (int k = k0; k < k1; ++k) {
      T* __restrict__ dst = m.base + o[k];
      const T wk = p.w[4 * s + k];
      if constexpr (kV > 0) {
#pragma GCC unroll 4
        for (int v = 0; v < kV; ++v) store8(dst + c + 8 * v, load8(dst + c + 8 * v) + qv[v] * wk);
      } else if (mC == 1) {
        for (int64_t e = c; e < n; ++e) dst[e] += q[e] * wk;
      } else {
        for (int64_t e = c; e < n; ++e) dst[e * mC] += q[e] * wk;
      }
    }
  }
}

// Adds box p's gradient for n channels to rows [r0, r1) (a band; m's origin is row r0),
// channel c of bin (i, j) at g + c * gC + i * gH + j * gW: each sample adds
// (grad / count) * w to those of its four neighbours in the band. NCHW grad (gC != 1,
// bins contiguous) is first transposed into q (ph * pw * n; else n suffices). Channel c
// at stride mC in m. Up to 32 channels at unit stride (NCHW tiles) have their grad in
// registers for a pass over a bin's samples; more (channels_last) are better added tap by
// tap, each tap one long contiguous run.
template <typename scalar_t, typename T>
ROIOPS_SIMD void backward_band(const RotatedPlan<T>& p, const scalar_t* g, int64_t gC, int64_t gH, int64_t gW,
                               int64_t n, int64_t ph, int64_t pw, T* __restrict__ q_, const Cells<T>& m, int64_t mC,
                               int64_t r0, int64_t r1) {
  const bool planes = gC != 1;
  int exp;
  const bool pow2 = std::frexp(p.count, &exp) == T(0.5);
  const T inv = T(1) / p.count;
  if (planes) transpose_block<false, false>(g, gC, n, ph * pw, q_, n);
  const auto grad_row = [&](int64_t b) { return g + (b / pw) * gH + (b % pw) * gW; };
  // The first bin from b on with a sample in the band, and that sample in `first` (a box
  // crossing many bands has most of its bins outside each one).
  const auto next_bin = [&](int64_t b, int64_t& first) {
    for (; b < ph * pw; ++b) {
      for (first = p.bin[b]; first < p.bin[b + 1]; ++first) {
        int k0, k1;
        taps_in_band(p, first, r0, r1, k0, k1);
        if (k0 < k1) return b;
      }
    }
    return b;
  };
  int64_t s0 = 0, next_s0 = 0;
  for (int64_t b = next_bin(0, s0), next; b < ph * pw; b = next, s0 = next_s0) {
    next = next_bin(b + 1, next_s0);
    // channels_last: the next bin's grad row is asked for while this one is added.
    if (!planes && next < ph * pw) prefetch_run(grad_row(next), n);
    const int64_t s1 = p.bin[b + 1];
    T* __restrict__ q = planes ? q_ + b * n : q_;
    // grad / count, read where it lies (channels_last) in the same pass; times the exact
    // inverse for a power of two: the same bits, faster.
    const scalar_t* gb = planes ? nullptr : grad_row(b);
    const auto scale = [&](auto f) __attribute__((always_inline)) {
      if (planes) {
        for (int64_t c = 0; c < n; ++c) q[c] = f(q[c]);
      } else {
        for (int64_t c = 0; c < n; ++c) q[c] = f(static_cast<T>(gb[c]));
      }
    };
    if (pow2) {
      scale([&](T v) __attribute__((always_inline)) { return v * inv; });
    } else {
      scale([&](T v) __attribute__((always_inline)) { return v / p.count; });
    }
    int64_t c = 0;
    if (mC == 1 && n <= 32) {
      if (c + 32 <= n) add_band<4>(p, s0, s1, q, m, 1, c, n, r0, r1), c += 32;
      if (c + 16 <= n) add_band<2>(p, s0, s1, q, m, 1, c, n, r0, r1), c += 16;
      if (c + 8 <= n) add_band<1>(p, s0, s1, q, m, 1, c, n, r0, r1), c += 8;
    }
    if (c < n) add_band<0>(p, s0, s1, q, m, mC, c, n, r0, r1);
  }
}

// Rectangle [y0, y1) x [x0, x1) of cb channels of NCHW planes (src at channel c0, rows of
// stride sH) <-> a channels-last tile, cell (y, x) at ((y - y0) * (x1 - x0) + x - x0) * cb:
// per row, a channels x columns matrix transposed.
template <typename S, typename T>
ROIOPS_SIMD void planes_to_rect(const S* src, int64_t sC, int64_t sH, int64_t cb, int64_t y0, int64_t y1, int64_t x0,
                                int64_t x1, T* __restrict__ tile) {
  for (int64_t y = y0; y < y1; ++y)
    transpose_block<false, false>(src + y * sH + x0, sC, cb, x1 - x0, tile + (y - y0) * (x1 - x0) * cb, cb);
}

template <typename T>
ROIOPS_SIMD void rect_to_planes(const T* __restrict__ tile, int64_t cb, int64_t y0, int64_t y1, int64_t x0, int64_t x1,
                                T* dst, int64_t sC, int64_t sH) {
  for (int64_t y = y0; y < y1; ++y)
    transpose_block<false, false>(tile + (y - y0) * (x1 - x0) * cb, cb, x1 - x0, cb, dst + y * sH + x0, sC);
}

// Plans of one call are built in chunks of boxes, in order, until their samples reach this
// budget (about 32 bytes each), so that plan memory is bounded for any number of boxes.
constexpr int64_t kSampleBudget = int64_t(1) << 20;
// Largest channels-last tile of an NCHW channel block a task allocates (bytes).
constexpr int64_t kTileBudget = int64_t(16) << 20;

// Runs f(k0, k1, plans, boxes_of_image) for consecutive chunks of the K boxes: plans[k - k0]
// of box k, and per image the chunk's boxes in increasing index.
template <typename T, typename F>
void for_chunks(const Tensor& rois, int64_t N, double spatial_scale, int64_t ph, int64_t pw,
                int64_t sampling_ratio, bool aligned, int64_t H, int64_t W, const F& f) {
  const int64_t K = rois.size(0);
  const T* r = rois.const_data_ptr<T>();
  std::vector<RotatedPlan<T>> plans;
  std::vector<std::vector<int64_t>> boxes(static_cast<size_t>(N));
  constexpr int64_t kBatch = 256;
  for (int64_t k0 = 0; k0 < K;) {
    int64_t k1 = k0, samples = 0;
    while (k1 < K && (k1 == k0 || samples < kSampleBudget)) {
      const int64_t n = std::min(K - k1, kBatch);
      plans.resize(static_cast<size_t>(k1 - k0 + n));
      parallel_for(0, n, 1, [&](int64_t b0, int64_t b1) {
        for (int64_t b = b0; b < b1; ++b) {
          build_plan(r + 6 * (k1 + b), spatial_scale, ph, pw, sampling_ratio, aligned, H, W, plans[k1 - k0 + b]);
        }
      });
      for (int64_t b = 0; b < n; ++b) samples += plans[k1 - k0 + b].samples();
      k1 += n;
    }
    for (auto& list : boxes) list.clear();
    for (int64_t k = k0; k < k1; ++k) boxes[plans[k - k0].batch].push_back(k);
    f(k0, k1, plans, boxes);
    k0 = k1;
  }
}

// The rectangle the given boxes' samples touch, {y0, y1, x0, x1} (all 0 when none).
template <typename T>
std::array<int64_t, 4> touched(const std::vector<RotatedPlan<T>>& plans, const std::vector<int64_t>& boxes,
                               int64_t k0) {
  std::array<int64_t, 4> r = {INT64_MAX, INT64_MIN, INT64_MAX, INT64_MIN};
  for (const int64_t k : boxes) {
    const RotatedPlan<T>& p = plans[k - k0];
    if (p.y0 >= p.y1) continue;
    r = {std::min(r[0], p.y0), std::max(r[1], p.y1), std::min(r[2], p.x0), std::max(r[3], p.x1)};
  }
  if (r[0] >= r[1]) r = {0, 0, 0, 0};
  return r;
}

}  // namespace

ROIOPS_ENTRY
Tensor roi_align_rotated_forward(const Tensor& input_, const Tensor& rois_, double spatial_scale,
                                 int64_t ph, int64_t pw, int64_t sampling_ratio, bool aligned) {
  check_forward_args(input_, rois_, 6, spatial_scale, ph, pw);
  check_sampling_ratio(sampling_ratio);
  const ForwardArgs a(input_, rois_, spatial_scale);  // angles checked too
  const Tensor &input = a.input, &rois = a.rois;
  const int64_t N = input.size(0), C = input.size(1), H = input.size(2), W = input.size(3);
  const bool channels_last = is_channels_last(input);
  Tensor out = empty_output({rois.size(0), C, ph, pw}, a.out_options);
  ROIOPS_DISPATCH(input.scalar_type(), [&] {
    using T = opmath_type<scalar_t>;
    const scalar_t* in = input.const_data_ptr<scalar_t>();
    scalar_t* o = out.mutable_data_ptr<scalar_t>();
    const int64_t sN = input.stride(0), sC = input.stride(1), sH = input.stride(2), sW = input.stride(3);
    const int64_t oK = out.stride(0), oC = out.stride(1), oH = out.stride(2), oW = out.stride(3);
    // channels_last: tasks of one box, all its channels, read in place (blocks of them only
    // when the boxes are too few to share out). NCHW: tasks of (image, block of 16
    // channels), each running the image's boxes of the chunk on a tile.
    const int64_t block = 16, blocks = (C + block - 1) / block;
    Scratch<T> acc;
    for_chunks<T>(rois, N, spatial_scale, ph, pw, sampling_ratio, aligned, H, W,
                  [&](int64_t k0, int64_t k1, const std::vector<RotatedPlan<T>>& plans,
                      const std::vector<std::vector<int64_t>>& boxes) {
      if (channels_last) {
        const int64_t cb = cl_box_channel_block(k1 - k0, C), parts = std::max<int64_t>(1, (C + cb - 1) / cb);
        parallel_tasks((k1 - k0) * parts, [&](int64_t t) {
          const int64_t k = k0 + t / parts, c0 = (t % parts) * cb, nc = std::min(cb, C - c0);
          const RotatedPlan<T>& p = plans[k - k0];
          const Cells<const scalar_t> m{in + p.batch * sN + c0, sH, sW, 0, 0};
          forward_cells(p, m, nc, ph, pw, acc.get(nc), o + k * oK + c0, oC, oH, oW);
        });
        return;
      }
      parallel_tasks(N * blocks, [&](int64_t t) {
        const int64_t n = t / blocks, c0 = (t % blocks) * block, cb = std::min(C, c0 + block) - c0;
        if (boxes[n].empty()) return;
        const scalar_t* img = in + n * sN + c0 * sC;
        const auto [y0, y1, x0, x1] = touched(plans, boxes[n], k0);
        const int64_t cells = (y1 - y0) * (x1 - x0);
        if (cells * cb * static_cast<int64_t>(sizeof(T)) > kTileBudget) {
          const Cells<const scalar_t> m{img, sH, sW, 0, 0};
          for (const int64_t k : boxes[n])
            forward_planes(plans[k - k0], m, sC, cb, ph, pw, o + k * oK + c0 * oC, oC, oH, oW);
          return;
        }
        // NCHW: the channel block of the rectangle the boxes touch, as a channels-last tile.
        std::vector<T> tile(static_cast<size_t>(cells * cb));
        planes_to_rect(img, sC, sH, cb, y0, y1, x0, x1, tile.data());
        const Cells<const T> m{tile.data(), (x1 - x0) * cb, cb, y0, x0};
        for (const int64_t k : boxes[n])
          forward_cells(plans[k - k0], m, cb, ph, pw, acc.get(cb), o + k * oK + c0 * oC, oC, oH, oW);
      });
    });
  });
  return out;
}

ROIOPS_ENTRY
Tensor roi_align_rotated_backward(const Tensor& grad_, const Tensor& rois_, double spatial_scale,
                                  int64_t ph, int64_t pw, int64_t N, int64_t C, int64_t H, int64_t W,
                                  int64_t sampling_ratio, bool aligned, bool channels_last) {
  check_backward_args(grad_, rois_, 6, N, C, H, W, spatial_scale, ph, pw);
  check_sampling_ratio(sampling_ratio);
  check_grad_shape(grad_, rois_.size(0), C, ph, pw);
  const BackwardArgs a(grad_, rois_, N, spatial_scale, channels_last);  // angles checked too
  const Tensor &grad = a.grad, &rois = a.rois;
  const Options& opts = a.grad_options;
  Tensor gi = empty_output({N, C, H, W}, opts);
  ROIOPS_DISPATCH(grad.scalar_type(), [&] {
    using T = opmath_type<scalar_t>;
    // Sums in T: float16/bfloat16 gradients are rounded once at the end.
    Tensor acc = std::is_same_v<T, scalar_t> ? gi : empty_output({N, C, H, W}, opts.dtype(scalar_type_of<T>));
    T* a = acc.mutable_data_ptr<T>();
    const scalar_t* g = grad.const_data_ptr<scalar_t>();
    const int64_t sN = acc.stride(0), sC = acc.stride(1), sH = acc.stride(2), sW = acc.stride(3);
    const int64_t gK = grad.stride(0), gC = grad.stride(1), gH = grad.stride(2), gW = grad.stride(3);
    // Tasks: (image, band of rows) for channels_last, all channels, summed in place;
    // (image, band, block of 16 channels) for NCHW, summed in a channels-last tile of the
    // band and written to the planes after. A band stays in cache while the image's boxes
    // add to it in increasing index: the same sums for any thread count, no atomics.
    const int64_t cb_max = channels_last ? C : std::min<int64_t>(C, 16);
    const int64_t blocks = cb_max > 0 ? (C + cb_max - 1) / cb_max : 0;
    const int64_t row_bytes = std::max<int64_t>(W * cb_max * static_cast<int64_t>(sizeof(T)), 1);
    const int64_t rows = std::max<int64_t>((channels_last ? kClBandBytes : kBandBytes) / row_bytes, 1);
    const int64_t bands = (H + rows - 1) / rows;
    if (rois.size(0) == 0 || blocks == 0) fill_zero(acc);
    for_chunks<T>(rois, N, spatial_scale, ph, pw, sampling_ratio, aligned, H, W,
                  [&](int64_t k0, int64_t, const std::vector<RotatedPlan<T>>& plans,
                      const std::vector<std::vector<int64_t>>& boxes) {
      parallel_tasks(N * bands * blocks, [&](int64_t t) {
        const int64_t n = t / (bands * blocks), r0 = (t / blocks % bands) * rows, r1 = std::min(H, r0 + rows);
        const int64_t c0 = (t % blocks) * cb_max, cb = std::min(C, c0 + cb_max) - c0;
        // NCHW grad (channels ph * pw apart) is transposed into q whole; else q holds one bin.
        std::vector<T> q(static_cast<size_t>((gC != 1 ? ph * pw : 1) * cb));
        T* img = a + n * sN + c0 * sC;
        std::vector<T> tile;
        Cells<T> m{img + r0 * sH, sH, sW, r0, 0};
        // In place: channels_last, and NCHW rows too long for a tile (then channel stride sC).
        const bool in_place = channels_last || W * cb * static_cast<int64_t>(sizeof(T)) > kTileBudget;
        if (in_place) {
          if (k0 == 0) {
            for (int64_t c = 0; c < (channels_last ? 1 : cb); ++c)
              for (int64_t y = r0; y < r1; ++y) std::fill_n(img + c * sC + y * sH, channels_last ? W * sW : W, T(0));
          }
        } else {
          tile.assign(static_cast<size_t>((r1 - r0) * W * cb), T(0));
          if (k0 > 0) planes_to_rect(img, sC, sH, cb, r0, r1, 0, W, tile.data());
          m = Cells<T>{tile.data(), W * cb, cb, r0, 0};
        }
        for (const int64_t k : boxes[n]) {
          const RotatedPlan<T>& p = plans[k - k0];
          if (p.y1 <= r0 || p.y0 >= r1) continue;
          backward_band(p, g + k * gK + c0 * gC, gC, gH, gW, cb, ph, pw, q.data(), m, in_place ? sC : 1, r0, r1);
        }
        if (!in_place) rect_to_planes(tile.data(), cb, r0, r1, 0, W, img, sC, sH);
      });
    });
    if (!std::is_same_v<T, scalar_t>) copy_into(gi, acc);
  });
  return gi;
}

}  // namespace roiops

// The CPU kernels (the schemas are defined from the ops' declarations: setup.py).
STABLE_TORCH_LIBRARY_IMPL(roiops, CPU, m) {
  m.impl("roi_align_rotated", TORCH_BOX(&roiops::roi_align_rotated_forward));
  m.impl("_roi_align_rotated_backward", TORCH_BOX(&roiops::roi_align_rotated_backward));
}
