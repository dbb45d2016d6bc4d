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
from ._declare import RoIModule, fx_leaf, register
from ._spec import Bench, Kernels, OpSpec, Peer, Workload


def _output_shape(input: Any, rois: Any, args: Mapping[str, Any]) -> tuple[Any, ...]:
    """``[N, C, K, 4]`` for an input ``[N, 4C, H, W]`` and boxes ``[N, K, 4]``."""
    return (input[0], input[1] // 4, rois[1], 4)


_KERNELS = Kernels(
    "border_align", (("int", "pool_size"),),
    ("pool_size", "batch_size", "channels", "height", "width", "channels_last"),
    saved=("argmax",), title="border_align", onnx="border align", output_shape=_output_shape,
    variants={"forward": (dict(pool_size=1), dict(pool_size=10)),
              "backward": (dict(pool_size=10, channels_last=False), dict(pool_size=3, channels_last=True))})
_border_align = register(_KERNELS)


@fx_leaf
def border_align(input: Tensor, boxes: Tensor, pool_size: int) -> Tensor:
    """Border align (BorderDet): for each box and border, the maximum of ``pool_size + 1``
    bilinear samples spaced evenly along that border, both corners included.

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

    Example::

        >>> x = torch.randn(2, 4 * 64, 25, 42)
        >>> boxes = torch.tensor([2.0, 3.0, 10.0, 9.0]).expand(2, 25 * 42, 4)
        >>> roiops.border_align(x, boxes, 10).shape
        torch.Size([2, 64, 1050, 4])
    """
    input = v.feature_map(input)
    if input.shape[1] % 4:
        raise ValueError(f"input channels ({input.shape[1]}) must be a multiple of 4 (top, left, bottom, right)")
    size = v.pool_size(pool_size)
    rois = v.border_boxes(input, boxes).detach()
    return _border_align(input, rois, size)[0]


class BorderAlign(RoIModule):
    """See :func:`roiops.border_align`.

    Example::

        >>> align = roiops.BorderAlign(pool_size=10)
        >>> align(features, boxes).shape  # [N, C, K, 4]
    """

    function = border_align

    def __init__(self, pool_size: int) -> None:
        super().__init__(pool_size=pool_size)


# BorderDet's border branch of the box regression (4 x 128 channels) on one FPN level,
# stride 8 of an 800 x 1333 image, one box per location, pool_size 10. The peer computes
# as many maxima of about as many samples on the same map and boxes: roiops' RoIAlign in
# max mode, one bin per box and channel of the 4C, a 3 x 3 grid (border align: 11 samples
# per value).
SPEC = OpSpec(
    border_align, BorderAlign, (_KERNELS,), options=(dict(pool_size=10),), boxes="per-image",
    bench=(Bench("border_align", "Border align", lambda w, x, b: border_align(x, b[:, 1:].view(w.n, -1, 4), w.size),
                 Peer("roiops", lambda r, w, x, b: r.roi_align(x, b, 1, 1.0, 3, mode="max"), same_result=False,
                      note="its own roi_align(mode='max'), one 3 x 3-sample bin per box and channel: as many "
                           "values as border align's, 9 samples each against 11"),
                 (Workload("borderdet p3", 2, 512, 100, 168, 1.0, 100 * 168, 10),),
                 argmax=True, sampled=False, boxes="per-image"),))
