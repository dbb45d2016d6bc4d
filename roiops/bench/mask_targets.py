"""Mask targets' workloads: Mask R-CNN's training step on one 800x1333 image, 20 ground-truth
instances and 512 positive proposals, each target 28x28. From uint8 masks (as
torchvision's detection datasets give them): roiops' drop-in project_masks_on_boxes, which
reads the masks as stored, against torchvision's, which converts them all to float first.
From polygons (detectron2's default): roiops' polygons_crop_and_resize against detectron2's
per-proposal pycocotools rasterisation."""

from __future__ import annotations

import math
from types import ModuleType

import numpy as np
import torch
from torch import Tensor

from .._boxes import AXIS_ALIGNED
from ..compat.detectron2 import polygons_crop_and_resize
from ..compat.torchvision import project_masks_on_boxes
from ._case import Bench, Inputs, Peer, Target, Workload


def _draw(w: Workload, g: torch.Generator, dtype: torch.dtype) -> tuple[Tensor, ...]:
    """``w.n`` uint8 masks of ``w.height x w.width`` (bits at random: the kernels' work does
    not depend on them), ``w.boxes`` proposals (``dtype``) drawn as the suite draws boxes,
    and each one's mask index."""
    masks = (torch.rand(w.n, w.height, w.width, generator=g) < 0.5).to(torch.uint8)
    rois = AXIS_ALIGNED.sample(w.n, w.boxes, w.width / w.scale, w.height / w.scale, g)
    return masks, rois[:, 1:].to(dtype), rois[:, 0].long()


def _nbytes(w: Workload, inputs: tuple[Tensor, ...], out: Tensor) -> int:
    """The mask cells some proposal reads (with the bilinear margin), once each, the boxes
    and indices, and the targets written."""
    from . import covered_cells  # the runner, which imports this module while it loads

    masks, boxes, index = inputs
    cells = covered_cells(torch.cat([index[:, None].float(), boxes.float()], dim=1), w)
    return (cells * masks.element_size() + boxes.numel() * boxes.element_size()
            + index.numel() * index.element_size() + out.numel() * out.element_size())


def _torchvision_targets(tv: ModuleType, w: Workload, masks: Tensor, boxes: Tensor, index: Tensor) -> Tensor:
    return tv.models.detection.roi_heads.project_masks_on_boxes(masks, boxes, index, w.size)


BENCH: tuple[Bench, ...] = (Bench("mask_targets", "Mask targets", lambda w, m, b, i: project_masks_on_boxes(m, b, i, w.size),
               Peer("torchvision", _torchvision_targets,
                    note="its project_masks_on_boxes (torchvision.models.detection.roi_heads), which the drop-in "
                         "(roiops.compat.torchvision) equals"),
               # torchvision's targets: RoIAlign with adaptive sampling, aligned=False
               (Workload("mask targets", 20, 1, 800, 1333, 1.0, 512, 28, sampling_ratio=0, aligned=False),),
               target=Target(10, None),
               inputs=Inputs(_draw, _nbytes, lambda w: (
                   f"{w.boxes} proposals' {w.size}x{w.size} targets from {w.n} uint8 {w.height}x{w.width} "
                   f"ground-truth masks, aligned={w.aligned}"))),)


# Polygon targets: detectron2's default ground truth (COCO polygons), one instance's
# polygons per positive proposal, rasterised within the proposal's box at 28x28.
_POLYGONS: dict[int, list[list[np.ndarray]]] = {}


def _draw_polygons(w: Workload, g: torch.Generator, dtype: torch.dtype) -> tuple[Tensor, ...]:
    """``w.n`` instances of 1 to 3 polygons of 8 to 24 vertices (star-shaped about a centre,
    radii 10-150 px), packed as roiops packs them, and ``w.boxes`` proposals, each an
    instance's bounding box with its sides moved by up to 20%, with their instances."""
    coords, vertex_offsets, polygon_offsets, extents = [], [0], [0], []
    for _ in range(w.n):
        centre = torch.rand(2, generator=g) * torch.tensor([float(w.width), float(w.height)])
        points = []
        for _ in range(int(torch.randint(1, 4, (), generator=g))):
            n = int(torch.randint(8, 25, (), generator=g))
            angle = torch.sort(torch.rand(n, generator=g) * 2 * math.pi).values
            radius = 10 + torch.rand(n, generator=g) * 140
            xy = centre + torch.stack([angle.cos(), angle.sin()], dim=1) * radius[:, None]
            coords.append(xy.double().reshape(-1))
            vertex_offsets.append(vertex_offsets[-1] + n)
            points.append(xy)
        polygon_offsets.append(len(vertex_offsets) - 1)
        every = torch.cat(points)
        extents.append(torch.cat([every.min(dim=0).values, every.max(dim=0).values]))
    indices = torch.randint(0, w.n, (w.boxes,), generator=g)
    boxes = torch.stack(extents)[indices]
    side = (boxes[:, 2:] - boxes[:, :2]).repeat(1, 2)
    boxes = boxes + (torch.rand(w.boxes, 4, generator=g) - 0.5) * 0.4 * side
    return (torch.cat(coords), torch.tensor(vertex_offsets), torch.tensor(polygon_offsets), boxes.to(dtype),
            indices)


