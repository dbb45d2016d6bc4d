"""The operators, one module each: its registered ``torch.ops.roiops`` ops (declared once,
built by ``_declare``), its public function and its Module. Importing this package
registers them all."""

from .._validation import BoxesType, OutputSize
from .multi_scale import fpn_levels, multi_scale_roi_align
from .prroi_pool import PrRoIPool, prroi_pool
from .ps_roi_align import PSRoIAlign, ps_roi_align
from .ps_roi_pool import PSRoIPool, ps_roi_pool
from .roi_align import RoIAlign, roi_align
from .roi_align_rotated import RoIAlignRotated, roi_align_rotated
from .roi_pool import RoIPool, roi_pool

__all__ = ["BoxesType", "OutputSize", "RoIAlign", "RoIPool", "fpn_levels", "multi_scale_roi_align", "roi_align", "roi_pool"]
__all__ += ["PSRoIAlign", "PSRoIPool", "ps_roi_align", "ps_roi_pool"]
__all__ += ["RoIAlignRotated", "roi_align_rotated"]
__all__ += ["PrRoIPool", "prroi_pool"]
