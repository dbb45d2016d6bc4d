"""roiops: exact, validated, fast region-of-interest operators for PyTorch.

Public API: :func:`roi_align`, :func:`roi_pool`, :func:`multi_scale_roi_align`, :class:`RoIAlign`, :class:`RoIPool`,
:func:`ps_roi_align`, :func:`ps_roi_pool`, :class:`PSRoIAlign`, :class:`PSRoIPool`,
:func:`roi_align_rotated`, :class:`RoIAlignRotated`, :func:`prroi_pool`, :class:`PrRoIPool`,
:func:`use_backend`, :mod:`roiops.config`, :mod:`roiops.compat` (peers' signatures) and
:mod:`roiops.reference` (the pure-PyTorch oracle). Semantics: docs/semantics.md.
"""

import importlib
from types import ModuleType

from . import _onnx_hook, config
from ._backend import use_backend
from .ops import RoIAlign, RoIPool, fpn_levels, multi_scale_roi_align, roi_align, roi_pool
from .ops import PSRoIAlign, PSRoIPool, ps_roi_align, ps_roi_pool
from .ops import RoIAlignRotated, roi_align_rotated
from .ops import PrRoIPool, prroi_pool

__all__ = ["RoIAlign", "RoIPool", "config", "fpn_levels", "multi_scale_roi_align", "roi_align", "roi_pool",
           "use_backend"]
__all__ += ["PSRoIAlign", "PSRoIPool", "ps_roi_align", "ps_roi_pool"]
__all__ += ["RoIAlignRotated", "roi_align_rotated"]
__all__ += ["PrRoIPool", "prroi_pool"]
__version__ = "0.1.0"

_onnx_hook.install()

# Loaded on first attribute access, so that `import roiops` does not pay for them.
_LAZY = ("compat", "onnx", "reference")


def __getattr__(name: str) -> ModuleType:
    if name in _LAZY:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
