"""Precise RoIPool in Triton (docs/semantics.md, "prroi_pool"): the exact integral of the
bilinearly interpolated map over each bin, divided by the bin's area.

The interpolation's weights are separable, so bin (i, j)'s integral is the sum over cells
(h, w) of F[h, w] * Iy(h) * Ix(w), where Ix(w) is the integral of the hat max(0, 1 - |x - w|)
over the bin's columns [xs, xs + dw] (hat_integral in _jit.py, given xs - w and dw).
Only the cells floor(xs) to ceil(xe) (and likewise rows), clipped to the map, can have a
non-zero weight: every loop below runs over them with a run-time bound, so a bin costs
what it covers of the map.

Forward and the atomic backward: one program per (box, block of bins, block of channels),
the tiles of roi_align.py's forward (channels the fast axis for channels_last input, bins for NCHW);
a bin's window and cell range are [BLOCK_P] vectors shared by the tile's channels.

Input backward
--------------
Fast path: each tile adds ``grad / area * Iy(h) * Ix(w)`` to the cells of its bins with
atomic adds (into a float32 scratch for half types, then one cast pass); the order of the
atomics, and so the last bits, vary between runs.

Deterministic path (``torch.are_deterministic_algorithms_enabled()``,
``roiops.config.deterministic_backward`` or ``deterministic=True``): the gather of
_align_gather.py. A prepass (one program per box) sets bit k of the mask rows of the 8x8-cell
tiles that box k's bins can reach; then one program per (tile, block of channels) walks
the set bits in increasing box index, adds each bin's terms to its cells in registers and
writes its tile once: bit-identical from run to run.

Box backward
------------
One program per (box, block of bins, block of channels) integrates, besides the output,
the map along each of its bins' four edges, forms the gradient with respect to the edges
(docs/semantics.md), sums it over the tile's channels and bins with the chain rule to
x1, y1, x2, y2, and writes these four partial sums; torch adds a box's partial sums in a
fixed order. No float atomics: deterministic on every path. Where the map's interpolant
has a kink under an edge (an edge on a cell centre) the edge integrals give the value at
that edge, which is continuous there: the derivative is defined except where x2 == x1 or
y2 == y1, where the bin is empty and the gradient is 0.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._geometry import dense
from .._kernel_checks import kernel_check
from ._common import (LAUNCH_OPTS, box_forward, box_grid, cdiv, check_device, f64_bits, from_atomic, gather_grid,
                      grad_input, kernel, next_pow2, opmath, tile_budget, tile_mask, use_deterministic)
from ._jit import (add_marked, box_tile, div_rn, hat, hat_integral, load_roi, mark_box, may_touch, pixel_tile, scale_of,
                   store_tile, touched_cells, with_flag)
from ._jit import along_c as _c  # per-channel vector -> tile axis
from ._jit import along_p as _p  # per-bin / per-pixel vector -> tile axis

__all__ = ["prroi_pool_backward", "prroi_pool_forward", "prroi_pool_rois_backward"]


@triton.jit
def _axis(c1, c2, scale, idx, pooled):
    """Bin idx's window [start, end] along one axis and its size max(c2 - c1, 0) * scale / pooled."""
    size = div_rn(tl.maximum(c2 - c1, 0.0) * scale, pooled.to(c1.dtype))
    start = c1 * scale + idx * size
    return start, start + size, size


@triton.jit
def _cells(start, end, size, live):
    """First cell and number of cells, of an axis of `size` cells (a float), whose hat can
    overlap [start, end]: floor(start) to ceil(end), clipped to the map; none unless live."""
    first = tl.minimum(tl.maximum(tl.floor(start), 0.0), size)
    last = tl.minimum(tl.ceil(end), size - 1.0)
    n = tl.where(live, tl.maximum(last - first + 1.0, 0.0), 0.0)
    return first.to(tl.int32), n.to(tl.int32)  # both in [0, size]


