// Polygon masks cropped to a box, as detectron2's PolygonMasks.crop_and_resize makes them
// (rasterize_polygons_within_box): every polygon of an instance shifted to the box corner
// and scaled onto an M x M grid, rasterised by pycocotools' rule (maskApi.c rleFrPoly) and
// the results united (mask_util.merge). Bit-for-bit equal to detectron2 under NumPy 2 with
// pycocotools on x86-64; roiops/reference/_polygons.py is the same rule in NumPy and states
// it in words.
//
// pycocotools' rule, on the scaled coordinates:
//  - vertices go to a lattice of 1/5 pixel: (int)(5 v + 0.5), C's truncation toward zero;
//  - each edge is walked one lattice step at a time along its longer axis, the other
//    coordinate (int)(start + slope * t + 0.5); the walk runs in vertex order and through
//    every edge of the closed outline, the last edge ending on the first vertex;
//  - two consecutive walk points with u (x) values on either side of a column centre
//    5c + 2.5 (pycocotools' test: the smaller u, or the later u - 1 when u grows, is 5c + 2)
//    mark column c at row ceil((v - 2) / 5) of the upper point (smaller v), clamped to
//    [0, M];
//  - the marks, as column-major indices c * M + row, toggle the mask: a pixel is inside when
//    an odd number of marks lie at or before it (pycocotools sorts them into RLE runs; equal
//    indices cancel in pairs). The parity runs through the whole grid, row M of column c
//    being row 0 of column c + 1; a closed outline crosses each column centre line an even
//    number of times, so nothing carries over, unless the walk skips a lattice column
//    (rounding along a near-diagonal y-major edge of some 1e5 pixels): kept as it is.
//
// Unlike pycocotools, nothing here grows with the walk: a walk point matters only in a pair
// that straddles a column centre, so each edge is visited at its crossings of the M column
// centres only (found directly along an x-major edge, by bisection along a y-major one,
// whose x is monotone). Memory is the M * M parity buffer; time per edge is O(M log L)
// for an edge of L lattice steps. The walk itself is never shortened, so the crossings
// (and their rows, however far outside the box) are pycocotools' exactly.
//
// Beyond pycocotools' domain: its lattice coordinates and edge lengths are C ints, so a
// scaled coordinate or edge past about 4e8 pixels overflows (undefined; on x86 the
// conversion gives INT_MIN, then the lengths overflow and the walk allocates gigabytes or
// crashes; it stores 16 bytes per lattice step even before that). Here lattice
// coordinates are 64-bit and clamped to +-2^40 (NaN to -2^40, the end x86 sends it to):
// where pycocotools is defined the clamp never applies, and past it the result is the
// same rule, 64-bit, on the clamped vertex.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace roiops {
namespace polygon_raster {

// pycocotools' walk is exact only with IEEE double evaluation (no x87 excess precision).
static_assert(sizeof(std::double_t) == sizeof(double), "polygon_raster needs FLT_EVAL_METHOD 0 or 1");

// Lattice coordinates are clamped here (see above); 2^40 keeps step counts and lattice
// values exact in double, and every sum far from int64 overflow.
constexpr int64_t kLatticeLimit = int64_t(1) << 40;
// C's (int) of NaN on x86 (the minor coordinate of a zero-length edge, whose slope is
// 0 / 0): the most negative value, whose row clamps to 0.
constexpr int64_t kNaNWalk = -(int64_t(1) << 62);

// C's (int)z, truncation toward zero, for a walk value (|z| < 2^42 unless NaN).
inline int64_t trunc_walk(double z) {
  if (!(z >= -0x1p62)) return kNaNWalk;
  return static_cast<int64_t>(std::min(z, 0x1p62));
}

// (int)(base + slope * t + .5) with C's three roundings: the product goes through a
// volatile so that no build (-ffp-contract=fast, -march with FMA) fuses it into the sum,
// which would round once and could move a tie.
inline int64_t walk_coord(double base, double slope, int64_t t) {
  volatile double product = slope * static_cast<double>(t);
  return trunc_walk(base + product + 0.5);
}

// A scaled coordinate on the 1/5-pixel lattice: (int)(5 * v + .5), unfused like walk_coord,
// then clamped to +-kLatticeLimit (NaN to the negative end).
inline int64_t lattice(double v) {
  volatile double scaled = 5.0 * v;
  const double z = scaled + 0.5;
  const double limit = static_cast<double>(kLatticeLimit);
  if (!(z >= -limit)) return -kLatticeLimit;
  if (z > limit) return kLatticeLimit;
  return static_cast<int64_t>(z);
}

// detectron2's shift and scale: p[0::2] = (p[0::2] - box[0]) * ratio_w, likewise y, in
// float64 (NumPy promotes the float32 box values and ratios exactly).
struct BoxMap {
  double x0, y0, sx, sy;
};

// mask_size / max(side, 0.1). Python's max keeps the float32 side unless 0.1 > side (NumPy 2
// compares in float32; it picks the same sides as a float64 comparison would, NaN kept).
// NumPy 2 divides a Python int by a float32 scalar in float32; Python divides by 0.1 in
// double. (NumPy 1.x divided in float64: M / double(side).)
struct Ratio {
  double value;
  bool is_float32;
};

inline Ratio box_ratio(float side, int64_t mask_size) {
  if (side < 0.1f) return {static_cast<double>(mask_size) / 0.1, false};
  return {static_cast<double>(static_cast<float>(mask_size) / side), true};
}

inline BoxMap box_map(const float box[4], int64_t mask_size) {
  const float w = box[2] - box[0];  // float32 scalars subtract in float32
  const float h = box[3] - box[1];
  const Ratio rw = box_ratio(w, mask_size), rh = box_ratio(h, mask_size);
  // ratio_h == ratio_w: NumPy 2 compares a Python float with a float32 scalar in float32
  // (NumPy 1.x in float64; as M / 0.1 is exactly 10 M for M < 2^20, that matters only
  // beyond). Equal ratios scale both axes by ratio_h.
  bool same;
  if (rw.is_float32 == rh.is_float32) {
    same = rw.value == rh.value;
  } else {
    same = static_cast<float>(rw.value) == static_cast<float>(rh.value);
  }
  return {static_cast<double>(box[0]), static_cast<double>(box[1]), same ? rh.value : rw.value, rh.value};
}

// One edge's walk as rleFrPoly sets it up: the endpoints swapped ("flip") so that the
// major coordinate grows, steps t = 0..n along it.
struct Edge {
  int64_t xs, ys, n;
  double slope;  // minor coordinate per step; NaN for a zero-length edge (0 / 0 in C)
  bool steep;    // y-major: dx < dy
  bool flip;

