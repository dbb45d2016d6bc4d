"""Bezier alignment in Triton (docs/semantics.md, "bezier_align"): bin (i, j) of box k
averages a grid of bilinear samples around its centre between the box's two cubic Bezier
curves, at u = j / pw, v = i / ph.

The forward and the atomic backward are RoIAlign's per-box tiles (roi_align.py) with a
start per bin, as deformable RoI pooling's (deform_roi_pool.py): each bin visits the
samples of its own span near the map (sample_span). The bins' centres are computed in
the kernels, per bin, in the C++ kernels' mixed float64 arithmetic (_bernstein), so that
every backend places the samples at the same bits.

The input gradient's deterministic path is deformable RoI pooling's gather: a prepass
marks, per box, the map tiles its bins' samples can reach; a program per tile and block
of channels walks its marked boxes in increasing index and their bins in order, and
writes its tile once: no float atomics, bit-identical runs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._geometry import dense
from .._kernel_checks import kernel_check
from ._align import pool_bins
from ._common import (LAUNCH_OPTS, box_forward, box_grid, cdiv, check_device, f64_bits, from_atomic, gather_grid,
                      grad_input, kernel, next_pow2, opmath, tile_budget, tile_mask, use_deterministic)
from ._jit import (INF, MAX_COORD, add_marked, bin_grid, bin_tile, box_program, div_rn, mark_box, may_touch,
                   pixel_tile, scale_of, scatter_samples, store_tile, tile_axis_weights, touched_cells, with_flag)
from ._jit import along_c as _c  # per-channel vector -> tile axis
from ._jit import along_p as _p  # per-bin / per-pixel vector -> tile axis

__all__ = ["bezier_align_backward", "bezier_align_forward"]

ROW = tl.constexpr(17)  # (batch_index, x0, y0, ..., x7, y7)


@triton.jit
def _point(rois_ptr, k, n, scale):
    """Coordinate n (0..15: x0, y0, ..., x7, y7) of box k's row, scaled."""
    return tl.load(rois_ptr + k * ROW + 1 + n) * scale


@triton.jit
def _bezier_box(rois_ptr, k, N, scale, ph, pw, sampling_ratio, ALIGNED: tl.constexpr):
    """Box k's (int64) row check and sizes: (ok, b, bw, bh, gwf, ghf, count). ok is False
    for a batch index that is not an integer in [0, N) or a coordinate beyond MAX_COORD
    cells after scaling (NaN fails every comparison); such a row has batch 0 and no
    samples. Bins are the larger end-point span of the two curves over the output side."""
    bf = tl.load(rois_ptr + k * ROW)
    ok = (bf >= 0) & (bf < N) & (bf == tl.floor(bf))
    for n in tl.static_range(16):
        ok = ok & (tl.abs(_point(rois_ptr, k, n, scale)) <= MAX_COORD)
    # The top curve runs from point 0 to point 3, the bottom one (stored right to left) from 7 to 4.
    rw = tl.maximum(tl.abs(_point(rois_ptr, k, 0, scale) - _point(rois_ptr, k, 6, scale)),
                    tl.abs(_point(rois_ptr, k, 14, scale) - _point(rois_ptr, k, 8, scale)))
    rh = tl.maximum(tl.abs(_point(rois_ptr, k, 1, scale) - _point(rois_ptr, k, 7, scale)),
                    tl.abs(_point(rois_ptr, k, 15, scale) - _point(rois_ptr, k, 9, scale)))
    _, _, bw, bh, gwf, ghf, count = bin_grid(tl.where(ok, rw, 0.0), tl.where(ok, rh, 0.0), ph, pw, sampling_ratio,
                                             ALIGNED)
    return ok, tl.where(ok, bf, 0.0).to(tl.int64), bw, bh, tl.where(ok, gwf, 0.0), tl.where(ok, ghf, 0.0), count


@triton.jit
def _bernstein(p0, p1, p2, p3, u):
    """The cubic Bezier curve at u (T): the first three terms in float64, u^3 p3 in T, the
    sum in float64 rounded once to T (the C++ kernels' and _geometry.bezier_point's order)."""
    ud = u.to(tl.float64)
    om = 1.0 - ud
    a = om * om * om * p0.to(tl.float64)
    b = 3.0 * ud * om * om * p1.to(tl.float64)
    c = 3.0 * ud * ud * om * p2.to(tl.float64)
    d = u * u * u * p3
    return (a + b + c + d.to(tl.float64)).to(p0.dtype)


