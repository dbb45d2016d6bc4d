"""Deformable RoI pooling in Triton (docs/semantics.md, "deform_roi_pool"): RoIAlign average
pooling with the half-cell shift, bin (i, j) of box k started (gamma * box width) *
offset[k, 0, i, j] cells right and (gamma * box height) * offset[k, 1, i, j] cells down.

The forward and the atomic backward are RoIAlign's per-box tiles (roi_align.py) with a
start per bin: each bin visits the samples of its own span near the map (sample_span), so
a bin moved far off the map costs nothing, and a bin whose start is not finite has no
samples (value 0, no gradient). Without an offset the forward is RoIAlign's, bit for bit.

The input gradient's deterministic path is RoIAlign's gather (_align_gather.py) with bins
in place of rows and columns: a prepass marks, per box, the tiles of the map (8x8 on a
GPU) that its bins' samples can reach; a program per tile and block of channels walks its
marked boxes in increasing index and their bins in order, adding (grad / count) times the
bin's separable weights over the tile (row weights x column weights, each summed over
the bin's samples that reach it), and writes its tile once: no float atomics,
bit-identical runs.

The offset gradient (deform_roi_pool_offset_backward, which reads the input) is summed by
per-box tiles over their channels and samples into a [K, channel blocks, 2, ph, pw]
buffer, which torch adds over the channel blocks in a fixed order and scales by gamma
times the box's width and height: no float atomics.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._geometry import dense
from .._kernel_checks import kernel_check
from ._align import align_box, align_tile, pool_bins
from ._common import (LAUNCH_OPTS, box_forward, box_grid, cdiv, check_device, f64_bits, from_atomic, gather_grid,
                      grad_input, kernel, next_pow2, opmath, tile_budget, tile_mask, use_deterministic)
from ._jit import (INF, add_marked, axis_slides, box_program, div_rn, load_roi, map_spans, mark_box, may_touch,
                   pixel_tile, sample_taps, scale_of, scatter_samples, store_tile, tap_slopes, tile_axis_weights,
                   touched_cells, with_flag)
from ._jit import along_c as _c  # per-channel vector -> tile axis
from ._jit import along_p as _p  # per-bin / per-pixel vector -> tile axis

__all__ = ["deform_roi_pool_backward", "deform_roi_pool_forward", "deform_roi_pool_offset_backward"]


@triton.jit
def _offset_units(rois_ptr, k, N, scale, sx, sy, gamma):
    """(gamma * roi width, gamma * roi height) of box k, whose start is (sx, sy): how far
    an offset of 1 moves its bins. The width is (x2 * scale - 0.5) - sx, as RoIAlign's."""
    _, _, _, _, x2, y2 = load_roi(rois_ptr, k, N, scale)
    return gamma * (x2 * scale - 0.5 - sx), gamma * (y2 * scale - 0.5 - sy)


@triton.jit
def _bin_starts(off_ptr, k, p, P, live, sx, sy, i, j, bw, bh, ux, uy, OFFSET: tl.constexpr):
    """Start (ybase, xbase) of bin p = (i, j) of box k: (sy + uy * offset_y) + i * bh, and x
    likewise; and `live` where the start is finite (elsewhere 0, which keeps the spans
    and addresses derived from it in range)."""
    T = sx.dtype
    if OFFSET:
        o = off_ptr + k * 2 * P + p
        sx = sx + ux * tl.load(o, mask=live, other=0.0)
        sy = sy + uy * tl.load(o + P, mask=live, other=0.0)
    ybase = sy + i.to(T) * bh
    xbase = sx + j.to(T) * bw
    live = live & (tl.abs(ybase) < INF) & (tl.abs(xbase) < INF)
    return tl.where(live, ybase, 0.0), tl.where(live, xbase, 0.0), live


