"""Mask targets (docs/semantics.md, "mask_targets"): RoIAlign ("avg") of each proposal's mask,
the masks read as the compute type; a threshold makes the targets bool."""

from __future__ import annotations

import torch
from torch import Tensor

from .. import _kernel_checks as checks
from .roi_align import roi_align_forward

__all__ = ["mask_targets_forward"]


def mask_targets_forward(masks: Tensor, rois: Tensor, pooled_height: int, pooled_width: int, sampling_ratio: int,
                         aligned: bool, threshold: float, binary: bool) -> Tensor:
    """``out[p]`` = RoIAlign of mask ``rois[p, 0]`` over box ``rois[p, 1:]`` (spatial scale 1);
    floating masks give their dtype, bool and uint8 ones float32; ``binary``: ``>= threshold``."""
    checks.mask_targets(masks, rois, pooled_height, pooled_width, sampling_ratio, threshold, binary)
    # A threshold compares the compute type's value, before any rounding to float16.
    dtype = masks.dtype if masks.is_floating_point() and not binary else \
        torch.float64 if masks.dtype == torch.float64 else torch.float32
    if masks.shape[1] == 0 or masks.shape[2] == 0:
        out = masks.new_zeros((rois.shape[0], pooled_height, pooled_width), dtype=dtype)
    else:
        out = roi_align_forward(masks[:, None].to(dtype), rois, 1.0, pooled_height, pooled_width, sampling_ratio,
                                aligned)[:, 0]
    return out >= threshold if binary else out
