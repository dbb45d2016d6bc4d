"""RoIAwarePool3d in Triton (docs/semantics.md, "roiaware_pool3d").

Forward: one program per box walks the points in blocks, in point order. A block's inside
points get their voxel (_jit.lidar_voxel) and their rank among the block's earlier points of
the same voxel (a [block x block] comparison); with the voxel's running count (int32 per
voxel, in the avg mode's saved count column, in a scratch row for max) a point is kept while
count + rank < max_points: the first max_points inside points of each voxel. The kept points
then update their voxels' rows in rounds of equal rank, so that the points of a round have
distinct voxels and each voxel sees its points in point order: max keeps the first strictly
greater value (out starts at 0 with argmax -1, compared as -inf), avg adds in the
accumulation type (float32, float64 for float64 features; a scratch unless out has that
dtype), and the count and last kept point follow. The running state lives in global memory
that only this program touches; a barrier separates each step that reads what another
thread of the program wrote (and each write from earlier reads of the same address), and
the program ends with the avg division.

Backward (deterministic, no atomics): one program per (block of points, block of channels)
adds its points' contributions over the boxes in increasing index in registers and writes
them once. Each point's voxel in a box is recomputed from the geometry: max takes grad where
argmax names the point; avg takes grad * (1 / max(count, 1)) where the point is kept, i.e.
not after the voxel's last kept point.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import _kernel_checks as checks
from ._common import LAUNCH_OPTS, box_trig, cdiv, check_device, kernel, next_pow2, opmath, tile_budget
from ._jit import div_rn, lidar_box, lidar_inside, lidar_point, lidar_voxel

__all__ = ["roiaware_pool3d_backward", "roiaware_pool3d_forward"]

_NEG_INF = tl.constexpr(float("-inf"))


@triton.jit
def _box_points(pts_ptr, p, pm, x, y, dx, dy, dz, zc, c, s):
    """Points p (mask pm) of the cloud: (pz, inside, lx, ly) for the box (lidar_inside)."""
    px, py, pz = lidar_point(pts_ptr, p.to(tl.int64), pm, x.dtype)
    inside, lx, ly = lidar_inside(px, py, pz, x, y, dx, dy, dz, zc, c, s)
    return pz, inside & pm, lx, ly


@triton.jit
def _pool_points(feat_ptr, out_ptr, arg_ptr, cnt_ptr, acc_ptr, p, inside, vox, box_v, C, max_points,
                 MAX_MODE: tl.constexpr, CS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr):
    """Adds a block of points, in point order, to their voxels' rows (vox: each inside
    point's voxel): the kept ones, in rounds of equal rank among the block's points of a
    voxel."""
    A: tl.constexpr = tl.float64 if feat_ptr.dtype.element_ty == tl.float64 else tl.float32  # accumulation
    i = tl.arange(0, BLOCK_N)
    vox = tl.where(inside, vox, -1)
    same = (vox[:, None] == vox[None, :]) & (i[None, :] < i[:, None])
    rank = tl.sum(same.to(tl.int32), axis=1)
    row = box_v + tl.where(inside, vox, 0)
    prior = tl.load(cnt_ptr + row * CS, mask=inside, other=0)
    tl.debug_barrier()  # every prior count read before any is rewritten
    kept = inside & (rank < max_points - prior)
    rounds = tl.max(tl.where(kept, rank + 1, 0), axis=0)
    feat = feat_ptr + p.to(tl.int64)[:, None] * C
    for r in range(0, rounds):
        sel = kept & (rank == r)  # distinct voxels
        for c0 in range(0, C, BLOCK_C):
            ch = c0 + tl.arange(0, BLOCK_C)
            m = sel[:, None] & (ch < C)[None, :]
            f = tl.load(feat + ch[None, :], mask=m, other=0.0).to(A)
            o = row[:, None] * C + ch[None, :]
            if MAX_MODE:
                best = tl.load(out_ptr + o, mask=m, other=0.0).to(A)
                a = tl.load(arg_ptr + o, mask=m, other=0)
                take = m & (f > tl.where(a < 0, _NEG_INF, best))
                tl.store(out_ptr + o, f.to(out_ptr.dtype.element_ty), mask=take)
                tl.store(arg_ptr + o, p[:, None] + tl.zeros([BLOCK_N, BLOCK_C], tl.int32), mask=take)
            else:
                tl.store(acc_ptr + o, tl.load(acc_ptr + o, mask=m, other=0.0) + f, mask=m)
        tl.store(cnt_ptr + row * CS, prior + r + 1, mask=sel)
        if not MAX_MODE:
            tl.store(cnt_ptr + row * CS + 1, p, mask=sel)
        tl.debug_barrier()  # the next round (or block) reads these rows


@kernel
def _aware_fwd_kernel(pts_ptr, feat_ptr, boxes_ptr, trig_ptr, out_ptr, arg_ptr, cnt_ptr, acc_ptr,
                      N, C, ox, oy, oz, max_points,
                      MAX_MODE: tl.constexpr, SCAN: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr,
                      BLOCK_F: tl.constexpr):
    # max: out and arg [K, V, C], cnt [K, V]; avg: acc [K, V, C] (out itself for float32
    # and float64 features) and cnt the saved [K, V, 2] (count, last kept point).
    A: tl.constexpr = tl.float64 if feat_ptr.dtype.element_ty == tl.float64 else tl.float32  # accumulation
    CS: tl.constexpr = 1 if MAX_MODE else 2
    k = tl.program_id(0).to(tl.int64)
    V = ox * oy * oz
    box_v = k * V  # first voxel row of this box
    VC = V.to(tl.int64) * C
    x, y, z, dx, dy, dz, zc, c, s = lidar_box(boxes_ptr, trig_ptr, k, k >= 0)
    fr = tl.arange(0, BLOCK_F)

    # The box's rows start empty: 0 (argmax -1) or a zero sum; count 0, last -1.
    for v0 in range(0, V, BLOCK_F):
        v = v0 + fr
        tl.store(cnt_ptr + (box_v + v) * CS, tl.zeros([BLOCK_F], tl.int32), mask=v < V)
        if not MAX_MODE:
            tl.store(cnt_ptr + (box_v + v) * CS + 1, tl.full([BLOCK_F], -1, tl.int32), mask=v < V)
    for e0 in range(0, VC, BLOCK_F):
        e = e0 + fr
        em = e < VC
        if MAX_MODE:
            tl.store(out_ptr + k * VC + e, tl.zeros([BLOCK_F], A).to(out_ptr.dtype.element_ty), mask=em)
            tl.store(arg_ptr + k * VC + e, tl.full([BLOCK_F], -1, tl.int32), mask=em)
        else:
            tl.store(acc_ptr + k * VC + e, tl.zeros([BLOCK_F], A), mask=em)
    tl.debug_barrier()

    # Most of the cloud is outside any one box: test SCAN points at a time, and pool the
    # blocks of those that hold some inside point.
    for s0 in range(0, N, SCAN):
        scan = s0 + tl.arange(0, SCAN)
        _, any_in, _, _ = _box_points(pts_ptr, scan, scan < N, x, y, dx, dy, dz, zc, c, s)
        if tl.max(any_in.to(tl.int32), axis=0) > 0:
            for p0 in range(s0, tl.minimum(s0 + SCAN, N), BLOCK_N):
                p = p0 + tl.arange(0, BLOCK_N)
                pz, inside, lx, ly = _box_points(pts_ptr, p, p < N, x, y, dx, dy, dz, zc, c, s)
                if tl.max(inside.to(tl.int32), axis=0) > 0:
                    vox = lidar_voxel(lx, ly, pz, z, dx, dy, dz, ox, oy, oz)
                    _pool_points(feat_ptr, out_ptr, arg_ptr, cnt_ptr, acc_ptr, p, inside, vox, box_v, C,
                                 max_points, MAX_MODE, CS, BLOCK_N, BLOCK_C)

    if not MAX_MODE:
        # out = sum / count in the accumulation type, 0 for an empty voxel.
        for e0 in range(0, VC, BLOCK_F):
            e = e0 + fr
            em = e < VC
            n = tl.load(cnt_ptr + (box_v + e // C) * CS, mask=em, other=0)
            total = tl.load(acc_ptr + k * VC + e, mask=em, other=0.0)
            avg = tl.where(n > 0, div_rn(total, tl.maximum(n, 1).to(A)), 0.0)
            tl.store(out_ptr + k * VC + e, avg.to(out_ptr.dtype.element_ty), mask=em)


@kernel
def _aware_bwd_kernel(grad_ptr, saved_ptr, pts_ptr, boxes_ptr, trig_ptr, gf_ptr,
                      N, C, K, ox, oy, oz,
                      MAX_MODE: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    A: tl.constexpr = tl.float64 if grad_ptr.dtype.element_ty == tl.float64 else tl.float32  # accumulation
    T = boxes_ptr.dtype.element_ty
    p = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    pm = p < N
    ch = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    cm = ch < C
    px, py, pz = lidar_point(pts_ptr, p.to(tl.int64), pm, T)
    V = ox * oy * oz
    acc = tl.zeros([BLOCK_P, BLOCK_C], A)
    for k in range(0, K):
        k64 = tl.zeros([], tl.int64) + k
        x, y, z, dx, dy, dz, zc, c, s = lidar_box(boxes_ptr, trig_ptr, k64, k64 >= 0)
        inside, lx, ly = lidar_inside(px, py, pz, x, y, dx, dy, dz, zc, c, s)
        inside = inside & pm
        if tl.max(inside.to(tl.int32), axis=0) > 0:
            row = k64 * V + tl.where(inside, lidar_voxel(lx, ly, pz, z, dx, dy, dz, ox, oy, oz), 0)
            o = row[:, None] * C + ch[None, :]
            m = inside[:, None] & cm[None, :]
            if MAX_MODE:
                a = tl.load(saved_ptr + o, mask=m, other=-1)
                hit = m & (a == p[:, None])
                g = tl.load(grad_ptr + o, mask=hit, other=0.0).to(A)
                acc = tl.where(hit, acc + g, acc)
            else:
                n = tl.load(saved_ptr + row * 2, mask=inside, other=0)
                last = tl.load(saved_ptr + row * 2 + 1, mask=inside, other=-1)
                share = div_rn(tl.full([BLOCK_P], 1.0, A), tl.maximum(n, 1).to(A))  # mmcv: a reciprocal, then products
                hit = m & (p <= last)[:, None]
                g = tl.load(grad_ptr + o, mask=hit, other=0.0).to(A)
                acc = tl.where(hit, acc + g * share[:, None], acc)
    tl.store(gf_ptr + p.to(tl.int64)[:, None] * C + ch[None, :], acc.to(gf_ptr.dtype.element_ty),
             mask=pm[:, None] & cm[None, :])


def _forward_blocks(on_cpu: bool, C: int) -> tuple[int, int, int, int]:
    """(SCAN, BLOCK_N, BLOCK_C, BLOCK_F): points per inside test, points per pooled block
    (its rank comparison is BLOCK_N^2), channels per round tile, elements per init or
    division step. The interpreter runs each tile op as one numpy call; on the GPU tiles
    stay within a few elements a thread."""
    if on_cpu:
        return 1024, 256, min(next_pow2(C), 64), 1 << 14
    return 256, 32, min(next_pow2(C), 8), 512


def _backward_blocks(on_cpu: bool, C: int, dtype: torch.dtype) -> tuple[int, int]:
    """(BLOCK_P, BLOCK_C) of the backward's [points x channels] tiles."""
    if on_cpu:
        return 256, min(next_pow2(C), 64)
    block_c = min(next_pow2(C), 8)
    return tile_budget(dtype) // block_c, block_c