@triton.jit
def _deform_tile(rois_ptr, off_ptr, scale_bits, gamma_bits, n_pblocks, N, C, ph, pw, sampling_ratio,
                 OFFSET: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr, CF: tl.constexpr):
    """The per-box kernels' prologue: box_program, then align_tile of box k (aligned, avg)
    with its bins' starts: (k as int64, pb, cb, ok, b, bw, bh, gwf, ghf, gw, gh, count, ux, uy,
    p, pm, i, j, c, cm, tile_m, ybase, xbase, live)."""
    T = rois_ptr.dtype.element_ty
    k, pb, cb = box_program(n_pblocks)
    k = k.to(tl.int64)
    scale = scale_of(scale_bits, T)
    ok, b, sx, sy, bw, bh, gwf, ghf, gw, gh, count, p, pm, i, j, c, cm, tile_m = align_tile(
        rois_ptr, k, pb, cb, k >= 0, scale, N, C, ph, pw, sampling_ratio, True, False, BLOCK_P, BLOCK_C, CF)
    ux, uy = _offset_units(rois_ptr, k, N, scale, sx, sy, scale_of(gamma_bits, T))
    ybase, xbase, live = _bin_starts(off_ptr, k, p, ph * pw, with_flag(pm, ok), sx, sy, i, j, bw, bh, ux, uy, OFFSET)
    return k, pb, cb, ok, b, bw, bh, gwf, ghf, gw, gh, count, ux, uy, p, pm, i, j, c, cm, tile_m, ybase, xbase, live


@triton.jit
def _tile_grad(grad_ptr, k, c64, i, j, tile_m, sgK, sgC, sgH, sgW, CF: tl.constexpr):
    """grad at a per-box tile's (bin, channel) elements, 0 outside tile_m."""
    return tl.load(grad_ptr + k * sgK + _c(c64 * sgC, CF) + _p(i.to(tl.int64) * sgH + j.to(tl.int64) * sgW, CF),
                   mask=tile_m, other=0.0)


@kernel
def _deform_fwd_kernel(
    x_ptr, rois_ptr, off_ptr, out_ptr, scale_bits, gamma_bits,
    N, C, H, W, ph, pw, sampling_ratio, n_pblocks,
    sxN, sxC, sxH, sxW, soK, soC, soH, soW,
    OFFSET: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr, CF: tl.constexpr,
):
    (k, pb, cb, ok, b, bw, bh, gwf, ghf, gw, gh, count, ux, uy, p, pm, i, j, c, cm, tile_m, ybase, xbase,
     live) = _deform_tile(rois_ptr, off_ptr, scale_bits, gamma_bits, n_pblocks, N, C, ph, pw, sampling_ratio, OFFSET,
                          BLOCK_P, BLOCK_C, CF)
    x_base = x_ptr + b * sxN + _c(c.to(tl.int64) * sxC, CF)
    acc, _ = pool_bins(x_base, tile_m, live, ybase, xbase, bh, bw, ghf, gwf, gh, gw, H, W, sxH, sxW,
                       False, BLOCK_P, BLOCK_C, CF)
    # out is allocated with soH == pw * soW, so bin p sits at p * soW.
    o = k * soK + _c(c.to(tl.int64) * soC, CF) + _p(p.to(tl.int64) * soW, CF)
    tl.store(out_ptr + o, div_rn(acc, count).to(out_ptr.dtype.element_ty), mask=_p(pm, CF) & _c(cm, CF))


@kernel
def _deform_bwd_atomic_kernel(
    grad_ptr, rois_ptr, off_ptr, gi_ptr, scale_bits, gamma_bits,
    N, C, H, W, ph, pw, sampling_ratio, n_pblocks,
    sgK, sgC, sgH, sgW, siN, siC, siH, siW,
    OFFSET: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr, CF: tl.constexpr,
):
    """Adds (grad / count) * w of every sample of a tile's bins to its four taps."""
    T = rois_ptr.dtype.element_ty
    (k, pb, cb, ok, b, bw, bh, gwf, ghf, gw, gh, count, ux, uy, p, pm, i, j, c, cm, tile_m, ybase, xbase,
     live) = _deform_tile(rois_ptr, off_ptr, scale_bits, gamma_bits, n_pblocks, N, C, ph, pw, sampling_ratio, OFFSET,
                          BLOCK_P, BLOCK_C, CF)
    c64 = c.to(tl.int64)
    g = _tile_grad(grad_ptr, k, c64, i, j, tile_m, sgK, sgC, sgH, sgW, CF).to(T)
    scatter_samples(gi_ptr + b * siN + _c(c64 * siC, CF), div_rn(g, count), count, live, tile_m, ybase, xbase,
                    bh, bw, ghf, gwf, H, W, siH, siW, CF, False)


