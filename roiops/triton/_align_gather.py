"""RoIAlign's deterministic backward in Triton, for one feature-map level (roi_align.py)
or several (multi_scale.py).

Taken when ``torch.are_deterministic_algorithms_enabled()``,
``roiops.config.deterministic_backward`` or ``deterministic=True`` asks for it: a gather,
not a scatter, in two launches:

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
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._align import align_box
from ._common import (LAUNCH_OPTS, cdiv, gather_blocks, gather_grid, grad_input, kernel, level_args, level_starts,
                      next_pow2, tile_mask)
from ._jit import (add_marked, axis_taps, box_level, div_rn, level_map, mark_box, may_touch, pick, pixel_tile,
                   sample_pos, scale_of, store_tile, tile_axis_weights, touched_cells)
from ._jit import along_c as _c  # per-channel vector -> tile axis
from ._jit import along_p as _p  # per-bin / per-pixel vector -> tile axis


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
    ok, b, sx, sy, bw, bh, gwf, ghf, gw, gh, count = align_box(rois_ptr, k, True, scale, N, ph, pw, sampling_ratio,
                                                          ALIGNED, MAX_MODE)
    use = ok & (b == n) & (gh > 0) & (gw > 0)
    use = use & may_touch(sy, sy + ph * bh, r_lo, r_hi, Hf) & may_touch(sx, sx + pw * bw, s_lo, s_hi, Wf)
    if use:
        for i in range(0, ph):
            ya = sy + i * bh
            if may_touch(ya, ya + bh, r_lo, r_hi, Hf):
                if not MAX_MODE:
                    # Row weights of this bin row, summed over its samples.
                    wy = tile_axis_weights(r, ya, bh, ghf, r_lo, r_hi, H)
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
                            wx = tile_axis_weights(s, xa, bw, gwf, s_lo, s_hi, W)
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
    # The boxes marked for this tile by _align_tiles_kernel.
    acc = add_marked(acc, mask_ptr, tile, n_words, _gather_box,
                     (grad_ptr, arg_ptr, rois_ptr, n, r, s, r_lo, r_hi, s_lo, s_hi, cm, c64, scale, N, H, W, ph, pw,
                      sampling_ratio, sgK, sgC, sgH, sgW, saK, saC, saH, saW, ALIGNED, MAX_MODE, TILE_H, TILE_W, CF))

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
    ok, b, sx, sy, bw, bh, gwf, ghf, gw, gh, count = align_box(rois_ptr, k.to(tl.int64), valid, scale, N, ph, pw,
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


# ----------------------------------------------------------------------------- launchers

def _mark_tiles(rois, levels, sbits, hs, ws, starts, n_levels, N, ph, pw, sampling_ratio, aligned, n_tiles, tile_h,
                tile_w, levels_on):
    """[n_tiles, ceil(K / 32)] int32 bit mask: bit k of row t is set when box k can reach
    gather tile t (see _align_tiles_kernel). Zero-filled and written on the device. The
    per-level arguments come padded (level_args, level_starts)."""
    mask = tile_mask(n_tiles, rois.shape[0], rois.device)
    _align_tiles_kernel[(rois.shape[0],)](
        rois, levels, mask, *sbits, *hs, *ws, *starts, n_levels, N, ph, pw, int(sampling_ratio), mask.shape[1],
        ALIGNED=bool(aligned), LEVELS=levels_on, TILE_H=tile_h, TILE_W=tile_w,
        BLOCK=min(next_pow2(cdiv(max(ws), tile_w)), 64), **LAUNCH_OPTS)
    return mask


def gather_backward(grad, arg, rois, spatial_scale, N, C, H, W, ph, pw, sampling_ratio, aligned, channels_last,
                    max_mode):
    """grad_input [N, C, H, W] in grad's dtype (arg: argmax in max mode), rois in opmath."""
    gi = grad_input(grad, N, C, H, W, channels_last)
    tile_h, tile_w, block_c, n_tw, n_tiles = gather_grid(grad, H, W, C, channels_last)
    _, sbits, hs, ws = level_args([rois], [spatial_scale], [H], [W])
    mask = _mark_tiles(rois, rois, sbits, hs, ws, level_starts([N * n_tiles]), 1, N, ph, pw, sampling_ratio,
                       aligned, N * n_tiles, tile_h, tile_w, levels_on=False)
    _align_bwd_gather_kernel[(N * n_tiles, cdiv(C, block_c))](
        grad, arg, rois, gi, mask, sbits[0],
        N, C, H, W, ph, pw, int(sampling_ratio), n_tw, n_tiles, mask.shape[1],
        *grad.stride(), *arg.stride(), *gi.stride(),
        ALIGNED=bool(aligned), MAX_MODE=max_mode, TILE_H=tile_h, TILE_W=tile_w, BLOCK_C=block_c,
        # [pixels, channels] for both layouts: the NCHW tile's single store gets its own
        # coalesced layout from the compiler, while [channels, pixels] would about triple
        # the registers of the per-bin updates.
        CF=True,
        **LAUNCH_OPTS)
    return gi


def gather_backward_levels(grad, rois, levels, grads, spatial_scales, N, C, ph, pw, sampling_ratio, aligned,
                           channels_last) -> None:
    """Writes the gradient of each level's input into `grads` (grad's dtype; rois in opmath)."""
    ptrs, sbits, hs, ws = level_args(grads, spatial_scales, [v.shape[2] for v in grads], [v.shape[3] for v in grads])
    tile_h, tile_w, block_c = gather_blocks(max(hs), max(ws), C, channels_last, grad.is_cpu,
                                            grad.dtype == torch.float64)
    programs = [N * cdiv(v.shape[2], tile_h) * cdiv(v.shape[3], tile_w) for v in grads]
    starts = level_starts(programs)
    mask = _mark_tiles(rois, levels, sbits, hs, ws, starts, len(grads), N, ph, pw, sampling_ratio, aligned,
                       sum(programs), tile_h, tile_w, levels_on=True)
    _align_bwd_gather_levels_kernel[(sum(programs), cdiv(C, block_c))](
        grad, rois, mask, *ptrs, *sbits, *hs, *ws, *starts,
        N, C, ph, pw, int(sampling_ratio), mask.shape[1], *grad.stride(),
        ALIGNED=bool(aligned), TILE_H=tile_h, TILE_W=tile_w, BLOCK_C=block_c, CF=channels_last, **LAUNCH_OPTS)