def roiaware_pool3d_forward(points: torch.Tensor, features: torch.Tensor, boxes: torch.Tensor, out_x: int,
                            out_y: int, out_z: int, max_points: int,
                            max_mode: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out [K, out_x, out_y, out_z, C] in the features' dtype, saved int32)``: max saves
    the argmax ``[K, X, Y, Z, C]`` (-1 where no point was taken); avg ``[K, X, Y, Z, 2]``,
    each voxel's (count, last kept point or -1)."""
    checks.roiaware_pool3d(points, features, boxes, out_x, out_y, out_z, max_points, max_mode)
    check_device(points, _aware_fwd_kernel)
    ox, oy, oz = int(out_x), int(out_y), int(out_z)
    K, (N, C) = boxes.shape[0], features.shape
    dev = features.device
    out = torch.empty((K, ox, oy, oz, C), dtype=features.dtype, device=dev)
    saved = torch.empty((K, ox, oy, oz, C if max_mode else 2), dtype=torch.int32, device=dev)
    if K == 0:
        return out, saved
    boxes = boxes.to(opmath(points.dtype)).contiguous()
    acc_dtype = opmath(features.dtype)
    if max_mode:
        arg, cnt, acc = saved, torch.empty((K, ox, oy, oz), dtype=torch.int32, device=dev), out
    else:
        arg, cnt = saved, saved
        acc = out if features.dtype == acc_dtype else torch.empty(out.shape, dtype=acc_dtype, device=dev)
    scan, block_n, block_c, block_f = _forward_blocks(points.is_cpu, C)
    _aware_fwd_kernel[(K,)](points.contiguous(), features.contiguous(), boxes, box_trig(boxes), out, arg, cnt, acc,
                            N, C, ox, oy, oz, int(max_points), MAX_MODE=bool(max_mode), SCAN=scan, BLOCK_N=block_n,
                            BLOCK_C=block_c, BLOCK_F=block_f, num_stages=1, **LAUNCH_OPTS)
    return out, saved


def roiaware_pool3d_backward(grad: torch.Tensor, saved: torch.Tensor, points: torch.Tensor, boxes: torch.Tensor,
                             num_points: int, max_mode: bool) -> torch.Tensor:
    """The features' gradient ``[N, C]`` in grad's dtype, summed over the boxes in
    increasing index (deterministic)."""
    checks.roiaware_pool3d_backward(grad, saved, points, boxes, num_points, max_mode)
    check_device(grad, _aware_bwd_kernel)
    K, ox, oy, oz, C = grad.shape
    N = int(num_points)
    gf = torch.empty((N, C), dtype=grad.dtype, device=grad.device)
    if gf.numel() == 0:
        return gf
    if K == 0:
        return gf.zero_()
    boxes = boxes.to(opmath(points.dtype)).contiguous()
    block_p, block_c = _backward_blocks(grad.is_cpu, C, grad.dtype)
    _aware_bwd_kernel[(cdiv(N, block_p), cdiv(C, block_c))](grad.contiguous(), saved.contiguous(),
                                                             points.contiguous(), boxes, box_trig(boxes), gf,
                                                             N, C, K, ox, oy, oz,
                                                MAX_MODE=bool(max_mode), BLOCK_P=block_p, BLOCK_C=block_c,
                                                **LAUNCH_OPTS)
    return gf
