"""Rotated RoIAlign in Triton (docs/semantics.md, "roi_align_rotated"), forward and backward.

Forward and the atomic backward run one program per (box, block of bins, block of
channels), as roi_align.py does. A rotated box's samples are not separable, but each bin
still visits only the samples near the map: per bin row (column), `sample_span` bounds the
sample indices whose box coordinate falls within the map's extent seen along the box's
axes, widened by a margin above the rounding of the rotation. cos and sin of each angle
are computed by the launcher on the device (float64, rounded once, as the C++ kernels do),
without a host sync.

The deterministic backward (``deterministic=True``, ``roiops.config.deterministic_backward``
or torch's deterministic flag) runs one program per (image, 16 x 16 cells of the map,
block of channels): it walks every box in increasing order and adds, sample after sample,
the taps that land in its own cells. Each cell thus gets its terms from one program in a
fixed order: bit-identical from run to run. A box that cannot reach the tile costs a test,
and per bin only the samples whose coordinates along the box's axes can reach it are
visited (sample_span of the tile's extent along those axes). Its cost grows with the
number of boxes times the tiles of the map (every program tests every box), as the other
deterministic gathers' does.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._geometry import dense
from .._kernel_checks import kernel_check
from ._common import (INTERP_TILE, LAUNCH_OPTS, box_forward, box_grid, cdiv, check_device, f64_bits, from_atomic,
                      grad_input, kernel, opmath, tile_budget, use_deterministic)
from ._jit import (MAX_COORD, axis_taps, bin_grid, bin_tile, box_program, div_rn, sample_pos, sample_span, scale_of,
                   with_flag)
from ._jit import along_c as _c
from ._jit import along_p as _p

__all__ = ["roi_align_rotated_backward", "roi_align_rotated_forward"]


@triton.jit
def _rotated_box(rois_ptr, cs_ptr, k, N, scale, ph, pw, sampling_ratio, ALIGNED: tl.constexpr):
    """Box k's row check and geometry: (ok, batch, centre cy, cx, cos, sin, bin sizes bh, bw,
    grid ghf, gwf, count, and the box's top-left corner in its own axes, sh = -height / 2,
    sw = -width / 2). A bad row (batch index, a coordinate beyond MAX_COORD cells after
    scaling, a non-finite angle) comes back with ok False and harmless values."""
    base = rois_ptr + k * 6
    bf = tl.load(base)
    cx = tl.load(base + 1)
    cy = tl.load(base + 2)
    w = tl.load(base + 3)
    h = tl.load(base + 4)
    cos = tl.load(cs_ptr + k * 2)
    sin = tl.load(cs_ptr + k * 2 + 1)
    ok = (bf >= 0) & (bf < N) & (bf == tl.floor(bf))
    ok = ok & (tl.abs(cx * scale) <= MAX_COORD) & (tl.abs(cy * scale) <= MAX_COORD)
    ok = ok & (tl.abs(w * scale) <= MAX_COORD) & (tl.abs(h * scale) <= MAX_COORD)
    ok = ok & (tl.abs(cos) <= 1.0) & (tl.abs(sin) <= 1.0)
    b = tl.where(ok, bf, 0.0).to(tl.int64)
    cx = tl.where(ok, cx, 0.0)
    cy = tl.where(ok, cy, 0.0)
    w = tl.where(ok, w, 0.0)
    h = tl.where(ok, h, 0.0)
    cos = tl.where(ok, cos, 1.0)
    sin = tl.where(ok, sin, 0.0)
    if ALIGNED:
        off = 0.5
    else:
        off = 0.0
    # Scale first, then shift by the offset.
    cx = cx * scale - off
    cy = cy * scale - off
    rw, rh, bw, bh, gwf, ghf, count = bin_grid(w * scale, h * scale, ph, pw, sampling_ratio, ALIGNED)
    # -rh * 0.5 is -rh / 2 exactly (Triton's float32 / is approximate)
    return ok, b, cy, cx, cos, sin, bh, bw, ghf, gwf, count, -rh * 0.5, -rw * 0.5


@triton.jit
def _region(cy, cx, cos, sin, sh, sw, y0, y1, x0, x1, H, W):
    """The rectangle [y0, y1] x [x0, x1] of the map seen from the box's centre along its
    axes (float64), widened by more than the rounding of the rotation: (ylo, yhi, xlo, xhi)."""
    c = cos.to(tl.float64)
    s = sin.to(tl.float64)
    a0 = y0 - cy.to(tl.float64)
    a1 = y1 - cy.to(tl.float64)
    b0 = x0 - cx.to(tl.float64)
    b1 = x1 - cx.to(tl.float64)
    y00, y01, y10, y11 = a0 * c + b0 * s, a0 * c + b1 * s, a1 * c + b0 * s, a1 * c + b1 * s
    x00, x01, x10, x11 = b0 * c - a0 * s, b1 * c - a0 * s, b0 * c - a1 * s, b1 * c - a1 * s
    margin = 2.0 + (tl.abs(cx.to(tl.float64)) + tl.abs(cy.to(tl.float64)) + 2.0 * tl.abs(sw.to(tl.float64))
                    + 2.0 * tl.abs(sh.to(tl.float64)) + H + W) * 9.5367431640625e-07
    ylo = tl.minimum(tl.minimum(y00, y01), tl.minimum(y10, y11)) - margin
    yhi = tl.maximum(tl.maximum(y00, y01), tl.maximum(y10, y11)) + margin
    xlo = tl.minimum(tl.minimum(x00, x01), tl.minimum(x10, x11)) - margin
    xhi = tl.maximum(tl.maximum(x00, x01), tl.maximum(x10, x11)) + margin
    return ylo, yhi, xlo, xhi


@triton.jit
def _box_tile(rois_ptr, cs_ptr, scale_bits, n_pblocks, N, C, H, W, ph, pw, sampling_ratio, ALIGNED: tl.constexpr,
              BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr, CF: tl.constexpr):
    """The per-box kernels' prologue: box_program; box k's row and geometry (_rotated_box)
    and the map [-1, H] x [-1, W] along its axes (_region); the program's tile (bin_tile).
    Returns k (int64), _rotated_box's values, (ylo, yhi, xlo, xhi) and the tile."""
    k, pb, cb = box_program(n_pblocks)
    k = k.to(tl.int64)
    scale = scale_of(scale_bits, rois_ptr.dtype.element_ty)
    ok, b, cy, cx, cos, sin, bh, bw, ghf, gwf, count, sh, sw = _rotated_box(rois_ptr, cs_ptr, k, N, scale, ph, pw,
                                                                           sampling_ratio, ALIGNED)
    ylo, yhi, xlo, xhi = _region(cy, cx, cos, sin, sh, sw, -1.0, H.to(tl.float64), -1.0, W.to(tl.float64), H, W)
    p, pm, i, j, c, cm = bin_tile(pb, cb, ph, pw, C, BLOCK_P, BLOCK_C, CF)
    return k, ok, b, cy, cx, cos, sin, bh, bw, ghf, gwf, count, sh, sw, ylo, yhi, xlo, xhi, p, pm, i, j, c, cm


