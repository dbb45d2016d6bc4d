"""Points in LiDAR boxes in Triton (docs/semantics.md, "points_in_boxes"): one program per
(batch, block of points) testing a [points x boxes] tile at a time, boxes in increasing
index, with the inside test of _jit.lidar_inside. The first-box mode keeps the smallest
index per point; the all-boxes mode stores each tile's bools (boxes contiguous)."""

from __future__ import annotations

import torch
import triton.language as tl

from .. import _kernel_checks as checks
from ._common import LAUNCH_OPTS, box_trig, cdiv, check_device, kernel, next_pow2, opmath, tile_budget
from ._jit import lidar_box, lidar_inside, lidar_point

__all__ = ["points_in_boxes_forward"]

_NONE = tl.constexpr(2147483647)


@kernel
def _in_boxes_kernel(pts_ptr, boxes_ptr, trig_ptr, out_ptr, N, K, n_pblocks,
                     ALL: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_K: tl.constexpr):
    pid = tl.program_id(0)
    b = pid // n_pblocks
    p = (pid - b * n_pblocks) * BLOCK_P + tl.arange(0, BLOCK_P)
    pm = p < N
    T = boxes_ptr.dtype.element_ty
    row = b.to(tl.int64) * N + p  # point row in [B * N, 3]
    px, py, pz = lidar_point(pts_ptr, row, pm, T)
    px, py, pz = px[:, None], py[:, None], pz[:, None]
    first = tl.full([BLOCK_P], _NONE, tl.int32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        km = k < K
        x, y, z, dx, dy, dz, zc, c, s = lidar_box(boxes_ptr, trig_ptr, b.to(tl.int64) * K + k, km)
        inside, lx, ly = lidar_inside(px, py, pz, x[None, :], y[None, :], dx[None, :], dy[None, :], dz[None, :],
                                      zc[None, :], c[None, :], s[None, :])
        m = pm[:, None] & km[None, :]
        if ALL:
            tl.store(out_ptr + row[:, None] * K + k[None, :], tl.where(inside, 1, 0).to(tl.uint8), mask=m)
        else:
            first = tl.minimum(first, tl.min(tl.where(inside & m, k[None, :], _NONE), axis=1))
    if not ALL:
        tl.store(out_ptr + row, tl.where(first < _NONE, first, -1).to(tl.int64), mask=pm)


def points_in_boxes_forward(points: torch.Tensor, boxes: torch.Tensor, all_boxes: bool) -> torch.Tensor:
    """``all_boxes``: bool ``[B, N, M]``, whether box m holds point n; else int64 ``[B, N]``,
    the smallest index of a box holding the point, -1 for none."""
    checks.points_in_boxes(points, boxes, all_boxes)
    check_device(points, _in_boxes_kernel)
    (B, N, _), M = points.shape, boxes.shape[1]
    if all_boxes:
        out = torch.empty((B, N, M), dtype=torch.bool, device=points.device)
    else:
        out = torch.empty((B, N), dtype=torch.int64, device=points.device)
    if out.numel() == 0:
        return out
    if M == 0:
        return out.fill_(-1)
    boxes = boxes.to(opmath(points.dtype)).contiguous()
    on_cpu = points.is_cpu
    # GPU tiles of 512 (float32) or 256 (float64) point-box pairs, 4 or 2 a thread
    block_p = min(next_pow2(N), 1024 if on_cpu else 32)
    block_k = min(next_pow2(M), 64 if on_cpu else tile_budget(boxes.dtype) // 16)
    n_pb = cdiv(N, block_p)
    dst = out.view(torch.uint8) if all_boxes else out
    _in_boxes_kernel[(B * n_pb,)](points.contiguous(), boxes, box_trig(boxes), dst, N, M, n_pb,
                                  ALL=bool(all_boxes), BLOCK_P=block_p, BLOCK_K=block_k, **LAUNCH_OPTS)
    return out
