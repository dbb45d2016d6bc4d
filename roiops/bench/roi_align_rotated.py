"""Rotated RoIAlign's workloads: a box head on the stride-4 map, and detectron2's rotated
Faster R-CNN box head (ROIAlignRotated, adaptive sampling) on a stride-8 map. Timed against
roiops' own RoIAlign on the same boxes unrotated: what the rotation costs."""

import torch
from torch import Tensor

from .._boxes import ROTATED
from ..ops.roi_align_rotated import roi_align_rotated
from ._case import Bench, Peer, Target, Workload


def _unrotated(rois: Tensor) -> Tensor:
    """The axis-aligned ``[K, 5]`` box each rotated box is at angle 0."""
    i, cx, cy, w, h = rois[:, :5].unbind(1)
    return torch.stack([i, cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], dim=1)


BENCH = (Bench("roi_align_rotated", "RoIAlign rotated",
               lambda w, x, b: roi_align_rotated(x, b, w.size, w.scale, w.sampling_ratio, w.aligned),
               Peer("roiops",
                    lambda r, w, x, b: r.roi_align(x, _unrotated(b), w.size, w.scale, w.sampling_ratio, w.aligned),
                    same_result=False, note="its own axis-aligned roi_align on the same boxes unrotated"),
               (Workload("rotated box head", 2, 256, 200, 336, 1 / 4, 1000, 7),
                Workload("rotated rpn adaptive", 2, 256, 100, 168, 1 / 8, 512, 7, sampling_ratio=0)),
               boxes=ROTATED, target=Target(1 / 1.5, 1 / 1.5, devices=("cpu", "cuda"))),)
