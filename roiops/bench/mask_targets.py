"""Mask targets' workload: Mask R-CNN's training step on one 800x1333 image, 20 ground-truth
masks stored as uint8 (as torchvision's detection datasets give them) and 512 positive
proposals, each target 28x28. roiops' drop-in project_masks_on_boxes, which reads the
masks as stored, against torchvision's, which converts them all to float first."""

from __future__ import annotations

from types import ModuleType

import torch
from torch import Tensor

from .._boxes import AXIS_ALIGNED
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


BENCH = (Bench("mask_targets", "Mask targets", lambda w, m, b, i: project_masks_on_boxes(m, b, i, w.size),
               Peer("torchvision", _torchvision_targets,
                    note="its project_masks_on_boxes (torchvision.models.detection.roi_heads), which the drop-in "
                         "(roiops.compat.torchvision) equals"),
               # torchvision's targets: RoIAlign with adaptive sampling, aligned=False
               (Workload("mask targets", 20, 1, 800, 1333, 1.0, 512, 28, sampling_ratio=0, aligned=False),),
               target=Target(10, None),
               inputs=Inputs(_draw, _nbytes, lambda w: (
                   f"{w.boxes} proposals' {w.size}x{w.size} targets from {w.n} uint8 {w.height}x{w.width} "
                   f"ground-truth masks, aligned={w.aligned}"))),)