def _instances(coords: Tensor, vertex_offsets: Tensor, polygon_offsets: Tensor) -> list[list[np.ndarray]]:
    """The drawn polygons as a data loader holds them (detectron2's PolygonMasks: a list per
    instance of float64 arrays), built once per drawing, outside the timed calls."""
    key = coords.data_ptr()
    if key not in _POLYGONS:
        xy, vo, po = coords.cpu().numpy(), vertex_offsets.tolist(), polygon_offsets.tolist()
        _POLYGONS[key] = [[xy[2 * vo[i]:2 * vo[i + 1]].copy() for i in range(po[g], po[g + 1])]
                          for g in range(len(po) - 1)]
    return _POLYGONS[key]


def _roiops_polygons(w: Workload, coords: Tensor, vertex_offsets: Tensor, polygon_offsets: Tensor, boxes: Tensor,
                     indices: Tensor) -> Tensor:
    instances = _instances(coords, vertex_offsets, polygon_offsets)
    return polygons_crop_and_resize([instances[i] for i in indices.tolist()], boxes, w.size)


def _detectron2_polygons(mask_util: ModuleType, w: Workload, coords: Tensor, vertex_offsets: Tensor,
                         polygon_offsets: Tensor, boxes: Tensor, indices: Tensor) -> Tensor:
    """detectron2's PolygonMasks.crop_and_resize written out: per proposal, its instance's
    polygons shifted to the box corner, scaled to the grid, then pycocotools' frPyObjects,
    merge and decode."""
    instances = _instances(coords, vertex_offsets, polygon_offsets)
    out = []
    for i, box in zip(indices.tolist(), boxes.cpu().numpy()):
        w_, h_ = box[2] - box[0], box[3] - box[1]
        ratio_h, ratio_w = w.size / max(h_, 0.1), w.size / max(w_, 0.1)
        scaled = []
        for p in instances[i]:
            p = p.copy()
            p[0::2] = (p[0::2] - box[0]) * ratio_w
            p[1::2] = (p[1::2] - box[1]) * ratio_h
            scaled.append(p)
        rle = mask_util.merge(mask_util.frPyObjects(scaled, w.size, w.size))
        out.append(torch.from_numpy(mask_util.decode(rle).astype(bool)))
    return torch.stack(out)


def _polygon_bytes(w: Workload, inputs: tuple[Tensor, ...], out: Tensor) -> int:
    """The polygons read once per proposal, the boxes, and the targets written."""
    coords, vertex_offsets, polygon_offsets, boxes, indices = inputs
    per_instance = coords.numel() * coords.element_size() / max(w.n, 1)
    return int(per_instance * w.boxes) + boxes.numel() * boxes.element_size() + out.numel() * out.element_size()


BENCH += (Bench("mask_targets polygons", "Mask targets from polygons", _roiops_polygons,
                Peer("pycocotools.mask", _detectron2_polygons,
                     note="detectron2's PolygonMasks.crop_and_resize written out (pycocotools' rasteriser, one "
                          "proposal at a time), which roiops.compat.detectron2.polygons_crop_and_resize equals"),
                (Workload("mask targets polygons", 20, 1, 800, 1333, 1.0, 512, 28),), sampled=False,
                target=Target(10, None),
                inputs=Inputs(_draw_polygons, _polygon_bytes, lambda w: (
                    f"{w.boxes} proposals' {w.size}x{w.size} targets from {w.n} instances of 1-3 polygons of 8-24 "
                    f"vertices in a {w.height}x{w.width} image"))),)
