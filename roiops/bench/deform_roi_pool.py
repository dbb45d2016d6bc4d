"""Deformable RoI pooling's workloads: mmdetection's deformable Faster R-CNN box head
(DeformRoIPoolPack on a stride-4 level), its second pooling with offsets given, against
roiops' RoIAlign on the same boxes."""

import torch
from torch import Tensor

from ..ops.deform_roi_pool import deform_roi_pool
from ._case import Bench, Peer, Target, Workload

_offset: dict[tuple[int, int, int], Tensor] = {}


def _offsets(boxes: Tensor, size: int) -> Tensor:
    """The offsets for these boxes, made once (outside the timed calls): small, as a trained
    head predicts them, and differentiable, as in training."""
    key = (boxes.data_ptr(), boxes.shape[0], size)
    if key not in _offset:
        g = torch.Generator().manual_seed(0)
        _offset.clear()
        _offset[key] = (0.5 * torch.randn(boxes.shape[0], 2, size, size, generator=g)).to(
            boxes.device, boxes.dtype).requires_grad_()
    return _offset[key]


BENCH = (Bench("deform_roi_pool", "Deformable RoI pooling",
               lambda w, x, b: deform_roi_pool(x, b, _offsets(b, w.size), w.size, w.scale, w.sampling_ratio),
               Peer("roiops", lambda r, w, x, b: r.roi_align(x, b, w.size, w.scale, w.sampling_ratio, aligned=True),
                    same_result=False, note="its own roi_align(aligned=True) on the same boxes, no offset"),
               (Workload("deformable box head", 2, 256, 200, 336, 1 / 4, 1024, 7),
                Workload("deformable box head adaptive", 2, 256, 200, 336, 1 / 4, 1024, 7, sampling_ratio=0)),
               target=Target(1 / 1.3, 1 / 1.3)),)
