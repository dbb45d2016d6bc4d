"""RoIAwarePool3d (docs/semantics.md, "roiaware_pool3d"): each box's points pooled into a
grid of voxels in the box's frame, max or average over the first ``max_points`` points of a
voxel in point order. Written as whole-tensor ops (sorts, scatters) over the inside (box,
point) pairs: the vectorised PyTorch form of the operator."""

from __future__ import annotations

import torch
from torch import Tensor

from .. import _kernel_checks as checks
from ._lidar import chunks, compute_type, inside, voxel

__all__ = ["roiaware_pool3d_backward", "roiaware_pool3d_forward"]


def _pairs(points: Tensor, boxes: Tensor, grid: tuple[int, int, int]) -> tuple[Tensor, Tensor, Tensor]:
    """Every inside (box, voxel, point), ordered by box then point."""
    t = compute_type(points.dtype)
    p, b = points.to(t), boxes.to(t)
    found = []
    for part in chunks(b.shape[0], p.shape[0]):
        mask, lx, ly = inside(p, b[part])
        v = voxel(p, b[part], lx, ly, grid)
        k, n = mask.nonzero(as_tuple=True)
        found.append((k + part.start, v[k, n], n))
    if not found:
        empty = torch.zeros(0, dtype=torch.int64, device=points.device)
        return empty, empty, empty
    k, v, n = (torch.cat(c) for c in zip(*found))
    return k, v, n


def _kept(points: Tensor, boxes: Tensor, grid: tuple[int, int, int], cap: int) -> tuple[Tensor, Tensor]:
    """The kept pairs as ``(box * V + voxel, point)``: the first ``cap`` points of each voxel."""
    k, v, n = _pairs(points, boxes, grid)
    key = k * (grid[0] * grid[1] * grid[2]) + v
    order = torch.sort(key, stable=True).indices  # pairs of a voxel together, in point order
    sorted_key = key[order]
    at = torch.arange(key.numel(), device=key.device)
    new = torch.ones_like(sorted_key, dtype=torch.bool)
    new[1:] = sorted_key[1:] != sorted_key[:-1]
    start = torch.where(new, at, 0).cummax(0).values
    keep = torch.empty_like(new)
    keep[order] = at - start < cap
    return key[keep], n[keep]


def roiaware_pool3d_forward(points: Tensor, features: Tensor, boxes: Tensor, out_x: int, out_y: int, out_z: int,
                            max_points: int, max_mode: bool) -> tuple[Tensor, Tensor]:
    """``(out [K, X, Y, Z, C], saved)``: max mode saves the argmax (int32, the point index, -1
    for none); avg mode the int32 ``(count, last kept point)`` of each voxel."""
    checks.roiaware_pool3d(points, features, boxes, out_x, out_y, out_z, max_points, max_mode)
    grid = (out_x, out_y, out_z)
    K, (N, C), V = boxes.shape[0], features.shape, out_x * out_y * out_z
    a = compute_type(features.dtype)
    key, n = _kept(points, boxes, grid, max_points)
    vals = features[n].to(a)
    if max_mode:
        # The first strictly greater value in point order: the smallest point index holding
        # the maximum; NaN and -inf are never taken.
        vals = torch.where(torch.isnan(vals), -torch.inf, vals)
        rows = key[:, None].expand(-1, C)
        best = torch.full((K * V, C), -torch.inf, dtype=a, device=features.device)
        best.scatter_reduce_(0, rows, vals, "amax")
        hit = (vals == best[key]) & (vals > -torch.inf)
        arg = torch.full((K * V, C), N, dtype=torch.int64, device=features.device)
        arg.scatter_reduce_(0, rows, torch.where(hit, n[:, None], N), "amin")
        taken = arg < N
        out = torch.where(taken, features.gather(0, arg.clamp(max=max(N - 1, 0))) if N else 0, 0)
        saved = torch.where(taken, arg, -1).to(torch.int32)
        return out.to(features.dtype).reshape(K, *grid, C), saved.reshape(K, *grid, C)
    sums = torch.zeros((K * V, C), dtype=a, device=features.device).index_add_(0, key, vals)
    count = torch.bincount(key, minlength=K * V)
    out = torch.where(count[:, None] > 0, sums / count.clamp(min=1)[:, None].to(a), 0)
    last = torch.full((K * V,), -1, dtype=torch.int64, device=features.device).scatter_reduce_(0, key, n, "amax")
    saved = torch.stack([count, last], 1).to(torch.int32)
    return out.to(features.dtype).reshape(K, *grid, C), saved.reshape(K, *grid, 2)


def roiaware_pool3d_backward(grad: Tensor, saved: Tensor, points: Tensor, boxes: Tensor, num_points: int,
                             max_mode: bool) -> Tensor:
    """The features' gradient ``[N, C]``: max sends each output's gradient to its argmax; avg
    sends ``grad * (1 / count)`` to every kept point of the voxel (``point <= last``)."""
    checks.roiaware_pool3d_backward(grad, saved, points, boxes, num_points, max_mode)
    K, X, Y, Z, C = grad.shape
    a = compute_type(grad.dtype)
    g = grad.reshape(K * X * Y * Z, C).to(a)
    out = torch.zeros((num_points, C), dtype=a, device=grad.device)
    if max_mode:
        arg = saved.reshape(-1, C).long()
        taken = arg >= 0
        flat = arg * C + torch.arange(C, device=grad.device)
        out.view(-1).index_add_(0, flat[taken], g[taken])  # in box order, as the kernels add
        return out.to(grad.dtype)
    count, last = saved.reshape(-1, 2).long().unbind(1)
    k, v, n = _pairs(points, boxes, (X, Y, Z))
    key = k * (X * Y * Z) + v
    kept = n <= last[key]
    key, n = key[kept], n[kept]
    share = 1 / count.clamp(min=1).to(a)  # the reciprocal, then a product: mmcv's backward
    out.index_add_(0, n, g[key] * share[key, None])
    return out.to(grad.dtype)