  Edge(int64_t x0, int64_t y0, int64_t x1, int64_t y1) {
    const int64_t dx = x1 > x0 ? x1 - x0 : x0 - x1;
    const int64_t dy = y1 > y0 ? y1 - y0 : y0 - y1;
    steep = dx < dy;
    flip = steep ? y0 > y1 : x0 > x1;
    if (flip) {
      const int64_t tx = x0, ty = y0;
      x0 = x1;
      y0 = y1;
      x1 = tx;
      y1 = ty;
    }
    xs = x0;
    ys = y0;
    n = steep ? dy : dx;
    if (steep) {
      slope = static_cast<double>(x1 - x0) / static_cast<double>(dy);
    } else {
      slope = dx == 0 ? std::nan("") : static_cast<double>(y1 - y0) / static_cast<double>(dx);
    }
  }

  // Walk point d in vertex order (d = 0 at the edge's first vertex): the flipped walk runs
  // t = n - d.
  int64_t u(int64_t d) const {
    const int64_t t = flip ? n - d : d;
    return steep ? walk_coord(static_cast<double>(xs), slope, t) : xs + t;
  }
  int64_t v(int64_t d) const {
    const int64_t t = flip ? n - d : d;
    return steep ? ys + t : walk_coord(static_cast<double>(ys), slope, t);
  }
};

// ceil(a / 5) for any int64 a > -2^63 + 5.
inline int64_t ceil_div5(int64_t a) { return a >= 0 ? (a + 4) / 5 : -((-a) / 5); }

// The mark of consecutive walk points (ua, va) -> (ub, vb), pycocotools' test: -1 for none
// (same u, or no pixel centre of the grid between them), else its column-major index in
// [0, M * M]; M * M lies past the last pixel and toggles nothing.
inline int64_t mark(int64_t ua, int64_t va, int64_t ub, int64_t vb, int64_t M) {
  if (ua == ub) return -1;
  const int64_t xd = ub < ua ? ub : ub - 1;
  if (xd < 2 || (xd - 2) % 5 != 0) return -1;
  const int64_t c = (xd - 2) / 5;
  if (c > M - 1) return -1;
  const int64_t row = std::min<int64_t>(std::max<int64_t>(ceil_div5(std::min(va, vb) - 2), 0), M);
  return c * M + row;
}

inline int64_t floor_div5(int64_t a) { return a >= 0 ? a / 5 : -((-a + 4) / 5); }

// Calls toggle(index) for every mark of the pairs (d - 1, d), d = 1..n, inside one edge.
// Only a pair with u values {X, X + 1}, X = 5c + 2, can mark; along the monotone u of the
// walk each X has one candidate pair. A y-major edge of at most linear_limit steps is
// walked point by point instead (cheaper than bisection when short; same pairs).
template <typename Toggle>
void edge_marks(const Edge& e, int64_t M, int64_t linear_limit, Toggle&& toggle) {
  if (e.n == 0) return;
  if (e.steep && e.n <= linear_limit) {
    int64_t ua = e.u(0), va = e.v(0);
    for (int64_t d = 1; d <= e.n; ++d) {
      const int64_t ub = e.u(d), vb = e.v(d);
      const int64_t k = mark(ua, va, ub, vb, M);
      if (k >= 0) toggle(k);
      ua = ub;
      va = vb;
    }
    return;
  }
  const int64_t u_first = e.u(0), u_last = e.u(e.n);
  if (u_first == u_last) return;  // u is monotone: constant, no pair changes it
  const bool rising = u_last > u_first;
  const int64_t lo = std::min(u_first, u_last), hi = std::max(u_first, u_last);
  // Candidates X = 5c + 2 in [lo, hi - 1], c in [0, M - 1].
  const int64_t c_first = std::max<int64_t>(ceil_div5(lo - 2), 0);
  const int64_t c_last = std::min<int64_t>(floor_div5(hi - 3), M - 1);
  for (int64_t c = c_first; c <= c_last; ++c) {
    const int64_t X = 5 * c + 2;
    // The candidate pair ends at the first point past X: u >= X + 1 rising, u <= X
    // falling (mark() then checks that it lands on X + 1, resp. X). As u(0) lies on the
    // near side of X, that point is never the first one.
    int64_t d;
    if (!e.steep) {
      d = rising ? X + 1 - u_first : u_first - X;  // x-major: u moves one step per point
    } else {
      int64_t a = 0, b = e.n;  // the predicate holds at b = n
      while (a < b) {
        const int64_t mid = a + (b - a) / 2;
        const int64_t um = e.u(mid);
        if (rising ? um >= X + 1 : um <= X) {
          b = mid;
        } else {
          a = mid + 1;
        }
      }
      d = a;
    }
    const int64_t k = mark(e.u(d - 1), e.v(d - 1), e.u(d), e.v(d), M);
    if (k >= 0) toggle(k);
  }
}

// Steps up to which a y-major edge is walked point by point (O(n)); longer ones are
// bisected (O(M log n)).
inline int64_t default_linear_limit(int64_t M) { return 20 * (M + 2); }

// The implementation, with the steep-edge walk limit as a parameter (tests force 0 to
// check the bisection path against pycocotools).
inline void rasterize_impl(const double* xy, const int64_t* vertex_offsets, int64_t n_polygons, const float box[4],
                           int64_t M, uint8_t* out, std::vector<uint8_t>& scratch, int64_t linear_limit) {
  if (M <= 0) return;
  const int64_t area = M * M;
  std::fill(out, out + area, uint8_t(0));
  if (n_polygons <= 0) return;
  const BoxMap map = box_map(box, M);
  scratch.resize(static_cast<size_t>(area));
  uint8_t* parity = scratch.data();
  auto toggle = [&](int64_t k) {
    if (k < area) parity[k] ^= 1;
  };
  for (int64_t p = 0; p < n_polygons; ++p) {
    const int64_t begin = vertex_offsets[p], count = vertex_offsets[p + 1] - begin;
    if (count <= 0) continue;
    const double* pts = xy + 2 * begin;
    auto vertex_x = [&](int64_t j) { return lattice((pts[2 * j] - map.x0) * map.sx); };
    auto vertex_y = [&](int64_t j) { return lattice((pts[2 * j + 1] - map.y0) * map.sy); };
    std::fill(parity, parity + area, uint8_t(0));
    int64_t x0 = vertex_x(0), y0 = vertex_y(0);
    const int64_t x_start = x0, y_start = y0;
    int64_t u_prev = 0, v_prev = 0;  // last walk point of the previous edge
    for (int64_t j = 0; j < count; ++j) {
      const bool closing = j + 1 == count;
      const int64_t x1 = closing ? x_start : vertex_x(j + 1), y1 = closing ? y_start : vertex_y(j + 1);
      const Edge e(x0, y0, x1, y1);
      // The walk continues from the previous edge's last point to this edge's first one
      // (the same vertex, but recomputed: they can differ where coordinates are negative).
      if (j > 0) {
        const int64_t k = mark(u_prev, v_prev, e.u(0), e.v(0), M);
        if (k >= 0) toggle(k);
      }
      edge_marks(e, M, linear_limit, toggle);
      u_prev = e.u(e.n);
      v_prev = e.v(e.n);
      x0 = x1;
      y0 = y1;
    }
    // Column-major parity of the marks, united into the row-major output.
    uint8_t inside = 0;
    for (int64_t c = 0; c < M; ++c) {
      for (int64_t r = 0; r < M; ++r) {
        inside ^= parity[c * M + r];
        out[r * M + c] |= inside;
      }
    }
  }
}

}  // namespace polygon_raster

// The mask of one instance: out[y * M + x] (row-major, 0/1) is 1 where any of its polygons
// covers pixel (x, y) of the M x M grid over `box` (x0, y0, x1, y1), by detectron2's
// rasterize_polygons_within_box (the rule above). Polygon i has the vertices (x, y) at
// xy[2 * vertex_offsets[i] .. 2 * vertex_offsets[i + 1]); detectron2 has at least 3, fewer
// are taken as pycocotools takes them (a polygon without vertices adds nothing). No
// polygons: all 0. M <= 2^24 (M is converted to float32 as NumPy does) and M * M bytes
// fit in memory; scratch is resized to M * M, reuse it across calls.
inline void rasterize_polygons_in_box(const double* xy, const int64_t* vertex_offsets, int64_t n_polygons,
                                      const float box[4], int64_t M, uint8_t* out, std::vector<uint8_t>& scratch) {
  polygon_raster::rasterize_impl(xy, vertex_offsets, n_polygons, box, M, out, scratch,
                                 polygon_raster::default_linear_limit(M));
}

}  // namespace roiops