@triton.jit
def _taps(yy, xx, cy, cx, cos, sin, H, W):
    """The rotated sample's bilinear taps: (ylo, yhi, xlo, xhi, w1, w2, w3, w4, inside)."""
    y = yy * cos - xx * sin + cy
    x = yy * sin + xx * cos + cx
    ylo, yhi, ly, hy, iny = axis_taps(y, H)
    xlo, xhi, lx, hx, inx = axis_taps(x, W)
    return ylo, yhi, xlo, xhi, hy * hx, hy * lx, ly * hx, ly * lx, iny & inx


@triton.jit
def _spans(live, i, j, sh, sw, bh, bw, ghf, gwf, ylo, yhi, xlo, xhi):
    """Bin (i, j)'s start along each box axis and its samples near the map (sample_span of
    the map's extent along the axes): (ybase, fy, ny, xbase, fx, nx), counts 0 unless live."""
    ybase = sh + i.to(sh.dtype) * bh
    xbase = sw + j.to(sw.dtype) * bw
    fy, ey = sample_span(ybase, bh, ghf, ylo, yhi)
    fx, ex = sample_span(xbase, bw, gwf, xlo, xhi)
    return ybase, fy, tl.where(live, ey - fy, 0), xbase, fx, tl.where(live, ex - fx, 0)


