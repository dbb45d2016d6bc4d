"""RoIPointPool3d in Triton (docs/semantics.md, "roipoint_pool3d").

Forward: one program per (batch, box) walks the batch's points in blocks, in point order,
placing each inside point (_jit.lidar_inside) at its running rank (a prefix sum), until the
box holds num_samples; after a barrier it repeats the n found cyclically (sample j takes
sample j mod n, written by other threads of the program) and copies each sample's point and
feature row.

Backward (deterministic, no atomics): torch sorts the (box, sample) slots of each batch by
the point they copy, stably, so that each point's slots are one run in increasing (box,
sample) order; one program per (batch, block of points, block of columns) adds its points'
runs in that order in registers and writes the coordinate and feature gradients once. Any
index works, not only the forward's cyclic rows: values outside [0, N) are dropped.
"""

from __future__ import annotations

import torch
import triton.language as tl

from .. import _kernel_checks as checks
from ._common import LAUNCH_OPTS, box_trig, cdiv, check_device, kernel, next_pow2, opmath, tile_budget
from ._jit import lidar_box, lidar_inside, lidar_point

__all__ = ["roipoint_pool3d_backward", "roipoint_pool3d_forward"]



@kernel
def _point_fwd_kernel(pts_ptr, feat_ptr, boxes_ptr, trig_ptr, pooled_ptr, empty_ptr, idx_ptr, N, C, K, S,
                      BLOCK_N: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_W: tl.constexpr):
    box = tl.program_id(0).to(tl.int64)  # b * K + m
    b = box // K
    x, y, z, dx, dy, dz, zc, c, s = lidar_box(boxes_ptr, trig_ptr, box, box >= 0)
    T = x.dtype
    first_pt = b * N  # the batch's first point row
    slots = idx_ptr + box * S
    i = tl.arange(0, BLOCK_N)
    found = tl.zeros([], tl.int32)
    p0 = tl.zeros([], tl.int32)
    while (p0 < N) & (found < S):
        p = p0 + i
        pm = p < N
        px, py, pz = lidar_point(pts_ptr, first_pt + p, pm, T)
        inside = lidar_inside(px, py, pz, x, y, dx, dy, dz, zc, c, s)[0] & pm
        hits = inside.to(tl.int32)
        at = found + tl.cumsum(hits, axis=0) - 1
        tl.store(slots + at, p, mask=inside & (at < S))
        found += tl.sum(hits, axis=0)
        p0 += BLOCK_N
    n = tl.minimum(found, S)
    tl.store(empty_ptr + box, tl.where(n == 0, 1, 0).to(tl.uint8))
    tl.debug_barrier()  # the first n slots, written by all threads, are read below

    W = C + 3
    jr = tl.arange(0, BLOCK_S)
    wr = tl.arange(0, BLOCK_W)
    for j0 in range(0, S, BLOCK_S):
        j = j0 + jr
        jm = j < S
        # Slots from n on repeat the first n cyclically; only they are written here.
        src = tl.where(j < n, j, j % tl.maximum(n, 1))
        pt = tl.load(slots + src, mask=jm & (n > 0), other=-1)
        tl.store(slots + j, pt, mask=jm & (j >= n))
        has = jm & (pt >= 0)
        row = first_pt + tl.where(has, pt, 0)
        out_row = (box * S + j) * W
        for w0 in range(0, W, BLOCK_W):
            w = w0 + wr
            wm = w < W
            xyz = tl.load(pts_ptr + row[:, None] * 3 + w[None, :], mask=has[:, None] & (w < 3)[None, :], other=0.0)
            f = tl.load(feat_ptr + row[:, None] * C + (w - 3)[None, :], mask=has[:, None] & ((w >= 3) & wm)[None, :],
                        other=0.0)
            v = tl.where((w < 3)[None, :], xyz.to(pooled_ptr.dtype.element_ty), f.to(pooled_ptr.dtype.element_ty))
            tl.store(pooled_ptr + out_row[:, None] + w[None, :], v, mask=jm[:, None] & wm[None, :])


