"""RoIPool (Fast R-CNN), Caffe and mmdetection conventions: its registered ops, public
function and Module. Semantics: docs/semantics.md, "roi_pool"."""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from .. import _validation as v
from .._spec import Kernels, OpSpec
from .._validation import BoxesType, OutputSize
from ._declare import RoIModule, fx_leaf, register

_KERNELS = Kernels(
    "roi_pool", (("float", "spatial_scale"), ("int", "pooled_height"), ("int", "pooled_width"), ("bool", "continuous")),
    ("batch_size", "channels", "height", "width", "channels_last"), saved=("argmax",), title="roi_pool", plane_argmax=True, variants={
        "forward": (dict(continuous=False), dict(continuous=True)), "backward": (dict(channels_last=False),)})
_roi_pool = register(_KERNELS)


@fx_leaf
def roi_pool(
    input: Tensor,
    boxes: BoxesType,
    output_size: OutputSize,
    spatial_scale: float = 1.0,
    convention: Literal["caffe", "mmdet"] = "caffe",
) -> Tensor:
    """RoIPool (Fast R-CNN): the maximum over each bin of whole cells.

    Semantics: docs/semantics.md, "roi_pool".

    Args:
        input: feature map ``Tensor[N, C, H, W]``, float16/bfloat16/float32/float64, NCHW
            or channels_last.
        boxes: ``Tensor[K, 5]`` with rows ``(batch_index, x1, y1, x2, y2)``, or a list of N
            ``Tensor[L_i, 4]`` (image i's boxes), in input-image pixels.
        output_size: ``int`` or ``(h, w)``.
        spatial_scale: feature-map cells per input-image pixel (e.g. 1/16).
        convention: ``"caffe"`` (default; Fast R-CNN, torchvision, maskrcnn-benchmark,
            chainer): box corners rounded to cells, inclusive ends. ``"mmdet"``:
            mmdetection's and mmcv's continuous coordinates, ``x1 * s`` to ``(x2 + 1) * s``
            unrounded; a box of width or height <= 0 gives zeros.

    Returns:
        ``Tensor[K, C, h, w]`` of the input's dtype and memory format; an empty bin gives 0.

    Examples:
        >>> x = torch.arange(16.0).view(1, 1, 4, 4)
        >>> roiops.roi_pool(x, [torch.tensor([[0.0, 0.0, 3.0, 3.0]])], 2)
        tensor([[[[ 5.,  7.],
                  [13., 15.]]]])
        >>> roiops.roi_pool(torch.randn(1, 3, 32, 32), torch.tensor([[0, 0.0, 0.0, 15.0, 15.0]]), 2,
        ...                 convention="mmdet").shape
        torch.Size([1, 3, 2, 2])
    """
    input = v.feature_map(input)
    h, w = v.output_size(output_size)
    scale = v.spatial_scale(spatial_scale)
    convention = v.choice("convention", convention, ("caffe", "mmdet"))  # type: ignore[assignment]
    rois = v.rois(input, boxes, scale)
    return _roi_pool(input, rois, scale, h, w, convention == "mmdet")[0]


class RoIPool(RoIModule):
    """Module form of [`roiops.roi_pool`][]: ``module(input, boxes)`` is ``roi_pool(input,
    boxes, **options)``, returning ``Tensor[K, C, h, w]``. The options are checked when the
    module is built and shown in its repr.

    Args:
        output_size: ``int`` or ``(h, w)``.
        spatial_scale: feature-map cells per input-image pixel (e.g. 1/16).
        convention: ``"caffe"`` (rounded box corners) or ``"mmdet"`` (continuous).

    Examples:
        >>> pool = roiops.RoIPool((7, 7), spatial_scale=1 / 16)
        >>> pool
        RoIPool(output_size=(7, 7), spatial_scale=0.0625, convention='caffe')
        >>> pool(torch.randn(1, 8, 40, 60), torch.tensor([[0, 16.0, 32.0, 320.0, 240.0]])).shape
        torch.Size([1, 8, 7, 7])
    """

    function = roi_pool

    def __init__(self, output_size: OutputSize, spatial_scale: float,
                 convention: Literal["caffe", "mmdet"] = "caffe") -> None:
        super().__init__(output_size=output_size, spatial_scale=spatial_scale, convention=convention)


SPEC = OpSpec(roi_pool, RoIPool, (_KERNELS,), title="RoIPool (Caffe and mmdetection conventions)")
