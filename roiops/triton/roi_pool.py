"""RoIPool in Triton, both conventions of docs/semantics.md: Caffe/torchvision (default) and
mmdetection's continuous bins (``continuous=True``).

Work mapping as in roi_align.py: one program per (box, block of bins, block of channels);
bin edges are [BLOCK_P] vectors computed once per (box, bin) and shared by the channels;
the loop over a bin's cells is a run-time loop bounded by the tile's largest bin (computed
in the kernel). channels_last tiles put the channels on the fast axis (coalesced loads),
NCHW tiles the bins. Rows outermost, then columns, so the first maximum in row-major
order wins; NaN follows the contract (the first NaN wins).

Backward
--------
Fast path: an atomic add of each bin's grad at its argmax cell (float32 scratch for half
types, then a cast pass); the order of the atomics, hence the last bits, vary per run.

Deterministic path: a gather. The backward contract carries no box geometry (no scale),
so a prepass (one program per box) reads argmax once, records per (box, bin) the
bounding rectangle of the argmax cells over all channels (16 bytes per bin), and sets bit
k of the mask rows of the 8x8-pixel tiles that box k's rectangle covers (OR-ed bits: the
same mask whatever the order of the programs). Then one program per (image, tile,
channel block) walks the set bits of its row in increasing box index, skips bins whose
rectangle misses its tile, adds the grads whose argmax hits its pixels in registers and
writes its tile once: one writer per grad address and a fixed order of additions, so
bit-identical across runs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._geometry import dense
from .._kernel_checks import kernel_check
from ._common import (LAUNCH_OPTS, box_forward, box_grid, cdiv, check_device, f64_bits, from_atomic, gather_grid,
                      grad_input, kernel, next_pow2, opmath, tile_mask, use_deterministic)
from ._jit import along_c as _c  # per-channel vector -> tile axis
from ._jit import along_p as _p  # per-bin / per-pixel vector -> tile axis
from ._jit import (add_marked, beats, bin_tile, box_program, box_tile, load_roi, mark_box, pixel_tile, pool_axis,
                   store_tile, with_flag)

__all__ = ["roi_pool_backward", "roi_pool_forward"]

_BIG = tl.constexpr(2147483647)


@kernel
def _pool_fwd_kernel(
    x_ptr, rois_ptr, out_ptr, arg_ptr, scale_bits,
    N, C, H, W, ph, pw, n_pblocks,
    sxN, sxC, sxH, sxW, soK, soC, soH, soW,
    CONTINUOUS: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr, CF: tl.constexpr,
):
    T = rois_ptr.dtype.element_ty
    k, scale, ok, b, x1, y1, x2, y2, p, pm, i, j, c, cm = box_tile(rois_ptr, scale_bits, n_pblocks, N, C, ph, pw,
                                                                   BLOCK_P, BLOCK_C, CF)
    hs, he, ney = pool_axis(y1, y2, scale, i, ph, H, CONTINUOUS)
    ws, we, nex = pool_axis(x1, x2, scale, j, pw, W, CONTINUOUS)
    live = with_flag(pm, ok & ney & nex)
    he = tl.where(live, he, hs)
    we = tl.where(live, we, ws)
    max_h = tl.max(he - hs, axis=0)
    max_w = tl.max(we - ws, axis=0)

    x_base = x_ptr + b * sxN + _c(c.to(tl.int64) * sxC, CF)
    best = _p(tl.zeros([BLOCK_P], dtype=T), CF) + _c(tl.zeros([BLOCK_C], dtype=T), CF)
    arg = _p(tl.full([BLOCK_P], -1, tl.int32), CF) + _c(tl.zeros([BLOCK_C], dtype=tl.int32), CF)
    # Rows outermost, then columns: the first maximum in row-major order wins.
    for dh in range(0, max_h):
        h = hs + dh
        mh = h < he
        oh = h.to(tl.int64) * sxH
        for dw in range(0, max_w):
            w = ws + dw
            m = _p(mh & (w < we), CF) & _c(cm, CF)
            v = tl.load(x_base + _p(oh + w.to(tl.int64) * sxW, CF), mask=m, other=0.0).to(T)
            take = m & beats(v, best, arg < 0)
            best = tl.where(take, v, best)
            arg = tl.where(take, _p(h * W + w, CF), arg)

    # soH == pw * soW (forward_output): p * soW exposes contiguous NCHW stores.
    o = k * soK + _c(c.to(tl.int64) * soC, CF) + _p(p.to(tl.int64) * soW, CF)
    om = _p(pm, CF) & _c(cm, CF)
    tl.store(out_ptr + o, tl.where(arg >= 0, best, 0.0).to(out_ptr.dtype.element_ty), mask=om)
    tl.store(arg_ptr + o, arg, mask=om)


@kernel
def _pool_bwd_atomic_kernel(
    grad_ptr, arg_ptr, rois_ptr, gi_ptr,
    N, C, H, W, ph, pw, n_pblocks,
    sgK, sgC, sgH, sgW, saK, saC, saH, saW, siN, siC, siH, siW,
    BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr, CF: tl.constexpr,
):
    T = rois_ptr.dtype.element_ty
    k, pb, cb = box_program(n_pblocks)
    k64 = k.to(tl.int64)
    # No scale in the backward contract: only the batch index and finiteness are checked.
    ok, b, x1, y1, x2, y2 = load_roi(rois_ptr, k64, N, 1.0, False)
    p, pm, i, j, c, cm = bin_tile(pb, cb, ph, pw, C, BLOCK_P, BLOCK_C, CF)
    m = with_flag(_p(pm, CF) & _c(cm, CF), ok)
    c64 = c.to(tl.int64)
    i64 = i.to(tl.int64)
    j64 = j.to(tl.int64)
    a = tl.load(arg_ptr + k64 * saK + _c(c64 * saC, CF) + _p(i64 * saH + j64 * saW, CF), mask=m, other=-1)
    m = m & (a >= 0) & (a.to(tl.int64) < H.to(tl.int64) * W)
    g = tl.load(grad_ptr + k64 * sgK + _c(c64 * sgC, CF) + _p(i64 * sgH + j64 * sgW, CF), mask=m, other=0.0)
    h = tl.where(m, a // W, 0)
    w = tl.where(m, a - (a // W) * W, 0)
    dst = gi_ptr + b * siN + _c(c64 * siC, CF) + h.to(tl.int64) * siH + w.to(tl.int64) * siW
    tl.atomic_add(dst, g.to(T).to(gi_ptr.dtype.element_ty), mask=m, sem="relaxed")


@kernel
def _pool_footprint_kernel(
    arg_ptr, rois_ptr, fbin_ptr, mask_ptr,
    N, C, H, W, ph, pw, n_words,
    saK, saC, saH, saW,
    BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr, TILE_H: tl.constexpr, TILE_W: tl.constexpr,
    BLOCK_T: tl.constexpr,
):
    """Prepass of the deterministic backward, one program per box: the rectangle of each
    bin's argmax cells over all channels, and bit k of the mask rows of the gather tiles
    that box k's rectangle covers (OR-ing bits is order-free: the same mask every run)."""
    k = tl.program_id(0)
    k64 = k.to(tl.int64)
    P = ph * pw
    box_rmin = tl.full([], _BIG, tl.int32)
    box_rmax = tl.full([], -1, tl.int32)
    box_cmin = tl.full([], _BIG, tl.int32)
    box_cmax = tl.full([], -1, tl.int32)
    for p0 in range(0, P, BLOCK_P):
        p = p0 + tl.arange(0, BLOCK_P)
        pm = p < P
        i = p // pw
        j = p - i * pw
        rmin = tl.full([BLOCK_P], _BIG, tl.int32)
        rmax = tl.full([BLOCK_P], -1, tl.int32)
        cmin = tl.full([BLOCK_P], _BIG, tl.int32)
        cmax = tl.full([BLOCK_P], -1, tl.int32)
        for c0 in range(0, C, BLOCK_C):
            c = c0 + tl.arange(0, BLOCK_C)
            m = pm[:, None] & (c < C)[None, :]
            a = tl.load(arg_ptr + k64 * saK + (c.to(tl.int64) * saC)[None, :]
                        + (i.to(tl.int64) * saH + j.to(tl.int64) * saW)[:, None], mask=m, other=-1)
            has = (a >= 0) & (a.to(tl.int64) < H.to(tl.int64) * W)
            row = a // W
            col = a - row * W
            rmin = tl.minimum(rmin, tl.min(tl.where(has, row, _BIG), axis=1))
            rmax = tl.maximum(rmax, tl.max(tl.where(has, row, -1), axis=1))
            cmin = tl.minimum(cmin, tl.min(tl.where(has, col, _BIG), axis=1))
            cmax = tl.maximum(cmax, tl.max(tl.where(has, col, -1), axis=1))
        fb = fbin_ptr + (k64 * P + p) * 4
        tl.store(fb, rmin, mask=pm)
        tl.store(fb + 1, rmax, mask=pm)
        tl.store(fb + 2, cmin, mask=pm)
        tl.store(fb + 3, cmax, mask=pm)
        box_rmin = tl.minimum(box_rmin, tl.min(rmin, axis=0))
        box_rmax = tl.maximum(box_rmax, tl.max(rmax, axis=0))
        box_cmin = tl.minimum(box_cmin, tl.min(cmin, axis=0))
        box_cmax = tl.maximum(box_cmax, tl.max(cmax, axis=0))
    ok, b, x1, y1, x2, y2 = load_roi(rois_ptr, k64, N, 1.0, False)
    if ok & (box_rmax >= 0):
        first = b * (((H + TILE_H - 1) // TILE_H) * ((W + TILE_W - 1) // TILE_W))
        mark_box(mask_ptr, first, k, box_rmin, box_rmax, box_cmin, box_cmax, W, n_words, TILE_H, TILE_W, BLOCK_T)


@triton.jit
def _pool_gather_box(acc, k, grad_ptr, arg_ptr, fbin_ptr, cell, r_lo, r_hi, s_lo, s_hi, cm, c64, ph, pw,
                     sgK, sgC, sgH, sgW, saK, saC, saH, saW, CF: tl.constexpr):
    """acc plus the grads of box k's bins whose argmax cells reach the tile."""
    T = acc.dtype
    P = ph * pw
    for p in range(0, P):
        fb = fbin_ptr + (k * P + p) * 4
        hit = (tl.load(fb) <= r_hi) & (tl.load(fb + 1) >= r_lo)
        hit = hit & (tl.load(fb + 2) <= s_hi) & (tl.load(fb + 3) >= s_lo)
        if hit:
            i = p // pw
            j = p - i * pw
            a = tl.load(arg_ptr + k * saK + c64 * saC + i * saH + j * saW, mask=cm, other=-1)
            g = tl.load(grad_ptr + k * sgK + c64 * sgC + i * sgH + j * sgW, mask=cm, other=0.0).to(T)
            acc += tl.where(_p(cell, CF) == _c(a, CF), _c(g, CF), 0.0)
    return acc


@kernel
def _pool_bwd_gather_kernel(
    grad_ptr, arg_ptr, rois_ptr, gi_ptr, fbin_ptr, mask_ptr,
    C, H, W, ph, pw, n_tw, n_tiles, n_words,
    sgK, sgC, sgH, sgW, saK, saC, saH, saW, siN, siC, siH, siW,
    TILE_H: tl.constexpr, TILE_W: tl.constexpr, BLOCK_C: tl.constexpr, CF: tl.constexpr,
):
    T = rois_ptr.dtype.element_ty
    pid = tl.program_id(0)
    n = pid // n_tiles
    t = pid - n * n_tiles
    th = t // n_tw
    tw = t - th * n_tw
    cb = tl.program_id(1)

    r, s, c, cm, r_lo, r_hi, s_lo, s_hi = pixel_tile(th, tw, cb, H, W, C, TILE_H, TILE_W, BLOCK_C)
    cell = r * W + s
    c64 = c.to(tl.int64)

    acc = _p(tl.zeros([TILE_H * TILE_W], dtype=T), CF) + _c(tl.zeros([BLOCK_C], dtype=T), CF)
    # The boxes the prepass marked for this tile (valid rows of this image).
    acc = add_marked(acc, mask_ptr, pid, n_words, _pool_gather_box,
                     (grad_ptr, arg_ptr, fbin_ptr, cell, r_lo, r_hi, s_lo, s_hi, cm, c64, ph, pw,
                      sgK, sgC, sgH, sgW, saK, saC, saH, saW, CF))

    store_tile(gi_ptr, acc, n, r, s, c, cm, H, W, siN, siC, siH, siW, CF)


# ----------------------------------------------------------------------------- launchers

_check_forward = kernel_check("roi_pool")
_check_backward = kernel_check("roi_pool", "backward")


def roi_pool_forward(input: torch.Tensor, rois: torch.Tensor, spatial_scale: float, pooled_height: int,
                     pooled_width: int, continuous: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """RoIPool forward: (out, argmax int32 = h * W + w in the image plane, -1 for an empty
    bin), in the input's dtype and memory format."""
    _check_forward(input, rois, spatial_scale, pooled_height, pooled_width, continuous)
    check_device(input, _pool_fwd_kernel)
    f = box_forward(input, rois, pooled_height, pooled_width, argmax=True)
    if f.out.numel():
        f.grid.launch(_pool_fwd_kernel, (input, f.rois, f.out, f.argmax, f64_bits(spatial_scale), *f.sizes),
                      (*input.stride(), *f.out.stride()), CONTINUOUS=bool(continuous))
    return f.out, f.argmax


def roi_pool_backward(grad: torch.Tensor, argmax: torch.Tensor, rois: torch.Tensor, batch_size: int, channels: int,
                      height: int, width: int, channels_last: bool, *,
                      deterministic: bool | None = None) -> torch.Tensor:
    """Gradient of roi_pool_forward: each bin's grad goes to its argmax cell.

    deterministic: None follows roiops.config.deterministic_backward, then torch's deterministic flag;
    see the module docstring for what the deterministic path costs.
    """
    _check_backward(grad, argmax, rois, batch_size, channels, height, width, channels_last)
    check_device(grad, _pool_bwd_atomic_kernel)
    N, C, H, W = int(batch_size), int(channels), int(height), int(width)
    K, _, ph, pw = grad.shape
    rois = dense(rois, opmath(grad.dtype))
    on_cpu = grad.is_cpu
    if K == 0 or N * C * H * W == 0 or ph * pw == 0:
        return grad_input(grad, N, C, H, W, bool(channels_last)).zero_()

    if use_deterministic(deterministic):
        P = ph * pw
        fbin = torch.empty((K, P, 4), dtype=torch.int32, device=grad.device)
        tile_h, tile_w, block_c, n_tw, n_tiles = gather_grid(grad, H, W, C, bool(channels_last))
        mask = tile_mask(N * n_tiles, K, grad.device)
        fp_block_p = min(next_pow2(P), 1 << 12 if on_cpu else 64)
        fp_block_c = max(1, min(next_pow2(C), (1 << 14 if on_cpu else 1024) // fp_block_p))
        _pool_footprint_kernel[(K,)](
            argmax, rois, fbin, mask, N, C, H, W, ph, pw, mask.shape[1], *argmax.stride(),
            BLOCK_P=fp_block_p, BLOCK_C=fp_block_c, TILE_H=tile_h, TILE_W=tile_w,
            BLOCK_T=min(next_pow2(n_tw), 64), **LAUNCH_OPTS)
        gi = grad_input(grad, N, C, H, W, bool(channels_last))
        _pool_bwd_gather_kernel[(N * n_tiles, cdiv(C, block_c))](
            grad, argmax, rois, gi, fbin, mask,
            C, H, W, ph, pw, n_tw, n_tiles, mask.shape[1],
            *grad.stride(), *argmax.stride(), *gi.stride(),
            TILE_H=tile_h, TILE_W=tile_w, BLOCK_C=block_c, CF=True, **LAUNCH_OPTS)  # CF: see _align_gather.py
        return gi

    gi = grad_input(grad, N, C, H, W, bool(channels_last), atomic=True)
    box_grid(K, ph, pw, C, bool(channels_last), on_cpu).launch(
        _pool_bwd_atomic_kernel, (grad, argmax, rois, gi, N, C, H, W, ph, pw),
        (*grad.stride(), *argmax.stride(), *gi.stride()))
    return from_atomic(gi, grad.dtype)
