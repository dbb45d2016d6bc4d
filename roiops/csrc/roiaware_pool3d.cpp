// RoIAwarePool3d on the CPU (docs/semantics.md, "roiaware_pool3d"): the features of the
// points inside each LiDAR box, pooled (max or average) over an out_x * out_y * out_z
// voxel grid of the box, each voxel keeping its first max_points points in point order.
//
// Forward tasks own boxes. A box's inside points are found in increasing index (lidar.h),
// each counted into its voxel while the voxel has room; a stable counting sort then gives
// every voxel its points in order, and the box's [V, C] block is written once, voxel by
// voxel (empty voxels as runs of zeros).
// Backward, deterministic without atomics: each grad_features element adds its terms in
// increasing box order and is written once. Max: one pass over the saved argmax checks
// every index and lists the voxels that hold a point; tasks own blocks of channels and add
// the listed rows. Average: tasks own runs of points and find the points' voxels again from
// the geometry; a point p of voxel (k, v) was kept iff p <= last[k, v].

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <tuple>
#include <type_traits>
#include <vector>

#include "args.h"
#include "checks.h"
#include "lidar.h"
#include "memory.h"
#include "parallel.h"
#include "simd.h"

namespace roiops {
namespace {

// The accumulation type of a feature dtype: float for float16, bfloat16 and float32.
template <typename S>
using acc_t = opmath_type<S>;

struct AwareShape {
  int64_t ox, oy, oz, V, C;
};

// One box's output block: out [V, C], saved [V, C] (max) or [V, 2] (count, last kept point).
// ints: scratch of 2 V + 3 N + C; acc: scratch of C.
template <typename T, typename S>
ROIOPS_SIMD void forward_box(const LidarBox<T>& b, const PointRun<T>& run, const S* __restrict__ feat,
                             const AwareShape& g, int64_t max_points, bool max_mode, int32_t* ints,
                             acc_t<S>* __restrict__ acc, S* __restrict__ out, int32_t* __restrict__ saved) {
  using A = acc_t<S>;
  const int64_t V = g.V, C = g.C, N = run.n;
  int32_t* __restrict__ count = ints;         // kept points per voxel
  int32_t* __restrict__ end = count + V;      // counting sort: each voxel's end in `order`
  int32_t* __restrict__ kept_p = end + V;     // kept points in increasing index ...
  int32_t* __restrict__ kept_v = kept_p + N;  // ... and their voxels
  int32_t* __restrict__ order = kept_v + N;   // kept points grouped by voxel, in index order
  int32_t* __restrict__ idx = order + N;      // max mode: a voxel's argmax row
  std::fill(count, count + V, 0);
  const VoxelGrid<T> grid(b, g.ox, g.oy, g.oz);
  int64_t n = 0;
  for_each_inside(b, run, [&](int64_t p) {
    T lx, ly;
    b.contains(run.x[p], run.y[p], run.z[p], lx, ly);
    const int64_t v = grid.voxel(b, lx, ly, run.z[p]);
    if (count[v] < max_points) {
      ++count[v];
      kept_p[n] = static_cast<int32_t>(p);
      kept_v[n] = static_cast<int32_t>(v);
      ++n;
    }
    return true;
  });
  int32_t at = 0;
  for (int64_t v = 0; v < V; ++v) end[v] = at += count[v];
  for (int64_t i = n; i-- > 0;) order[--end[kept_v[i]]] = kept_p[i];  // now end[v] is the voxel's start
  const int64_t saved_row = max_mode ? C : 2;
  for (int64_t v = 0; v < V;) {
    if (count[v] == 0) {  // a run of empty voxels: 0, argmax -1 / (0, -1)
      int64_t e = v + 1;
      while (e < V && count[e] == 0) ++e;
      if (C > 0) std::memset(out + v * C, 0, static_cast<size_t>((e - v) * C) * sizeof(S));
      if (max_mode) {
        if (C > 0) std::memset(saved + v * C, 0xff, static_cast<size_t>((e - v) * C) * sizeof(int32_t));
      } else {
        for (int64_t u = v; u < e; ++u) {
          saved[2 * u] = 0;
          saved[2 * u + 1] = -1;
        }
      }
      v = e;
      continue;
    }
    const int32_t* pts = order + end[v];
    const int32_t m = count[v];
    // The points' feature rows lie anywhere: those of the points 8 ahead are prefetched.
    constexpr int64_t kLine = 64 / static_cast<int64_t>(sizeof(S));
    for (int64_t ahead = end[v] + 8; ahead < std::min<int64_t>(n, end[v] + m + 8); ++ahead)
      for (int64_t c = 0; c < C; c += kLine) __builtin_prefetch(feat + order[ahead] * C + c);
    S* __restrict__ o = out + v * C;
    int32_t* __restrict__ sv = saved + v * saved_row;
    if (max_mode) {
      // Strictly greater from -inf: the first of equal maxima, never NaN, never -inf.
      for (int64_t c = 0; c < C; ++c) {
        acc[c] = -std::numeric_limits<A>::infinity();
        idx[c] = -1;
      }
      for (int32_t i = 0; i < m; ++i) {
        const int32_t p = pts[i];
        const S* __restrict__ f = feat + p * C;
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) {
          const A x = static_cast<A>(f[c]);
          const bool t = x > acc[c];
          acc[c] = t ? x : acc[c];
          idx[c] = t ? p : idx[c];
        }
      }
      for (int64_t c = 0; c < C; ++c) {
        o[c] = idx[c] < 0 ? S(0) : static_cast<S>(acc[c]);
        sv[c] = idx[c];
      }
    } else {
      for (int64_t c = 0; c < C; ++c) acc[c] = A(0);
      for (int32_t i = 0; i < m; ++i) {
        const S* __restrict__ f = feat + static_cast<int64_t>(pts[i]) * C;
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) acc[c] += static_cast<A>(f[c]);
      }
      const A den = static_cast<A>(m);
      for (int64_t c = 0; c < C; ++c) o[c] = static_cast<S>(acc[c] / den);
      sv[0] = m;
      sv[1] = pts[m - 1];
    }
    ++v;
  }
}

