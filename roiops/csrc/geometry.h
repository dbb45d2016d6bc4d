// The sampling rules of docs/semantics.md shared by the CPU kernels: one axis's bilinear
// tap with its border rule, sample positions, C's rounding of box corners and RoIPool's
// bin edges, the first-maximum rule. Each is a rule about one sample or bin, independent
// of how a kernel plans its loops, so an op that does not separate into row and column
// plans (rotated boxes) reuses them as they are; the separable plans live in plans.h.
// Expressions keep torchvision's operations and order, so float32 results agree with it
// bit for bit where the formulas are the same.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace roiops {

// Interpolation taps of one sample along one axis: weight h at lo, l at hi.
template <typename T>
struct Tap {
  int64_t lo, hi;
  T l, h;
};

// semantics.md "roi_align avg" border rule along one axis; false for a point with value 0.
template <typename T>
inline bool make_tap(T v, int64_t size, Tap<T>& t) {
  if (!(v >= T(-1) && v <= static_cast<T>(size))) return false;  // NaN too
  if (v <= 0) v = 0;
  int64_t lo = static_cast<int64_t>(v);
  int64_t hi;
  if (lo >= size - 1) {
    hi = lo = size - 1;
    v = static_cast<T>(lo);
  } else {
    hi = lo + 1;
  }
  t.lo = lo;
  t.hi = hi;
  t.l = v - static_cast<T>(lo);
  t.h = T(1) - t.l;
  return true;
}

// Derivative of make_tap's l with respect to the point (h has the opposite): 1 where l
// follows it (inside the map, above 0, before the last cell), 0 where the border rule
// holds it constant or the point is outside (value 0). It jumps at every integer
// coordinate and at the borders (semantics.md "roi_align box gradient").
template <typename T>
inline T tap_slope(T v, int64_t size) {
  return v > 0 && v <= static_cast<T>(size) && static_cast<int64_t>(v) < size - 1 ? T(1) : T(0);
}

// Position of sample s of bin b along one axis (semantics.md "roi_align avg"): bins of
// `bin` cells from `start`, each with `grid` samples at the centres of equal parts.
template <typename T>
inline T sample_position(T start, T bin, int64_t b, int64_t s, int64_t grid) {
  return start + static_cast<T>(b) * bin + (static_cast<T>(s) + T(0.5)) * bin / static_cast<T>(grid);
}

// Derivative of sample_position with respect to `bin` (with respect to `start` it is 1).
template <typename T>
inline T sample_position_slope(int64_t b, int64_t s, int64_t grid) {
  return static_cast<T>(b) + (static_cast<T>(s) + T(0.5)) / static_cast<T>(grid);
}

// C's round(), halves away from zero: Caffe-convention RoIPool snaps box corners with it
// (semantics.md "roi_pool").
template <typename T>
inline int64_t round_half_away(T v) {
  return static_cast<int64_t>(std::round(v));
}

// Cells [lo, hi) of RoIPool bin p along one axis (semantics.md "roi_pool"), for bins of
// `bin` cells from `start`, clipped to [0, size]: floor(p * bin) and ceil((p + 1) * bin).
// Caffe (torchvision) adds the integer start after floor/ceil; mmdetection (continuous)
// adds the real start before.
template <typename T>
inline void pool_bin_edges(T start, T bin, int64_t p, int64_t size, bool continuous, int64_t& lo, int64_t& hi) {
  int64_t a, b;
  if (continuous) {
    a = static_cast<int64_t>(std::floor(static_cast<T>(p) * bin + start));
    b = static_cast<int64_t>(std::ceil(static_cast<T>(p + 1) * bin + start));
  } else {
    const int64_t s = static_cast<int64_t>(start);
    a = static_cast<int64_t>(std::floor(static_cast<T>(p) * bin)) + s;
    b = static_cast<int64_t>(std::ceil(static_cast<T>(p + 1) * bin)) + s;
  }
  lo = std::min(std::max<int64_t>(a, 0), size);
  hi = std::min(std::max<int64_t>(b, 0), size);
}

// The running maximum of docs/semantics.md (strictly greater wins, the first NaN wins) with
// positions: does candidate (v, a) come before (best, idx) in row-major order of the first
// maximum? idx < 0: nothing yet. Vectorised loops use take_first_max.
template <typename T>
inline bool first_max(T v, int64_t a, T best, int64_t idx) {
  if (idx < 0) return true;
  if (std::isnan(v)) return !std::isnan(best) || a < idx;
  return !std::isnan(best) && (v > best || (v == best && a < idx));
}

// first_max for a candidate v at `at` that comes after (best, idx) in row-major order, in
// a loop along channels or columns: branch-free, so that the loop vectorises.
template <typename T, typename I>
inline void take_first_max(T v, I at, T& best, I& idx) {
  const bool take = (v > best) | ((v != v) & (best == best));  // v wins: greater, or the first NaN
  best = take ? v : best;
  idx = take ? at : idx;
}

}  // namespace roiops