@kernel
def _deform_offset_grad_kernel(
    grad_ptr, x_ptr, rois_ptr, off_ptr, part_ptr, units_ptr, scale_bits, gamma_bits,
    N, C, H, W, ph, pw, sampling_ratio, n_pblocks,
    sgK, sgC, sgH, sgW, sxN, sxC, sxH, sxW,
    BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr, CF: tl.constexpr,
):
    """Per bin of the tile, the sums over its channels and samples of (grad / count) *
    dv/dx and * dv/dy, stored in the program's own slice part[k, cb, :, bins] (part is
    [K, channel blocks, 2, ph, pw]); the programs of block (0, 0) also store the box's
    gamma * width and gamma * height in units[k] (0 for a bad row)."""
    T = rois_ptr.dtype.element_ty
    (k, pb, cb, ok, b, bw, bh, gwf, ghf, gw, gh, count, ux, uy, p, pm, i, j, c, cm, tile_m, ybase, xbase,
     live) = _deform_tile(rois_ptr, off_ptr, scale_bits, gamma_bits, n_pblocks, N, C, ph, pw, sampling_ratio, True,
                          BLOCK_P, BLOCK_C, CF)
    c64 = c.to(tl.int64)
    g = _tile_grad(grad_ptr, k, c64, i, j, tile_m, sgK, sgC, sgH, sgW, CF).to(T)
    x_base = x_ptr + b * sxN + _c(c64 * sxC, CF)
    fy, ey, ny, fx, ex, nx = map_spans(live, ybase, xbase, bh, bw, ghf, gwf, H, W)
    ax = _p(tl.zeros([BLOCK_P], dtype=T), CF) + _c(tl.zeros([BLOCK_C], dtype=T), CF)
    ay = tl.zeros_like(ax)
    for dy in range(0, tl.max(ny, axis=0)):
        y, oylo, oyhi, ly, hy, iny = sample_taps(ybase, fy + dy, bh, ghf, H, sxH)
        slides_y = _p(axis_slides(y, H), CF)
        on_y = iny & (dy < ny)
        for dx in range(0, tl.max(nx, axis=0)):
            x, oxlo, oxhi, lx, hx, inx = sample_taps(xbase, fx + dx, bw, gwf, W, sxW)
            m = tile_m & _p(on_y & inx & (dx < nx), CF)
            dvdy, dvdx = tap_slopes(x_base, m, oylo, oyhi, oxlo, oxhi, ly, hy, lx, hx, slides_y,
                                    _p(axis_slides(x, W), CF), CF)
            ax += dvdx
            ay += dvdy
    q = div_rn(g, count)
    if CF == 1:
        sx = tl.sum(q * ax, axis=1)
        sy = tl.sum(q * ay, axis=1)
    else:
        sx = tl.sum(q * ax, axis=0)
        sy = tl.sum(q * ay, axis=0)
    P = ph * pw
    out = part_ptr + (k * tl.num_programs(1) + cb) * 2 * P + p
    tl.store(out, sx, mask=pm)
    tl.store(out + P, sy, mask=pm)
    if (pb == 0) & (cb == 0):
        tl.store(units_ptr + k * 2, tl.where(ok, ux, 0.0))
        tl.store(units_ptr + k * 2 + 1, tl.where(ok, uy, 0.0))


