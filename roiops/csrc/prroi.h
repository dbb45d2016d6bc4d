// Precise RoI Pooling's maths (docs/semantics.md "prroi_pool"), from which prroi_pool.cpp
// builds its plans: a bin's window along one axis, the cells whose hat reaches into it,
// and the hat's exact integral over part of the window.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>

namespace roiops {

// Side of one bin: the box side max(p2 - p1, 0) in map cells, divided into `pooled` bins.
template <typename T>
inline T prroi_bin_size(T p1, T p2, T scale, int64_t pooled) {
  return std::max(p2 - p1, T(0)) * scale / static_cast<T>(pooled);
}

// Start of bin b of a side that starts at p1 (image coordinates); the bin ends at start + bin.
template <typename T>
inline T prroi_bin_start(T p1, T scale, T bin, int64_t b) {
  return p1 * scale + static_cast<T>(b) * bin;
}

// Cells [first, last] of a map side of `size` cells whose hat reaches into the window
// [start, start + len] (floor(start) to ceil(start + len), clipped); first > last: none.
template <typename T>
inline std::pair<int64_t, int64_t> prroi_window_cells(T start, T len, int64_t size) {
  const int64_t first = std::max<int64_t>(static_cast<int64_t>(std::floor(start)), 0);
  const int64_t last = std::min<int64_t>(static_cast<int64_t>(std::ceil(start + len)), size - 1);
  return {first, last};
}

// The hat max(0, 1 - |t|): the weight of a cell at distance t from its centre.
template <typename T>
inline T hat(T t) {
  return std::max(T(0), T(1) - std::abs(t));
}

// Integral of the hat over [a, a + len], len >= 0, as the sum over its two linear pieces
// of (length inside the piece) x (hat at the middle of that part). A window inside one
// piece gets its length as len itself, not as a difference of end points, so that the
// average len^-1 * integral of a short window keeps full precision.
template <typename T>
inline T hat_integral(T a, T len) {
  const T b = a + len;
  const T l0 = std::max(len - std::max(T(-1) - a, T(0)) - std::max(b, T(0)), T(0));       // inside [-1, 0]
  const T l1 = std::max(len - std::max(-a, T(0)) - std::max(b - T(1), T(0)), T(0));       // inside [0, 1]
  return l0 * (T(1) + std::max(a, T(-1)) + l0 * T(0.5)) + l1 * (T(1) - std::max(a, T(0)) - l1 * T(0.5));
}

}  // namespace roiops
