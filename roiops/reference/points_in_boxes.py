"""Points in LiDAR boxes (docs/semantics.md, "points_in_boxes"): for each point, the first
box that holds it, or every box that does."""

from __future__ import annotations

import torch
from torch import Tensor

from .. import _kernel_checks as checks
from ._lidar import chunks, compute_type, inside

__all__ = ["points_in_boxes_forward"]


def points_in_boxes_forward(points: Tensor, boxes: Tensor, all_boxes: bool) -> Tensor:
    """``all_boxes``: bool ``[B, N, M]``; else int64 ``[B, N]``, the smallest index of a box
    holding the point, -1 for none."""
    checks.points_in_boxes(points, boxes, all_boxes)
    (B, N, _), M = points.shape, boxes.shape[1]
    t = compute_type(points.dtype)
    if all_boxes:
        out = torch.zeros((B, N, M), dtype=torch.bool, device=points.device)
    else:
        out = torch.full((B, N), -1, dtype=torch.int64, device=points.device)
    for b in range(B):
        p = points[b].to(t)
        for part in chunks(M, N):
            mask = inside(p, boxes[b, part].to(t))[0]
            if all_boxes:
                out[b, :, part] = mask.T
            else:
                # argmax over bools: the first True
                found = mask.any(0) & (out[b] < 0)
                out[b] = torch.where(found, mask.byte().argmax(0) + part.start, out[b])
    return out
