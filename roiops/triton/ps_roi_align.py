"""Position-sensitive RoIAlign in Triton (docs/semantics.md, "ps_roi_align").

Forward: one program per (box, block of bins, block of output channels), as roi_align.py's
forward: the box's geometry (roi_align's with the half-cell shift) and each bin's sample
taps are computed once per tile, and bin p of output channel c reads input channel
c * ph * pw + p. Samples are visited over their span near the map (sample_span).

Backward, fast path: one program per (box, block of bins, block of output channels), as
the forward, adds ``grad * weight / count`` to each tap of each sample near the map with
atomic adds (into a float32 scratch for half types): the order of the adds, and so the
last bits, vary between runs.

Backward, deterministic path (``torch.are_deterministic_algorithms_enabled()``,
``roiops.config.deterministic_backward`` or ``deterministic=True``): a gather with no
atomics. One program per (image, bin, tile of 8x8 map cells, block of output channels)
owns the tile of input channels c * ph * pw + bin; it walks all boxes in increasing index
and, for each box of its image, the samples of the bin that can reach the tile, adding
``grad * weight / count`` for each tap that hits one of its cells, then writes the tile
once. Each cell thus receives its terms in the CPU kernels' order (box, sample row, sample
column, tap), so the float32 and float64 gradients equal theirs bit for bit. Its cost
grows with the number of boxes times the tiles of the map (every program reads every box
row).
"""

from __future__ import annotations

import torch
import triton.language as tl

from .._kernel_checks import kernel_check
from ._common import check_device, kernel
from ._jit import (align_geometry, axis_taps, box_tile, div_rn, load_roi, map_spans, sample_pos, sample_span,
                   sample_taps, scatter_samples, with_flag)
from ._jit import along_c as _c  # per-channel vector -> tile axis
from ._jit import along_p as _p  # per-bin / per-pixel vector -> tile axis
from ._position_sensitive import channel_base, gather_tile, launch_backward, launch_forward, store_gathered

__all__ = ["ps_roi_align_backward", "ps_roi_align_forward"]


@kernel
def _ps_align_fwd_kernel(
    x_ptr, rois_ptr, out_ptr, scale_bits,
    N, C, H, W, ph, pw, sampling_ratio, n_pblocks,
    sxN, sxC, sxH, sxW, soK, soC, soH, soW,
    BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr, CF: tl.constexpr,
):
    """Bins [pb * BLOCK_P, +BLOCK_P) x output channels [cb * BLOCK_C, +BLOCK_C) of box k, each
    the average of its samples (C is the output's channel count)."""
    T = rois_ptr.dtype.element_ty
    k, scale, ok, b, x1, y1, x2, y2, p, pm, i, j, c, cm = box_tile(rois_ptr, scale_bits, n_pblocks, N, C, ph, pw,
                                                                   BLOCK_P, BLOCK_C, CF)
    sx, sy, bw, bh, gwf, ghf, gw, gh, count = align_geometry(x1, y1, x2, y2, scale, ph, pw, sampling_ratio, True)
    tile_m = with_flag(_p(pm, CF) & _c(cm, CF), ok)
    x_base = channel_base(x_ptr, b, p, c, ph, pw, sxN, sxC, CF)
    ybase = sy + i.to(T) * bh
    xbase = sx + j.to(T) * bw

    fy, ey, ny, fx, ex, nx = map_spans(with_flag(pm, ok), ybase, xbase, bh, bw, ghf, gwf, H, W)
    acc = _p(tl.zeros([BLOCK_P], dtype=T), CF) + _c(tl.zeros([BLOCK_C], dtype=T), CF)
    for dy in range(0, tl.max(ny, axis=0)):
        _, oylo, oyhi, ly, hy, iny = sample_taps(ybase, fy + dy, bh, ghf, H, sxH)
        row = dy < ny
        for dx in range(0, tl.max(nx, axis=0)):
            _, oxlo, oxhi, lx, hx, inx = sample_taps(xbase, fx + dx, bw, gwf, W, sxW)
            m = tile_m & _p(row & (dx < nx) & iny & inx, CF)
            v1 = tl.load(x_base + _p(oylo + oxlo, CF), mask=m, other=0.0).to(T)
            v2 = tl.load(x_base + _p(oylo + oxhi, CF), mask=m, other=0.0).to(T)
            v3 = tl.load(x_base + _p(oyhi + oxlo, CF), mask=m, other=0.0).to(T)
            v4 = tl.load(x_base + _p(oyhi + oxhi, CF), mask=m, other=0.0).to(T)
            acc += (_p(hy * hx, CF) * v1 + _p(hy * lx, CF) * v2 + _p(ly * hx, CF) * v3 + _p(ly * lx, CF) * v4)

    # out is allocated with soH == pw * soW: bin p sits at p * soW.
    o = k * soK + _c(c.to(tl.int64) * soC, CF) + _p(p.to(tl.int64) * soW, CF)
    tl.store(out_ptr + o, div_rn(acc, count).to(out_ptr.dtype.element_ty), mask=_p(pm, CF) & _c(cm, CF))