@kernel
def _deform_tiles_kernel(
    rois_ptr, off_ptr, mask_ptr, scale_bits, gamma_bits, N, H, W, ph, pw, sampling_ratio, n_words,
    OFFSET: tl.constexpr, TILE_H: tl.constexpr, TILE_W: tl.constexpr, BLOCK: tl.constexpr,
):
    """Prepass of the deterministic backward, one program per box: sets bit k of the mask
    row of every gather tile that a sample of box k can reach, bin by bin with an offset
    (its bins may lie anywhere), else over the box. OR-ing bits is order-free."""
    k32 = tl.program_id(0)
    k = k32.to(tl.int64)
    T = rois_ptr.dtype.element_ty
    scale = scale_of(scale_bits, T)
    ok, b, sx, sy, bw, bh, gwf, ghf, gw, gh, count = align_box(rois_ptr, k, True, scale, N, ph, pw, sampling_ratio,
                                                               True, False)
    first = b * (((H + TILE_H - 1) // TILE_H) * ((W + TILE_W - 1) // TILE_W))
    if ok & (gh > 0) & (gw > 0):
        if OFFSET:
            ux, uy = _offset_units(rois_ptr, k, N, scale, sx, sy, scale_of(gamma_bits, T))
            for p in range(0, ph * pw):
                i = p // pw
                ya, xa, live = _bin_starts(off_ptr, k, p, ph * pw, ok, sx, sy, i, p - i * pw, bw, bh, ux, uy, True)
                r0, r1, rows = touched_cells(ya, ya + bh, H)
                c0, c1, cols = touched_cells(xa, xa + bw, W)
                if live & rows & cols:
                    mark_box(mask_ptr, first, k32, r0, r1, c0, c1, W, n_words, TILE_H, TILE_W, BLOCK)
        else:
            r0, r1, rows = touched_cells(sy, sy + ph * bh, H)
            c0, c1, cols = touched_cells(sx, sx + pw * bw, W)
            if rows & cols:
                mark_box(mask_ptr, first, k32, r0, r1, c0, c1, W, n_words, TILE_H, TILE_W, BLOCK)


@triton.jit
def _gather_box(
    acc, k, grad_ptr, rois_ptr, off_ptr, n, r, s, r_lo, r_hi, s_lo, s_hi, cm, c64, scale, gamma,
    N, H, W, ph, pw, sampling_ratio, sgK, sgC, sgH, sgW, OFFSET: tl.constexpr, CF: tl.constexpr,
):
    """acc plus what box k gives the tile's pixels: per bin that can reach the tile,
    (grad / count) times its row weights times its column weights over the tile."""
    T = rois_ptr.dtype.element_ty
    Hf = H.to(T)
    Wf = W.to(T)
    ok, b, sx, sy, bw, bh, gwf, ghf, gw, gh, count = align_box(rois_ptr, k, True, scale, N, ph, pw, sampling_ratio,
                                                               True, False)
    if ok & (b == n) & (gh > 0) & (gw > 0):
        ux, uy = _offset_units(rois_ptr, k, N, scale, sx, sy, gamma)
        for p in range(0, ph * pw):
            i = p // pw
            j = p - i * pw
            ya, xa, live = _bin_starts(off_ptr, k, p, ph * pw, ok, sx, sy, i, j, bw, bh, ux, uy, OFFSET)
            if live & may_touch(ya, ya + bh, r_lo, r_hi, Hf) & may_touch(xa, xa + bw, s_lo, s_hi, Wf):
                wy = tile_axis_weights(r, ya, bh, ghf, r_lo, r_hi, H)
                wx = tile_axis_weights(s, xa, bw, gwf, s_lo, s_hi, W)
                g = tl.load(grad_ptr + k * sgK + c64 * sgC + i * sgH + j * sgW, mask=cm, other=0.0).to(T)
                acc += _c(div_rn(g, count), CF) * _p(wy * wx, CF)
    return acc


@kernel
def _deform_bwd_gather_kernel(
    grad_ptr, rois_ptr, off_ptr, gi_ptr, mask_ptr, scale_bits, gamma_bits,
    N, C, H, W, ph, pw, sampling_ratio, n_tw, n_tiles, n_words,
    sgK, sgC, sgH, sgW, siN, siC, siH, siW,
    OFFSET: tl.constexpr, TILE_H: tl.constexpr, TILE_W: tl.constexpr, BLOCK_C: tl.constexpr, CF: tl.constexpr,
):
    """Pixels of one tile x a block of channels of image n: the sum of what the boxes
    marked in the tile's row of the mask give them, in box order, written once."""
    T = rois_ptr.dtype.element_ty
    pid = tl.program_id(0)
    n = pid // n_tiles
    t = pid - n * n_tiles
    th = t // n_tw
    r, s, c, cm, r_lo, r_hi, s_lo, s_hi = pixel_tile(th, t - th * n_tw, tl.program_id(1), H, W, C, TILE_H, TILE_W,
                                                     BLOCK_C)
    acc = _p(tl.zeros([TILE_H * TILE_W], dtype=T), CF) + _c(tl.zeros([BLOCK_C], dtype=T), CF)
    acc = add_marked(acc, mask_ptr, pid, n_words, _gather_box,
                     (grad_ptr, rois_ptr, off_ptr, n, r, s, r_lo.to(T), r_hi.to(T), s_lo.to(T), s_hi.to(T), cm,
                      c.to(tl.int64), scale_of(scale_bits, T), scale_of(gamma_bits, T), N, H, W, ph, pw,
                      sampling_ratio, sgK, sgC, sgH, sgW, OFFSET, CF))
    store_tile(gi_ptr, acc, n, r, s, c, cm, H, W, siN, siC, siH, siW, CF)


# ----------------------------------------------------------------------------- launchers

_check_forward = kernel_check("deform_roi_pool")
_check_backward = kernel_check("deform_roi_pool", "backward")
_check_offset = kernel_check("deform_roi_pool", "offset_backward")


def deform_roi_pool_forward(input: torch.Tensor, rois: torch.Tensor, offset: torch.Tensor | None,
                            spatial_scale: float, pooled_height: int, pooled_width: int, sampling_ratio: int,
                            gamma: float) -> torch.Tensor:
    """Deformable RoI pooling forward: [K, C, ph, pw] in the input's dtype and memory format."""
    _check_forward(input, rois, offset, spatial_scale, pooled_height, pooled_width, sampling_ratio, gamma)
    check_device(input, _deform_fwd_kernel)
    f = box_forward(input, rois, pooled_height, pooled_width, tile_budget(input.dtype), flat=True)
    if f.out.numel():
        off = f.rois if offset is None else dense(offset, f.rois.dtype)
        f.grid.launch(_deform_fwd_kernel, (input, f.rois, off, f.out, f64_bits(spatial_scale), f64_bits(gamma),
                                           *f.sizes, int(sampling_ratio)),
                      (*input.stride(), *f.out.stride()), OFFSET=offset is not None)
    return f.out


def deform_roi_pool_backward(grad: torch.Tensor, rois: torch.Tensor, offset: torch.Tensor | None,
                             spatial_scale: float, pooled_height: int, pooled_width: int, batch_size: int,
                             channels: int, height: int, width: int, sampling_ratio: int, gamma: float,
                             channels_last: bool, *, deterministic: bool | None = None) -> torch.Tensor:
    """Gradient of deform_roi_pool_forward w.r.t. its input, [N, C, H, W] in grad's dtype.

    deterministic: None follows roiops.config.deterministic_backward, then torch's
    deterministic flag.
    """
    _check_backward(grad, rois, offset, spatial_scale, pooled_height, pooled_width, batch_size, channels, height,
                    width, sampling_ratio, gamma, channels_last)
    check_device(grad, _deform_bwd_atomic_kernel)
    N, C, H, W = int(batch_size), int(channels), int(height), int(width)
    K = rois.shape[0]
    ph, pw = int(pooled_height), int(pooled_width)
    cl = bool(channels_last)
    rois = dense(rois, opmath(grad.dtype))
    off = rois if offset is None else dense(offset, rois.dtype)
    common = (grad, rois, off)
    tail = (f64_bits(spatial_scale), f64_bits(gamma), N, C, H, W, ph, pw, int(sampling_ratio))
    if K == 0 or N * C * H * W == 0:
        return grad_input(grad, N, C, H, W, cl).zero_()
    if use_deterministic(deterministic):
        gi = grad_input(grad, N, C, H, W, cl)
        tile_h, tile_w, block_c, n_tw, n_tiles = gather_grid(grad, H, W, C, cl)
        mask = tile_mask(N * n_tiles, K, grad.device)
        _deform_tiles_kernel[(K,)](rois, off, mask, *tail[:2], N, H, W, ph, pw, int(sampling_ratio), mask.shape[1],
                                   OFFSET=offset is not None, TILE_H=tile_h, TILE_W=tile_w,
                                   BLOCK=min(next_pow2(cdiv(W, tile_w)), 64), **LAUNCH_OPTS)
        _deform_bwd_gather_kernel[(N * n_tiles, cdiv(C, block_c))](
            *common, gi, mask, *tail, n_tw, n_tiles, mask.shape[1], *grad.stride(), *gi.stride(),
            # [pixels, channels] for both layouts, as RoIAlign's gather (_align_gather.py).
            OFFSET=offset is not None, TILE_H=tile_h, TILE_W=tile_w, BLOCK_C=block_c, CF=True, **LAUNCH_OPTS)
        return gi
    gi = grad_input(grad, N, C, H, W, cl, atomic=True)
    box_grid(K, ph, pw, C, cl, grad.is_cpu, tile_budget(grad.dtype)).launch(
        _deform_bwd_atomic_kernel, (*common, gi, *tail), (*grad.stride(), *gi.stride()), OFFSET=offset is not None)
    return from_atomic(gi, grad.dtype)


def deform_roi_pool_offset_backward(grad: torch.Tensor, input: torch.Tensor, rois: torch.Tensor,
                                    offset: torch.Tensor | None, spatial_scale: float, pooled_height: int,
                                    pooled_width: int, sampling_ratio: int, gamma: float) -> torch.Tensor:
    """Gradient of deform_roi_pool_forward w.r.t. the offset: offset's shape and dtype,
    contiguous; an empty [0] tensor of the input's dtype without an offset. Deterministic:
    partial sums per program, added by torch in a fixed order."""
    _check_offset(grad, input, rois, offset, spatial_scale, pooled_height, pooled_width, sampling_ratio, gamma)
    check_device(input, _deform_offset_grad_kernel)
    if offset is None:
        return torch.empty((0,), dtype=input.dtype, device=input.device)
    N, C, H, W = input.shape
    K = rois.shape[0]
    ph, pw = int(pooled_height), int(pooled_width)
    acc = opmath(input.dtype)
    if K == 0 or C == 0:
        return torch.zeros(offset.shape, dtype=offset.dtype, device=input.device)
    # Two accumulators per tile element.
    grid = box_grid(K, ph, pw, C, input.stride(1) < input.stride(3), input.is_cpu, tile_budget(input.dtype, 2))
    part = torch.empty((K, grid.n_cb, 2, ph, pw), dtype=acc, device=input.device)
    units = torch.empty((K, 2), dtype=acc, device=input.device)
    grid.launch(_deform_offset_grad_kernel, (grad, input, dense(rois, acc), dense(offset, acc), part, units,
                                             f64_bits(spatial_scale), f64_bits(gamma), N, C, H, W, ph, pw,
                                             int(sampling_ratio)),
                (*grad.stride(), *input.stride()))
    return (units[:, :, None, None] * part.sum(dim=1)).to(offset.dtype)
