"""RoIAlign in Triton: modes "avg" and "max" (docs/semantics.md), forward and backward, one
or several feature-map levels.

Work mapping
------------
Forward and the atomic backward run one program per (box, block of bins, block of
channels): a 2-D tile of BLOCK_P bins x BLOCK_C channels. All bins of a tile belong to one
box, so they share its sampling grid, and the loop over the grid is a run-time loop whose
bounds the kernel computes from the box (never a compile-time constant taken from data).
Per sample, coordinates, taps and weights are [BLOCK_P] vectors, computed once and
broadcast over the tile's channels.

- channels_last input (CF=True): tiles are [bins, channels] with channels the fast axis;
  channels are contiguous in memory, so each tap is one coalesced, vectorised load, and
  with up to 256 channels per tile a box's coordinates are computed once for all of them.
- NCHW input: the forward takes flat tiles (CF=FLAT) of 256 consecutive outputs of a
  box, channel after channel and bin after bin: a warp's lanes run along consecutive
  output cells (neighbouring lanes read neighbouring pixels, and the stores are
  contiguous), and 7x7 or 14x14 bins fill every lane. Each lane computes its own bin's
  coordinates: ~30 flops per sample against 4 gathers. The atomic backward and the box
  gradients keep [channels, bins] tiles (CF=False), 64 bins along the lanes and the warps
  over a few channels: on an H100 flat tiles made the backward slower.

Backward
--------
Fast path: each tile scatters ``grad * weight / count`` to the four taps of every sample
with atomic adds (into a float32 scratch for half types, then one cast pass). The order
of the atomics varies between runs, so the last bits of the gradient do too.

Deterministic path (``torch.are_deterministic_algorithms_enabled()``,
``roiops.config.deterministic_backward`` or ``deterministic=True``) is a gather, not a
scatter, in two launches:

1. A prepass (one program per box) sets bit k of a [tiles, ceil(K / 32)] int32 mask in
   the row of every 8x8-pixel tile of its image (and level) that box k's samples can
   reach. Bits are OR-ed, so the mask does not depend on the order of the programs.
2. One program per tile x block of channels keeps that part of the gradient in
   registers, walks the set bits of its mask row in increasing box index, adds what every
   bin of each box contributes to its pixels (bilinear weights are separable: the weight
   of pixel (y, x) is wy(y) * wx(x), each summed over the bin's samples that reach the
   tile), then writes its tile once.

Every grad address has a single writer and a fixed order of additions, so results are
bit-identical from run to run. A tile reads K / 32 mask words and computes the geometry
only of the boxes that reach it; the mask costs N * H * W * K / 512 bytes (1 MB for
K = 1024 on two 200x336 maps). It needs no zero-fill of the gradient and no float32
scratch for half types. Max mode evaluates [pixels x channels] compare-selects per bin.

Box gradient
------------
``roi_align_rois_backward`` and ``roi_align_max_rois_backward`` run on the forward's tiles.
A tile walks its bins' samples as the forward does (max mode: through the same loop,
``_pool_bins``, so it picks the forward's sample, then differentiates that one alone),
and sums, over its bins and channels, grad times each sample's slope dv/dy (dv/dx) times
how the sample moves with y1 and y2 (x1 and x2). Its four sums go to its own row of a
[K, bin blocks, channel blocks, 4] buffer that torch then adds up in a fixed order: no
float atomics, so the result is bit-identical from run to run. An adaptive grid
(sampling_ratio <= 0) is held at the box's current size: its derivative ignores that the
grid would grow with the box. The slopes jump where a sample crosses a cell edge or the
border rule's limits, and where the 1-cell minimum size starts to hold.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._geometry import MAX_LEVELS, dense, is_channels_last, memory_format
from ._common import (GPU_TILE, LAUNCH_OPTS, cdiv, check_device, f64_bits, gather_blocks, kernel, next_pow2, opmath,
                      tile_blocks, use_deterministic)
from ._common import check_align_backward, check_align_forward, check_align_rois_backward
from ._jit import (align_geometry, argmax_fits, axis_slides, axis_taps, beats, bilinear_slopes, bin_tile, box_level,
                   corner_slopes, div_rn, first_skipped, level_map, load_roi, map_spans, mark_box, may_touch, pick,
                   pixel_tile, sample_pos, sample_span, scale_of, scatter_samples, store_tile, touched_cells,
                   with_flag)
from ._jit import along_c as _c  # per-channel vector -> tile axis
from ._jit import along_p as _p  # per-bin / per-pixel vector -> tile axis

__all__ = ["multi_scale_roi_align_backward", "multi_scale_roi_align_forward", "roi_align_backward", "roi_align_forward",
           "roi_align_max_backward", "roi_align_max_forward", "roi_align_max_rois_backward", "roi_align_rois_backward"]

@triton.jit
def _box(rois_ptr, k, valid, scale, N, ph, pw, sampling_ratio, ALIGNED: tl.constexpr, MAX_MODE: tl.constexpr):
    """Box k's (int64) row check and sampling geometry; ok is False for a bad row, one masked off by
    `valid`, or (mode max) one whose grid its argmax cannot index."""
    ok, b, x1, y1, x2, y2 = load_roi(rois_ptr, k, N, scale)
    sx, sy, bw, bh, gwf, ghf, gw, gh, count = align_geometry(x1, y1, x2, y2, scale, ph, pw, sampling_ratio,
                                                             ALIGNED)
    ok = ok & valid
    if MAX_MODE:
        ok = ok & argmax_fits(ghf, gwf)
    return ok, b, sx, sy, bw, bh, gwf, ghf, gw, gh, count


@triton.jit
def _pool_bins(x_base, tile_m, live, ybase, xbase, bh, bw, ghf, gwf, gh, gw, H, W, sxH, sxW,
               MAX_MODE: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr, CF: tl.constexpr):
    """A tile's samples pooled per (bin, channel): their sum (avg), or (max) the largest and
    its argmax, -1 for none (docs/semantics.md). x_base: the tile's channels of the box's
    image; live: the bins of a valid box; ybase, xbase: each bin's start."""
    T = ybase.dtype
    # Each bin visits only the samples that can touch the map, [fy, ey) x [fx, ex); the
    # others are 0 and add nothing (max mode merges them in below).
    fy, ey, ny, fx, ex, nx = map_spans(live, ybase, xbase, bh, bw, ghf, gwf, H, W)

    acc = _p(tl.zeros([BLOCK_P], dtype=T), CF) + _c(tl.zeros([BLOCK_C], dtype=T), CF)
    arg = _p(tl.full([BLOCK_P], -1, tl.int32), CF) + _c(tl.zeros([BLOCK_C], dtype=tl.int32), CF)
    for dy in range(0, tl.max(ny, axis=0)):
        iy = fy + dy
        y = sample_pos(ybase, iy, bh, ghf)
        ylo, yhi, ly, hy, iny = axis_taps(y, H)
        oylo = ylo.to(tl.int64) * sxH
        oyhi = yhi.to(tl.int64) * sxH
        row = dy < ny
        for dx in range(0, tl.max(nx, axis=0)):
            ix = fx + dx
            x = sample_pos(xbase, ix, bw, gwf)
            xlo, xhi, lx, hx, inx = axis_taps(x, W)
            oxlo = xlo.to(tl.int64) * sxW
            oxhi = xhi.to(tl.int64) * sxW
            real = row & (dx < nx)
            m = tile_m & _p(real & iny & inx, CF)
            v1 = tl.load(x_base + _p(oylo + oxlo, CF), mask=m, other=0.0).to(T)
            v2 = tl.load(x_base + _p(oylo + oxhi, CF), mask=m, other=0.0).to(T)
            v3 = tl.load(x_base + _p(oyhi + oxlo, CF), mask=m, other=0.0).to(T)
            v4 = tl.load(x_base + _p(oyhi + oxhi, CF), mask=m, other=0.0).to(T)
            val = (_p(hy * hx, CF) * v1 + _p(hy * lx, CF) * v2 + _p(ly * hx, CF) * v3
                   + _p(ly * lx, CF) * v4)
            if MAX_MODE:
                take = _p(real, CF) & beats(val, acc, arg < 0)
                acc = tl.where(take, val, acc)
                arg = tl.where(take, _p(iy * gw + ix, CF), arg)
            else:
                acc += val
    if MAX_MODE:
        # The first sample left out (outside the map, value 0) competes as if visited in
        # its row-major place: it wins over nothing, a smaller maximum, or an equal one
        # that comes later; never over NaN.
        skip = _p(first_skipped(fy, ey, fx, ex, gh, gw), CF)
        out0 = (skip < 2147483647) & ((arg < 0) | ((acc == acc) & ((acc < 0.0) | ((acc == 0.0) & (skip < arg)))))
        acc = tl.where(out0, 0.0, acc)
        arg = tl.where(out0, skip, arg)
    return acc, arg