@kernel
def _rotated_fwd_kernel(
    x_ptr, rois_ptr, cs_ptr, out_ptr, scale_bits,
    N, C, H, W, ph, pw, sampling_ratio, n_pblocks,
    sxN, sxC, sxH, sxW, soK, soC, soH, soW,
    ALIGNED: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr, CF: tl.constexpr,
):
    T = rois_ptr.dtype.element_ty
    k, ok, b, cy, cx, cos, sin, bh, bw, ghf, gwf, count, sh, sw, ylo, yhi, xlo, xhi, p, pm, i, j, c, cm = _box_tile(
        rois_ptr, cs_ptr, scale_bits, n_pblocks, N, C, H, W, ph, pw, sampling_ratio, ALIGNED, BLOCK_P, BLOCK_C, CF)
    tile_m = with_flag(_p(pm, CF) & _c(cm, CF), ok)
    x_base = x_ptr + b * sxN + _c(c.to(tl.int64) * sxC, CF)
    ybase, fy, ny, xbase, fx, nx = _spans(with_flag(pm, ok), i, j, sh, sw, bh, bw, ghf, gwf, ylo, yhi, xlo, xhi)
    acc = _p(tl.zeros([BLOCK_P], dtype=T), CF) + _c(tl.zeros([BLOCK_C], dtype=T), CF)
    for dy in range(0, tl.max(ny, axis=0)):
        yy = sample_pos(ybase, fy + dy, bh, ghf)
        for dx in range(0, tl.max(nx, axis=0)):
            xx = sample_pos(xbase, fx + dx, bw, gwf)
            ylo_, yhi_, xlo_, xhi_, w1, w2, w3, w4, inside = _taps(yy, xx, cy, cx, cos, sin, H, W)
            m = tile_m & _p(inside & (dy < ny) & (dx < nx), CF)
            oy0 = ylo_.to(tl.int64) * sxH
            oy1 = yhi_.to(tl.int64) * sxH
            ox0 = xlo_.to(tl.int64) * sxW
            ox1 = xhi_.to(tl.int64) * sxW
            v1 = tl.load(x_base + _p(oy0 + ox0, CF), mask=m, other=0.0).to(T)
            v2 = tl.load(x_base + _p(oy0 + ox1, CF), mask=m, other=0.0).to(T)
            v3 = tl.load(x_base + _p(oy1 + ox0, CF), mask=m, other=0.0).to(T)
            v4 = tl.load(x_base + _p(oy1 + ox1, CF), mask=m, other=0.0).to(T)
            acc += _p(w1, CF) * v1 + _p(w2, CF) * v2 + _p(w3, CF) * v3 + _p(w4, CF) * v4
    o = k * soK + _c(c.to(tl.int64) * soC, CF) + _p(i.to(tl.int64) * soH + j.to(tl.int64) * soW, CF)
    res = tl.where(tile_m, div_rn(acc, count), 0.0)
    tl.store(out_ptr + o, res.to(out_ptr.dtype.element_ty), mask=_p(pm, CF) & _c(cm, CF))


