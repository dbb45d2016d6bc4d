// The module roiops._C: importing it loads this library, whose static registrations put
// the ops' schemas and CPU kernels in the dispatcher (each op's .cpp registers its own).
// Beside them, two helper ops: the kernels' own check of box rows for the validation
// layer (_first_invalid), which scans a CPU tensor's rows in a microsecond where a dozen
// tensor ops take tens; and for tests, how many bytes of freed outputs the kernels keep
// (memory.h's OutputCache). Python's limited API only: one build serves every Python.
#include <Python.h>

#include <tuple>

#include "checks.h"
#include "memory.h"

namespace roiops {
namespace {

std::tuple<int64_t, int64_t> first_invalid_op(const Tensor& rois, int64_t batch_size, double spatial_scale) {
  const auto [k, column] = first_invalid(rois, batch_size, spatial_scale);
  return {k, column};
}

int64_t output_cache_bytes() {
#if defined(__linux__)
  return static_cast<int64_t>(OutputCache::get().cached_bytes());
#else
  return 0;
#endif
}

}  // namespace
}  // namespace roiops

STABLE_TORCH_LIBRARY_FRAGMENT(roiops, m) {
  m.def("_first_invalid(Tensor rois, int batch_size, float spatial_scale) -> (int, int)");
  m.def("_output_cache_bytes() -> int");
}

STABLE_TORCH_LIBRARY_IMPL(roiops, CPU, m) {
  m.impl("_first_invalid", TORCH_BOX(&roiops::first_invalid_op));
}

STABLE_TORCH_LIBRARY_IMPL(roiops, CompositeExplicitAutograd, m) {
  m.impl("_output_cache_bytes", TORCH_BOX(&roiops::output_cache_bytes));
}

PyMODINIT_FUNC PyInit__C(void) {
  static PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr, nullptr, nullptr, nullptr, nullptr};
  return PyModule_Create(&module);
}