@triton.jit
def _fwd_tile(
    x_ptr, rois_ptr, out_ptr, arg_ptr, k, pb, cb, valid, scale,
    N, C, H, W, ph, pw, sampling_ratio,
    sxN, sxC, sxH, sxW, soK, soC, soH, soW,
    ALIGNED: tl.constexpr, MAX_MODE: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr,
    CF: tl.constexpr,
):
    """Bins [pb * BLOCK_P, +BLOCK_P) x channels [cb * BLOCK_C, +BLOCK_C) of box k; the box
    is masked unless `valid` (the multi-level kernel's level check)."""
    T = rois_ptr.dtype.element_ty
    ok, b, sx, sy, bw, bh, gwf, ghf, gw, gh, count = _box(rois_ptr, k.to(tl.int64), valid, scale, N, ph, pw,
                                                          sampling_ratio, ALIGNED, MAX_MODE)

    p, pm, i, j, c, cm = bin_tile(pb, cb, ph, pw, C, BLOCK_P, BLOCK_C, CF)
    tile_m = with_flag(_p(pm, CF) & _c(cm, CF), ok)
    x_base = x_ptr + b * sxN + _c(c.to(tl.int64) * sxC, CF)
    ybase = sy + i.to(T) * bh
    xbase = sx + j.to(T) * bw

    acc, arg = _pool_bins(x_base, tile_m, with_flag(pm, ok), ybase, xbase, bh, bw, ghf, gwf, gh, gw, H, W, sxH, sxW,
                          MAX_MODE, BLOCK_P, BLOCK_C, CF)

    # out is allocated with soH == pw * soW, so bin p sits at p * soW.
    o = k.to(tl.int64) * soK + _c(c.to(tl.int64) * soC, CF) + _p(p.to(tl.int64) * soW, CF)
    om = _p(pm, CF) & _c(cm, CF)
    if MAX_MODE:
        arg = tl.where(tile_m, arg, -1)
        res = tl.where(arg >= 0, acc, 0.0)
        tl.store(arg_ptr + o, arg, mask=om)
    else:
        res = div_rn(acc, count)
    tl.store(out_ptr + o, res.to(out_ptr.dtype.element_ty), mask=om)


@kernel
def _align_fwd_kernel(
    x_ptr, rois_ptr, out_ptr, arg_ptr, scale_bits,
    N, C, H, W, ph, pw, sampling_ratio, n_pblocks,
    sxN, sxC, sxH, sxW, soK, soC, soH, soW,
    ALIGNED: tl.constexpr, MAX_MODE: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr,
    CF: tl.constexpr,
):
    pid = tl.program_id(0)
    k = pid // n_pblocks
    scale = scale_of(scale_bits, rois_ptr.dtype.element_ty)
    _fwd_tile(x_ptr, rois_ptr, out_ptr, arg_ptr, k, pid - k * n_pblocks, tl.program_id(1), k >= 0, scale,
              N, C, H, W, ph, pw, sampling_ratio, sxN, sxC, sxH, sxW, soK, soC, soH, soW,
              ALIGNED, MAX_MODE, BLOCK_P, BLOCK_C, CF)


@kernel
def _align_fwd_levels_kernel(
    x0, x1, x2, x3, x4, rois_ptr, lvl_ptr, out_ptr,
    sb0, sb1, sb2, sb3, sb4, H0, H1, H2, H3, H4, W0, W1, W2, W3, W4, n_levels,
    N, C, ph, pw, sampling_ratio, n_pblocks, soK, soC, soH, soW,
    ALIGNED: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr, CF: tl.constexpr,
):
    """Multi-level RoIAlign in one launch: box k reads the map of level lvl[k] (a box
    whose level is outside [0, n_levels) pools to 0). CF: True or FLAT (NCHW maps)."""
    pid = tl.program_id(0)
    k = pid // n_pblocks
    valid, l, H, W, sxN, sxC, sxH, sxW, scale = box_level(
        lvl_ptr, k, n_levels, C, sb0, sb1, sb2, sb3, sb4, H0, H1, H2, H3, H4, W0, W1, W2, W3, W4,
        rois_ptr.dtype.element_ty, CF == 1)  # the maps are channels_last
    _fwd_tile(pick(l, x0, x1, x2, x3, x4), rois_ptr, out_ptr, out_ptr, k, pid - k * n_pblocks, tl.program_id(1),
              valid, scale, N, C, H, W, ph, pw, sampling_ratio, sxN, sxC, sxH, sxW, soK, soC, soH, soW,
              ALIGNED, False, BLOCK_P, BLOCK_C, CF)


