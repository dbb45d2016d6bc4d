"""Public functional API. The exact semantics are in docs/semantics.md."""

from __future__ import annotations

import math
from collections.abc import Sequence
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
    rois = v.rois(input, boxes, scale, (h, w, ratio, aligned) if mode == "max" else None)
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


def fpn_levels(rois: Tensor, k_min: int, k_max: int, canonical_box_size: float = 224.0, canonical_level: int = 4,
               rule: Literal["torchvision", "detectron2"] = "torchvision", eps: float = 1e-6) -> Tensor:
    """FPN level of each ``(batch_index, x1, y1, x2, y2)`` row (Feature Pyramid Networks,
    eq. 1), as an int64 offset from ``k_min``, computed on the boxes' device (no sync).

    ``"torchvision"``: ``floor(canonical_level + log2(sqrt(area) / canonical_box_size) + eps)``;
    ``"detectron2"``: ``floor(canonical_level + log2(sqrt(area) / canonical_box_size + 1e-8))``;
    both in the boxes' dtype, as those libraries compute them, clamped to ``[k_min, k_max]``.
    A box of negative area has no level: -1 (it pools to 0).
    """
    size = ((rois[:, 3] - rois[:, 1]) * (rois[:, 4] - rois[:, 2])).sqrt()
    if rule == "torchvision":
        level = (canonical_level + torch.log2(size / canonical_box_size)) + torch.tensor(eps, dtype=size.dtype)
    else:
        level = canonical_level + torch.log2(size / canonical_box_size + 1e-8)
    level = level.floor().clamp(min=k_min, max=k_max)
    return torch.where(level.isnan(), k_min - 1, level).to(torch.int64) - k_min


def multi_scale_roi_align(
    features: Sequence[Tensor],
    boxes: BoxesType,
    output_size: OutputSize,
    spatial_scales: Sequence[float],
    sampling_ratio: int = -1,
    aligned: bool = False,
    *,
    level_rule: Literal["torchvision", "detectron2"] = "torchvision",
    canonical_box_size: float = 224.0,
    canonical_level: int = 4,
) -> Tensor:
    """Multi-level (FPN) RoIAlign: each box is pooled from the feature map its size selects.

    Args:
        features: 1 to 5 maps ``[N, C, H_l, W_l]``, finest first, same N, C, dtype and
            device (channels_last if the first one is).
        boxes: as for :func:`roi_align`, in input-image pixels.
        output_size, sampling_ratio, aligned: as for :func:`roi_align` (mode "avg").
        spatial_scales: one per map, consecutive powers of two, e.g. ``[1/4, 1/8, 1/16, 1/32]``.
        level_rule: the level formula of torchvision's ``MultiScaleRoIAlign`` or of
            detectron2's ``ROIPooler`` (see :func:`fpn_levels`).
        canonical_box_size, canonical_level: a box of this size (pixels) goes to this level.

    Returns:
        ``Tensor[K, C, h, w]`` in box order. On CUDA all levels run in one kernel launch
        per pass, with the levels chosen on the device: no host synchronisation.

    Example::

        >>> maps = [torch.randn(2, 256, 200 // 2**i, 336 // 2**i) for i in range(4)]
        >>> boxes = [torch.tensor([[10.0, 20.0, 300.0, 250.0]]), torch.tensor([[0.0, 0.0, 64.0, 64.0]])]
        >>> roiops.multi_scale_roi_align(maps, boxes, 7, [1 / 4, 1 / 8, 1 / 16, 1 / 32], 2).shape
        torch.Size([2, 256, 7, 7])
    """
    maps = v.feature_maps(features)
    scales = v.spatial_scales(spatial_scales, len(maps), pyramid=True)
    k_min = -int(math.log2(scales[0]))
    h, w = v.output_size(output_size)
    ratio = v.sampling_ratio(sampling_ratio)
    aligned = v.flag("aligned", aligned)
    rule = v.choice("level_rule", level_rule, ("torchvision", "detectron2"))
    rois = v.rois(maps[0], boxes, max(scales))
    levels = fpn_levels(rois, k_min, k_min + len(maps) - 1, canonical_box_size, canonical_level,
                        rule)  # type: ignore[arg-type]
    return torch.ops.roiops.multi_scale_roi_align(maps, rois, levels, scales, h, w, ratio, aligned)