template <typename T, typename S>
void forward_impl(const Tensor& points, const Tensor& features, const Tensor& boxes, const AwareShape& g,
                  int64_t max_points, bool max_mode, Tensor& out, Tensor& saved) {
  const int64_t K = boxes.size(0), N = points.size(0), V = g.V, C = g.C;
  const PointColumns<T> cols(points.const_data_ptr<T>(), N);
  const auto box = lidar_boxes(boxes.const_data_ptr<T>(), K);
  const S* feat = features.const_data_ptr<S>();
  S* o = out.mutable_data_ptr<S>();
  int32_t* sv = saved.mutable_data_ptr<int32_t>();
  const int64_t saved_row = max_mode ? C : 2;
  Scratch<int32_t> ints;
  Scratch<acc_t<S>> acc;
  parallel_tasks(K, [&](int64_t k) {
    forward_box<T, S>(box[k], PointRun<T>(cols, 0, N), feat, g, max_points, max_mode, ints.get(2 * V + 3 * N + C),
                      acc.get(std::max<int64_t>(C, 1)), o + k * V * C, sv + k * V * saved_row);
  });
}

// ---- Backward, max: grad_features[argmax, c] += grad for argmax != -1.

// Whether each row of argmax [rows, C] holds a point (an index other than -1), as a byte per
// row; returns the first row holding an index outside [-1, N), or -1. The one full read of
// argmax: every row is checked, and the rows of empty voxels, most of them, are never read
// again.
ROIOPS_SIMD int64_t occupied_rows(const int32_t* __restrict__ argmax, int64_t r0, int64_t r1, int64_t C, int64_t N,
                                  uint8_t* __restrict__ occupied) {
  const uint32_t limit = static_cast<uint32_t>(N);
  for (int64_t r = r0; r < r1; ++r) {
    const int32_t* __restrict__ a = argmax + r * C;
    uint32_t used = 0, bad = 0;
#pragma omp simd reduction(| : used, bad)
    for (int64_t c = 0; c < C; ++c) {
      used |= static_cast<uint32_t>(a[c] != -1);
      bad |= static_cast<uint32_t>(static_cast<uint32_t>(a[c]) + 1u > limit);  // a < -1 or a >= N
    }
    if (bad) return r;
    occupied[r] = static_cast<uint8_t>(used);
  }
  return -1;
}

