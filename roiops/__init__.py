"""roiops: exact, validated, fast region-of-interest operators for PyTorch.

Each operator is a function (``roiops.roi_align``, ``roiops.roi_pool``, ...) with a Module
form (``roiops.RoIAlign``, ``roiops.RoIPool``, ...). ``roiops.use_backend`` and
``roiops.config`` choose the kernels and the checks; ``roiops.compat`` holds drop-ins with
other projects' signatures, ``roiops.onnx`` the ONNX export and ``roiops.reference`` the
pure-PyTorch kernels. What each operator computes, exactly: docs/semantics.md.

Conventions of the API:

- ``input`` is a feature map ``Tensor[N, C, H, W]``: float16, bfloat16, float32 or
  float64, NCHW or channels_last (the output keeps the input's memory format).
- ``boxes`` is either a ``Tensor[K, 5]`` of rows ``(batch_index, x1, y1, x2, y2)`` or a
  list of N ``Tensor[L_i, 4]`` of rows ``(x1, y1, x2, y2)`` for image i, in input-image
  pixels: any floating dtype, any row order, and K may be 0.
- ``output_size`` is an int ``s``, meaning ``(s, s)``, or a pair ``(h, w)``.
- ``spatial_scale`` maps input-image pixels to feature-map cells: ``1/16`` for a
  stride-16 map.
- Integer and real arguments may also be numpy scalars or 0-d tensors, as torchvision
  takes them.
- Bad arguments raise ``TypeError`` or ``ValueError`` naming the argument (and the first
  bad box row); the limits on sizes and values are in docs/semantics.md, "Limits".
"""

import importlib
from types import ModuleType

from . import _requirements

_WHY = _requirements.torch_too_old()
if _WHY:
    raise ImportError(_WHY)

from . import _onnx_hook, config  # noqa: E402  (after the torch check: they import the ops)
from ._backend import use_backend
from .ops import SPECS, fpn_levels, multi_scale_roi_align

# Spelled out for type checkers and editors, which cannot follow a computed __all__;
# tests/test_api.py checks these against roiops.ops.SPECS.
from .ops.bezier_align import BezierAlign, bezier_align
from .ops.border_align import BorderAlign, border_align
from .ops.deform_roi_pool import DeformRoIPool, deform_roi_pool
from .ops.mask_targets import mask_targets
from .ops.paste_masks import paste_masks
from .ops.points_in_boxes import PointsInBoxes, points_in_boxes
from .ops.prroi_pool import PrRoIPool, prroi_pool
from .ops.ps_roi_align import PSRoIAlign, ps_roi_align
from .ops.ps_roi_pool import PSRoIPool, ps_roi_pool
from .ops.riroi_align_rotated import RiRoIAlignRotated, riroi_align_rotated
from .ops.roi_align import RoIAlign, roi_align
from .ops.roi_align_rotated import RoIAlignRotated, roi_align_rotated
from .ops.roi_pool import RoIPool, roi_pool
from .ops.roiaware_pool3d import RoIAwarePool3d, roiaware_pool3d
from .ops.roipoint_pool3d import RoIPointPool3d, roipoint_pool3d

__all__ = ["PointsInBoxes", "RoIAwarePool3d", "RoIPointPool3d", "config", "fpn_levels", "mask_targets",
           "multi_scale_roi_align", "paste_masks", "points_in_boxes", "roiaware_pool3d", "roipoint_pool3d",
           "use_backend"]
__all__ += [name for spec in SPECS for name in (spec.name, spec.module.__name__)]
__version__ = "0.1.0"

_onnx_hook.install()

# Loaded on first attribute access, so that `import roiops` does not pay for them.
_LAZY = ("compat", "cpu", "onnx", "reference")


def __getattr__(name: str) -> ModuleType:
    if name in _LAZY:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