@triton.jit
def _centre(rois_ptr, k, a, scale, u, v, v_rest, ALIGNED: tl.constexpr):
    """Axis a's (0: x, 1: y) coordinate of the bins' centres at (u, v): the bottom curve's
    point times v in T, plus the top one's times 1 - v in float64, minus the half cell
    when aligned, rounded once."""
    top = _bernstein(_point(rois_ptr, k, a, scale), _point(rois_ptr, k, 2 + a, scale),
                     _point(rois_ptr, k, 4 + a, scale), _point(rois_ptr, k, 6 + a, scale), u)
    bottom = _bernstein(_point(rois_ptr, k, 14 + a, scale), _point(rois_ptr, k, 12 + a, scale),
                        _point(rois_ptr, k, 10 + a, scale), _point(rois_ptr, k, 8 + a, scale), u)
    c = (bottom * v).to(tl.float64) + top.to(tl.float64) * v_rest
    if ALIGNED:
        c = c - 0.5
    return c.to(u.dtype)


@triton.jit
def _bin_starts(rois_ptr, k, live, scale, i, j, ph, pw, bw, bh, ALIGNED: tl.constexpr):
    """Start (ybase, xbase) of bins (i, j) of box k, their centres minus half a bin; and
    `live` where the box is valid (elsewhere 0, which keeps the spans and addresses
    derived from it in range)."""
    T = bw.dtype
    u = div_rn(j.to(T), pw.to(T))
    v = div_rn(i.to(T), ph.to(T))
    v_rest = 1.0 - v.to(tl.float64)
    ybase = _centre(rois_ptr, k, 1, scale, u, v, v_rest, ALIGNED) - 0.5 * bh
    xbase = _centre(rois_ptr, k, 0, scale, u, v, v_rest, ALIGNED) - 0.5 * bw
    live = live & (tl.abs(ybase) < INF) & (tl.abs(xbase) < INF)
    return tl.where(live, ybase, 0.0), tl.where(live, xbase, 0.0), live


@triton.jit
def _bezier_tile(rois_ptr, scale_bits, n_pblocks, N, C, ph, pw, sampling_ratio, ALIGNED: tl.constexpr,
                 BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr, CF: tl.constexpr):
    """The per-box kernels' prologue: box_program, box k's geometry and the program's tile
    of it with its bins' starts: (k as int64, b, bw, bh, gwf, ghf, count, p, pm, i, j, c,
    cm, tile_m, ybase, xbase, live)."""
    T = rois_ptr.dtype.element_ty
    k, pb, cb = box_program(n_pblocks)
    k = k.to(tl.int64)
    scale = scale_of(scale_bits, T)
    ok, b, bw, bh, gwf, ghf, count = _bezier_box(rois_ptr, k, N, scale, ph, pw, sampling_ratio, ALIGNED)
    p, pm, i, j, c, cm = bin_tile(pb, cb, ph, pw, C, BLOCK_P, BLOCK_C, CF)
    tile_m = with_flag(_p(pm, CF) & _c(cm, CF), ok)
    ybase, xbase, live = _bin_starts(rois_ptr, k, with_flag(pm, ok), scale, i, j, ph, pw, bw, bh, ALIGNED)
    return k, b, bw, bh, gwf, ghf, count, p, pm, i, j, c, cm, tile_m, ybase, xbase, live


@kernel
def _bezier_fwd_kernel(
    x_ptr, rois_ptr, out_ptr, scale_bits,
    N, C, H, W, ph, pw, sampling_ratio, n_pblocks,
    sxN, sxC, sxH, sxW, soK, soC, soH, soW,
    ALIGNED: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr, CF: tl.constexpr,
):
    k, b, bw, bh, gwf, ghf, count, p, pm, i, j, c, cm, tile_m, ybase, xbase, live = _bezier_tile(
        rois_ptr, scale_bits, n_pblocks, N, C, ph, pw, sampling_ratio, ALIGNED, BLOCK_P, BLOCK_C, CF)
    x_base = x_ptr + b * sxN + _c(c.to(tl.int64) * sxC, CF)
    acc, _ = pool_bins(x_base, tile_m, live, ybase, xbase, bh, bw, ghf, gwf, ghf.to(tl.int32), gwf.to(tl.int32),
                       H, W, sxH, sxW, False, BLOCK_P, BLOCK_C, CF)
    # out is allocated with soH == pw * soW, so bin p sits at p * soW.
    o = k * soK + _c(c.to(tl.int64) * soC, CF) + _p(p.to(tl.int64) * soW, CF)
    tl.store(out_ptr + o, div_rn(acc, count).to(out_ptr.dtype.element_ty), mask=_p(pm, CF) & _c(cm, CF))


