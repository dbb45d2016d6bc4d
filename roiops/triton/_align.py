"""RoIAlign's device functions shared by its Triton modules: a box's geometry, and the
forward's and the atomic backward's work on one tile of bins x channels of a box, for one
feature-map level (roi_align.py) or several (multi_scale.py); the deterministic backward
(_align_gather.py) and the box gradient (roi_align_box_grad.py) reuse the geometry and the
forward's pooling. Work mapping: roi_align.py's docstring.
"""

import triton
import triton.language as tl

from ._jit import (align_geometry, argmax_fits, axis_taps, beats, bin_tile, div_rn, first_skipped, load_roi, map_spans,
                   sample_pos, sample_taps, scatter_samples, with_flag)
from ._jit import along_c as _c  # per-channel vector -> tile axis
from ._jit import along_p as _p  # per-bin / per-pixel vector -> tile axis


@triton.jit
def align_box(rois_ptr, k, valid, scale, N, ph, pw, sampling_ratio, ALIGNED: tl.constexpr, MAX_MODE: tl.constexpr):
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
def align_tile(rois_ptr, k, pb, cb, valid, scale, N, C, ph, pw, sampling_ratio, ALIGNED: tl.constexpr,
               MAX_MODE: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr, CF: tl.constexpr):
    """The prologue of RoIAlign's per-box tiles: box k's row check and geometry (align_box),
    the program's tile of it (bin_tile) and the tile's mask, empty for a bad box. Returns
    align_box's values, bin_tile's and the mask."""
    ok, b, sx, sy, bw, bh, gwf, ghf, gw, gh, count = align_box(rois_ptr, k.to(tl.int64), valid, scale, N, ph, pw,
                                                               sampling_ratio, ALIGNED, MAX_MODE)
    p, pm, i, j, c, cm = bin_tile(pb, cb, ph, pw, C, BLOCK_P, BLOCK_C, CF)
    tile_m = with_flag(_p(pm, CF) & _c(cm, CF), ok)
    return ok, b, sx, sy, bw, bh, gwf, ghf, gw, gh, count, p, pm, i, j, c, cm, tile_m


@triton.jit
def pool_bins(x_base, tile_m, live, ybase, xbase, bh, bw, ghf, gwf, gh, gw, H, W, sxH, sxW,
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
        _, oylo, oyhi, ly, hy, iny = sample_taps(ybase, iy, bh, ghf, H, sxH)
        row = dy < ny
        for dx in range(0, tl.max(nx, axis=0)):
            ix = fx + dx
            _, oxlo, oxhi, lx, hx, inx = sample_taps(xbase, ix, bw, gwf, W, sxW)
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
def argmax_taps(arg, has, ybase, xbase, bh, bw, ghf, gwf, gw, H, W, sH, sW, CF: tl.constexpr):
    """The taps of each tile element's argmax sample arg = iy * grid_w + ix (where `has`) in
    its bin (ybase, xbase: the bins' starts): (iy, ix, the grid sides at least 1 (ghs, gws),
    the sample's y and x, axis_taps' weights ly, hy, lx, hx, m: has and inside the map, and
    the taps' offsets (ylo, xlo), (ylo, xhi), (yhi, xlo), (yhi, xhi) with strides sH, sW)."""
    gwi = tl.maximum(gw, 1)
    iy = tl.where(has, arg // gwi, 0)
    ix = tl.where(has, arg - (arg // gwi) * gwi, 0)
    # max(., 1): a box without samples has no argmax; keep its lanes free of 0/0.
    ghs = tl.maximum(ghf, 1.0)
    gws = tl.maximum(gwf, 1.0)
    y = sample_pos(_p(ybase, CF), iy, bh, ghs)
    x = sample_pos(_p(xbase, CF), ix, bw, gws)
    ylo, yhi, ly, hy, iny = axis_taps(y, H)
    xlo, xhi, lx, hx, inx = axis_taps(x, W)
    oylo = ylo.to(tl.int64) * sH
    oyhi = yhi.to(tl.int64) * sH
    oxlo = xlo.to(tl.int64) * sW
    oxhi = xhi.to(tl.int64) * sW
    return (iy, ix, ghs, gws, y, x, ly, hy, lx, hx, has & iny & inx,
            oylo + oxlo, oylo + oxhi, oyhi + oxlo, oyhi + oxhi)


@triton.jit
def fwd_tile(
    x_ptr, rois_ptr, out_ptr, arg_ptr, k, pb, cb, valid, scale,
    N, C, H, W, ph, pw, sampling_ratio,
    sxN, sxC, sxH, sxW, soK, soC, soH, soW,
    ALIGNED: tl.constexpr, MAX_MODE: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr,
    CF: tl.constexpr,
):
    """Bins [pb * BLOCK_P, +BLOCK_P) x channels [cb * BLOCK_C, +BLOCK_C) of box k; the box
    is masked unless `valid` (the multi-level kernel's level check)."""
    T = rois_ptr.dtype.element_ty
    ok, b, sx, sy, bw, bh, gwf, ghf, gw, gh, count, p, pm, i, j, c, cm, tile_m = align_tile(
        rois_ptr, k, pb, cb, valid, scale, N, C, ph, pw, sampling_ratio, ALIGNED, MAX_MODE, BLOCK_P, BLOCK_C, CF)
    x_base = x_ptr + b * sxN + _c(c.to(tl.int64) * sxC, CF)
    ybase = sy + i.to(T) * bh
    xbase = sx + j.to(T) * bw

    acc, arg = pool_bins(x_base, tile_m, with_flag(pm, ok), ybase, xbase, bh, bw, ghf, gwf, gh, gw, H, W, sxH, sxW,
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


@triton.jit
def bwd_atomic_tile(
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
    ok, b, sx, sy, bw, bh, gwf, ghf, gw, gh, count, p, pm, i, j, c, cm, tile_m = align_tile(
        rois_ptr, k, pb, cb, valid, scale, N, C, ph, pw, sampling_ratio, ALIGNED, MAX_MODE, BLOCK_P, BLOCK_C, CF)
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
        _, _, _, _, _, _, ly, hy, lx, hx, m, o1, o2, o3, o4 = argmax_taps(
            a, tile_m & (a >= 0) & (a < gh * gw), ybase, xbase, bh, bw, ghf, gwf, gw, H, W, siH, siW, CF)
        tl.atomic_add(gi_base + o1, ((hy * hx) * g).to(G), mask=m, sem="relaxed")
        tl.atomic_add(gi_base + o2, ((hy * lx) * g).to(G), mask=m, sem="relaxed")
        tl.atomic_add(gi_base + o3, ((ly * hx) * g).to(G), mask=m, sem="relaxed")
        tl.atomic_add(gi_base + o4, ((ly * lx) * g).to(G), mask=m, sem="relaxed")
    else:
        # Only the samples that can touch the map (see the forward).
        scatter_samples(gi_base, g, count, with_flag(pm, ok), tile_m, ybase, xbase, bh, bw, ghf, gwf, H, W, siH, siW,
                        CF)