@triton.jit
def _bins(ok, pm, x1, y1, x2, y2, scale, i, j, ph, pw, H, W):
    """The windows of a tile's bins (i, j) and the cells to visit: (ys, ye, dh, h0, nh, xs,
    xe, dw, w0, nw, area), area 0 for a bin that is empty, masked or of a bad row."""
    T = x1.dtype
    ys, ye, dh = _axis(y1, y2, scale, i, ph)
    xs, xe, dw = _axis(x1, x2, scale, j, pw)
    area = tl.where(with_flag(pm, ok), dw * dh, 0.0)
    h0, nh = _cells(ys, ye, H.to(T), area > 0)
    w0, nw = _cells(xs, xe, W.to(T), area > 0)
    return ys, ye, dh, h0, nh, xs, xe, dw, w0, nw, area


@triton.jit
def _sum_c(v, CF: tl.constexpr):
    """A tile's sum over its channels: a per-bin vector."""
    if CF:
        r = tl.sum(v, axis=1)
    else:
        r = tl.sum(v, axis=0)
    return r


@kernel
def _prroi_fwd_kernel(
    x_ptr, rois_ptr, out_ptr, scale_bits,
    N, C, H, W, ph, pw, n_pblocks,
    sxN, sxC, sxH, sxW, soK, soC, soH, soW,
    BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr, CF: tl.constexpr,
):
    """Bins [pb * BLOCK_P, +BLOCK_P) x channels [cb * BLOCK_C, +BLOCK_C) of box k."""
    T = rois_ptr.dtype.element_ty
    k, scale, ok, b, x1, y1, x2, y2, p, pm, i, j, c, cm = box_tile(rois_ptr, scale_bits, n_pblocks, N, C, ph, pw,
                                                                   BLOCK_P, BLOCK_C, CF)
    ys, ye, dh, h0, nh, xs, xe, dw, w0, nw, area = _bins(ok, pm, x1, y1, x2, y2, scale, i, j, ph, pw, H, W)

    x_base = x_ptr + b * sxN + _c(c.to(tl.int64) * sxC, CF)
    cmask = _c(cm, CF)
    acc = _p(tl.zeros([BLOCK_P], dtype=T), CF) + _c(tl.zeros([BLOCK_C], dtype=T), CF)
    for dy in range(0, tl.max(nh, axis=0)):
        h = h0 + dy
        wy = hat_integral(ys - h.to(T), dh)
        row = dy < nh
        oh = h.to(tl.int64) * sxH
        for dx in range(0, tl.max(nw, axis=0)):
            w = w0 + dx
            wx = hat_integral(xs - w.to(T), dw)
            m = _p(row & (dx < nw), CF) & cmask
            v = tl.load(x_base + _p(oh + w.to(tl.int64) * sxW, CF), mask=m, other=0.0).to(T)
            acc += v * _p(wy * wx, CF)

    # out has soH == pw * soW (forward_output): bin p sits at p * soW.
    o = k * soK + _c(c.to(tl.int64) * soC, CF) + _p(p.to(tl.int64) * soW, CF)
    res = tl.where(_p(area > 0, CF), div_rn(acc, _p(tl.where(area > 0, area, 1.0), CF)), 0.0)
    tl.store(out_ptr + o, res.to(out_ptr.dtype.element_ty), mask=_p(pm, CF) & cmask)


