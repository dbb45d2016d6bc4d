// The module roiops._C: runs the binder of every op file (registry.h). The torch.library
// ops are declared in roiops/ops/ and pick a backend per call; this module only exposes
// the kernels to them.
#include <torch/extension.h>

#include "registry.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  for (const roiops::Binder binder : roiops::binders()) binder(m);
}
