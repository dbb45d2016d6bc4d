// LiDAR box geometry of the point-cloud ops (docs/semantics.md, "Point clouds"): a box's
// constants, hoisted once per box; the inside test and the voxel of a point, each rounding
// step of the definition one operation in T (float for float16/bfloat16/float32 coordinates,
// double for float64); the points as columns so that the inside test vectorises over
// points; and the argument checks the three kernel files share (_kernel_checks.py's, in
// its order and words).
//
// Compiled with -ffp-contract=off: `a * b + c * d` rounds both products and the sum, as
// the definition does; an FMA would move points across a face.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>

#include "torch_api.h"

namespace roiops {

constexpr int64_t kMaxVoxelSide = 1024;                                  // _geometry.MAX_VOXEL_SIDE
constexpr int64_t kMaxPointIndex = std::numeric_limits<int32_t>::max();  // point indices are int32

// A box row (x, y, z, dx, dy, dz, yaw), (x, y, z) the centre of its bottom face, with the
// constants of its inside test and voxel grid.
template <typename T>
struct LidarBox {
  T x, y, z, dx, dy, dz;
  T zc;          // centre height: the sum in double, rounded once to T
  T hx, hy, hz;  // half sizes (exact)
  T c, s, ns;    // cos(-yaw), sin(-yaw) rounded from double; -s

  LidarBox() = default;
  explicit LidarBox(const T* r)
      : x(r[0]),
        y(r[1]),
        z(r[2]),
        dx(r[3]),
        dy(r[4]),
        dz(r[5]),
        zc(static_cast<T>(static_cast<double>(r[2]) + static_cast<double>(r[5]) / 2)),
        hx(r[3] / T(2)),
        hy(r[4] / T(2)),
        hz(r[5] / T(2)),
        c(static_cast<T>(std::cos(-static_cast<double>(r[6])))),
        s(static_cast<T>(std::sin(-static_cast<double>(r[6])))),
        ns(-s) {}

  // Whether (px, py, pz) is inside, and its coordinates (lx, ly) in the box's frame. Inclusive
  // on the z faces, strict on the others. A NaN height difference passes the z test (only
  // `|pz - zc| > hz` rejects), a NaN lx or ly fails. |lx| < hx is -hx < lx < hx for every
  // lx and hx, NaN, infinities, signed zeros and negative sizes included, with fewer
  // registers. Branch-free: it vectorises.
  inline bool contains(T px, T py, T pz, T& lx, T& ly) const {
    const T sx = px - x, sy = py - y;
    lx = sx * c + sy * ns;
    ly = sx * s + sy * c;
    return !(std::abs(pz - zc) > hz) & (std::abs(lx) < hx) & (std::abs(ly) < hy);
  }
};

// A voxel coordinate: trunc(q) clamped to [0, n - 1] before any conversion to an integer, so
// that NaN (-> 0), infinities and huge quotients never reach one. Compared in double, where
// trunc of a float is exact and n - 1 is representable.
template <typename T>
inline int64_t voxel_cell(T q, int64_t n) {
  const double t = std::trunc(static_cast<double>(q));
  if (!(t > 0)) return 0;
  return t >= static_cast<double>(n - 1) ? n - 1 : static_cast<int64_t>(t);
}

// A box's voxel grid of ox * oy * oz cells, numbered (ix * oy + iy) * oz + iz.
template <typename T>
struct VoxelGrid {
  int64_t ox, oy, oz;
  T rx, ry, rz;  // cell sizes

  VoxelGrid() = default;
  VoxelGrid(const LidarBox<T>& b, int64_t ox_, int64_t oy_, int64_t oz_)
      : ox(ox_),
        oy(oy_),
        oz(oz_),
        rx(b.dx / static_cast<T>(ox_)),
        ry(b.dy / static_cast<T>(oy_)),
        rz(b.dz / static_cast<T>(oz_)) {}