@kernel
def _point_bwd_kernel(grad_ptr, order_ptr, bounds_ptr, gp_ptr, gf_ptr, N, C, n_pblocks,
                      BLOCK_P: tl.constexpr, BLOCK_W: tl.constexpr):
    A: tl.constexpr = tl.float64 if grad_ptr.dtype.element_ty == tl.float64 else tl.float32  # accumulation
    pid = tl.program_id(0)
    b = pid // n_pblocks
    p = (pid - b * n_pblocks) * BLOCK_P + tl.arange(0, BLOCK_P)
    pm = p < N
    W = C + 3
    w = tl.program_id(1) * BLOCK_W + tl.arange(0, BLOCK_W)
    wm = w < W
    # Point p's run in the sorted slots: [bounds[b, p], bounds[b, p + 1]).
    key = b.to(tl.int64) * (N + 1) + p
    lo = tl.load(bounds_ptr + key, mask=pm, other=0)
    hi = tl.load(bounds_ptr + key + 1, mask=pm, other=0)
    length = hi - lo
    acc = tl.zeros([BLOCK_P, BLOCK_W], A)
    for t in range(0, tl.max(length, axis=0)):
        live = t < length
        slot = tl.load(order_ptr + lo + t, mask=live, other=0)  # b * M * S + m * S + j
        m = live[:, None] & wm[None, :]
        g = tl.load(grad_ptr + slot[:, None] * W + w[None, :], mask=m, other=0.0).to(A)
        acc = tl.where(m, acc + g, acc)
    row = b.to(tl.int64) * N + p
    out = acc.to(gp_ptr.dtype.element_ty)
    tl.store(gp_ptr + row[:, None] * 3 + w[None, :], out, mask=pm[:, None] & (w < 3)[None, :])
    tl.store(gf_ptr + row[:, None] * C + (w - 3)[None, :], out, mask=pm[:, None] & ((w >= 3) & wm)[None, :])


def _blocks(on_cpu: bool) -> tuple[int, int, int]:
    """(points, samples, columns) per block: the interpreter runs each tile op as one numpy
    call; on the GPU a program's tiles stay within 2 or 16 elements a thread."""
    return (1024, 256, 64) if on_cpu else (256, 64, 32)


def roipoint_pool3d_forward(points: torch.Tensor, features: torch.Tensor, boxes: torch.Tensor,
                            num_samples: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(pooled [B, M, S, 3 + C] in the points' dtype, empty bool [B, M], index int32
    [B, M, S])``: each box's first S inside points in point order, repeated cyclically; an
    empty box has zero rows and index -1."""
    checks.roipoint_pool3d(points, features, boxes, num_samples)
    check_device(points, _point_fwd_kernel)
    (B, N, _), M, C, S = points.shape, boxes.shape[1], features.shape[2], int(num_samples)
    dev = points.device
    pooled = torch.empty((B, M, S, 3 + C), dtype=points.dtype, device=dev)
    empty = torch.empty((B, M), dtype=torch.bool, device=dev)
    index = torch.empty((B, M, S), dtype=torch.int32, device=dev)
    if B * M == 0:
        return pooled, empty, index
    boxes = boxes.to(opmath(points.dtype)).contiguous()
    block_n, block_s, block_w = _blocks(points.is_cpu)
    _point_fwd_kernel[(B * M,)](points.contiguous(), features.contiguous(), boxes, box_trig(boxes), pooled,
                                empty.view(torch.uint8), index, N, C, M, S, BLOCK_N=block_n,
                                BLOCK_S=min(next_pow2(S), block_s), BLOCK_W=min(next_pow2(3 + C), block_w),
                                num_stages=1, **LAUNCH_OPTS)
    return pooled, empty, index


def roipoint_pool3d_backward(grad: torch.Tensor, index: torch.Tensor,
                             num_points: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(grad_points [B, N, 3], grad_features [B, N, C])`` in grad's dtype: each point sums
    the gradients of the slots that copy it in increasing (box, sample) order (deterministic)."""
    checks.roipoint_pool3d_backward(grad, index, num_points)
    check_device(grad, _point_bwd_kernel)
    B, M, S, W = grad.shape
    N, C = int(num_points), W - 3
    gp = torch.empty((B, N, 3), dtype=grad.dtype, device=grad.device)
    gf = torch.empty((B, N, C), dtype=grad.dtype, device=grad.device)
    if B * N == 0:
        return gp, gf
    if M * S == 0:
        return gp.zero_(), gf.zero_()
    # Sort keys b * (N + 1) + p, point N collecting the slots outside [0, N).
    idx = index.reshape(B, M * S).to(torch.int64)
    key = torch.where((idx >= 0) & (idx < N), idx, N)
    key += torch.arange(B, dtype=torch.int64, device=grad.device)[:, None] * (N + 1)
    sorted_key, order = torch.sort(key.reshape(-1), stable=True)
    bounds = torch.searchsorted(sorted_key, torch.arange(B * (N + 1), dtype=torch.int64, device=grad.device))
    if grad.is_cpu:
        block_p, block_w = min(next_pow2(N), 256), min(next_pow2(W), 64)
    else:  # GPU_TILE elements (half for float64), the columns of a slot contiguous
        block_w = min(next_pow2(W), 16)
        block_p = tile_budget(grad.dtype) // block_w
    n_pb = cdiv(N, block_p)
    _point_bwd_kernel[(B * n_pb, cdiv(W, block_w))](grad.contiguous(), order, bounds, gp, gf, N, C, n_pb,
                                                     BLOCK_P=block_p, BLOCK_W=block_w, **LAUNCH_OPTS)
    return gp, gf
