// RoIPointPool3d on the CPU (docs/semantics.md, "roipoint_pool3d"): for each LiDAR box, its
// first num_samples inside points in index order, repeated cyclically when fewer are
// inside, as rows (x, y, z, features) with their indices; a box with no point is empty.
//
// Forward tasks own boxes: the inside test stops at the box's num_samples-th point.
// Backward tasks own runs of points: the samples are sorted by run (stably), and each task
// adds its samples' rows of grad into its points' sums in increasing (m, j); every gradient
// element is written once, no atomics.

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <vector>

#include "args.h"
#include "checks.h"
#include "lidar.h"
#include "memory.h"
#include "parallel.h"
#include "simd.h"

namespace roiops {
namespace {

// Box (b, m): its rows [samples, 3 + C] of `pooled` and their indices. list: scratch of
// min(samples, N).
template <typename T, typename S>
ROIOPS_SIMD void forward_box(const LidarBox<T>& box, const PointRun<T>& run, const S* __restrict__ xyz,
                             const S* __restrict__ feat, int64_t C, int64_t samples, int32_t* __restrict__ list,
                             S* __restrict__ pooled, int32_t* __restrict__ index, bool* empty) {
  int64_t n = 0;
  for_each_inside(box, run, [&](int64_t p) {
    list[n++] = static_cast<int32_t>(p);
    return n < samples;
  });
  const int64_t row = 3 + C;
  *empty = n == 0;
  if (n == 0) {
    std::memset(pooled, 0, static_cast<size_t>(samples * row) * sizeof(S));
    std::fill(index, index + samples, -1);
    return;
  }
  for (int64_t j = 0, i = 0; j < samples; ++j, i = i + 1 == n ? 0 : i + 1) {
    const int64_t p = list[i];
    S* __restrict__ o = pooled + j * row;
    o[0] = xyz[3 * p];
    o[1] = xyz[3 * p + 1];
    o[2] = xyz[3 * p + 2];
    if (C > 0) std::memcpy(o + 3, feat + p * C, static_cast<size_t>(C) * sizeof(S));
    index[j] = static_cast<int32_t>(p);
  }
}

template <typename T, typename S>
void forward_impl(const Tensor& coords, const Tensor& points, const Tensor& features, const Tensor& boxes,
                  int64_t samples, Tensor& pooled, Tensor& empty, Tensor& index) {
  const int64_t B = points.size(0), N = points.size(1), M = boxes.size(1), C = features.size(2);
  const PointColumns<T> cols(coords.const_data_ptr<T>(), B * N);
  const auto box = lidar_boxes(boxes.const_data_ptr<T>(), B * M);
  const S* xyz = points.const_data_ptr<S>();
  const S* feat = features.const_data_ptr<S>();
  S* out = pooled.mutable_data_ptr<S>();
  bool* e = empty.mutable_data_ptr<bool>();
  int32_t* idx = index.mutable_data_ptr<int32_t>();
  Scratch<int32_t> scratch;
  const int64_t list = std::max<int64_t>(std::min(samples, N), 1);
  parallel_tasks(B * M, [&](int64_t t) {
    const int64_t b = t / M;
    forward_box<T, S>(box[t], PointRun<T>(cols, b * N, N), xyz + b * N * 3, feat + b * N * C, C, samples,
                      scratch.get(list), out + t * samples * (3 + C), idx + t * samples, e + t);
  });
}

// ---- Backward

// One task's points [q0, q0 + n) of the B * N: its samples' rows of grad ([B * M * S, row]),
// listed in increasing order (rows[i], at point q0 + at[i]), added into acc [n, row], then
// written to the gradients.
template <typename S>
ROIOPS_SIMD void backward_points(const S* __restrict__ grad, int64_t row, const int64_t* __restrict__ rows,
                                 const int32_t* __restrict__ at, int64_t count, int64_t q0, int64_t n,
                                 opmath_type<S>* __restrict__ acc, S* __restrict__ gp, S* __restrict__ gf) {
  using A = opmath_type<S>;
  const int64_t C = row - 3;
  // The rows are a sparse, increasing subset of grad, which the hardware does not prefetch.
  constexpr int64_t kAhead = 4, kLine = 64 / static_cast<int64_t>(sizeof(S));
  std::fill(acc, acc + n * row, A(0));
  for (int64_t i = 0; i < std::min(count, kAhead); ++i)
    for (int64_t c = 0; c < row; c += kLine) __builtin_prefetch(grad + rows[i] * row + c);
  for (int64_t i = 0; i < count; ++i) {
    if (i + kAhead < count)
      for (int64_t c = 0; c < row; c += kLine) __builtin_prefetch(grad + rows[i + kAhead] * row + c);
    const S* __restrict__ g = grad + rows[i] * row;
    A* __restrict__ a = acc + static_cast<int64_t>(at[i]) * row;
#pragma omp simd
    for (int64_t c = 0; c < row; ++c) a[c] += static_cast<A>(g[c]);
  }
  for (int64_t q = 0; q < n; ++q) {
    const A* __restrict__ a = acc + q * row;
    for (int64_t c = 0; c < 3; ++c) gp[3 * (q0 + q) + c] = static_cast<S>(a[c]);
    for (int64_t c = 0; c < C; ++c) gf[C * (q0 + q) + c] = static_cast<S>(a[3 + c]);
  }
}

template <typename S>
void backward_impl(const Tensor& grad, const Tensor& index, int64_t N, Tensor& grad_points, Tensor& grad_features) {
  using A = opmath_type<S>;
  const int64_t B = grad.size(0), S_ = grad.size(2), per_scene = grad.size(1) * S_, row = grad.size(3);
  const int64_t E = B * per_scene, total = B * N;
  const int32_t* idx = index.const_data_ptr<int32_t>();
  for (int64_t e = 0; e < E; ++e) {
    const int32_t p = idx[e];
    if (p >= -1 && p < N) continue;
    ROIOPS_CHECK(false, "roiops: index holds point index ", p, " at [", e / per_scene, ", ", e % per_scene / S_, ", ",
                 e % S_, "], not in [-1, ", N, ")");
  }
  // Tasks own runs of points whose sums fit in a core's cache, and are enough for the
  // threads; a run's length is a power of two (a shift finds a point's run). The samples
  // are sorted by run (stable: each run's in increasing (m, j)).
  const int64_t fit = std::max<int64_t>(16, (int64_t(512) << 10) / (row * static_cast<int64_t>(sizeof(A))));
  const int64_t want = std::max(4 * num_threads(), (total + fit - 1) / fit);
  int shift = 0;
  while ((int64_t(1) << shift) * want < total) ++shift;
  const int64_t len = int64_t(1) << shift, runs = (total + len - 1) / len;
  std::vector<int64_t> start(static_cast<size_t>(runs + 1), 0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t e = b * per_scene; e < (b + 1) * per_scene; ++e)
      if (idx[e] >= 0) ++start[((b * N + idx[e]) >> shift) + 1];
  for (int64_t t = 0; t < runs; ++t) start[t + 1] += start[t];
  std::vector<int64_t> rows(static_cast<size_t>(std::max<int64_t>(start[runs], 1)));
  std::vector<int32_t> at(rows.size());
  {
    std::vector<int64_t> next(start.begin(), start.end() - 1);
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t e = b * per_scene; e < (b + 1) * per_scene; ++e) {
        if (idx[e] < 0) continue;
        const int64_t q = b * N + idx[e], t = q >> shift;
        rows[next[t]] = e;
        at[next[t]++] = static_cast<int32_t>(q - (t << shift));
      }
    }
  }
  const S* g = grad.const_data_ptr<S>();
  S* gp = grad_points.mutable_data_ptr<S>();
  S* gf = grad_features.mutable_data_ptr<S>();
  Scratch<A> scratch;
  parallel_tasks(runs, [&](int64_t t) {
    const int64_t q0 = t * len, n = std::min(len, total - q0);
    backward_points<S>(g, row, rows.data() + start[t], at.data() + start[t], start[t + 1] - start[t], q0, n,
                       scratch.get(n * row), gp, gf);
  });
}

}  // namespace

