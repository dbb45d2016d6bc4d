"""Mask targets (Mask R-CNN training): each proposal's ground-truth mask cropped and resized
to the mask head's grid, read straight from bool, uint8 or floating masks, or rasterised
from polygons within the box. Registered ops and public function. Semantics:
docs/semantics.md, "mask_targets"."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from .. import _backend
from .. import _validation as v
from ._declare import define_plain, fx_leaf


def _forward(masks: Tensor, rois: Tensor, pooled_height: int, pooled_width: int, sampling_ratio: int, aligned: bool,
             threshold: float, binary: bool) -> Tensor:
    return _backend.kernels_of(masks).mask_targets_forward(masks, rois, pooled_height, pooled_width, sampling_ratio,
                                                           aligned, threshold, binary)


def _fake(masks: Tensor, rois: Tensor, pooled_height: int, pooled_width: int, sampling_ratio: int, aligned: bool,
          threshold: float, binary: bool) -> Tensor:
    dtype = torch.bool if binary else masks.dtype if masks.is_floating_point() else torch.float32
    return masks.new_empty((rois.shape[0], pooled_height, pooled_width), dtype=dtype)


def _polygon_forward(coords: Tensor, vertex_offsets: Tensor, polygon_offsets: Tensor, boxes: Tensor,
                     indices: Tensor, size: int) -> Tensor:
    kernels = _backend.kernels_of(coords)
    # Polygons are host data (lists the data loader holds): the Triton set has no kernel.
    kernel = getattr(kernels, "polygon_targets_forward", None) or \
        _backend.kernels(torch.device("cpu")).polygon_targets_forward
    return kernel(coords, vertex_offsets, polygon_offsets, boxes, indices, size)


def _polygon_fake(coords: Tensor, vertex_offsets: Tensor, polygon_offsets: Tensor, boxes: Tensor, indices: Tensor,
                  size: int) -> Tensor:
    return boxes.new_empty((boxes.shape[0], size, size), dtype=torch.bool)


_targets = define_plain("mask_targets", "(Tensor masks, Tensor rois, int pooled_height, int pooled_width, "
                        "int sampling_ratio, bool aligned, float threshold, bool binary) -> Tensor", _forward, _fake)
_polygon_targets = define_plain("polygon_targets", "(Tensor coords, Tensor vertex_offsets, Tensor polygon_offsets, "
                                "Tensor boxes, Tensor indices, int size) -> Tensor", _polygon_forward, _polygon_fake)


def targets(masks: Tensor, rois: Tensor, output_size: tuple[int, int], sampling_ratio: int, aligned: bool,
            threshold: float | None) -> Tensor:
    """The op on checked arguments (``rois`` ``[P, 5]`` of rows ``(index, x1, y1, x2, y2)``)."""
    return _targets(masks, rois, *output_size, sampling_ratio, aligned, 0.0 if threshold is None else threshold,
                    threshold is not None)


def polygon_targets(polygons: list[Any], boxes: Tensor, indices: Tensor, size: int) -> Tensor:
    """Polygon targets on checked arguments, on the boxes' device. An instance that appears
    more than once (the same list object: detectron2's masks indexed per proposal) is
    packed once."""
    index_of: dict[int, int] = {}
    unique: list[Any] = []
    remap = []
    for instance in polygons:
        u = index_of.get(id(instance))
        if u is None:
            u = index_of[id(instance)] = len(unique)
            unique.append(instance)
        remap.append(u)
    rows = indices.to("cpu", torch.int64)
    if len(unique) < len(polygons):
        rows = torch.tensor(remap, dtype=torch.int64)[rows]
    coords, vertex_offsets, polygon_offsets = v.packed_polygons(unique)
    out = _polygon_targets(coords, vertex_offsets, polygon_offsets,
                                   boxes.detach().to("cpu", torch.float32).contiguous(), rows, size)
    return out.to(boxes.device)


@fx_leaf
def mask_targets(masks: Tensor | list[Any], boxes: Tensor, indices: Tensor, output_size: int | tuple[int, int], *,
                 aligned: bool = True, sampling_ratio: int = 0, threshold: float | None = None) -> Tensor:
    """Mask R-CNN's mask targets: proposal p's ground-truth mask ``masks[indices[p]]``
    cropped to ``boxes[p]`` and resized to ``output_size`` by RoIAlign ("avg"), reading the
    masks as they are stored: no float copy of the ``[G, H, W]`` masks is made.

    Each value equals ``roi_align(masks[:, None].float(), rois, output_size, 1.0,
    sampling_ratio, aligned)`` bit for bit (torchvision's arithmetic), where ``rois`` holds
    ``(indices[p], *boxes[p])``. Work grows with the proposals' sampling grids, memory with
    the output.

    Masks may also be polygons, as COCO annotations give them: instance ``indices[p]``'s
    polygons are rasterised within ``boxes[p]`` onto a square grid by pycocotools' rule,
    bit for bit detectron2's ``PolygonMasks.crop_and_resize`` (no pycocotools needed).
    Semantics: docs/semantics.md, "mask_targets".

    Args:
        masks: ``Tensor[G, H, W]`` of ground-truth masks: bool, uint8 or floating (any
            dtype roiops' maps take); or polygons: a list of G instances, each a list of
            polygons, each a flat sequence ``[x0, y0, x1, y1, ...]`` (list, numpy array or
            tensor) in mask pixels. Polygons give bool targets; ``aligned``,
            ``sampling_ratio`` and ``threshold`` do not apply to them (left at their
            defaults), and the output must be square.
        boxes: ``Tensor[P, 4]`` of proposals ``(x1, y1, x2, y2)`` in mask pixels, any
            floating dtype.
        indices: ``Tensor[P]`` of integers: the mask of each proposal, in ``[0, G)``.
        output_size: the targets' size, an int ``s`` for ``(s, s)`` or a pair ``(h, w)``.
        aligned: shift the boxes by half a pixel, as RoIAlign's ``aligned=True``
            (detectron2's targets); torchvision's targets use False.
        sampling_ratio: samples per bin side; ``<= 0`` adaptive (``ceil`` of the bin's
            side), as RoIAlign's.
        threshold: None returns the soft targets (floating masks' dtype, float32 for bool
            and uint8 masks); a real returns bool targets, True where the value is ``>=
            threshold`` (detectron2 uses 0.5).

    Returns:
        ``Tensor[P, h, w]``. No gradient flows to the masks.

    Examples:
        >>> masks = torch.zeros(2, 32, 32, dtype=torch.bool)
        >>> masks[1, 8:24, 8:24] = True
        >>> boxes = torch.tensor([[8.0, 8.0, 24.0, 24.0], [0.0, 0.0, 16.0, 16.0]])
        >>> t = roiops.mask_targets(masks, boxes, torch.tensor([1, 1]), 4)
        >>> t[0].tolist() == [[1.0] * 4] * 4, t[1].tolist()
        (True, [[0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 1.0, 1.0], [0.0, 0.0, 1.0, 1.0]])
    """
    if isinstance(masks, (list, tuple)):
        size = v.output_size(output_size)
        if size[0] != size[1]:
            raise ValueError(f"output_size must be square for polygons, got {size}")
        if v.flag("aligned", aligned) is not True or v.sampling_ratio(sampling_ratio) != 0 or threshold is not None:
            raise ValueError("aligned, sampling_ratio and threshold do not apply to polygons: leave them at their "
                             "defaults")
        v.polygon_rows(masks, boxes, indices)
        return polygon_targets(masks, boxes, indices, size[0])
    masks = v.target_masks(masks).detach()
    rois = v.target_rois(masks, boxes, indices).detach()
    return targets(masks, rois, v.output_size(output_size), v.sampling_ratio(sampling_ratio),
                   v.flag("aligned", aligned), v.threshold(threshold))
