// Python entry points of the CPU kernels. The torch.library ops live in roiops/_ops.py,
// which picks a backend per call; this module only exposes the kernels to it.
#include <torch/extension.h>

#include "ops.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("roi_align_forward", &roiops::roi_align_forward);
  m.def("roi_align_backward", &roiops::roi_align_backward);
  m.def("roi_align_max_forward", &roiops::roi_align_max_forward);
  m.def("roi_align_max_backward", &roiops::roi_align_max_backward);
  m.def("roi_pool_forward", &roiops::roi_pool_forward);
  m.def("roi_pool_backward", &roiops::roi_pool_backward);
}
