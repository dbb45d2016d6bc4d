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
    """RoIPool (Fast R-CNN): the maximum over each bin of integer cells.

    Args:
        input, boxes, output_size, spatial_scale: as for :func:`roi_align`.
        convention: ``"caffe"`` (default; Fast R-CNN, torchvision, maskrcnn-benchmark,
            chainer): box corners rounded to cells, inclusive ends. ``"mmdet"``:
            mmdetection's continuous coordinates, ``x1 * s`` to ``(x2 + 1) * s`` unrounded;
            a box of width or height <= 0 gives zeros.

    Returns:
        ``Tensor[K, C, h, w]`` of the input's dtype and memory format; an empty bin gives 0.

    Example::

        >>> roiops.roi_pool(torch.randn(1, 3, 32, 32), [torch.tensor([[0.0, 0.0, 15.0, 15.0]])], 2).shape
        torch.Size([1, 3, 2, 2])
    """
    input = v.feature_map(input)
    h, w = v.output_size(output_size)
    scale = v.spatial_scale(spatial_scale)
    convention = v.choice("convention", convention, ("caffe", "mmdet"))  # type: ignore[assignment]
    rois = v.rois(input, boxes, scale)
    return _roi_pool(input, rois, scale, h, w, convention == "mmdet")[0]


class RoIPool(RoIModule):
    """See :func:`roiops.roi_pool`.

    Example::

        >>> pool = roiops.RoIPool((7, 7), spatial_scale=1 / 16)
        >>> pool(features, boxes).shape  # [K, C, 7, 7]
    """

    function = roi_pool

    def __init__(self, output_size: OutputSize, spatial_scale: float,
                 convention: Literal["caffe", "mmdet"] = "caffe") -> None:
        super().__init__(output_size=output_size, spatial_scale=spatial_scale, convention=convention)


SPEC = OpSpec(roi_pool, RoIPool, (_KERNELS,), title="RoIPool (Caffe and mmdetection conventions)")