ROIOPS_ENTRY
std::tuple<Tensor, Tensor, Tensor> roipoint_pool3d_forward(const Tensor& points_, const Tensor& features_,
                                                           const Tensor& boxes_, int64_t num_samples) {
  check_scene(points_, boxes_, true);
  check_point_features(features_, points_, true);
  check_count("num_samples", num_samples);
  check_cpu(points_);
  const int64_t B = points_.size(0), M = boxes_.size(1), C = features_.size(2);
  const ScalarType s = points_.scalar_type();
  Tensor pooled = empty_output({B, M, num_samples, 3 + C}, Options{s});
  Tensor empty_flags = empty({B, M}, Options{ScalarType::Bool});
  Tensor index = empty_output({B, M, num_samples}, Options{kInt});
  if (B * M == 0) return {pooled, empty_flags, index};
  const Tensor coords = lidar_coords(points_), boxes = lidar_coords(boxes_);
  const Tensor points = in_format(points_), features = in_format(features_);
  ROIOPS_DISPATCH_COORDS(coords.scalar_type(), [&] {
    ROIOPS_DISPATCH(s, [&] {
      forward_impl<coord_t, scalar_t>(coords, points, features, boxes, num_samples, pooled, empty_flags, index);
    });
  });
  return {pooled, empty_flags, index};
}

