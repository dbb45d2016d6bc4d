"""Border align (BorderDet; mmcv's ``border_align``): its registered ops, public function
and Module. Semantics: docs/semantics.md, "border_align".

Not an RoI pooling of the usual shape: boxes come per image (``[N, K, 4]``, one per
location of a dense head, no batch index), and each box gives one value per channel and
border, the maximum of ``pool_size + 1`` bilinear samples along that border, with the
int32 index of the winning sample kept for the backward."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor

from .. import _validation as v
from .._boxes import PER_IMAGE
from .._spec import Kernels, OpSpec
from ._declare import RoIModule, fx_leaf, register


def _output_shape(input: Any, rois: Any, args: Mapping[str, Any]) -> tuple[Any, ...]:
    """``[N, C, K, 4]`` for an input ``[N, 4C, H, W]`` and boxes ``[N, K, 4]``."""
    return (input[0], input[1] // 4, rois[1], 4)


_KERNELS = Kernels(
    "border_align", (("int", "pool_size"),),
    ("pool_size", "batch_size", "channels", "height", "width", "channels_last"),
    saved=("argmax",), title="border_align", output_shape=_output_shape,
    variants={"forward": (dict(pool_size=1), dict(pool_size=10)),
              "backward": (dict(pool_size=10, channels_last=False), dict(pool_size=3, channels_last=True))})
_border_align = register(_KERNELS)


@fx_leaf
def border_align(input: Tensor, boxes: Tensor, pool_size: int) -> Tensor:
    """Border align (BorderDet, mmcv's ``border_align``): for each box and each of its four
    borders, the maximum of ``pool_size + 1`` bilinear samples spaced evenly along that
    border, both corners included.

    Not an RoI pooling of the usual shape: the boxes come per image, one per location of a
    dense head, and in feature-map cells (no ``spatial_scale``). Semantics (sample
    positions, ties, NaN): docs/semantics.md, "border_align".

    Args:
        input: feature map ``Tensor[N, 4C, H, W]``, float16/bfloat16/float32/float64, NCHW
            or channels_last: four groups of C channels, read by the top, left, bottom and
            right borders in that order.
        boxes: ``Tensor[N, K, 4]``, rows ``(x1, y1, x2, y2)`` in feature-map cells (no
            scale; BorderDet divides its boxes by the level's stride), box k of image n at
            ``boxes[n, k]``. Any floating dtype (float64 for a float64 input); receives no
            gradient.
        pool_size: samples per border minus one, in [1, 1024]. The top border is walked
            from (x1, y1) to the right, the left one from (x1, y1) down, the bottom one from
            (x2, y2) to the left and the right one from (x2, y2) up, in steps of a
            ``pool_size``-th of the box's side, added one after another.

    Returns:
        ``Tensor[N, C, K, 4]`` of the input's dtype and memory format, the last axis
        ordered (top, left, bottom, right). Ties keep the first sample of the walk; a NaN
        sample wins (the first one).

    Examples:
        >>> x = torch.randn(2, 4 * 16, 25, 42)
        >>> boxes = torch.tensor([2.0, 3.0, 10.0, 9.0]).expand(2, 25 * 42, 4)  # one per location
        >>> roiops.border_align(x, boxes, pool_size=10).shape
        torch.Size([2, 16, 1050, 4])
    """
    input = v.feature_map(input)
    if input.shape[1] % 4:
        raise ValueError(f"input channels ({input.shape[1]}) must be a multiple of 4 (top, left, bottom, right)")
    size = v.pool_size(pool_size)
    rois = v.border_boxes(input, boxes).detach()
    return _border_align(input, rois, size)[0]


class BorderAlign(RoIModule):
    """Module form of [`roiops.border_align`][]: ``module(input, boxes)`` is
    ``border_align(input, boxes, pool_size)``, returning ``Tensor[N, C, K, 4]``.

    Args:
        pool_size: samples per border minus one, in [1, 1024].

    Examples:
        >>> align = roiops.BorderAlign(pool_size=10)
        >>> align
        BorderAlign(pool_size=10)
        >>> align(torch.randn(1, 4 * 8, 20, 30), torch.tensor([[[2.0, 3.0, 10.0, 9.0]]])).shape
        torch.Size([1, 8, 1, 4])
    """

    function = border_align

    def __init__(self, pool_size: int) -> None:
        super().__init__(pool_size=pool_size)


SPEC = OpSpec(border_align, BorderAlign, (_KERNELS,), title="border align (BorderDet)", boxes=PER_IMAGE)