@kernel
def _bezier_bwd_atomic_kernel(
    grad_ptr, rois_ptr, gi_ptr, scale_bits,
    N, C, H, W, ph, pw, sampling_ratio, n_pblocks,
    sgK, sgC, sgH, sgW, siN, siC, siH, siW,
    ALIGNED: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr, CF: tl.constexpr,
):
    """Adds (grad * w) / count of every sample of a tile's bins to its four taps."""
    T = rois_ptr.dtype.element_ty
    k, b, bw, bh, gwf, ghf, count, p, pm, i, j, c, cm, tile_m, ybase, xbase, live = _bezier_tile(
        rois_ptr, scale_bits, n_pblocks, N, C, ph, pw, sampling_ratio, ALIGNED, BLOCK_P, BLOCK_C, CF)
    c64 = c.to(tl.int64)
    g = tl.load(grad_ptr + k * sgK + _c(c64 * sgC, CF) + _p(i.to(tl.int64) * sgH + j.to(tl.int64) * sgW, CF),
                mask=tile_m, other=0.0).to(T)
    scatter_samples(gi_ptr + b * siN + _c(c64 * siC, CF), g, count, live, tile_m, ybase, xbase, bh, bw, ghf, gwf,
                    H, W, siH, siW, CF)


@kernel
def _bezier_tiles_kernel(
    rois_ptr, mask_ptr, scale_bits, N, H, W, ph, pw, sampling_ratio, n_words,
    ALIGNED: tl.constexpr, TILE_H: tl.constexpr, TILE_W: tl.constexpr, BLOCK: tl.constexpr,
):
    """Prepass of the deterministic backward, one program per box: sets bit k of the mask
    row of every gather tile that a sample of box k can reach, bin by bin. OR-ing bits is
    order-free."""
    k32 = tl.program_id(0)
    k = k32.to(tl.int64)
    T = rois_ptr.dtype.element_ty
    scale = scale_of(scale_bits, T)
    ok, b, bw, bh, gwf, ghf, count = _bezier_box(rois_ptr, k, N, scale, ph, pw, sampling_ratio, ALIGNED)
    first = b * (((H + TILE_H - 1) // TILE_H) * ((W + TILE_W - 1) // TILE_W))
    if ok & (ghf > 0) & (gwf > 0):
        for p in range(0, ph * pw):
            i = p // pw
            ya, xa, live = _bin_starts(rois_ptr, k, ok, scale, i, p - i * pw, ph, pw, bw, bh, ALIGNED)
            r0, r1, rows = touched_cells(ya, ya + bh, H)
            c0, c1, cols = touched_cells(xa, xa + bw, W)
            if live & rows & cols:
                mark_box(mask_ptr, first, k32, r0, r1, c0, c1, W, n_words, TILE_H, TILE_W, BLOCK)


@triton.jit
def _gather_box(
    acc, k, grad_ptr, rois_ptr, n, r, s, r_lo, r_hi, s_lo, s_hi, cm, c64, scale,
    N, H, W, ph, pw, sampling_ratio, sgK, sgC, sgH, sgW, ALIGNED: tl.constexpr, CF: tl.constexpr,
):
    """acc plus what box k gives the tile's pixels: per bin that can reach the tile,
    (grad times its row weights times its column weights over the tile) / count."""
    T = rois_ptr.dtype.element_ty
    Hf = H.to(T)
    Wf = W.to(T)
    ok, b, bw, bh, gwf, ghf, count = _bezier_box(rois_ptr, k, N, scale, ph, pw, sampling_ratio, ALIGNED)
    if ok & (b == n) & (ghf > 0) & (gwf > 0):
        for p in range(0, ph * pw):
            i = p // pw
            j = p - i * pw
            ya, xa, live = _bin_starts(rois_ptr, k, ok, scale, i, j, ph, pw, bw, bh, ALIGNED)
            if live & may_touch(ya, ya + bh, r_lo, r_hi, Hf) & may_touch(xa, xa + bw, s_lo, s_hi, Wf):
                wy = tile_axis_weights(r, ya, bh, ghf, r_lo, r_hi, H)
                wx = tile_axis_weights(s, xa, bw, gwf, s_lo, s_hi, W)
                g = tl.load(grad_ptr + k * sgK + c64 * sgC + i * sgH + j * sgW, mask=cm, other=0.0).to(T)
                acc += div_rn(_c(g, CF) * _p(wy * wx, CF), count)
    return acc


@kernel
def _bezier_bwd_gather_kernel(
    grad_ptr, rois_ptr, gi_ptr, mask_ptr, scale_bits,
    N, C, H, W, ph, pw, sampling_ratio, n_tw, n_tiles, n_words,
    sgK, sgC, sgH, sgW, siN, siC, siH, siW,
    ALIGNED: tl.constexpr, TILE_H: tl.constexpr, TILE_W: tl.constexpr, BLOCK_C: tl.constexpr, CF: tl.constexpr,
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
                     (grad_ptr, rois_ptr, n, r, s, r_lo.to(T), r_hi.to(T), s_lo.to(T), s_hi.to(T), cm,
                      c.to(tl.int64), scale_of(scale_bits, T), N, H, W, ph, pw, sampling_ratio, sgK, sgC, sgH, sgW,
                      ALIGNED, CF))
    store_tile(gi_ptr, acc, n, r, s, c, cm, H, W, siN, siC, siH, siW, CF)


# ----------------------------------------------------------------------------- launchers

_check_forward = kernel_check("bezier_align")
_check_backward = kernel_check("bezier_align", "backward")


def bezier_align_forward(input: torch.Tensor, rois: torch.Tensor, spatial_scale: float, pooled_height: int,
                         pooled_width: int, sampling_ratio: int, aligned: bool) -> torch.Tensor:
    """Bezier alignment forward: [K, C, ph, pw] in the input's dtype and memory format."""
    _check_forward(input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned)
    check_device(input, _bezier_fwd_kernel)
    f = box_forward(input, rois, pooled_height, pooled_width, tile_budget(input.dtype), flat=True)
    if f.out.numel():
        f.grid.launch(_bezier_fwd_kernel, (input, f.rois, f.out, f64_bits(spatial_scale), *f.sizes,
                                           int(sampling_ratio)),
                      (*input.stride(), *f.out.stride()), ALIGNED=bool(aligned))
    return f.out


def bezier_align_backward(grad: torch.Tensor, rois: torch.Tensor, spatial_scale: float, pooled_height: int,
                          pooled_width: int, batch_size: int, channels: int, height: int, width: int,
                          sampling_ratio: int, aligned: bool, channels_last: bool, *,
                          deterministic: bool | None = None) -> torch.Tensor:
    """Gradient of bezier_align_forward w.r.t. its input, [N, C, H, W] in grad's dtype.

    deterministic: None follows roiops.config.deterministic_backward, then torch's
    deterministic flag.
    """
    _check_backward(grad, rois, spatial_scale, pooled_height, pooled_width, batch_size, channels, height, width,
                    sampling_ratio, aligned, channels_last)
    check_device(grad, _bezier_bwd_atomic_kernel)
    N, C, H, W = int(batch_size), int(channels), int(height), int(width)
    K = rois.shape[0]
    ph, pw = int(pooled_height), int(pooled_width)
    cl = bool(channels_last)
    rois = dense(rois, opmath(grad.dtype))
    tail = (f64_bits(spatial_scale), N, C, H, W, ph, pw, int(sampling_ratio))
    if K == 0 or N * C * H * W == 0:
        return grad_input(grad, N, C, H, W, cl).zero_()
    if use_deterministic(deterministic):
        gi = grad_input(grad, N, C, H, W, cl)
        tile_h, tile_w, block_c, n_tw, n_tiles = gather_grid(grad, H, W, C, cl)
        mask = tile_mask(N * n_tiles, K, grad.device)
        _bezier_tiles_kernel[(K,)](rois, mask, tail[0], N, H, W, ph, pw, int(sampling_ratio), mask.shape[1],
                                   ALIGNED=bool(aligned), TILE_H=tile_h, TILE_W=tile_w,
                                   BLOCK=min(next_pow2(cdiv(W, tile_w)), 64), **LAUNCH_OPTS)
        _bezier_bwd_gather_kernel[(N * n_tiles, cdiv(C, block_c))](
            grad, rois, gi, mask, *tail, n_tw, n_tiles, mask.shape[1], *grad.stride(), *gi.stride(),
            # [pixels, channels] for both layouts, as RoIAlign's gather (_align_gather.py).
            ALIGNED=bool(aligned), TILE_H=tile_h, TILE_W=tile_w, BLOCK_C=block_c, CF=True, **LAUNCH_OPTS)
        return gi
    gi = grad_input(grad, N, C, H, W, cl, atomic=True)
    box_grid(K, ph, pw, C, cl, grad.is_cpu, tile_budget(grad.dtype)).launch(
        _bezier_bwd_atomic_kernel, (grad, rois, gi, *tail), (*grad.stride(), *gi.stride()), ALIGNED=bool(aligned))
    return from_atomic(gi, grad.dtype)
