"""roiops: exact, validated, fast region-of-interest operators for PyTorch.

Public API: :func:`roi_align`, :func:`roi_pool`, :func:`multi_scale_roi_align`, :class:`RoIAlign`, :class:`RoIPool`,
:func:`ps_roi_align`, :func:`ps_roi_pool`, :class:`PSRoIAlign`, :class:`PSRoIPool`,
:func:`roi_align_rotated`, :class:`RoIAlignRotated`, :func:`riroi_align_rotated`, :class:`RiRoIAlignRotated`,
:func:`prroi_pool`, :class:`PrRoIPool`, :func:`deform_roi_pool`, :class:`DeformRoIPool`,
:func:`bezier_align`, :class:`BezierAlign`, :func:`border_align`, :class:`BorderAlign`,
:func:`use_backend`, :mod:`roiops.config`, :mod:`roiops.compat` (peers' signatures) and
:mod:`roiops.reference` (the pure-PyTorch oracle). Semantics: docs/semantics.md.
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
from .ops.prroi_pool import PrRoIPool, prroi_pool
from .ops.ps_roi_align import PSRoIAlign, ps_roi_align
from .ops.ps_roi_pool import PSRoIPool, ps_roi_pool
from .ops.riroi_align_rotated import RiRoIAlignRotated, riroi_align_rotated
from .ops.roi_align import RoIAlign, roi_align
from .ops.roi_align_rotated import RoIAlignRotated, roi_align_rotated
from .ops.roi_pool import RoIPool, roi_pool

__all__ = ["config", "fpn_levels", "multi_scale_roi_align", "use_backend"]
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