@kernel
def _ps_align_bwd_atomic_kernel(
    grad_ptr, rois_ptr, gi_ptr, scale_bits,
    N, C, H, W, ph, pw, sampling_ratio, n_pblocks,
    sgK, sgC, sgH, sgW, siN, siC, siH, siW,
    BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr, CF: tl.constexpr,
):
    """Scatters the grad of bins [pb * BLOCK_P, +BLOCK_P) x output channels [cb * BLOCK_C,
    +BLOCK_C) of box k into input channels c * ph * pw + p (C is the output's channel count)."""
    T = rois_ptr.dtype.element_ty
    k, scale, ok, b, x1, y1, x2, y2, p, pm, i, j, c, cm = box_tile(rois_ptr, scale_bits, n_pblocks, N, C, ph, pw,
                                                                   BLOCK_P, BLOCK_C, CF)
    sx, sy, bw, bh, gwf, ghf, gw, gh, count = align_geometry(x1, y1, x2, y2, scale, ph, pw, sampling_ratio, True)
    tile_m = with_flag(_p(pm, CF) & _c(cm, CF), ok)
    c64 = c.to(tl.int64)
    g = tl.load(grad_ptr + k * sgK + _c(c64 * sgC, CF)
                + _p(i.to(tl.int64) * sgH + j.to(tl.int64) * sgW, CF), mask=tile_m, other=0.0).to(T)
    gi_base = channel_base(gi_ptr, b, p, c, ph, pw, siN, siC, CF)
    scatter_samples(gi_base, g, count, with_flag(pm, ok), tile_m, sy + i.to(T) * bh, sx + j.to(T) * bw, bh, bw, ghf,
                    gwf, H, W, siH, siW, CF)


