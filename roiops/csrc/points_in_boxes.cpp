// Points in LiDAR boxes on the CPU (docs/semantics.md, "points_in_boxes"): per point, the
// smallest index of a box holding it (int64, -1 for none), or with all_boxes whether each
// box holds it (bool [B, N, M]).
//
// Tasks own runs of points of one scene and test them against every box in increasing m,
// vectorised over the points (lidar.h); each output element is written by one task.

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <tuple>

#include "args.h"
#include "checks.h"
#include "lidar.h"
#include "memory.h"
#include "parallel.h"
#include "simd.h"

namespace roiops {
namespace {

// One run of at most kFlagBlock points against the M boxes of its scene; first / all: the
// run's rows of the output.
template <typename T>
ROIOPS_SIMD void run_boxes(const LidarBox<T>* boxes, int64_t M, const PointRun<T>& run, bool all_boxes,
                           int64_t* __restrict__ first, bool* __restrict__ all) {
  alignas(64) uint8_t flags[kFlagBlock];
  const int64_t n = run.n;
  if (all_boxes) {
    // Eight boxes at a time, so that each point's row takes one 8-byte store per group
    // instead of eight scattered byte stores.
    alignas(64) uint8_t group[8][kFlagBlock];
    int64_t m = 0;
    for (; m + 8 <= M; m += 8) {
      for (int64_t j = 0; j < 8; ++j) inside_flags(boxes[m + j], run.x, run.y, run.z, n, group[j]);
      for (int64_t i = 0; i < n; ++i) {
        uint8_t row[8];
        for (int64_t j = 0; j < 8; ++j) row[j] = group[j][i];
        std::memcpy(all + i * M + m, row, 8);
      }
    }
    for (; m < M; ++m) {
      inside_flags(boxes[m], run.x, run.y, run.z, n, flags);
      for (int64_t i = 0; i < n; ++i) all[i * M + m] = flags[i] != 0;
    }
    return;
  }
  alignas(64) int64_t best[kFlagBlock];
  for (int64_t i = 0; i < n; ++i) best[i] = -1;
  int64_t open = n;  // points without a box yet: a run whose points all have one stops
  for (int64_t m = 0; m < M && open > 0; ++m) {
    inside_flags(boxes[m], run.x, run.y, run.z, n, flags);
    for (int64_t w = 0; w < n; w += 8) {  // few points are inside: 8 flags at a time
      uint64_t word;
      std::memcpy(&word, flags + w, 8);
      for (; word != 0; word &= word - 1) {
        const int64_t i = w + (__builtin_ctzll(word) >> 3);
        if (best[i] < 0) {
          best[i] = m;
          --open;
        }
      }
    }
  }
  std::copy(best, best + n, first);
}

template <typename T>
void points_in_boxes_impl(const Tensor& points, const Tensor& boxes, bool all_boxes, Tensor& out) {
  const int64_t B = points.size(0), N = points.size(1), M = boxes.size(1);
  const PointColumns<T> cols(points.const_data_ptr<T>(), B * N);
  const auto box = lidar_boxes(boxes.const_data_ptr<T>(), B * M);
  const int64_t runs = (N + kFlagBlock - 1) / kFlagBlock;
  int64_t* first = all_boxes ? nullptr : out.mutable_data_ptr<int64_t>();
  bool* all = all_boxes ? out.mutable_data_ptr<bool>() : nullptr;
  parallel_tasks(B * runs, [&](int64_t t) {
    const int64_t b = t / runs, p0 = (t % runs) * kFlagBlock, n = std::min(kFlagBlock, N - p0);
    const int64_t at = b * N + p0;
    run_boxes<T>(box.get() + b * M, M, PointRun<T>(cols, at, n), all_boxes, all_boxes ? nullptr : first + at,
                 all_boxes ? all + at * M : nullptr);
  });
}

}  // namespace

ROIOPS_ENTRY
Tensor points_in_boxes_forward(const Tensor& points_, const Tensor& boxes_, bool all_boxes) {
  check_scene(points_, boxes_, true);
  check_cpu(points_);
  const int64_t B = points_.size(0), N = points_.size(1), M = boxes_.size(1);
  // bool outputs from torch's allocator: empty_output sizes its blocks for 4-byte elements.
  Tensor out = all_boxes ? empty({B, N, M}, Options{ScalarType::Bool}) : empty_output({B, N}, Options{ScalarType::Long});
  if (B * N == 0) return out;
  if (M == 0) {
    if (all_boxes) return out;
    int64_t* o = out.mutable_data_ptr<int64_t>();
    std::fill(o, o + B * N, int64_t(-1));
    return out;
  }
  const Tensor points = lidar_coords(points_), boxes = lidar_coords(boxes_);
  ROIOPS_DISPATCH_COORDS(points.scalar_type(), [&] { points_in_boxes_impl<coord_t>(points, boxes, all_boxes, out); });
  return out;
}

}  // namespace roiops

STABLE_TORCH_LIBRARY_FRAGMENT(roiops, m) { m.def("points_in_boxes(Tensor points, Tensor boxes, bool all_boxes) -> Tensor"); }

STABLE_TORCH_LIBRARY_IMPL(roiops, CPU, m) { m.impl("points_in_boxes", TORCH_BOX(&roiops::points_in_boxes_forward)); }
