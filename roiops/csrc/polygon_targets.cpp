// Mask targets from polygons on the CPU (docs/semantics.md, "mask_targets", polygons): each
// proposal's instance rasterised within its box by pycocotools' rule, as detectron2's
// PolygonMasks.crop_and_resize (polygon_raster.h). Polygons are host data, packed by the
// Python layer: coords [2V] float64 (x, y pairs), vertex_offsets [n + 1] (polygon i's
// vertices), polygon_offsets [G + 1] (instance g's polygons). Proposals are independent
// tasks, each writing its own M x M plane.

#include <cstdint>
#include <vector>

#include "args.h"
#include "bounds.h"
#include "checks.h"
#include "memory.h"
#include "parallel.h"
#include "polygon_raster.h"
#include "torch_api.h"

namespace roiops {
namespace {

void check_offsets(const Tensor& t, const char* name, int64_t last, const char* of) {
  ROIOPS_CHECK(t.dim() == 1 && t.size(0) >= 1 && t.scalar_type() == ScalarType::Long && t.is_cpu(), "roiops: ", name,
               " must be a 1-D int64 CPU tensor, got ", shape_name(t), " ", dtype_name(t.scalar_type()));
  const int64_t* o = t.const_data_ptr<int64_t>();
  const int64_t n = t.size(0);
  bool ok = o[0] == 0 && o[n - 1] == last;
  for (int64_t i = 1; ok && i < n; ++i) ok = o[i] >= o[i - 1];
  ROIOPS_CHECK(ok, "roiops: ", name, " must rise from 0 to ", last, " (", of, ")");
}

}  // namespace

ROIOPS_ENTRY
Tensor polygon_targets_forward(const Tensor& coords_, const Tensor& vertex_offsets_, const Tensor& polygon_offsets_,
                               const Tensor& boxes_, const Tensor& indices_, int64_t size) {
  ROIOPS_CHECK(coords_.dim() == 1 && coords_.size(0) % 2 == 0 && coords_.scalar_type() == kDouble && coords_.is_cpu(),
               "roiops: coords must be a 1-D float64 CPU tensor of (x, y) pairs, got ", shape_name(coords_), " ",
               dtype_name(coords_.scalar_type()));
  const Tensor coords = in_format(coords_), vertex_offsets = in_format(vertex_offsets_),
               polygon_offsets = in_format(polygon_offsets_);
  check_offsets(vertex_offsets, "vertex_offsets", coords.size(0) / 2, "the vertices");
  check_offsets(polygon_offsets, "polygon_offsets", vertex_offsets.size(0) - 1, "the polygons");
  const int64_t G = polygon_offsets.size(0) - 1;
  ROIOPS_CHECK(boxes_.dim() == 2 && boxes_.size(1) == 4 && boxes_.scalar_type() == kFloat && boxes_.is_cpu(),
               "roiops: boxes must be a float32 CPU tensor [P, 4], got ", shape_name(boxes_), " ",
               dtype_name(boxes_.scalar_type()));
  ROIOPS_CHECK(indices_.dim() == 1 && indices_.size(0) == boxes_.size(0) &&
                   indices_.scalar_type() == ScalarType::Long && indices_.is_cpu(),
               "roiops: indices must be an int64 CPU tensor [P] with P = ", boxes_.size(0), ", got ",
               shape_name(indices_), " ", dtype_name(indices_.scalar_type()));
  ROIOPS_CHECK(size >= 1 && size <= kMaxPooled, "roiops: output size must be in [1, ", kMaxPooled, "], got ", size);
  const Tensor boxes = in_format(boxes_), indices = in_format(indices_);
  const int64_t P = boxes.size(0);
  const int64_t* idx = indices.const_data_ptr<int64_t>();
  for (int64_t p = 0; p < P; ++p)
    ROIOPS_CHECK(idx[p] >= 0 && idx[p] < G, "roiops: indices[", p, "] = ", idx[p], " is not an instance in [0, ", G,
                 ")");
  Tensor out = empty_output({P, size, size}, Options{ScalarType::Bool});
  const double* xy = coords.const_data_ptr<double>();
  const int64_t* vo = vertex_offsets.const_data_ptr<int64_t>();
  const int64_t* po = polygon_offsets.const_data_ptr<int64_t>();
  const float* b = boxes.const_data_ptr<float>();
  auto* o = reinterpret_cast<uint8_t*>(out.mutable_data_ptr<bool>());
  std::vector<std::vector<uint8_t>> scratch(static_cast<size_t>(std::max<int64_t>(num_threads(), 1)));
  parallel_tasks(P, [&](int64_t p) {
    const int64_t g = idx[p];
    const size_t t = std::min<size_t>(static_cast<size_t>(thread_num()), scratch.size() - 1);
    rasterize_polygons_in_box(xy, vo + po[g], po[g + 1] - po[g], b + 4 * p, size, o + p * size * size, scratch[t]);
  });
  return out;
}

}  // namespace roiops

STABLE_TORCH_LIBRARY_FRAGMENT(roiops, m) {
  m.def("polygon_targets(Tensor coords, Tensor vertex_offsets, Tensor polygon_offsets, Tensor boxes, "
        "Tensor indices, int size) -> Tensor");
}

STABLE_TORCH_LIBRARY_IMPL(roiops, CPU, m) { m.impl("polygon_targets", TORCH_BOX(&roiops::polygon_targets_forward)); }