@triton.jit
def _bwd_atomic_tile(
    grad_ptr, arg_ptr, rois_ptr, gi_ptr, k, pb, cb, valid, scale,
    N, C, H, W, ph, pw, sampling_ratio,
    sgK, sgC, sgH, sgW, saK, saC, saH, saW, siN, siC, siH, siW,
    ALIGNED: tl.constexpr, MAX_MODE: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr,
    CF: tl.constexpr,
):
    """Scatters the grad of bins [pb * BLOCK_P, +BLOCK_P) x channels [cb * BLOCK_C, +BLOCK_C)
    of box k (masked unless `valid`)."""
    T = rois_ptr.dtype.element_ty
    G = gi_ptr.dtype.element_ty
    ok, b, sx, sy, bw, bh, gwf, ghf, gw, gh, count = _box(rois_ptr, k.to(tl.int64), valid, scale, N, ph, pw,
                                                          sampling_ratio, ALIGNED, MAX_MODE)

    p, pm, i, j, c, cm = bin_tile(pb, cb, ph, pw, C, BLOCK_P, BLOCK_C, CF)
    tile_m = with_flag(_p(pm, CF) & _c(cm, CF), ok)
    k64 = k.to(tl.int64)
    c64 = c.to(tl.int64)
    i64 = i.to(tl.int64)
    j64 = j.to(tl.int64)
    g = tl.load(grad_ptr + k64 * sgK + _c(c64 * sgC, CF) + _p(i64 * sgH + j64 * sgW, CF),
                mask=tile_m, other=0.0).to(T)
    gi_base = gi_ptr + b * siN + _c(c64 * siC, CF)
    ybase = sy + i.to(T) * bh
    xbase = sx + j.to(T) * bw

    if MAX_MODE:
        a = tl.load(arg_ptr + k64 * saK + _c(c64 * saC, CF) + _p(i64 * saH + j64 * saW, CF),
                    mask=tile_m, other=-1)
        has = tile_m & (a >= 0) & (a < gh * gw)
        gws = tl.maximum(gw, 1)
        iy = tl.where(has, a // gws, 0)
        ix = tl.where(has, a - (a // gws) * gws, 0)
        # max(., 1): a box without samples has no argmax; keep its lanes free of 0/0.
        y = sample_pos(_p(ybase, CF), iy, bh, tl.maximum(ghf, 1.0))
        x = sample_pos(_p(xbase, CF), ix, bw, tl.maximum(gwf, 1.0))
        ylo, yhi, ly, hy, iny = axis_taps(y, H)
        xlo, xhi, lx, hx, inx = axis_taps(x, W)
        m = has & iny & inx
        oylo = ylo.to(tl.int64) * siH
        oyhi = yhi.to(tl.int64) * siH
        oxlo = xlo.to(tl.int64) * siW
        oxhi = xhi.to(tl.int64) * siW
        tl.atomic_add(gi_base + oylo + oxlo, ((hy * hx) * g).to(G), mask=m, sem="relaxed")
        tl.atomic_add(gi_base + oylo + oxhi, ((hy * lx) * g).to(G), mask=m, sem="relaxed")
        tl.atomic_add(gi_base + oyhi + oxlo, ((ly * hx) * g).to(G), mask=m, sem="relaxed")
        tl.atomic_add(gi_base + oyhi + oxhi, ((ly * lx) * g).to(G), mask=m, sem="relaxed")
    else:
        # Only the samples that can touch the map (see the forward).
        scatter_samples(gi_base, g, count, with_flag(pm, ok), tile_m, ybase, xbase, bh, bw, ghf, gwf, H, W, siH, siW,
                        CF)


@kernel
def _align_bwd_atomic_kernel(
    grad_ptr, arg_ptr, rois_ptr, gi_ptr, scale_bits,
    N, C, H, W, ph, pw, sampling_ratio, n_pblocks,
    sgK, sgC, sgH, sgW, saK, saC, saH, saW, siN, siC, siH, siW,
    ALIGNED: tl.constexpr, MAX_MODE: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr,
    CF: tl.constexpr,
):
    pid = tl.program_id(0)
    k = pid // n_pblocks
    scale = scale_of(scale_bits, rois_ptr.dtype.element_ty)
    _bwd_atomic_tile(grad_ptr, arg_ptr, rois_ptr, gi_ptr, k, pid - k * n_pblocks, tl.program_id(1), k >= 0, scale,
                     N, C, H, W, ph, pw, sampling_ratio, sgK, sgC, sgH, sgW, saK, saC, saH, saW, siN, siC, siH, siW,
                     ALIGNED, MAX_MODE, BLOCK_P, BLOCK_C, CF)


@kernel
def _align_bwd_atomic_levels_kernel(
    grad_ptr, rois_ptr, lvl_ptr, g0, g1, g2, g3, g4,
    sb0, sb1, sb2, sb3, sb4, H0, H1, H2, H3, H4, W0, W1, W2, W3, W4, n_levels,
    N, C, ph, pw, sampling_ratio, n_pblocks, sgK, sgC, sgH, sgW,
    ALIGNED: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr, CF: tl.constexpr,
):
    """Atomic backward of _align_fwd_levels_kernel: box k scatters into level lvl[k]'s grad."""
    pid = tl.program_id(0)
    k = pid // n_pblocks
    valid, l, H, W, siN, siC, siH, siW, scale = box_level(
        lvl_ptr, k, n_levels, C, sb0, sb1, sb2, sb3, sb4, H0, H1, H2, H3, H4, W0, W1, W2, W3, W4,
        rois_ptr.dtype.element_ty, CF)
    _bwd_atomic_tile(grad_ptr, grad_ptr, rois_ptr, pick(l, g0, g1, g2, g3, g4), k, pid - k * n_pblocks,
                     tl.program_id(1), valid, scale, N, C, H, W, ph, pw, sampling_ratio,
                     sgK, sgC, sgH, sgW, sgK, sgC, sgH, sgW, siN, siC, siH, siW, ALIGNED, False, BLOCK_P, BLOCK_C, CF)


@triton.jit
def _gather_box(
    acc, k, grad_ptr, arg_ptr, rois_ptr, n, r, s, r_lo, r_hi, s_lo, s_hi, cm, c64, scale,
    N, H, W, ph, pw, sampling_ratio, sgK, sgC, sgH, sgW, saK, saC, saH, saW,
    ALIGNED: tl.constexpr, MAX_MODE: tl.constexpr, TILE_H: tl.constexpr, TILE_W: tl.constexpr, CF: tl.constexpr,
):
    """acc plus what box k gives the tile's pixels (the bins and samples that reach them)."""
    T = rois_ptr.dtype.element_ty
    Hf = H.to(T)
    Wf = W.to(T)
    ok, b, sx, sy, bw, bh, gwf, ghf, gw, gh, count = _box(rois_ptr, k, True, scale, N, ph, pw, sampling_ratio,
                                                          ALIGNED, MAX_MODE)
    use = ok & (b == n) & (gh > 0) & (gw > 0)
    use = use & may_touch(sy, sy + ph * bh, r_lo, r_hi, Hf) & may_touch(sx, sx + pw * bw, s_lo, s_hi, Wf)
    if use:
        for i in range(0, ph):
            ya = sy + i * bh
            if may_touch(ya, ya + bh, r_lo, r_hi, Hf):
                if not MAX_MODE:
                    # Row weights of this bin row, summed over its samples.
                    wy = tl.zeros([TILE_H * TILE_W], dtype=T)
                    fy, ey = sample_span(ya, bh, ghf, r_lo - 1.0, r_hi + 1.0)
                    for iy in range(fy, ey):
                        y = sample_pos(ya, iy, bh, ghf)
                        ylo, yhi, ly, hy, iny = axis_taps(y, H)
                        wy += tl.where(iny, tl.where(r == ylo, hy, 0.0) + tl.where(r == yhi, ly, 0.0), 0.0)
                for j in range(0, pw):
                    xa = sx + j * bw
                    if may_touch(xa, xa + bw, s_lo, s_hi, Wf):
                        go = k * sgK + c64 * sgC + i * sgH + j * sgW
                        g = tl.load(grad_ptr + go, mask=cm, other=0.0).to(T)
                        if MAX_MODE:
                            a = tl.load(arg_ptr + k * saK + c64 * saC + i * saH + j * saW, mask=cm, other=-1)
                            has = cm & (a >= 0) & (a < gh * gw)
                            iy = tl.where(has, a // gw, 0)
                            ix = tl.where(has, a - (a // gw) * gw, 0)
                            y = sample_pos(ya, iy, bh, ghf)
                            x = sample_pos(xa, ix, bw, gwf)
                            ylo, yhi, ly, hy, iny = axis_taps(y, H)
                            xlo, xhi, lx, hx, inx = axis_taps(x, W)
                            g = tl.where(has & iny & inx, g, 0.0)
                            wy2 = (tl.where(_p(r, CF) == _c(ylo, CF), _c(hy, CF), 0.0)
                                   + tl.where(_p(r, CF) == _c(yhi, CF), _c(ly, CF), 0.0))
                            wx2 = (tl.where(_p(s, CF) == _c(xlo, CF), _c(hx, CF), 0.0)
                                   + tl.where(_p(s, CF) == _c(xhi, CF), _c(lx, CF), 0.0))
                            acc += (wy2 * wx2) * _c(g, CF)
                        else:
                            wx = tl.zeros([TILE_H * TILE_W], dtype=T)
                            fx, ex = sample_span(xa, bw, gwf, s_lo - 1.0, s_hi + 1.0)
                            for ix in range(fx, ex):
                                x = sample_pos(xa, ix, bw, gwf)
                                xlo, xhi, lx, hx, inx = axis_taps(x, W)
                                wx += tl.where(inx, tl.where(s == xlo, hx, 0.0) + tl.where(s == xhi, lx, 0.0),
                                               0.0)
                            acc += div_rn(_c(g, CF) * _p(wy * wx, CF), count)
    return acc


@triton.jit
def _bwd_gather_tile(
    grad_ptr, arg_ptr, rois_ptr, gi_ptr, mask_ptr, tile, n_words, n, th, tw, cb, scale,
    N, C, H, W, ph, pw, sampling_ratio,
    sgK, sgC, sgH, sgW, saK, saC, saH, saW, siN, siC, siH, siW,
    ALIGNED: tl.constexpr, MAX_MODE: tl.constexpr,
    TILE_H: tl.constexpr, TILE_W: tl.constexpr, BLOCK_C: tl.constexpr, CF: tl.constexpr,
):
    """Pixels of tile (th, tw) x channels [cb * BLOCK_C, +BLOCK_C) of image n: the sum of
    what the boxes marked in the tile's row `tile` of the mask give them, in box order."""
    T = rois_ptr.dtype.element_ty
    r, s, c, cm, r_lo, r_hi, s_lo, s_hi = pixel_tile(th, tw, cb, H, W, C, TILE_H, TILE_W, BLOCK_C)
    c64 = c.to(tl.int64)
    # The tile's cells as coordinates for the skip tests.
    r_lo, r_hi, s_lo, s_hi = r_lo.to(T), r_hi.to(T), s_lo.to(T), s_hi.to(T)

    acc = _p(tl.zeros([TILE_H * TILE_W], dtype=T), CF) + _c(tl.zeros([BLOCK_C], dtype=T), CF)
    # The boxes marked for this tile by _align_tiles_kernel, in increasing index.
    row = mask_ptr + tile.to(tl.int64) * n_words
    for w in range(0, n_words.to(tl.int64)):  # int64: box k indexes grad as k * sgK
        bits = tl.load(row + w)
        if bits != 0:
            for j in range(0, 32):
                if ((bits >> j) & 1) != 0:
                    acc = _gather_box(acc, w * 32 + j, grad_ptr, arg_ptr, rois_ptr, n, r, s, r_lo, r_hi,
                                      s_lo, s_hi, cm, c64, scale, N, H, W, ph, pw, sampling_ratio,
                                      sgK, sgC, sgH, sgW, saK, saC, saH, saW, ALIGNED, MAX_MODE, TILE_H, TILE_W, CF)

    store_tile(gi_ptr, acc, n, r, s, c, cm, H, W, siN, siC, siH, siW, CF)


@kernel
def _align_tiles_kernel(
    rois_ptr, lvl_ptr, mask_ptr, sb0, sb1, sb2, sb3, sb4, H0, H1, H2, H3, H4, W0, W1, W2, W3, W4, p1, p2, p3, p4,
    n_levels, N, ph, pw, sampling_ratio, n_words,
    ALIGNED: tl.constexpr, LEVELS: tl.constexpr, TILE_H: tl.constexpr, TILE_W: tl.constexpr, BLOCK: tl.constexpr,
):
    """Prepass of the deterministic backward, one program per box: sets bit k of the mask
    row of every gather tile that box k's samples can reach. A tile's row numbers its
    program: level start + image * tiles + tile (levels only with LEVELS). OR-ing bits is
    order-free, so the mask, and what the gather does with it, is the same every run."""
    k = tl.program_id(0)
    T = rois_ptr.dtype.element_ty
    if LEVELS:
        # (the strides box_level derives, here for N channels, go unused)
        valid, l, H, W, sN, sC, sH, sW, scale = box_level(
            lvl_ptr, k, n_levels, N, sb0, sb1, sb2, sb3, sb4, H0, H1, H2, H3, H4, W0, W1, W2, W3, W4, T, False)
        start = pick(l, 0, p1, p2, p3, p4)
    else:
        valid = k >= 0
        H = H0
        W = W0
        scale = scale_of(sb0, T)
        start = 0
    ok, b, sx, sy, bw, bh, gwf, ghf, gw, gh, count = _box(rois_ptr, k.to(tl.int64), valid, scale, N, ph, pw,
                                                          sampling_ratio, ALIGNED, False)
    # Cells the samples can touch: a sample at y reaches rows floor(y) and floor(y) + 1;
    # one more each side for the rounding of its position.
    r0, r1, rows = touched_cells(sy, sy + ph * bh, H)
    c0, c1, cols = touched_cells(sx, sx + pw * bw, W)
    if ok & (gh > 0) & (gw > 0) & rows & cols:
        first = start + b * (((H + TILE_H - 1) // TILE_H) * ((W + TILE_W - 1) // TILE_W))
        mark_box(mask_ptr, first, k, r0, r1, c0, c1, W, n_words, TILE_H, TILE_W, BLOCK)


@kernel
def _align_bwd_gather_kernel(
    grad_ptr, arg_ptr, rois_ptr, gi_ptr, mask_ptr, scale_bits,
    N, C, H, W, ph, pw, sampling_ratio, n_tw, n_tiles, n_words,
    sgK, sgC, sgH, sgW, saK, saC, saH, saW, siN, siC, siH, siW,
    ALIGNED: tl.constexpr, MAX_MODE: tl.constexpr,
    TILE_H: tl.constexpr, TILE_W: tl.constexpr, BLOCK_C: tl.constexpr, CF: tl.constexpr,
):
    pid = tl.program_id(0)
    n = pid // n_tiles
    t = pid - n * n_tiles
    th = t // n_tw
    scale = scale_of(scale_bits, rois_ptr.dtype.element_ty)
    _bwd_gather_tile(grad_ptr, arg_ptr, rois_ptr, gi_ptr, mask_ptr, pid, n_words, n, th, t - th * n_tw,
                     tl.program_id(1), scale, N, C, H, W, ph, pw, sampling_ratio,
                     sgK, sgC, sgH, sgW, saK, saC, saH, saW, siN, siC, siH, siW,
                     ALIGNED, MAX_MODE, TILE_H, TILE_W, BLOCK_C, CF)


@kernel
def _align_bwd_gather_levels_kernel(
    grad_ptr, rois_ptr, mask_ptr, g0, g1, g2, g3, g4,
    sb0, sb1, sb2, sb3, sb4, H0, H1, H2, H3, H4, W0, W1, W2, W3, W4, p1, p2, p3, p4,
    N, C, ph, pw, sampling_ratio, n_words, sgK, sgC, sgH, sgW,
    ALIGNED: tl.constexpr, TILE_H: tl.constexpr, TILE_W: tl.constexpr, BLOCK_C: tl.constexpr, CF: tl.constexpr,
):
    """Deterministic backward of _align_fwd_levels_kernel: programs [p_l, p_(l+1)) own
    level l's tiles (p_0 = 0; unused levels start past the grid)."""
    tile = tl.program_id(0)
    l = (tile >= p1).to(tl.int32) + (tile >= p2).to(tl.int32) + (tile >= p3).to(tl.int32) + (tile >= p4).to(tl.int32)
    pid = tile - pick(l, 0, p1, p2, p3, p4)
    H, W, siN, siC, siH, siW, scale = level_map(l, C, sb0, sb1, sb2, sb3, sb4, H0, H1, H2, H3, H4, W0, W1, W2, W3,
                                                W4, rois_ptr.dtype.element_ty, CF)
    n_tw = (W + TILE_W - 1) // TILE_W
    n_tiles = ((H + TILE_H - 1) // TILE_H) * n_tw
    n = pid // n_tiles
    t = pid - n * n_tiles
    th = t // n_tw
    _bwd_gather_tile(grad_ptr, grad_ptr, rois_ptr, pick(l, g0, g1, g2, g3, g4), mask_ptr, tile, n_words, n, th,
                     t - th * n_tw, tl.program_id(1), scale, N, C, H, W, ph, pw, sampling_ratio,
                     sgK, sgC, sgH, sgW, sgK, sgC, sgH, sgW, siN, siC, siH, siW,
                     ALIGNED, False, TILE_H, TILE_W, BLOCK_C, True)


@triton.jit
def _rois_bwd_tile(
    grad_ptr, x_ptr, rois_ptr, part_ptr, part_row, k, pb, cb, scale,
    N, C, H, W, ph, pw, sampling_ratio,
    sgK, sgC, sgH, sgW, sxN, sxC, sxH, sxW,
    ALIGNED: tl.constexpr, MAX_MODE: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr,
    CF: tl.constexpr,
):
    """What bins [pb * BLOCK_P, +BLOCK_P) x channels [cb * BLOCK_C, +BLOCK_C) of box k give
    the gradient of its (x1, y1, x2, y2): four partial sums, stored in row `part_row` of the
    [programs, 4] part_ptr. A bad box row gives 0."""
    T = rois_ptr.dtype.element_ty
    k64 = k.to(tl.int64)
    ok, b, sx, sy, bw, bh, gwf, ghf, gw, gh, count = _box(rois_ptr, k64, k >= 0, scale, N, ph, pw, sampling_ratio,
                                                          ALIGNED, MAX_MODE)
    _, _, x1, y1, x2, y2 = load_roi(rois_ptr, k64, N, scale)  # the corners, for corner_slopes

    p, pm, i, j, c, cm = bin_tile(pb, cb, ph, pw, C, BLOCK_P, BLOCK_C, CF)
    tile_m = with_flag(_p(pm, CF) & _c(cm, CF), ok)
    c64 = c.to(tl.int64)
    g = tl.load(grad_ptr + k64 * sgK + _c(c64 * sgC, CF) + _p(i.to(tl.int64) * sgH + j.to(tl.int64) * sgW, CF),
                mask=tile_m, other=0.0).to(T)
    x_base = x_ptr + b * sxN + _c(c64 * sxC, CF)
    ybase = sy + i.to(T) * bh
    xbase = sx + j.to(T) * bw

    if MAX_MODE:
        # The sample the forward chose, differentiated alone; none, or a NaN maximum: 0.
        acc, arg = _pool_bins(x_base, tile_m, with_flag(pm, ok), ybase, xbase, bh, bw, ghf, gwf, gh, gw, H, W,
                              sxH, sxW, True, BLOCK_P, BLOCK_C, CF)
        has = tile_m & (arg >= 0) & (acc == acc)
        gws = tl.maximum(gw, 1)
        iy = tl.where(has, arg // gws, 0)
        ix = tl.where(has, arg - (arg // gws) * gws, 0)
        # max(., 1): a box without samples has no argmax; keep its lanes free of 0/0.
        ghs = tl.maximum(ghf, 1.0)
        gwss = tl.maximum(gwf, 1.0)
        y = sample_pos(_p(ybase, CF), iy, bh, ghs)
        x = sample_pos(_p(xbase, CF), ix, bw, gwss)
        ylo, yhi, ly, hy, iny = axis_taps(y, H)
        xlo, xhi, lx, hx, inx = axis_taps(x, W)
        m = has & iny & inx
        oylo = ylo.to(tl.int64) * sxH
        oyhi = yhi.to(tl.int64) * sxH
        oxlo = xlo.to(tl.int64) * sxW
        oxhi = xhi.to(tl.int64) * sxW
        v1 = tl.load(x_base + oylo + oxlo, mask=m, other=0.0).to(T)
        v2 = tl.load(x_base + oylo + oxhi, mask=m, other=0.0).to(T)
        v3 = tl.load(x_base + oyhi + oxlo, mask=m, other=0.0).to(T)
        v4 = tl.load(x_base + oyhi + oxhi, mask=m, other=0.0).to(T)
        dvdy, dvdx = bilinear_slopes(v1, v2, v3, v4, ly, hy, lx, hx, m & axis_slides(y, H), m & axis_slides(x, W))
        dy1, dy2 = corner_slopes(y1, y2, scale, _p(i, CF), iy, ghs, ph, ALIGNED)
        dx1, dx2 = corner_slopes(x1, x2, scale, _p(j, CF), ix, gwss, pw, ALIGNED)
        gy = g * dvdy
        gx = g * dvdx
        sx1 = tl.sum(tl.sum(gx * dx1, axis=1), axis=0)
        sy1 = tl.sum(tl.sum(gy * dy1, axis=1), axis=0)
        sx2 = tl.sum(tl.sum(gx * dx2, axis=1), axis=0)
        sy2 = tl.sum(tl.sum(gy * dy2, axis=1), axis=0)
    else:
        # Per (bin, channel), the samples' dv/dy and dv/dx weighted by how each sample moves
        # with each corner. A row of samples shares its y weights: dv/dy is summed over
        # the row first.
        fy, ey, ny, fx, ex, nx = map_spans(with_flag(pm, ok), ybase, xbase, bh, bw, ghf, gwf, H, W)
        ay1 = _p(tl.zeros([BLOCK_P], dtype=T), CF) + _c(tl.zeros([BLOCK_C], dtype=T), CF)
        ay2 = tl.zeros_like(ay1)
        ax1 = tl.zeros_like(ay1)
        ax2 = tl.zeros_like(ay1)
        for dy in range(0, tl.max(ny, axis=0)):
            iy = fy + dy
            y = sample_pos(ybase, iy, bh, ghf)
            ylo, yhi, ly, hy, iny = axis_taps(y, H)
            slides_y = _p(axis_slides(y, H), CF)
            oylo = ylo.to(tl.int64) * sxH
            oyhi = yhi.to(tl.int64) * sxH
            on_y = iny & (dy < ny)
            ry = tl.zeros_like(ay1)
            for dx in range(0, tl.max(nx, axis=0)):
                ix = fx + dx
                x = sample_pos(xbase, ix, bw, gwf)
                xlo, xhi, lx, hx, inx = axis_taps(x, W)
                oxlo = xlo.to(tl.int64) * sxW
                oxhi = xhi.to(tl.int64) * sxW
                m = tile_m & _p(on_y & inx & (dx < nx), CF)
                v1 = tl.load(x_base + _p(oylo + oxlo, CF), mask=m, other=0.0).to(T)
                v2 = tl.load(x_base + _p(oylo + oxhi, CF), mask=m, other=0.0).to(T)
                v3 = tl.load(x_base + _p(oyhi + oxlo, CF), mask=m, other=0.0).to(T)
                v4 = tl.load(x_base + _p(oyhi + oxhi, CF), mask=m, other=0.0).to(T)
                dvdy, dvdx = bilinear_slopes(v1, v2, v3, v4, _p(ly, CF), _p(hy, CF), _p(lx, CF), _p(hx, CF),
                                             m & slides_y, m & _p(axis_slides(x, W), CF))
                dx1, dx2 = corner_slopes(x1, x2, scale, j, ix, gwf, pw, ALIGNED)
                ry += dvdy
                ax1 += dvdx * _p(dx1, CF)
                ax2 += dvdx * _p(dx2, CF)
            dy1, dy2 = corner_slopes(y1, y2, scale, i, iy, ghf, ph, ALIGNED)
            ay1 += ry * _p(dy1, CF)
            ay2 += ry * _p(dy2, CF)
        sx1 = div_rn(tl.sum(tl.sum(g * ax1, axis=1), axis=0), count)
        sy1 = div_rn(tl.sum(tl.sum(g * ay1, axis=1), axis=0), count)
        sx2 = div_rn(tl.sum(tl.sum(g * ax2, axis=1), axis=0), count)
        sy2 = div_rn(tl.sum(tl.sum(g * ay2, axis=1), axis=0), count)

    out = part_ptr + part_row * 4
    tl.store(out, sx1)
    tl.store(out + 1, sy1)
    tl.store(out + 2, sx2)
    tl.store(out + 3, sy2)


@kernel
def _align_rois_bwd_kernel(
    grad_ptr, x_ptr, rois_ptr, part_ptr, scale_bits,
    N, C, H, W, ph, pw, sampling_ratio, n_pblocks,
    sgK, sgC, sgH, sgW, sxN, sxC, sxH, sxW,
    ALIGNED: tl.constexpr, MAX_MODE: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr,
    CF: tl.constexpr,
):
    """Gradient w.r.t. the boxes, one program per (box, block of bins, block of channels)
    as the forward's: each writes its own row of partial sums (no float atomics)."""
    pid = tl.program_id(0)
    k = pid // n_pblocks
    cb = tl.program_id(1)
    scale = scale_of(scale_bits, rois_ptr.dtype.element_ty)
    _rois_bwd_tile(grad_ptr, x_ptr, rois_ptr, part_ptr, pid.to(tl.int64) * tl.num_programs(1) + cb, k,
                   pid - k * n_pblocks, cb, scale, N, C, H, W, ph, pw, sampling_ratio,
                   sgK, sgC, sgH, sgW, sxN, sxC, sxH, sxW, ALIGNED, MAX_MODE, BLOCK_P, BLOCK_C, CF)


# ----------------------------------------------------------------------------- launchers

def _level_args(tensors, scales, heights, widths):
    """The per-level kernel arguments (pointers, scale bits, heights, widths), padded to
    MAX_LEVELS with level 0's (padding is never selected: boxes of other levels are masked)."""
    L = len(tensors)
    if not 1 <= L <= MAX_LEVELS:
        raise ValueError(f"roiops: multi-level RoIAlign takes 1 to {MAX_LEVELS} levels, got {L}")
    pad = MAX_LEVELS - L
    return ([*tensors, *[tensors[0]] * pad], [f64_bits(s) for s in [*scales, *[scales[0]] * pad]],
            [*heights, *[heights[0]] * pad], [*widths, *[widths[0]] * pad])


def _level_starts(programs):
    """First program of levels 1 to 4 in a grid of per-level program counts, the missing
    levels' past any grid."""
    return [sum(programs[:i]) for i in range(1, len(programs))] + [2 ** 31 - 1] * (MAX_LEVELS - len(programs))


def _mark_tiles(rois, levels, sbits, hs, ws, starts, n_levels, N, ph, pw, sampling_ratio, aligned, n_tiles, tile_h,
                tile_w, levels_on):
    """[n_tiles, ceil(K / 32)] int32 bit mask: bit k of row t is set when box k can reach
    gather tile t (see _align_tiles_kernel). Zero-filled and written on the device. The
    per-level arguments come padded (_level_args, _level_starts)."""
    K = rois.shape[0]
    mask = torch.zeros((n_tiles, cdiv(K, 32)), dtype=torch.int32, device=rois.device)
    _align_tiles_kernel[(K,)](
        rois, levels, mask, *sbits, *hs, *ws, *starts, n_levels, N, ph, pw, int(sampling_ratio), mask.shape[1],
        ALIGNED=bool(aligned), LEVELS=levels_on, TILE_H=tile_h, TILE_W=tile_w,
        BLOCK=min(next_pow2(cdiv(max(ws), tile_w)), 64), **LAUNCH_OPTS)
    return mask


def _forward(input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned, max_mode):
    check_align_forward(input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned)
    check_device(input, _align_fwd_kernel)
    N, C, H, W = input.shape
    K = rois.shape[0]
    ph, pw = int(pooled_height), int(pooled_width)
    rois = dense(rois, opmath(input.dtype))
    fmt = memory_format(is_channels_last(input))
    out = torch.empty((K, C, ph, pw), dtype=input.dtype, device=input.device, memory_format=fmt)
    argmax = torch.empty((K, C, ph, pw), dtype=torch.int32, device=input.device, memory_format=fmt) \
        if max_mode else None
    if out.numel() == 0:
        return out, argmax
    if H == 0 or W == 0:  # no cell to sample: zeros, and argmax "no sample"
        out.zero_()
        if argmax is not None:
            argmax.fill_(-1)
        return out, argmax
    lanes_c = input.stride(1) < input.stride(3)
    budget = GPU_TILE // 2 if input.dtype == torch.float64 else GPU_TILE
    block_p, block_c, n_pb, n_cb, cf = tile_blocks(ph * pw, C, lanes_c, input.is_cpu, budget, flat=True)
    assert ph == 1 or out.stride(2) == pw * out.stride(3)
    _align_fwd_kernel[(K * n_pb, n_cb)](
        input, rois, out, argmax if max_mode else out, f64_bits(spatial_scale),
        N, C, H, W, ph, pw, int(sampling_ratio), n_pb,
        *input.stride(), *out.stride(),
        ALIGNED=bool(aligned), MAX_MODE=max_mode, BLOCK_P=block_p, BLOCK_C=block_c, CF=cf, **LAUNCH_OPTS)
    return out, argmax


def _backward(grad, argmax, rois, spatial_scale, pooled_height, pooled_width, batch_size, channels, height, width,
              sampling_ratio, aligned, channels_last, max_mode, deterministic):
    check_align_backward(grad, argmax, rois, spatial_scale, pooled_height, pooled_width, batch_size, channels, height,
                         width, sampling_ratio, aligned, channels_last, max_mode)
    check_device(grad, _align_bwd_atomic_kernel)
    N, C, H, W = int(batch_size), int(channels), int(height), int(width)
    K = rois.shape[0]
    ph, pw = int(pooled_height), int(pooled_width)
    rois = dense(rois, opmath(grad.dtype))
    fmt = memory_format(bool(channels_last))
    on_cpu = grad.is_cpu
    if K == 0 or N * C * H * W == 0:
        return torch.empty((N, C, H, W), dtype=grad.dtype, device=grad.device, memory_format=fmt).zero_()
    arg = argmax if max_mode else grad
    common = (f64_bits(spatial_scale),)

    if use_deterministic(deterministic):
        gi = torch.empty((N, C, H, W), dtype=grad.dtype, device=grad.device, memory_format=fmt)
        tile_h, tile_w, block_c = gather_blocks(H, W, C, bool(channels_last), on_cpu, grad.dtype == torch.float64)
        n_tw = cdiv(W, tile_w)
        n_tiles = cdiv(H, tile_h) * n_tw
        _, sbits, hs, ws = _level_args([rois], [spatial_scale], [H], [W])
        mask = _mark_tiles(rois, rois, sbits, hs, ws, _level_starts([N * n_tiles]), 1, N, ph, pw, sampling_ratio,
                           aligned, N * n_tiles, tile_h, tile_w, levels_on=False)
        grid = (N * n_tiles, cdiv(C, block_c))
        _align_bwd_gather_kernel[grid](
            grad, arg, rois, gi, mask, *common,
            N, C, H, W, ph, pw, int(sampling_ratio), n_tw, n_tiles, mask.shape[1],
            *grad.stride(), *arg.stride(), *gi.stride(),
            ALIGNED=bool(aligned), MAX_MODE=max_mode, TILE_H=tile_h, TILE_W=tile_w, BLOCK_C=block_c,
            # [pixels, channels] for both layouts: the NCHW tile's single store gets its own
            # coalesced layout from the compiler, while [channels, pixels] would about triple
            # the registers of the per-bin updates (ptxas: 255 vs ~90).
            CF=True,
            **LAUNCH_OPTS)
        return gi

    # Half types accumulate in a float32 scratch (one extra cast pass), as the CPU kernels do.
    acc_dtype = grad.dtype if grad.dtype in (torch.float32, torch.float64) else torch.float32
    gi = torch.empty((N, C, H, W), dtype=acc_dtype, device=grad.device, memory_format=fmt).zero_()
    lanes_c = bool(channels_last)
    # Max mode carries per-element sample coordinates: smaller tiles.
    budget = GPU_TILE // 2 if (max_mode or grad.dtype == torch.float64) else GPU_TILE
    block_p, block_c, n_pb, n_cb, cf = tile_blocks(ph * pw, C, lanes_c, on_cpu, budget)
    grid = (K * n_pb, n_cb)
    _align_bwd_atomic_kernel[grid](
        grad, arg, rois, gi, *common,
        N, C, H, W, ph, pw, int(sampling_ratio), n_pb,
        *grad.stride(), *arg.stride(), *gi.stride(),
        ALIGNED=bool(aligned), MAX_MODE=max_mode, BLOCK_P=block_p, BLOCK_C=block_c, CF=cf, **LAUNCH_OPTS)
    return gi if acc_dtype == grad.dtype else gi.to(grad.dtype)


def _rois_backward(grad, input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned, max_mode):
    check_align_rois_backward(grad, input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned)
    check_device(input, _align_rois_bwd_kernel)
    N, C, H, W = input.shape
    K = rois.shape[0]
    ph, pw = int(pooled_height), int(pooled_width)
    acc = opmath(input.dtype)
    out = torch.zeros((K, 5), dtype=acc, device=input.device)
    if K == 0 or C == 0:
        return out.to(rois.dtype)
    r = dense(rois, acc)
    lanes_c = input.stride(1) < input.stride(3)
    # Four accumulators per tile element (max mode: per-element sample coordinates).
    budget = GPU_TILE // (4 if input.dtype == torch.float64 else 2)
    block_p, block_c, n_pb, n_cb, cf = tile_blocks(ph * pw, C, lanes_c, input.is_cpu, budget)
    grid = (K * n_pb, n_cb)
    # One row of partial sums per program, added up in a fixed order: bit-identical runs.
    part = torch.empty((K, n_pb, n_cb, 4), dtype=acc, device=input.device)
    _align_rois_bwd_kernel[grid](
        grad, input, r, part, f64_bits(spatial_scale),
        N, C, H, W, ph, pw, int(sampling_ratio), n_pb,
        *grad.stride(), *input.stride(),
        ALIGNED=bool(aligned), MAX_MODE=max_mode, BLOCK_P=block_p, BLOCK_C=block_c, CF=cf, **LAUNCH_OPTS)
    out[:, 1:] = part.sum(dim=(1, 2))
    return out.to(rois.dtype)


def roi_align_forward(input: torch.Tensor, rois: torch.Tensor, spatial_scale: float, pooled_height: int,
                      pooled_width: int, sampling_ratio: int, aligned: bool) -> torch.Tensor:
    """RoIAlign "avg" forward: [K, C, ph, pw] in the input's dtype and memory format."""
    return _forward(input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned, False)[0]


def roi_align_backward(grad: torch.Tensor, rois: torch.Tensor, spatial_scale: float, pooled_height: int,
                       pooled_width: int, batch_size: int, channels: int, height: int, width: int,
                       sampling_ratio: int, aligned: bool, channels_last: bool, *,
                       deterministic: bool | None = None) -> torch.Tensor:
    """Gradient of roi_align_forward w.r.t. its input, [N, C, H, W] in grad's dtype.

    deterministic: None follows roiops.config.deterministic_backward, then torch's deterministic flag;
    see the module docstring for what the deterministic path costs.
    """
    return _backward(grad, None, rois, spatial_scale, pooled_height, pooled_width, batch_size, channels, height,
                     width, sampling_ratio, aligned, channels_last, False, deterministic)


def roi_align_max_forward(input: torch.Tensor, rois: torch.Tensor, spatial_scale: float, pooled_height: int,
                          pooled_width: int, sampling_ratio: int,
                          aligned: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """RoIAlign "max" forward: (out, argmax int32 = iy * grid_w + ix, -1 for no sample)."""
    return _forward(input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned, True)


def roi_align_max_backward(grad: torch.Tensor, argmax: torch.Tensor, rois: torch.Tensor, spatial_scale: float,
                           pooled_height: int, pooled_width: int, batch_size: int, channels: int, height: int,
                           width: int, sampling_ratio: int, aligned: bool, channels_last: bool, *,
                           deterministic: bool | None = None) -> torch.Tensor:
    """Gradient of roi_align_max_forward: each bin's grad goes to the four taps of its
    argmax sample with their bilinear weights."""
    return _backward(grad, argmax, rois, spatial_scale, pooled_height, pooled_width, batch_size, channels, height,
                     width, sampling_ratio, aligned, channels_last, True, deterministic)


def roi_align_rois_backward(grad: torch.Tensor, input: torch.Tensor, rois: torch.Tensor, spatial_scale: float,
                            pooled_height: int, pooled_width: int, sampling_ratio: int,
                            aligned: bool) -> torch.Tensor:
    """Gradient of roi_align_forward w.r.t. the box coordinates: [K, 5] in rois' dtype, the
    batch-index column 0 (see the module docstring)."""
    return _rois_backward(grad, input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned,
                          False)


def roi_align_max_rois_backward(grad: torch.Tensor, input: torch.Tensor, rois: torch.Tensor, spatial_scale: float,
                                pooled_height: int, pooled_width: int, sampling_ratio: int,
                                aligned: bool) -> torch.Tensor:
    """Gradient of roi_align_max_forward w.r.t. the box coordinates: that of each bin's
    chosen sample, recomputed as the forward chooses it."""
    return _rois_backward(grad, input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned,
                          True)


# ----------------------------------------------------------------------------- multi-level


def multi_scale_roi_align_forward(inputs: list[torch.Tensor], rois: torch.Tensor, levels: torch.Tensor,
                                  spatial_scales: list[float], pooled_height: int, pooled_width: int,
                                  sampling_ratio: int, aligned: bool) -> torch.Tensor:
    """RoIAlign "avg" of box k on ``inputs[levels[k]]`` at ``spatial_scales[levels[k]]``,
    all levels in one launch: [K, C, ph, pw] in the first input's dtype and memory format.
    A box whose level is not in [0, len(inputs)) gives 0."""
    first = inputs[0]
    check_device(first, _align_fwd_levels_kernel)
    fmt = memory_format(is_channels_last(first))
    # Dense in one layout, so that the kernel derives each level's strides from its size.
    maps = [x.contiguous(memory_format=fmt) for x in inputs]
    N, C = first.shape[:2]
    K = rois.shape[0]
    ph, pw = int(pooled_height), int(pooled_width)
    rois = dense(rois, opmath(first.dtype))
    levels = dense(levels, torch.int64)
    out = torch.empty((K, C, ph, pw), dtype=first.dtype, device=first.device, memory_format=fmt)
    if out.numel() == 0:
        return out
    ptrs, sbits, hs, ws = _level_args(maps, spatial_scales, [x.shape[2] for x in maps], [x.shape[3] for x in maps])
    cl = fmt == torch.channels_last
    budget = GPU_TILE // 2 if first.dtype == torch.float64 else GPU_TILE
    block_p, block_c, n_pb, n_cb, cf = tile_blocks(ph * pw, C, cl, first.is_cpu, budget, flat=True)
    _align_fwd_levels_kernel[(K * n_pb, n_cb)](
        *ptrs, rois, levels, out, *sbits, *hs, *ws, len(maps),
        N, C, ph, pw, int(sampling_ratio), n_pb, *out.stride(),
        ALIGNED=bool(aligned), BLOCK_P=block_p, BLOCK_C=block_c, CF=cf, **LAUNCH_OPTS)
    return out


def multi_scale_roi_align_backward(grad: torch.Tensor, rois: torch.Tensor, levels: torch.Tensor,
                                   spatial_scales: list[float], pooled_height: int, pooled_width: int,
                                   batch_size: int, channels: int, heights: list[int], widths: list[int],
                                   sampling_ratio: int, aligned: bool, channels_last: bool, *,
                                   deterministic: bool | None = None) -> list[torch.Tensor]:
    """Gradients of multi_scale_roi_align_forward w.r.t. each level's input, in one launch:
    [N, C, H_l, W_l] in grad's dtype."""
    check_device(grad, _align_bwd_atomic_levels_kernel)
    N, C = int(batch_size), int(channels)
    K = rois.shape[0]
    ph, pw = int(pooled_height), int(pooled_width)
    rois = dense(rois, opmath(grad.dtype))
    levels = dense(levels, torch.int64)
    on_cpu = grad.is_cpu
    det = use_deterministic(deterministic)
    # The gather writes every cell once; the scatter adds into zeros, in float32 for half types.
    acc_dtype = grad.dtype if det or grad.dtype in (torch.float32, torch.float64) else torch.float32
    fmt = memory_format(bool(channels_last))
    grads = [torch.empty((N, C, int(h), int(w)), dtype=acc_dtype, device=grad.device, memory_format=fmt)
             for h, w in zip(heights, widths)]
    empty = K == 0 or all(v.numel() == 0 for v in grads)
    if empty or not det:
        for v in grads:
            v.zero_()
    if not empty:
        ptrs, sbits, hs, ws = _level_args(grads, spatial_scales, [int(h) for h in heights], [int(w) for w in widths])
        L = len(grads)
        if det:
            tile_h, tile_w, block_c = gather_blocks(max(hs), max(ws), C, bool(channels_last), on_cpu,
                                                    grad.dtype == torch.float64)
            programs = [N * cdiv(h, tile_h) * cdiv(w, tile_w) for h, w in zip(hs[:L], ws[:L])]
            starts = _level_starts(programs)
            mask = _mark_tiles(rois, levels, sbits, hs, ws, starts, L, N, ph, pw, sampling_ratio, aligned,
                               sum(programs), tile_h, tile_w, levels_on=True)
            _align_bwd_gather_levels_kernel[(sum(programs), cdiv(C, block_c))](
                grad, rois, mask, *ptrs, *sbits, *hs, *ws, *starts,
                N, C, ph, pw, int(sampling_ratio), mask.shape[1], *grad.stride(),
                ALIGNED=bool(aligned), TILE_H=tile_h, TILE_W=tile_w, BLOCK_C=block_c, CF=bool(channels_last),
                **LAUNCH_OPTS)
        else:
            budget = GPU_TILE // 2 if grad.dtype == torch.float64 else GPU_TILE
            block_p, block_c, n_pb, n_cb, cf = tile_blocks(ph * pw, C, bool(channels_last), on_cpu, budget)
            _align_bwd_atomic_levels_kernel[(K * n_pb, n_cb)](
                grad, rois, levels, *ptrs, *sbits, *hs, *ws, L,
                N, C, ph, pw, int(sampling_ratio), n_pb, *grad.stride(),
                ALIGNED=bool(aligned), BLOCK_P=block_p, BLOCK_C=block_c, CF=cf, **LAUNCH_OPTS)
    return grads if acc_dtype == grad.dtype else [v.to(grad.dtype) for v in grads]