ROIOPS_ENTRY
std::tuple<Tensor, Tensor> roipoint_pool3d_backward(const Tensor& grad_, const Tensor& index_, int64_t num_points) {
  check_lidar_tensor("grad", grad_, "[B, M, S, 3 + C]", 4, -1);
  ROIOPS_CHECK(grad_.size(3) >= 3, "roiops: grad must be [B, M, S, 3 + C], got ", shape_name(grad_));
  bool ok = index_.dim() == 3 && index_.scalar_type() == kInt && same_device(index_, grad_);
  for (int64_t d = 0; ok && d < 3; ++d) ok = index_.size(d) == grad_.size(d);
  ROIOPS_CHECK(ok, "roiops: index must be int32 [", grad_.size(0), ", ", grad_.size(1), ", ", grad_.size(2), "] on ",
               device_name(grad_), ", got ", dtype_name(index_.scalar_type()), " ", shape_name(index_), " on ",
               device_name(index_));
  ROIOPS_CHECK(num_points >= 0 && num_points <= kMaxPointIndex, "roiops: num_points must be in [0, 2^31 - 1], got ",
               num_points);
  check_cpu(grad_);
  const int64_t B = grad_.size(0), N = num_points, C = grad_.size(3) - 3;
  const Options options{grad_.scalar_type()};
  Tensor grad_points = empty_output({B, N, 3}, options), grad_features = empty_output({B, N, C}, options);
  if (B * N == 0) return {grad_points, grad_features};
  const Tensor grad = in_format(grad_), index = in_format(index_);
  ROIOPS_DISPATCH(grad.scalar_type(), [&] { backward_impl<scalar_t>(grad, index, N, grad_points, grad_features); });
  return {grad_points, grad_features};
}

}  // namespace roiops

STABLE_TORCH_LIBRARY_FRAGMENT(roiops, m) {
  m.def("roipoint_pool3d(Tensor points, Tensor features, Tensor boxes, int num_samples) -> (Tensor, Tensor, Tensor)");
  m.def("_roipoint_pool3d_backward(Tensor grad, Tensor index, int num_points) -> (Tensor, Tensor)");
}

STABLE_TORCH_LIBRARY_IMPL(roiops, CPU, m) {
  m.impl("roipoint_pool3d", TORCH_BOX(&roiops::roipoint_pool3d_forward));
  m.impl("_roipoint_pool3d_backward", TORCH_BOX(&roiops::roipoint_pool3d_backward));
}