@kernel
def _prroi_bwd_atomic_kernel(
    grad_ptr, rois_ptr, gi_ptr, scale_bits,
    N, C, H, W, ph, pw, n_pblocks,
    sgK, sgC, sgH, sgW, siN, siC, siH, siW,
    BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr, CF: tl.constexpr,
):
    """Scatters the grad of bins [pb * BLOCK_P, +BLOCK_P) x channels [cb * BLOCK_C, +BLOCK_C) of box k."""
    T = rois_ptr.dtype.element_ty
    G = gi_ptr.dtype.element_ty
    k, scale, ok, b, x1, y1, x2, y2, p, pm, i, j, c, cm = box_tile(rois_ptr, scale_bits, n_pblocks, N, C, ph, pw,
                                                                   BLOCK_P, BLOCK_C, CF)
    ys, ye, dh, h0, nh, xs, xe, dw, w0, nw, area = _bins(ok, pm, x1, y1, x2, y2, scale, i, j, ph, pw, H, W)

    c64 = c.to(tl.int64)
    cmask = _c(cm, CF)
    g = tl.load(grad_ptr + k * sgK + _c(c64 * sgC, CF)
                + _p(i.to(tl.int64) * sgH + j.to(tl.int64) * sgW, CF),
                mask=_p(area > 0, CF) & cmask, other=0.0).to(T)
    q = div_rn(g, _p(tl.where(area > 0, area, 1.0), CF))
    gi_base = gi_ptr + b * siN + _c(c64 * siC, CF)
    for dy in range(0, tl.max(nh, axis=0)):
        h = h0 + dy
        wy = hat_integral(ys - h.to(T), dh)
        row = dy < nh
        oh = h.to(tl.int64) * siH
        for dx in range(0, tl.max(nw, axis=0)):
            w = w0 + dx
            wx = hat_integral(xs - w.to(T), dw)
            m = _p(row & (dx < nw), CF) & cmask
            tl.atomic_add(gi_base + _p(oh + w.to(tl.int64) * siW, CF), (q * _p(wy * wx, CF)).to(G), mask=m,
                          sem="relaxed")


