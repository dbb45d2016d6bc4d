"""Position-sensitive RoIPool (R-FCN): its registered ops, public function and Module.
Semantics: docs/semantics.md, "ps_roi_pool"."""

from __future__ import annotations

import torch
from torch import Tensor

from .. import _validation as v
from .._spec import Kernels, OpSpec
from .._validation import BoxesType, OutputSize
from ._declare import RoIModule, fx_leaf, register
from .ps_roi_align import ps_channels

_KERNELS = Kernels(
    "ps_roi_pool", (("float", "spatial_scale"), ("int", "pooled_height"), ("int", "pooled_width")),
    ("spatial_scale", "pooled_height", "pooled_width", "batch_size", "channels", "height", "width", "channels_last"),
    title="ps_roi_pool", out_channels=ps_channels, variants={
        "forward": (dict(channels=12, out_channels=2),),
        "backward": (dict(channels=12, out_channels=2, channels_last=False),)})
_ps_roi_pool = register(_KERNELS)


@fx_leaf
def ps_roi_pool(
    input: Tensor,
    boxes: BoxesType,
    output_size: OutputSize,
    spatial_scale: float = 1.0,
) -> Tensor:
    """Position-sensitive RoIPool (R-FCN), as ``torchvision.ops.ps_roi_pool``: bin ``(i,
    j)`` of output channel ``c`` is the average of input channel ``(c * h + i) * w + j``
    over the bin's cells.

    Box corners are rounded to cells (C's rounding), and a box is at least one cell wide
    and high. Semantics: docs/semantics.md, "ps_roi_align and ps_roi_pool".

    Args:
        input: feature map ``Tensor[N, C, H, W]`` with ``C = C_out * h * w`` (else
            ``ValueError``), float16/bfloat16/float32/float64, NCHW or channels_last.
        boxes: ``Tensor[K, 5]`` with rows ``(batch_index, x1, y1, x2, y2)``, or a list of N
            ``Tensor[L_i, 4]``, in input-image pixels.
        output_size: ``int`` or ``(h, w)``.
        spatial_scale: feature-map cells per input-image pixel (e.g. 1/16).

    Returns:
        ``Tensor[K, C_out, h, w]`` of the input's dtype and memory format; an empty bin
        gives 0.

    Examples:
        >>> x = torch.randn(1, 4 * 9, 32, 32)
        >>> roiops.ps_roi_pool(x, [torch.tensor([[0.0, 0.0, 15.0, 15.0]])], 3).shape
        torch.Size([1, 4, 3, 3])
    """
    input = v.feature_map(input)
    h, w = v.output_size(output_size)
    scale = v.spatial_scale(spatial_scale)
    rois = v.rois(input, boxes, scale)
    v.position_sensitive(input, h, w)
    return _ps_roi_pool(input, rois, scale, h, w)


class PSRoIPool(RoIModule):
    """Module form of [`roiops.ps_roi_pool`][]: ``module(input, boxes)`` is
    ``ps_roi_pool(input, boxes, **options)``, returning ``Tensor[K, C // (h * w), h, w]``.
    The options are checked when the module is built and shown in its repr.

    Args:
        output_size: ``int`` or ``(h, w)``.
        spatial_scale: feature-map cells per input-image pixel (e.g. 1/16).

    Examples:
        >>> head = roiops.PSRoIPool(3, spatial_scale=1 / 16)
        >>> head(torch.randn(1, 4 * 9, 20, 30), torch.tensor([[0, 16.0, 32.0, 320.0, 240.0]])).shape
        torch.Size([1, 4, 3, 3])
    """

    function = ps_roi_pool

    def __init__(self, output_size: OutputSize, spatial_scale: float) -> None:
        super().__init__(output_size=output_size, spatial_scale=spatial_scale)


SPEC = OpSpec(ps_roi_pool, PSRoIPool, (_KERNELS,), title="position-sensitive RoIPool (R-FCN)",
              position_sensitive=True)