@kernel
def _rotated_bwd_atomic_kernel(
    grad_ptr, rois_ptr, cs_ptr, gi_ptr, scale_bits,
    N, C, H, W, ph, pw, sampling_ratio, n_pblocks,
    sgK, sgC, sgH, sgW, siN, siC, siH, siW,
    ALIGNED: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr, CF: tl.constexpr,
):
    """Scatters (grad / count) * w of every sample of a tile's bins to its four taps."""
    T = rois_ptr.dtype.element_ty
    G = gi_ptr.dtype.element_ty
    k, ok, b, cy, cx, cos, sin, bh, bw, ghf, gwf, count, sh, sw, ylo, yhi, xlo, xhi, p, pm, i, j, c, cm = _box_tile(
        rois_ptr, cs_ptr, scale_bits, n_pblocks, N, C, H, W, ph, pw, sampling_ratio, ALIGNED, BLOCK_P, BLOCK_C, CF)
    tile_m = with_flag(_p(pm, CF) & _c(cm, CF), ok)
    g = tl.load(grad_ptr + k * sgK + _c(c.to(tl.int64) * sgC, CF) + _p(i.to(tl.int64) * sgH + j.to(tl.int64) * sgW,
                                                                      CF), mask=tile_m, other=0.0).to(T)
    q = div_rn(g, count)
    gi_base = gi_ptr + b * siN + _c(c.to(tl.int64) * siC, CF)
    ybase, fy, ny, xbase, fx, nx = _spans(with_flag(pm, ok), i, j, sh, sw, bh, bw, ghf, gwf, ylo, yhi, xlo, xhi)
    for dy in range(0, tl.max(ny, axis=0)):
        yy = sample_pos(ybase, fy + dy, bh, ghf)
        for dx in range(0, tl.max(nx, axis=0)):
            xx = sample_pos(xbase, fx + dx, bw, gwf)
            ylo_, yhi_, xlo_, xhi_, w1, w2, w3, w4, inside = _taps(yy, xx, cy, cx, cos, sin, H, W)
            m = tile_m & _p(inside & (dy < ny) & (dx < nx), CF)
            oy0 = ylo_.to(tl.int64) * siH
            oy1 = yhi_.to(tl.int64) * siH
            ox0 = xlo_.to(tl.int64) * siW
            ox1 = xhi_.to(tl.int64) * siW
            tl.atomic_add(gi_base + _p(oy0 + ox0, CF), (q * _p(w1, CF)).to(G), mask=m, sem="relaxed")
            tl.atomic_add(gi_base + _p(oy0 + ox1, CF), (q * _p(w2, CF)).to(G), mask=m, sem="relaxed")
            tl.atomic_add(gi_base + _p(oy1 + ox0, CF), (q * _p(w3, CF)).to(G), mask=m, sem="relaxed")
            tl.atomic_add(gi_base + _p(oy1 + ox1, CF), (q * _p(w4, CF)).to(G), mask=m, sem="relaxed")


@triton.jit
def _add_tile_taps(gi_base, q, yy, xx, cy, cx, cos, sin, H, W, r0, r1, s0, s1, cm, siH, siW):
    """Adds q times the weight of each tap of sample (yy, xx) that lies in rows [r0, r1) and
    columns [s0, s1), at gi_base (per channel lane, cm) plus the tap's offset, taps in order."""
    G = gi_base.dtype.element_ty
    ylo, yhi, xlo, xhi, w1, w2, w3, w4, inside = _taps(yy, xx, cy, cx, cos, sin, H, W)
    y0in = inside & (ylo >= r0) & (ylo < r1)
    y1in = inside & (yhi >= r0) & (yhi < r1)
    x0in = (xlo >= s0) & (xlo < s1)
    x1in = (xhi >= s0) & (xhi < s1)
    oy0 = ylo.to(tl.int64) * siH
    oy1 = yhi.to(tl.int64) * siH
    ox0 = xlo.to(tl.int64) * siW
    ox1 = xhi.to(tl.int64) * siW
    tl.atomic_add(gi_base + oy0 + ox0, (q * w1).to(G), mask=with_flag(cm, y0in & x0in), sem="relaxed")
    tl.atomic_add(gi_base + oy0 + ox1, (q * w2).to(G), mask=with_flag(cm, y0in & x1in), sem="relaxed")
    tl.atomic_add(gi_base + oy1 + ox0, (q * w3).to(G), mask=with_flag(cm, y1in & x0in), sem="relaxed")
    tl.atomic_add(gi_base + oy1 + ox1, (q * w4).to(G), mask=with_flag(cm, y1in & x1in), sem="relaxed")