@kernel
def _ps_align_bwd_kernel(
    grad_ptr, rois_ptr, gi_ptr, scale_bits,
    K, N, C, H, W, ph, pw, sampling_ratio, n_tw, n_tiles,
    sgK, sgC, sgH, sgW, siN, siC, siH, siW,
    TILE_H: tl.constexpr, TILE_W: tl.constexpr, BLOCK_C: tl.constexpr, CF: tl.constexpr,
):
    T = rois_ptr.dtype.element_ty
    n, p, i, j, r, s, c, cm, r_lo, r_hi, s_lo, s_hi, scale, acc = gather_tile(
        rois_ptr, scale_bits, ph, pw, n_tw, n_tiles, H, W, C, TILE_H, TILE_W, BLOCK_C, CF)
    for k in range(0, K.to(tl.int64)):  # int64: grad is indexed k * sgK
        ok, b, x1, y1, x2, y2 = load_roi(rois_ptr, k, N, scale)
        sx, sy, bw, bh, gwf, ghf, gw, gh, count = align_geometry(x1, y1, x2, y2, scale, ph, pw, sampling_ratio,
                                                                 True)
        ybase = sy + i.to(T) * bh
        xbase = sx + j.to(T) * bw
        # A sample reaches rows floor(y) and floor(y) + 1 (clamped): those in the tile lie
        # in [r_lo - 1, r_hi + 1]; sample_span gives a superset, taps are tested below.
        fy, ey = sample_span(ybase, bh, ghf, (r_lo - 1).to(T), (r_hi + 1).to(T))
        fx, ex = sample_span(xbase, bw, gwf, (s_lo - 1).to(T), (s_hi + 1).to(T))
        if ok & (b == n) & (ey > fy) & (ex > fx):
            g = tl.load(grad_ptr + k * sgK + c.to(tl.int64) * sgC + i * sgH + j * sgW, mask=cm, other=0.0).to(T)
            for iy in range(fy, ey):
                y = sample_pos(ybase, iy, bh, ghf)
                ylo, yhi, ly, hy, iny = axis_taps(y, H)
                for ix in range(fx, ex):
                    x = sample_pos(xbase, ix, bw, gwf)
                    xlo, xhi, lx, hx, inx = axis_taps(x, W)
                    if iny & inx:  # the taps in order, as the CPU kernels add them
                        acc += tl.where(_p((r == ylo) & (s == xlo), CF), _c(div_rn(g * (hy * hx), count), CF), 0.0)
                        acc += tl.where(_p((r == ylo) & (s == xhi), CF), _c(div_rn(g * (hy * lx), count), CF), 0.0)
                        acc += tl.where(_p((r == yhi) & (s == xlo), CF), _c(div_rn(g * (ly * hx), count), CF), 0.0)
                        acc += tl.where(_p((r == yhi) & (s == xhi), CF), _c(div_rn(g * (ly * lx), count), CF), 0.0)

    store_gathered(gi_ptr, acc, n, p, r, s, c, cm, ph, pw, H, W, siN, siC, siH, siW, CF)


_check_forward = kernel_check("ps_roi_align")
_check_backward = kernel_check("ps_roi_align", "backward")


def ps_roi_align_forward(input: torch.Tensor, rois: torch.Tensor, spatial_scale: float, pooled_height: int,
                         pooled_width: int, sampling_ratio: int) -> torch.Tensor:
    """Position-sensitive RoIAlign forward: [K, C / (ph * pw), ph, pw] in the input's dtype and memory format."""
    _check_forward(input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio)
    check_device(input, _ps_align_fwd_kernel)
    return launch_forward(_ps_align_fwd_kernel, input, rois, spatial_scale, int(pooled_height), int(pooled_width),
                          int(sampling_ratio))


def ps_roi_align_backward(grad: torch.Tensor, rois: torch.Tensor, spatial_scale: float, pooled_height: int,
                          pooled_width: int, batch_size: int, channels: int, height: int, width: int,
                          sampling_ratio: int, channels_last: bool, *,
                          deterministic: bool | None = None) -> torch.Tensor:
    """Gradient of ps_roi_align_forward w.r.t. its input, [N, C, H, W] in grad's dtype.

    deterministic: None follows roiops.config.deterministic_backward, then torch's
    deterministic flag; see the module docstring for the two paths.
    """
    _check_backward(grad, rois, spatial_scale, pooled_height, pooled_width, batch_size, channels, height, width,
                    sampling_ratio, channels_last)
    check_device(grad, _ps_align_bwd_kernel)
    return launch_backward(_ps_align_bwd_kernel, _ps_align_bwd_atomic_kernel, grad, rois, spatial_scale,
                           int(pooled_height), int(pooled_width), int(batch_size), int(channels), int(height),
                           int(width), bool(channels_last), deterministic, int(sampling_ratio))