// Channels [c0, c0 + cb) of the listed rows of grad and argmax ([rows, C]) into out [N, C],
// rows in increasing order. The sums are kept in out itself when it has the accumulation
// type, else in acc [N, cb].
template <typename S>
ROIOPS_SIMD void max_backward_block(const S* __restrict__ grad, const int32_t* __restrict__ argmax,
                                    const int64_t* rows, int64_t n_rows, int64_t C, int64_t c0, int64_t cb,
                                    int64_t N, acc_t<S>* __restrict__ acc, S* __restrict__ out) {
  using A = acc_t<S>;
  constexpr bool in_place = std::is_same_v<A, S>;
  A* __restrict__ sums = in_place ? reinterpret_cast<A*>(out) + c0 : acc;
  const int64_t stride = in_place ? C : cb;
  for (int64_t p = 0; p < N; ++p) std::fill(sums + p * stride, sums + p * stride + cb, A(0));
  constexpr int64_t kAhead = 8;  // rows prefetched ahead: the listed rows are scattered in memory
  for (int64_t i = 0; i < n_rows; ++i) {
    if (i + kAhead < n_rows) {
      const int64_t r = rows[i + kAhead] * C + c0;
      for (int64_t c = 0; c < cb; c += 64 / static_cast<int64_t>(sizeof(int32_t))) __builtin_prefetch(argmax + r + c);
      for (int64_t c = 0; c < cb; c += 64 / static_cast<int64_t>(sizeof(S))) __builtin_prefetch(grad + r + c);
    }
    const int32_t* __restrict__ a = argmax + rows[i] * C + c0;
    const S* __restrict__ g = grad + rows[i] * C + c0;
    for (int64_t c = 0; c < cb; ++c)
      if (a[c] >= 0) sums[static_cast<int64_t>(a[c]) * stride + c] += static_cast<A>(g[c]);
  }
  if constexpr (!in_place) {
    for (int64_t p = 0; p < N; ++p)
      for (int64_t c = 0; c < cb; ++c) out[p * C + c0 + c] = static_cast<S>(acc[p * cb + c]);
  }
}

template <typename S>
void max_backward_impl(const Tensor& grad, const Tensor& argmax, int64_t N, Tensor& out) {
  const int64_t K = grad.size(0), C = grad.size(4), V = grad.numel() / (K * C);
  const S* g = grad.const_data_ptr<S>();
  const int32_t* a = argmax.const_data_ptr<int32_t>();
  std::vector<uint8_t> occupied(static_cast<size_t>(K * V));
  std::vector<int64_t> bad(static_cast<size_t>(K), -1);
  parallel_for(0, K, 1, [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) bad[k] = occupied_rows(a, k * V, (k + 1) * V, C, N, occupied.data());
  });
  for (const int64_t r : bad) {
    if (r < 0) continue;
    for (int64_t c = 0; c < C; ++c) {
      const int32_t v = a[r * C + c];
      ROIOPS_CHECK(v >= -1 && v < N, "roiops: saved holds point index ", v, " at [", r / V, ", ", r % V, ", ", c,
                   "] of its [K, voxels, C] rows, not in [-1, ", N, ")");
    }
  }
  std::vector<int64_t> rows;
  for (int64_t r = 0; r < K * V; ++r)
    if (occupied[r]) rows.push_back(r);
  // Blocks of channels, enough tasks for the threads, a multiple of a cache line's elements
  // (fewer lines that two tasks write): each sums its channels over the listed rows in
  // increasing box order.
  constexpr int64_t kLine = 64 / static_cast<int64_t>(sizeof(S));
  const int64_t want = 2 * num_threads();
  const int64_t cb = std::min(C, std::max<int64_t>(kLine, ((C + want - 1) / want + kLine - 1) / kLine * kLine));
  S* o = out.mutable_data_ptr<S>();
  Scratch<acc_t<S>> scratch;
  parallel_tasks((C + cb - 1) / cb, [&](int64_t t) {
    const int64_t c0 = t * cb, n = std::min(cb, C - c0);
    acc_t<S>* acc = std::is_same_v<acc_t<S>, S> ? nullptr : scratch.get(N * n);
    max_backward_block<S>(g, a, rows.data(), static_cast<int64_t>(rows.size()), C, c0, n, N, acc, o);
  });
}

// ---- Backward, average: grad_features[p, c] += grad[k, v, c] / count for every kept p.

constexpr int64_t kAvgRun = 256;       // points per average-backward task (acc: kAvgRun x C)
constexpr int64_t kAvgPending = 1024;  // (point, voxel) pairs found before their rows are read