@kernel
def _rotated_bwd_ordered_kernel(
    grad_ptr, rois_ptr, cs_ptr, gi_ptr, scale_bits,
    K, N, C, H, W, ph, pw, sampling_ratio, TILE, n_tw, n_tiles,
    sgK, sgC, sgH, sgW, siN, siC, siH, siW,
    ALIGNED: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """Deterministic backward: one program per (image, TILE x TILE cells of the map, block
    of channels) adds box after box, bin after bin, sample after sample, the taps that fall
    in its cells. Only it writes those cells, in that order, and its lanes are distinct
    channels, so no two updates of one address ever race. Per box and bin, it visits only
    the samples whose coordinates along the box's axes can reach the tile (sample_span of
    the tile's extent along those axes)."""
    T = rois_ptr.dtype.element_ty
    scale = scale_of(scale_bits, T)
    pid = tl.program_id(0)
    n = pid // n_tiles
    t = pid - n * n_tiles
    th = t // n_tw
    r0 = th * TILE
    s0 = (t - th * n_tw) * TILE
    r1 = tl.minimum(r0 + TILE, H)
    s1 = tl.minimum(s0 + TILE, W)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    cm = c < C
    c64 = c.to(tl.int64)
    gi_base = gi_ptr + n.to(tl.int64) * siN + c64 * siC
    for k in range(0, K):
        k64 = k + tl.zeros([], dtype=tl.int64)
        ok, b, cy, cx, cos, sin, bh, bw, ghf, gwf, count, sh, sw = _rotated_box(
            rois_ptr, cs_ptr, k64, N, scale, ph, pw, sampling_ratio, ALIGNED)
        if ok & (b == n):  # the other images' boxes cost no more than this test
            # A sample taps rows floor(y) and floor(y) + 1, clamped into the map: those in
            # the tile come from y in [r0 - 2, r1 + 1] (likewise x); the box meets that
            # region if its extent [-|sh|, |sh|] x [-|sw|, |sw|] along its axes does.
            ylo, yhi, xlo, xhi = _region(cy, cx, cos, sin, sh, sw, (r0 - 2).to(tl.float64),
                                         (r1 + 1).to(tl.float64), (s0 - 2).to(tl.float64), (s1 + 1).to(tl.float64),
                                         H, W)
            ah = tl.abs(sh).to(tl.float64)
            aw = tl.abs(sw).to(tl.float64)
            if (ylo <= ah) & (yhi >= -ah) & (xlo <= aw) & (xhi >= -aw):
                for p in range(0, ph * pw):
                    i = p // pw
                    j = p - i * pw
                    ybase, fy, ny, xbase, fx, nx = _spans(ok, i, j, sh, sw, bh, bw, ghf, gwf, ylo, yhi, xlo, xhi)
                    if (ny > 0) & (nx > 0):
                        g = tl.load(grad_ptr + k64 * sgK + c64 * sgC + i.to(tl.int64) * sgH + j.to(tl.int64) * sgW,
                                    mask=cm, other=0.0).to(T)
                        q = div_rn(g, count)
                        for dy in range(0, ny):
                            yy = sample_pos(ybase, fy + dy, bh, ghf)
                            for dx in range(0, nx):
                                xx = sample_pos(xbase, fx + dx, bw, gwf)
                                _add_tile_taps(gi_base, q, yy, xx, cy, cx, cos, sin, H, W, r0, r1, s0, s1, cm, siH,
                                               siW)


_check_forward = kernel_check("roi_align_rotated")
_check_backward = kernel_check("roi_align_rotated", "backward")


def _cos_sin(rois: torch.Tensor) -> torch.Tensor:
    """[K, 2] cos and sin of the angles, computed in float64 and rounded to the rois' type
    (non-finite angles give NaN, which the kernels mask as a bad row)."""
    theta = rois[:, 5].double()
    # Written through out=, which rounds the float64 results once: two ops, not five.
    cs = torch.empty((rois.shape[0], 2), dtype=rois.dtype, device=rois.device)
    torch.cos(theta, out=cs[:, 0])
    torch.sin(theta, out=cs[:, 1])
    return cs


def roi_align_rotated_forward(input: torch.Tensor, rois: torch.Tensor, spatial_scale: float, pooled_height: int,
                              pooled_width: int, sampling_ratio: int, aligned: bool) -> torch.Tensor:
    """Rotated RoIAlign forward: [K, C, ph, pw] in the input's dtype and memory format."""
    _check_forward(input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned)
    check_device(input, _rotated_fwd_kernel)
    f = box_forward(input, rois, pooled_height, pooled_width, tile_budget(input.dtype), flat=True)
    if f.out.numel():
        f.grid.launch(_rotated_fwd_kernel, (input, f.rois, _cos_sin(f.rois), f.out, f64_bits(spatial_scale), *f.sizes,
                                            int(sampling_ratio)),
                      (*input.stride(), *f.out.stride()), ALIGNED=bool(aligned))
    return f.out


def roi_align_rotated_backward(grad: torch.Tensor, rois: torch.Tensor, spatial_scale: float, pooled_height: int,
                               pooled_width: int, batch_size: int, channels: int, height: int, width: int,
                               sampling_ratio: int, aligned: bool, channels_last: bool, *,
                               deterministic: bool | None = None) -> torch.Tensor:
    """Gradient of roi_align_rotated_forward w.r.t. its input, [N, C, H, W] in grad's dtype.

    deterministic: None follows roiops.config.deterministic_backward, then torch's deterministic flag.
    """
    _check_backward(grad, rois, spatial_scale, pooled_height, pooled_width, batch_size, channels, height, width,
                    sampling_ratio, aligned, channels_last)
    check_device(grad, _rotated_bwd_atomic_kernel)
    N, C, H, W = int(batch_size), int(channels), int(height), int(width)
    K = rois.shape[0]
    ph, pw = int(pooled_height), int(pooled_width)
    rois = dense(rois, opmath(grad.dtype))
    # Both paths add atomically (the deterministic one in a fixed order).
    gi = grad_input(grad, N, C, H, W, bool(channels_last), atomic=True)
    if K == 0 or gi.numel() == 0:
        return from_atomic(gi, grad.dtype)
    common = (grad, rois, _cos_sin(rois), gi, f64_bits(spatial_scale))
    if use_deterministic(deterministic):
        # Each program walks every box, so the walk's length, not the lanes, sets its time:
        # many programs of one warp. Small tiles on the CPU test the tiles' edges.
        on_cpu = grad.is_cpu
        tile = 8 if on_cpu else 16
        block_c = min(triton.next_power_of_2(C), INTERP_TILE if on_cpu else 32)
        n_tw = cdiv(W, tile)
        n_tiles = cdiv(H, tile) * n_tw
        _rotated_bwd_ordered_kernel[(N * n_tiles, cdiv(C, block_c))](
            *common, K, N, C, H, W, ph, pw, int(sampling_ratio), tile, n_tw, n_tiles, *grad.stride(), *gi.stride(),
            ALIGNED=bool(aligned), BLOCK_C=block_c, **{**LAUNCH_OPTS, "num_warps": 1})
    else:
        box_grid(K, ph, pw, C, bool(channels_last), grad.is_cpu, tile_budget(grad.dtype)).launch(
            _rotated_bwd_atomic_kernel, (*common, N, C, H, W, ph, pw, int(sampling_ratio)),
            (*grad.stride(), *gi.stride()), ALIGNED=bool(aligned))
    return from_atomic(gi, grad.dtype)
