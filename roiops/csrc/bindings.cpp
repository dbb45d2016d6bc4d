// The module roiops._C: runs the binder of every op file (registry.h). The torch.library
// ops are declared in roiops/ops/ and pick a backend per call; this module only exposes
// the kernels to them, and to the validation layer the kernels' own check of box rows
// (first_invalid), which scans a CPU tensor's rows in a microsecond where a dozen tensor
// ops take tens; and for tests, how many bytes of freed outputs the kernels keep
// (memory.h's OutputCache).
#include <torch/extension.h>

#include "geometry.h"
#include "memory.h"
#include "registry.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  for (const roiops::Binder binder : roiops::binders()) binder(m);
  m.def("first_invalid", [](const at::Tensor& rois, int64_t batch_size, double spatial_scale) {
    return roiops::first_invalid(rois, batch_size, spatial_scale);
  });
  m.def("output_cache_bytes", [] {
#if defined(__linux__)
    return roiops::OutputCache::get().cached_bytes();
#else
    return size_t(0);
#endif
  });
}