// Adds the found pairs' terms, in the order found. Their rows of saved and grad lie anywhere
// in memory: each is prefetched a few pairs ahead.
template <typename S>
inline void avg_add_pairs(const int32_t* __restrict__ at, const int64_t* __restrict__ rows, int64_t n, int64_t p0,
                          int64_t C, const S* __restrict__ grad, const int32_t* __restrict__ saved,
                          acc_t<S>* __restrict__ acc) {
  using A = acc_t<S>;
  constexpr int64_t kAhead = 6, kLine = 64 / static_cast<int64_t>(sizeof(S));
  for (int64_t h = 0; h < n; ++h) {
    if (h + kAhead < n) {
      const int64_t e = rows[h + kAhead];
      __builtin_prefetch(saved + 2 * e);
      for (int64_t c = 0; c < C; c += kLine) __builtin_prefetch(grad + e * C + c);
    }
    const int64_t e = rows[h], i = at[h];
    if (p0 + i > saved[2 * e + 1]) continue;  // past the voxel's cap
    const A r = A(1) / static_cast<A>(std::max<int32_t>(saved[2 * e], 1));
    const S* __restrict__ g = grad + e * C;
    A* __restrict__ a = acc + i * C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) a[c] += static_cast<A>(g[c]) * r;
  }
}

// The points [p0, p0 + run.n): every box's inside points found in increasing box order, so
// that each point's terms are added in increasing k; acc: scratch of run.n * C.
template <typename T, typename S>
ROIOPS_SIMD void avg_backward_run(const LidarBox<T>* boxes, const VoxelGrid<T>* grids, int64_t K, int64_t V,
                                  int64_t C, const PointRun<T>& run, int64_t p0, const S* __restrict__ grad,
                                  const int32_t* __restrict__ saved, acc_t<S>* __restrict__ acc,
                                  S* __restrict__ out) {
  using A = acc_t<S>;
  std::fill(acc, acc + run.n * C, A(0));
  int32_t at[kAvgPending];
  int64_t rows[kAvgPending];
  int64_t n = 0;
  for (int64_t k = 0; k < K; ++k) {
    const LidarBox<T>& b = boxes[k];
    for_each_inside(b, run, [&](int64_t i) {
      T lx, ly;
      b.contains(run.x[i], run.y[i], run.z[i], lx, ly);
      at[n] = static_cast<int32_t>(i);
      rows[n] = k * V + grids[k].voxel(b, lx, ly, run.z[i]);
      if (++n == kAvgPending) {
        avg_add_pairs<S>(at, rows, n, p0, C, grad, saved, acc);
        n = 0;
      }
      return true;
    });
  }
  avg_add_pairs<S>(at, rows, n, p0, C, grad, saved, acc);
  for (int64_t i = 0; i < run.n * C; ++i) out[i] = static_cast<S>(acc[i]);
}

template <typename T, typename S>
void avg_backward_impl(const Tensor& grad, const Tensor& saved, const Tensor& points, const Tensor& boxes,
                       Tensor& out) {
  const int64_t K = grad.size(0), V = grad.size(1) * grad.size(2) * grad.size(3), C = grad.size(4);
  const int64_t N = points.size(0);
  const PointColumns<T> cols(points.const_data_ptr<T>(), N);
  const auto box = lidar_boxes(boxes.const_data_ptr<T>(), K);
  std::vector<VoxelGrid<T>> grids(static_cast<size_t>(K));
  for (int64_t k = 0; k < K; ++k) grids[k] = VoxelGrid<T>(box[k], grad.size(1), grad.size(2), grad.size(3));
  const S* g = grad.const_data_ptr<S>();
  const int32_t* sv = saved.const_data_ptr<int32_t>();
  S* o = out.mutable_data_ptr<S>();
  // Runs short enough that every thread gets a few.
  const int64_t len = std::clamp<int64_t>((N + 4 * num_threads() - 1) / (4 * num_threads()), 16, kAvgRun);
  const int64_t runs = (N + len - 1) / len;
  Scratch<acc_t<S>> scratch;
  parallel_tasks(runs, [&](int64_t t) {
    const int64_t p0 = t * len, n = std::min(len, N - p0);
    avg_backward_run<T, S>(box.get(), grids.data(), K, V, C, PointRun<T>(cols, p0, n), p0, g, sv,
                           scratch.get(n * C), o + p0 * C);
  });
}

