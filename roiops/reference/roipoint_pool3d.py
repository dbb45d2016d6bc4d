"""RoIPointPool3d (docs/semantics.md, "roipoint_pool3d"): each box's first ``num_samples``
points in point order, repeated cyclically when it holds fewer, as rows of coordinates and
features."""

from __future__ import annotations

import torch
from torch import Tensor

from .. import _kernel_checks as checks
from ._lidar import chunks, compute_type, inside

__all__ = ["roipoint_pool3d_backward", "roipoint_pool3d_forward"]


def roipoint_pool3d_forward(points: Tensor, features: Tensor, boxes: Tensor,
                            num_samples: int) -> tuple[Tensor, Tensor, Tensor]:
    """``(pooled [B, M, S, 3 + C], empty bool [B, M], index int32 [B, M, S])``; an empty box
    has zero rows and index -1."""
    checks.roipoint_pool3d(points, features, boxes, num_samples)
    (B, N, _), M, S = points.shape, boxes.shape[1], num_samples
    t = compute_type(points.dtype)
    index = torch.full((B, M, S), -1, dtype=torch.int64, device=points.device)
    j = torch.arange(S, device=points.device)
    for b in range(B):
        p = points[b].to(t)
        for part in chunks(M, N):
            mask = inside(p, boxes[b, part].to(t))[0]
            rank = mask.long().cumsum(1) - 1
            box, point = (mask & (rank < S)).nonzero(as_tuple=True)
            first = torch.full((mask.shape[0], S), -1, dtype=torch.int64, device=points.device)
            first[box, rank[box, point]] = point
            n = mask.sum(1).clamp(max=S)
            index[b, part] = first.gather(1, j % n.clamp(min=1)[:, None])
    empty = index[..., 0] < 0
    # A zero row for the empty boxes to copy (also when there are no points at all).
    rows = torch.cat([torch.cat([points, features], -1), points.new_zeros((B, 1, 3 + features.shape[-1]))], 1)
    pooled = rows.gather(1, torch.where(index < 0, N, index).reshape(B, M * S, 1).expand(-1, -1, rows.shape[-1]))
    pooled = pooled.reshape(B, M, S, rows.shape[-1])
    return pooled, empty, index.to(torch.int32)


def roipoint_pool3d_backward(grad: Tensor, index: Tensor, num_points: int) -> tuple[Tensor, Tensor]:
    """``(grad_points [B, N, 3], grad_features [B, N, C])``: each pooled row's gradient
    added to the point it copies."""
    checks.roipoint_pool3d_backward(grad, index, num_points)
    B, M, S, W = grad.shape
    a = compute_type(grad.dtype)
    g = grad.reshape(B, M * S, W).to(a)
    idx = index.reshape(B, M * S).long()
    out = torch.zeros((B, num_points, W), dtype=a, device=grad.device)
    for b in range(B):
        taken = idx[b] >= 0
        out[b].index_add_(0, idx[b][taken], g[b][taken])
    out = out.to(grad.dtype)
    return out[..., :3].contiguous(), out[..., 3:].contiguous()
