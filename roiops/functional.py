"""Public functional API. The exact semantics are in docs/semantics.md."""

from __future__ import annotations

from typing import Literal, Union

import torch
from torch import Tensor

from . import _ops  # noqa: F401  (registers torch.ops.roiops.*)
from . import _validation as v
from ._validation import BoxesType

OutputSize = Union[int, tuple[int, int], list[int]]


def roi_align(
    input: Tensor,
    boxes: BoxesType,
    output_size: OutputSize,
    spatial_scale: float = 1.0,
    sampling_ratio: int = -1,
    aligned: bool = False,
    mode: Literal["avg", "max"] = "avg",
) -> Tensor:
    """RoIAlign (Mask R-CNN): bilinear samples averaged (or maxed) over each output bin.

    Args:
        input: feature map ``Tensor[N, C, H, W]``, float16/bfloat16/float32/float64, NCHW
            or channels_last.
        boxes: ``Tensor[K, 5]`` with rows ``(batch_index, x1, y1, x2, y2)``, or a list of N
            ``Tensor[L_i, 4]`` (image i's boxes), in input-image pixels.
        output_size: ``int`` or ``(h, w)``.
        spatial_scale: feature-map cells per input-image pixel (e.g. 1/16).
        sampling_ratio: sample points per bin along each axis; ``<= 0`` means adaptive,
            ``ceil(bin size)``.
        aligned: shift box corners by -0.5 cell (detectron2 ``aligned=True``); with
            ``False`` (torchvision's default) boxes are also widened to at least 1 cell.
        mode: ``"avg"`` (Mask R-CNN) or ``"max"`` (largest sample, as mmcv's
            ``pool_mode="max"``).

    Returns:
        ``Tensor[K, C, h, w]`` of the input's dtype and memory format.

    Example::

        >>> x = torch.randn(2, 256, 50, 84)
        >>> boxes = torch.tensor([[0, 10.0, 20.0, 200.0, 150.0]])
        >>> roiops.roi_align(x, boxes, 7, spatial_scale=1 / 4, sampling_ratio=2, aligned=True).shape
        torch.Size([1, 256, 7, 7])
    """
    input = v.feature_map(input)
    h, w = v.output_size(output_size)
    scale = v.spatial_scale(spatial_scale)
    ratio = v.sampling_ratio(sampling_ratio)
    aligned = v.flag("aligned", aligned)
    mode = v.choice("mode", mode, ("avg", "max"))  # type: ignore[assignment]
    rois = v.rois(input, boxes, scale)
    if mode == "avg":
        return torch.ops.roiops.roi_align(input, rois, scale, h, w, ratio, aligned)
    return torch.ops.roiops.roi_align_max(input, rois, scale, h, w, ratio, aligned)[0]


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
    return torch.ops.roiops.roi_pool(input, rois, scale, h, w, convention == "mmdet")[0]