@kernel
def _prroi_tiles_kernel(
    rois_ptr, mask_ptr, scale_bits, N, H, W, ph, pw, n_words,
    TILE_H: tl.constexpr, TILE_W: tl.constexpr, BLOCK: tl.constexpr,
):
    """Prepass of the deterministic backward, one program per box: sets bit k of the mask
    rows of the gather tiles that box k's bins can reach (OR-ed bits: the same mask
    whatever the order of the programs)."""
    k = tl.program_id(0)
    T = rois_ptr.dtype.element_ty
    scale = scale_of(scale_bits, T)
    ok, b, x1, y1, x2, y2 = load_roi(rois_ptr, k.to(tl.int64), N, scale)
    sy, _ey, dh = _axis(y1, y2, scale, 0, ph)
    sx, _ex, dw = _axis(x1, x2, scale, 0, pw)
    # The bins span [sy, sy + ph * dh] up to rounding, which touched_cells' slack of a
    # cell each side covers.
    r0, r1, rows = touched_cells(sy, sy + ph * dh, H)
    c0, c1, cols = touched_cells(sx, sx + pw * dw, W)
    if ok & (dw * dh > 0) & rows & cols:
        first = b * (((H + TILE_H - 1) // TILE_H) * ((W + TILE_W - 1) // TILE_W))
        mark_box(mask_ptr, first, k, r0, r1, c0, c1, W, n_words, TILE_H, TILE_W, BLOCK)


@triton.jit
def _gather_box(acc, k, grad_ptr, rois_ptr, rf, sf, r_lo, r_hi, s_lo, s_hi, cm, c64, scale, N, H, W, ph, pw,
                sgK, sgC, sgH, sgW, CF: tl.constexpr):
    """acc plus what box k's bins give the tile's cells (rows rf, columns sf as floats)."""
    T = rois_ptr.dtype.element_ty
    Hf = H.to(T)
    Wf = W.to(T)
    ok, b, x1, y1, x2, y2 = load_roi(rois_ptr, k, N, scale)
    for i in range(0, ph):
        ys, ye, dh = _axis(y1, y2, scale, i, ph)
        if may_touch(ys, ye, r_lo, r_hi, Hf):
            wy = hat_integral(ys - rf, dh)
            rows = (rf >= tl.floor(ys)) & (rf <= tl.ceil(ye))
            for j in range(0, pw):
                xs, xe, dw = _axis(x1, x2, scale, j, pw)
                if may_touch(xs, xe, s_lo, s_hi, Wf):
                    wx = hat_integral(xs - sf, dw)
                    g = tl.load(grad_ptr + k * sgK + c64 * sgC + i * sgH + j * sgW, mask=cm, other=0.0).to(T)
                    # The prepass marks only boxes of positive area. Only the bin's cells
                    # (those the atomic path visits) take its terms: a non-finite grad
                    # times a zero weight would be NaN.
                    cells = rows & (sf >= tl.floor(xs)) & (sf <= tl.ceil(xe))
                    acc += tl.where(_p(cells, CF), _c(div_rn(g, dw * dh), CF) * _p(wy * wx, CF), 0.0)
    return acc


@kernel
def _prroi_bwd_gather_kernel(
    grad_ptr, rois_ptr, gi_ptr, mask_ptr, scale_bits,
    N, C, H, W, ph, pw, n_tw, n_tiles, n_words,
    sgK, sgC, sgH, sgW, siN, siC, siH, siW,
    TILE_H: tl.constexpr, TILE_W: tl.constexpr, BLOCK_C: tl.constexpr, CF: tl.constexpr,
):
    """Cells of tile t of image n x channels [cb * BLOCK_C, +BLOCK_C): the sum of what the
    boxes marked in the tile's mask row give them, in box order."""
    T = rois_ptr.dtype.element_ty
    pid = tl.program_id(0)
    n = pid // n_tiles
    t = pid - n * n_tiles
    th = t // n_tw
    scale = scale_of(scale_bits, T)
    r, s, c, cm, r_lo, r_hi, s_lo, s_hi = pixel_tile(th, t - th * n_tw, tl.program_id(1), H, W, C, TILE_H, TILE_W,
                                                     BLOCK_C)
    c64 = c.to(tl.int64)
    rf = r.to(T)
    sf = s.to(T)
    r_lo, r_hi, s_lo, s_hi = r_lo.to(T), r_hi.to(T), s_lo.to(T), s_hi.to(T)

    acc = _p(tl.zeros([TILE_H * TILE_W], dtype=T), CF) + _c(tl.zeros([BLOCK_C], dtype=T), CF)
    acc = add_marked(acc, mask_ptr, pid, n_words, _gather_box,
                     (grad_ptr, rois_ptr, rf, sf, r_lo, r_hi, s_lo, s_hi, cm, c64, scale, N, H, W, ph, pw,
                      sgK, sgC, sgH, sgW, CF))

    store_tile(gi_ptr, acc, n, r, s, c, cm, H, W, siN, siC, siH, siW, CF)


@kernel
def _prroi_rois_bwd_kernel(
    grad_ptr, x_ptr, rois_ptr, part_ptr, scale_bits,
    N, C, H, W, ph, pw, n_pblocks,
    sgK, sgC, sgH, sgW, sxN, sxC, sxH, sxW,
    BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr, CF: tl.constexpr,
):
    """Box k's gradient from bins [pb * BLOCK_P, +BLOCK_P) x channels [cb * BLOCK_C, +BLOCK_C):
    four partial sums (x1, y1, x2, y2) at part[(program_id(0) * n_cblocks + cb) * 4]."""
    T = rois_ptr.dtype.element_ty
    k, scale, ok, b, x1, y1, x2, y2, p, pm, i, j, c, cm = box_tile(rois_ptr, scale_bits, n_pblocks, N, C, ph, pw,
                                                                   BLOCK_P, BLOCK_C, CF)
    ys, ye, dh, h0, nh, xs, xe, dw, w0, nw, area = _bins(ok, pm, x1, y1, x2, y2, scale, i, j, ph, pw, H, W)

    c64 = c.to(tl.int64)
    cmask = _c(cm, CF)
    x_base = x_ptr + b * sxN + _c(c64 * sxC, CF)
    zero = _p(tl.zeros([BLOCK_P], dtype=T), CF) + _c(tl.zeros([BLOCK_C], dtype=T), CF)
    # The integral over the bin, and over its edges xs, xe (along y) and ys, ye (along x).
    acc = zero
    e_xs = zero
    e_xe = zero
    e_ys = zero
    e_ye = zero
    for dy in range(0, tl.max(nh, axis=0)):
        h = h0 + dy
        hf = h.to(T)
        wy = _p(hat_integral(ys - hf, dh), CF)
        at_ys = _p(hat(ys - hf), CF)
        at_ye = _p(hat(ys - hf + dh), CF)
        row = dy < nh
        oh = h.to(tl.int64) * sxH
        for dx in range(0, tl.max(nw, axis=0)):
            w = w0 + dx
            wf = w.to(T)
            m = _p(row & (dx < nw), CF) & cmask
            v = tl.load(x_base + _p(oh + w.to(tl.int64) * sxW, CF), mask=m, other=0.0).to(T)
            vy = v * wy
            vx = v * _p(hat_integral(xs - wf, dw), CF)
            acc += vx * wy
            e_xs += vy * _p(hat(xs - wf), CF)
            e_xe += vy * _p(hat(xs - wf + dw), CF)
            e_ys += vx * at_ys
            e_ye += vx * at_ye

    live = area > 0
    a = _p(tl.where(live, area, 1.0), CF)
    g = tl.load(grad_ptr + k * sgK + _c(c64 * sgC, CF)
                + _p(i.to(tl.int64) * sgH + j.to(tl.int64) * sgW, CF),
                mask=_p(live, CF) & cmask, other=0.0).to(T)
    ga = div_rn(g, a)
    out = div_rn(acc, a)
    # grad * d out / d edge, summed over the tile's channels: per bin.
    g_xs = _sum_c(ga * (out * _p(dh, CF) - e_xs), CF)
    g_xe = _sum_c(ga * (e_xe - out * _p(dh, CF)), CF)
    g_ys = _sum_c(ga * (out * _p(dw, CF) - e_ys), CF)
    g_ye = _sum_c(ga * (e_ye - out * _p(dw, CF)), CF)
    # Chain rule: xs = x1 * s + j * (x2 - x1) * s / pw, xe the same with j + 1.
    pwf = pw.to(T)
    phf = ph.to(T)
    fx0 = div_rn(j.to(T), pwf)
    fx1 = div_rn((j + 1).to(T), pwf)
    fy0 = div_rn(i.to(T), phf)
    fy1 = div_rn((i + 1).to(T), phf)
    gx1 = tl.sum((1.0 - fx0) * g_xs + (1.0 - fx1) * g_xe, axis=0) * scale
    gx2 = tl.sum(fx0 * g_xs + fx1 * g_xe, axis=0) * scale
    gy1 = tl.sum((1.0 - fy0) * g_ys + (1.0 - fy1) * g_ye, axis=0) * scale
    gy2 = tl.sum(fy0 * g_ys + fy1 * g_ye, axis=0) * scale
    out_ptr = part_ptr + (tl.program_id(0).to(tl.int64) * tl.num_programs(1) + tl.program_id(1)) * 4
    tl.store(out_ptr, gx1)
    tl.store(out_ptr + 1, gy1)
    tl.store(out_ptr + 2, gx2)
    tl.store(out_ptr + 3, gy2)


# ----------------------------------------------------------------------------- launchers

_check_forward = kernel_check("prroi_pool")
_check_backward = kernel_check("prroi_pool", "backward")
_check_rois_backward = kernel_check("prroi_pool", "rois_backward")


def prroi_pool_forward(input: torch.Tensor, rois: torch.Tensor, spatial_scale: float, pooled_height: int,
                       pooled_width: int) -> torch.Tensor:
    """Precise RoIPool forward: [K, C, ph, pw] in the input's dtype and memory format."""
    _check_forward(input, rois, spatial_scale, pooled_height, pooled_width)
    check_device(input, _prroi_fwd_kernel)
    f = box_forward(input, rois, pooled_height, pooled_width, tile_budget(input.dtype))
    if f.out.numel():
        f.grid.launch(_prroi_fwd_kernel, (input, f.rois, f.out, f64_bits(spatial_scale), *f.sizes),
                      (*input.stride(), *f.out.stride()))
    return f.out


def prroi_pool_backward(grad: torch.Tensor, rois: torch.Tensor, spatial_scale: float, pooled_height: int,
                        pooled_width: int, batch_size: int, channels: int, height: int, width: int,
                        channels_last: bool, *, deterministic: bool | None = None) -> torch.Tensor:
    """Gradient of prroi_pool_forward w.r.t. its input, [N, C, H, W] in grad's dtype.

    deterministic: None follows roiops.config.deterministic_backward, then torch's deterministic flag;
    see the module docstring for the two paths.
    """
    _check_backward(grad, rois, spatial_scale, pooled_height, pooled_width, batch_size, channels, height, width,
                    channels_last)
    check_device(grad, _prroi_bwd_atomic_kernel)
    N, C, H, W = int(batch_size), int(channels), int(height), int(width)
    K = rois.shape[0]
    ph, pw = int(pooled_height), int(pooled_width)
    rois = dense(rois, opmath(grad.dtype))
    if K == 0 or N * C * H * W == 0:
        return grad_input(grad, N, C, H, W, bool(channels_last)).zero_()
    bits = f64_bits(spatial_scale)

    if use_deterministic(deterministic):
        gi = grad_input(grad, N, C, H, W, bool(channels_last))
        tile_h, tile_w, block_c, n_tw, n_tiles = gather_grid(grad, H, W, C, bool(channels_last))
        mask = tile_mask(N * n_tiles, K, grad.device)
        _prroi_tiles_kernel[(K,)](
            rois, mask, bits, N, H, W, ph, pw, mask.shape[1],
            TILE_H=tile_h, TILE_W=tile_w, BLOCK=min(next_pow2(n_tw), 64), **LAUNCH_OPTS)
        _prroi_bwd_gather_kernel[(N * n_tiles, cdiv(C, block_c))](
            grad, rois, gi, mask, bits, N, C, H, W, ph, pw, n_tw, n_tiles, mask.shape[1],
            *grad.stride(), *gi.stride(),
            TILE_H=tile_h, TILE_W=tile_w, BLOCK_C=block_c, CF=True, **LAUNCH_OPTS)  # CF: see _align_gather.py
        return gi

    gi = grad_input(grad, N, C, H, W, bool(channels_last), atomic=True)
    box_grid(K, ph, pw, C, bool(channels_last), grad.is_cpu, tile_budget(grad.dtype)).launch(
        _prroi_bwd_atomic_kernel, (grad, rois, gi, bits, N, C, H, W, ph, pw), (*grad.stride(), *gi.stride()))
    return from_atomic(gi, grad.dtype)


def prroi_pool_rois_backward(grad: torch.Tensor, input: torch.Tensor, rois: torch.Tensor, spatial_scale: float,
                             pooled_height: int, pooled_width: int) -> torch.Tensor:
    """Gradient of prroi_pool_forward w.r.t. the box coordinates: [K, 5] in rois' dtype,
    zero in the batch-index column and in rows that are not valid boxes (deterministic:
    see the module docstring)."""
    _check_rois_backward(grad, input, rois, spatial_scale, pooled_height, pooled_width)
    check_device(input, _prroi_rois_bwd_kernel)
    N, C, H, W = input.shape
    K = rois.shape[0]
    ph, pw = int(pooled_height), int(pooled_width)
    grad_rois = torch.zeros((K, 5), dtype=rois.dtype, device=rois.device)
    if K == 0 or C == 0:
        return grad_rois
    T = opmath(input.dtype)
    # Five accumulators per tile element.
    grid = box_grid(K, ph, pw, C, input.stride(1) < input.stride(3), input.is_cpu, tile_budget(input.dtype, 4))
    part = torch.empty((K, grid.n_pb, grid.n_cb, 4), dtype=T, device=input.device)
    grid.launch(_prroi_rois_bwd_kernel, (grad, input, dense(rois, T), part, f64_bits(spatial_scale),
                                         N, C, H, W, ph, pw), (*grad.stride(), *input.stride()))
    grad_rois[:, 1:] = part.sum(dim=(1, 2))
    return grad_rois