  // The voxel of an inside point from its frame coordinates (contains) and height.
  inline int64_t voxel(const LidarBox<T>& b, T lx, T ly, T pz) const {
    const int64_t ix = voxel_cell((lx + b.hx) / rx, ox);
    const int64_t iy = voxel_cell((ly + b.hy) / ry, oy);
    const int64_t iz = voxel_cell((pz - b.z) / rz, oz);
    return (ix * oy + iy) * oz + iz;
  }
};

// Points [n, 3] as three columns: the inside test then reads whole vectors of points.
template <typename T>
struct PointColumns {
  std::unique_ptr<T[]> data;
  const T *x = nullptr, *y = nullptr, *z = nullptr;

  PointColumns(const T* rows, int64_t n) : data(new T[static_cast<size_t>(3 * std::max<int64_t>(n, 1))]) {
    T* xs = data.get();
    T* ys = xs + n;
    T* zs = ys + n;
    for (int64_t i = 0; i < n; ++i) {
      xs[i] = rows[3 * i];
      ys[i] = rows[3 * i + 1];
      zs[i] = rows[3 * i + 2];
    }
    x = xs;
    y = ys;
    z = zs;
  }
};

// Points of one box's test: a run of the columns.
template <typename T>
struct PointRun {
  const T *x, *y, *z;
  int64_t n;

  PointRun(const PointColumns<T>& c, int64_t begin, int64_t count)
      : x(c.x + begin), y(c.y + begin), z(c.z + begin), n(count) {}
};

constexpr int64_t kFlagBlock = 256;  // points per vectorised inside test

// flags[i] = whether point i of the run is inside b, for n <= kFlagBlock points; the bytes up to
// the next multiple of 8 are zeroed (for_each_inside reads them 8 at a time). Always inlined,
// so that it is compiled for the instruction set of its caller's version (ROIOPS_SIMD).
template <typename T>
__attribute__((always_inline)) inline void inside_flags(const LidarBox<T>& box, const T* __restrict__ x, const T* __restrict__ y,
                         const T* __restrict__ z, int64_t n, uint8_t* __restrict__ flags) {
  const LidarBox<T> b = box;
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    T lx, ly;
    flags[i] = static_cast<uint8_t>(b.contains(x[i], y[i], z[i], lx, ly));
  }
  for (int64_t i = n; i < ((n + 7) & ~int64_t(7)); ++i) flags[i] = 0;
}

// Calls f(p) for the points p of the run inside b, in increasing p (the run's index), until f
// returns false. Most points of a scene lie outside a box: the flags are tested 8 at a time.
template <typename T, typename F>
__attribute__((always_inline)) inline void for_each_inside(const LidarBox<T>& b, const PointRun<T>& run, F&& f) {
  alignas(64) uint8_t flags[kFlagBlock];
  for (int64_t p0 = 0; p0 < run.n; p0 += kFlagBlock) {
    const int64_t m = std::min(kFlagBlock, run.n - p0);
    inside_flags(b, run.x + p0, run.y + p0, run.z + p0, m, flags);
    for (int64_t w = 0; w < m; w += 8) {
      uint64_t word;
      std::memcpy(&word, flags + w, 8);
      while (word != 0) {
        const int64_t p = p0 + w + (__builtin_ctzll(word) >> 3);
        word &= word - 1;
        if (!f(p)) return;
      }
    }
  }
}

// The boxes of a call, each once: rows [count, 7] in T.
template <typename T>
std::unique_ptr<LidarBox<T>[]> lidar_boxes(const T* rows, int64_t count) {
  std::unique_ptr<LidarBox<T>[]> out(new LidarBox<T>[static_cast<size_t>(std::max<int64_t>(count, 1))]);
  for (int64_t k = 0; k < count; ++k) out[k] = LidarBox<T>(rows + 7 * k);
  return out;
}

