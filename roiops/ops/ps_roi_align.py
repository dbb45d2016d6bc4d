"""Position-sensitive RoIAlign (R-FCN): its registered ops, public function and Module.
Semantics: docs/semantics.md, "ps_roi_align"."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from .. import _validation as v
from .._spec import Kernels, OpSpec
from .._validation import BoxesType, OutputSize
from ._declare import RoIModule, fx_leaf, register


def ps_channels(channels: Any, ph: int, pw: int) -> Any:
    """Output channels of a position-sensitive op (each reads ``ph * pw`` input channels);
    ``channels`` is an int, or a symbolic one while tracing."""
    return channels // (ph * pw)


# The contract tests' position-sensitive inputs read pooled_height * pooled_width (2 * 3)
# input channels per output channel.
_KERNELS = Kernels(
    "ps_roi_align", (("float", "spatial_scale"), ("int", "pooled_height"), ("int", "pooled_width"),
                     ("int", "sampling_ratio")),
    ("spatial_scale", "pooled_height", "pooled_width", "batch_size", "channels", "height", "width", "sampling_ratio",
     "channels_last"), title="ps_roi_align", out_channels=ps_channels, variants={
        "forward": (dict(sampling_ratio=-1, channels=12, out_channels=2),),
        "backward": (dict(sampling_ratio=2, channels=12, out_channels=2, channels_last=True),)})
_ps_roi_align = register(_KERNELS)


@fx_leaf
def ps_roi_align(
    input: Tensor,
    boxes: BoxesType,
    output_size: OutputSize,
    spatial_scale: float = 1.0,
    sampling_ratio: int = -1,
) -> Tensor:
    """Position-sensitive RoIAlign (R-FCN), as ``torchvision.ops.ps_roi_align``: bin ``(i,
    j)`` of output channel ``c`` averages bilinear samples of input channel ``(c * h + i)
    * w + j``.

    The input holds ``h * w`` score maps per output channel. Box corners are shifted by
    -0.5 cell, as ``roi_align(aligned=True)``. Semantics: docs/semantics.md,
    "ps_roi_align and ps_roi_pool".

    Args:
        input: feature map ``Tensor[N, C, H, W]`` with ``C = C_out * h * w`` (else
            ``ValueError``), float16/bfloat16/float32/float64, NCHW or channels_last.
        boxes: ``Tensor[K, 5]`` with rows ``(batch_index, x1, y1, x2, y2)``, or a list of N
            ``Tensor[L_i, 4]``, in input-image pixels.
        output_size: ``int`` or ``(h, w)``.
        spatial_scale: feature-map cells per input-image pixel (e.g. 1/16).
        sampling_ratio: sample points per bin along each axis; ``<= 0`` means adaptive,
            ``ceil(bin size)``.

    Returns:
        ``Tensor[K, C_out, h, w]`` of the input's dtype and memory format.

    Examples:
        >>> x = torch.randn(1, 21 * 49, 38, 50)                  # 21 classes, 7 x 7 score maps
        >>> roiops.ps_roi_align(x, torch.tensor([[0, 16.0, 32.0, 320.0, 240.0]]), 7, 1 / 16).shape
        torch.Size([1, 21, 7, 7])
    """
    input = v.feature_map(input)
    h, w = v.output_size(output_size)
    scale = v.spatial_scale(spatial_scale)
    ratio = v.sampling_ratio(sampling_ratio)
    rois = v.rois(input, boxes, scale)
    v.position_sensitive(input, h, w)
    return _ps_roi_align(input, rois, scale, h, w, ratio)


class PSRoIAlign(RoIModule):
    """Module form of [`roiops.ps_roi_align`][]: ``module(input, boxes)`` is
    ``ps_roi_align(input, boxes, **options)``, returning ``Tensor[K, C // (h * w), h,
    w]``. The options are checked when the module is built and shown in its repr.

    Args:
        output_size: ``int`` or ``(h, w)``.
        spatial_scale: feature-map cells per input-image pixel (e.g. 1/16).
        sampling_ratio: sample points per bin along each axis; ``<= 0`` means adaptive.

    Examples:
        >>> head = roiops.PSRoIAlign(3, spatial_scale=1 / 16, sampling_ratio=2)
        >>> head(torch.randn(1, 4 * 9, 20, 30), torch.tensor([[0, 16.0, 32.0, 320.0, 240.0]])).shape
        torch.Size([1, 4, 3, 3])
    """

    function = ps_roi_align

    def __init__(self, output_size: OutputSize, spatial_scale: float, sampling_ratio: int = -1) -> None:
        super().__init__(output_size=output_size, spatial_scale=spatial_scale, sampling_ratio=sampling_ratio)


SPEC = OpSpec(ps_roi_align, PSRoIAlign, (_KERNELS,), title="position-sensitive RoIAlign (R-FCN)",
              position_sensitive=True)