void check_backward(const Tensor& grad, const Tensor& saved, const Tensor& points, const Tensor& boxes,
                    int64_t num_points, bool max_mode) {
  check_scene(points, boxes, false);
  check_lidar_tensor("grad", grad, "[K, out_x, out_y, out_z, C]", 5, -1, &points);
  ROIOPS_CHECK(grad.size(0) == boxes.size(0), "roiops: grad must have one row per box (", boxes.size(0), "), got ",
               shape_name(grad));
  bool ok = saved.dim() == 5 && saved.scalar_type() == kInt && same_device(saved, grad);
  for (int64_t d = 0; ok && d < 5; ++d) ok = saved.size(d) == (d == 4 && !max_mode ? 2 : grad.size(d));
  if (!ok) {
    const std::string want = "[" + std::to_string(grad.size(0)) + ", " + std::to_string(grad.size(1)) + ", " +
                             std::to_string(grad.size(2)) + ", " + std::to_string(grad.size(3)) + ", " +
                             std::to_string(max_mode ? grad.size(4) : 2) + "]";
    ROIOPS_CHECK(false, "roiops: saved must be int32 ", want, " on ", device_name(grad), ", got ",
                 dtype_name(saved.scalar_type()), " ", shape_name(saved), " on ", device_name(saved));
  }
  ROIOPS_CHECK(num_points == points.size(0), "roiops: num_points must be the points' count ", points.size(0),
               ", got ", num_points);
}

}  // namespace

ROIOPS_ENTRY
std::tuple<Tensor, Tensor> roiaware_pool3d_forward(const Tensor& points_, const Tensor& features_,
                                                   const Tensor& boxes_, int64_t out_x, int64_t out_y, int64_t out_z,
                                                   int64_t max_points, bool max_mode) {
  check_scene(points_, boxes_, false);
  check_point_features(features_, points_, false);
  check_count("out_x", out_x, kMaxVoxelSide);
  check_count("out_y", out_y, kMaxVoxelSide);
  check_count("out_z", out_z, kMaxVoxelSide);
  check_count("max_points", max_points);
  check_cpu(points_);
  const int64_t K = boxes_.size(0), C = features_.size(1);
  const AwareShape g{out_x, out_y, out_z, out_x * out_y * out_z, C};
  Tensor out = empty_output({K, out_x, out_y, out_z, C}, Options{features_.scalar_type()});
  Tensor saved = empty_output({K, out_x, out_y, out_z, max_mode ? C : 2}, Options{kInt});
  if (K == 0) return {out, saved};
  const Tensor points = lidar_coords(points_), boxes = lidar_coords(boxes_), features = in_format(features_);
  ROIOPS_DISPATCH_COORDS(points.scalar_type(), [&] {
    ROIOPS_DISPATCH(features.scalar_type(), [&] {
      forward_impl<coord_t, scalar_t>(points, features, boxes, g, max_points, max_mode, out, saved);
    });
  });
  return {out, saved};
}

ROIOPS_ENTRY
Tensor roiaware_pool3d_backward(const Tensor& grad_, const Tensor& saved_, const Tensor& points_, const Tensor& boxes_,
                                int64_t num_points, bool max_mode) {
  check_backward(grad_, saved_, points_, boxes_, num_points, max_mode);
  check_cpu(points_);
  const int64_t N = num_points, C = grad_.size(4);
  Tensor out = empty_output({N, C}, Options{grad_.scalar_type()});
  if (N == 0 || C == 0) return out;
  if (grad_.numel() == 0) {  // no boxes
    fill_zero(out);
    return out;
  }
  const Tensor grad = in_format(grad_), saved = in_format(saved_);
  if (max_mode) {
    ROIOPS_DISPATCH(grad.scalar_type(), [&] { max_backward_impl<scalar_t>(grad, saved, N, out); });
    return out;
  }
  const Tensor points = lidar_coords(points_), boxes = lidar_coords(boxes_);
  ROIOPS_DISPATCH_COORDS(points.scalar_type(), [&] {
    ROIOPS_DISPATCH(grad.scalar_type(), [&] { avg_backward_impl<coord_t, scalar_t>(grad, saved, points, boxes, out); });
  });
  return out;
}

}  // namespace roiops

STABLE_TORCH_LIBRARY_FRAGMENT(roiops, m) {
  m.def("roiaware_pool3d(Tensor points, Tensor features, Tensor boxes, int out_x, int out_y, int out_z, "
        "int max_points, bool max_mode) -> (Tensor, Tensor)");
  m.def("_roiaware_pool3d_backward(Tensor grad, Tensor saved, Tensor points, Tensor boxes, int num_points, "
        "bool max_mode) -> Tensor");
}

STABLE_TORCH_LIBRARY_IMPL(roiops, CPU, m) {
  m.impl("roiaware_pool3d", TORCH_BOX(&roiops::roiaware_pool3d_forward));
  m.impl("_roiaware_pool3d_backward", TORCH_BOX(&roiops::roiaware_pool3d_backward));
}