// Coordinates (points, boxes) contiguous in their compute type: float32 for float16,
// bfloat16 and float32, float64 for float64 (the 16-bit values upcast exactly).
inline Tensor lidar_coords(const Tensor& t) { return in_format(to_dtype(t, t.scalar_type() == kDouble ? kDouble : kFloat)); }

#define ROIOPS_DISPATCH_COORDS(dtype, ...)                                   \
  do {                                                                       \
    if ((dtype) == ::roiops::kDouble) {                                      \
      using coord_t = double;                                                \
      __VA_ARGS__();                                                         \
    } else {                                                                 \
      using coord_t = float;                                                 \
      __VA_ARGS__();                                                         \
    }                                                                        \
  } while (0)

// ---- Argument checks: _kernel_checks.py's point-cloud checks, in its order and words.

// A tensor of `dims` dimensions whose last size is `last` (-1: any), of a kernel dtype, on
// like's device (like: the points).
inline void check_lidar_tensor(const char* name, const Tensor& t, const char* shape, int64_t dims, int64_t last,
                               const Tensor* like = nullptr) {
  ROIOPS_CHECK(t.dim() == dims && (last < 0 || t.size(dims - 1) == last), "roiops: ", name, " must be ", shape,
               ", got ", shape_name(t));
  ROIOPS_CHECK(kernel_dtype(t.scalar_type()), "roiops: ", name, " must be float16, bfloat16, float32 or float64, got ",
               dtype_name(t.scalar_type()));
  if (like != nullptr)
    ROIOPS_CHECK(same_device(t, *like), "roiops: ", name, " is on ", device_name(t), " but points is on ",
                 device_name(*like));
}

// points [B, N, 3] and boxes [B, M, 7] (batched), or [N, 3] and [K, 7].
inline void check_scene(const Tensor& points, const Tensor& boxes, bool batched) {
  check_lidar_tensor("points", points, batched ? "[B, N, 3]" : "[N, 3]", batched ? 3 : 2, 3);
  check_lidar_tensor("boxes", boxes, batched ? "[B, M, 7]" : "[K, 7]", batched ? 3 : 2, 7, &points);
  ROIOPS_CHECK(boxes.scalar_type() == points.scalar_type(), "roiops: boxes must have the points' dtype ",
               dtype_name(points.scalar_type()), ", got ", dtype_name(boxes.scalar_type()));
  if (batched)
    ROIOPS_CHECK(boxes.size(0) == points.size(0), "roiops: boxes has batch size ", boxes.size(0),
                 " but points has ", points.size(0));
  const int64_t n = points.size(points.dim() - 2);
  ROIOPS_CHECK(n <= kMaxPointIndex, "roiops: at most 2^31 - 1 points, got ", n);
}

// features [B, N, C] (or [N, C]) of the points; of their dtype when same_dtype.
inline void check_point_features(const Tensor& features, const Tensor& points, bool same_dtype) {
  const char* shape = points.dim() == 3 ? "[B, N, C]" : "[N, C]";
  check_lidar_tensor("features", features, shape, points.dim(), -1, &points);
  std::string lead = "[";
  bool same = true;
  for (int64_t d = 0; d + 1 < points.dim(); ++d) {
    lead += (d ? ", " : "") + std::to_string(points.size(d));
    same &= features.size(d) == points.size(d);
  }
  ROIOPS_CHECK(same, "roiops: features must be ", shape, " with the points' leading sizes ", lead, "], got ",
               shape_name(features));
  if (same_dtype)
    ROIOPS_CHECK(features.scalar_type() == points.scalar_type(), "roiops: features must have the points' dtype ",
                 dtype_name(points.scalar_type()), ", got ", dtype_name(features.scalar_type()));
}

inline void check_count(const char* name, int64_t value, int64_t high = kMaxPointIndex) {
  ROIOPS_CHECK(value >= 1 && value <= high, "roiops: ", name, " must be in [1, ", high, "], got ", value);
}

}  // namespace roiops
