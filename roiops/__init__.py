"""roiops: exact, validated, fast region-of-interest operators for PyTorch.

Public API: :func:`roi_align`, :func:`roi_pool`, :func:`multi_scale_roi_align`, :class:`RoIAlign`, :class:`RoIPool`,
:func:`use_backend`, :mod:`roiops.config`, :mod:`roiops.compat` (peers' signatures) and
:mod:`roiops.reference` (the pure-PyTorch oracle). Semantics: docs/semantics.md.
"""

from . import config
from ._backend import use_backend
from .functional import fpn_levels, multi_scale_roi_align, roi_align, roi_pool
from .modules import RoIAlign, RoIPool

__all__ = ["RoIAlign", "RoIPool", "config", "fpn_levels", "multi_scale_roi_align", "roi_align", "roi_pool",
           "use_backend"]
__version__ = "0.1.0"
