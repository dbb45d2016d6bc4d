"""Position-sensitive RoIPool in Triton (docs/semantics.md, "ps_roi_pool").

Forward: one program per (box, block of bins, block of output channels); bin edges are
computed once per tile, bin p of output channel c reads input channel c * ph * pw + p, and
the loop over a bin's cells (rows, then columns: the CPU kernels' order of the sum) is
bounded by the tile's largest bin, clipped to the map.

Backward, as in ps_roi_align.py: the fast path scatters grad / area to each cell of a
bin with atomic adds, one program per (box, block of bins, block of output channels); the
deterministic path is a gather, one program per (image, bin, tile of map cells, block of
output channels) that walks all boxes in increasing index, adds grad / area to the cells
of its tile that the box's bin covers and writes the tile once: equal to the CPU kernels'
gradient bit for bit.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._kernel_checks import kernel_check
from ._common import check_device, kernel
from ._jit import bin_edges, box_tile, c_round, div_rn, load_roi, with_flag
from ._jit import along_c as _c  # per-channel vector -> tile axis
from ._jit import along_p as _p  # per-bin / per-pixel vector -> tile axis
from ._position_sensitive import channel_base, gather_tile, launch_backward, launch_forward, store_gathered

__all__ = ["ps_roi_pool_backward", "ps_roi_pool_forward"]


@triton.jit
def _ps_axis(c1, c2, scale, idx, pooled, size):
    """Bin edges [lo, hi) along one axis, clipped to [0, size]: corners rounded (C's round),
    the box at least one cell (no + 1, unlike RoIPool), bins as RoIPool's."""
    st = c_round(c1 * scale)
    length = tl.maximum(c_round(c2 * scale) - st, 1.0)
    return bin_edges(st, length, idx.to(length.dtype), pooled, size, False)


@triton.jit
def _ps_bins(ok, pm, x1, y1, x2, y2, scale, i, j, ph, pw, H, W):
    """A tile's bins (i, j): rows [hs, he) and columns [ws, we), and whether each is live
    (a valid row, a bin of the tile, not empty); a bin that is not live has he = hs and
    we = ws, so that the loops over its cells run none."""
    T = x1.dtype
    hs, he = _ps_axis(y1, y2, scale, i, ph, H.to(T))
    ws, we = _ps_axis(x1, x2, scale, j, pw, W.to(T))
    live = with_flag(pm, ok) & (he > hs) & (we > ws)
    return hs, tl.where(live, he, hs), ws, tl.where(live, we, ws), live


@kernel
def _ps_pool_fwd_kernel(
    x_ptr, rois_ptr, out_ptr, scale_bits,
    N, C, H, W, ph, pw, n_pblocks,
    sxN, sxC, sxH, sxW, soK, soC, soH, soW,
    BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr, CF: tl.constexpr,
):
    """Bins [pb * BLOCK_P, +BLOCK_P) x output channels [cb * BLOCK_C, +BLOCK_C) of box k, each
    the average of its cells (C is the output's channel count)."""
    T = rois_ptr.dtype.element_ty
    k, scale, ok, b, x1, y1, x2, y2, p, pm, i, j, c, cm = box_tile(rois_ptr, scale_bits, n_pblocks, N, C, ph, pw,
                                                                   BLOCK_P, BLOCK_C, CF)
    hs, he, ws, we, _ = _ps_bins(ok, pm, x1, y1, x2, y2, scale, i, j, ph, pw, H, W)
    x_base = channel_base(x_ptr, b, p, c, ph, pw, sxN, sxC, CF)
    cmask = _c(cm, CF)
    acc = _p(tl.zeros([BLOCK_P], dtype=T), CF) + _c(tl.zeros([BLOCK_C], dtype=T), CF)
    for dh in range(0, tl.max(he - hs, axis=0)):
        h = hs + dh
        oh = h.to(tl.int64) * sxH
        for dw in range(0, tl.max(we - ws, axis=0)):
            w = ws + dw
            m = _p((h < he) & (w < we), CF) & cmask
            acc += tl.load(x_base + _p(oh + w.to(tl.int64) * sxW, CF), mask=m, other=0.0).to(T)
    area = ((he - hs) * (we - ws)).to(T)
    # A bin is live exactly when its area is positive. Testing the area rather than reusing
    # `live` in 2-D keeps Triton 3.6 from giving `live` two layouts (it fails to compile
    # some float64 variants then).
    res = tl.where(_p(area > 0, CF), div_rn(acc, _p(tl.maximum(area, 1.0), CF)), 0.0)
    o = k * soK + _c(c.to(tl.int64) * soC, CF) + _p(p.to(tl.int64) * soW, CF)
    tl.store(out_ptr + o, res.to(out_ptr.dtype.element_ty), mask=_p(pm, CF) & cmask)


@kernel
def _ps_pool_bwd_atomic_kernel(
    grad_ptr, rois_ptr, gi_ptr, scale_bits,
    N, C, H, W, ph, pw, n_pblocks,
    sgK, sgC, sgH, sgW, siN, siC, siH, siW,
    BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr, CF: tl.constexpr,
):
    """Scatters the grad of bins [pb * BLOCK_P, +BLOCK_P) x output channels [cb * BLOCK_C,
    +BLOCK_C) of box k into input channels c * ph * pw + p (C is the output's channel count)."""
    T = rois_ptr.dtype.element_ty
    G = gi_ptr.dtype.element_ty
    k, scale, ok, b, x1, y1, x2, y2, p, pm, i, j, c, cm = box_tile(rois_ptr, scale_bits, n_pblocks, N, C, ph, pw,
                                                                   BLOCK_P, BLOCK_C, CF)
    hs, he, ws, we, live = _ps_bins(ok, pm, x1, y1, x2, y2, scale, i, j, ph, pw, H, W)
    c64 = c.to(tl.int64)
    cmask = _c(cm, CF)
    g = tl.load(grad_ptr + k * sgK + _c(c64 * sgC, CF)
                + _p(i.to(tl.int64) * sgH + j.to(tl.int64) * sgW, CF), mask=_p(live, CF) & cmask, other=0.0).to(T)
    d = div_rn(g, _p(tl.maximum((he - hs) * (we - ws), 1.0).to(T), CF))
    gi_base = channel_base(gi_ptr, b, p, c, ph, pw, siN, siC, CF)
    for dh in range(0, tl.max(he - hs, axis=0)):
        h = hs + dh
        oh = h.to(tl.int64) * siH
        for dw in range(0, tl.max(we - ws, axis=0)):
            w = ws + dw
            m = _p((h < he) & (w < we), CF) & cmask
            tl.atomic_add(gi_base + _p(oh + w.to(tl.int64) * siW, CF), d.to(G), mask=m, sem="relaxed")


@kernel
def _ps_pool_bwd_kernel(
    grad_ptr, rois_ptr, gi_ptr, scale_bits,
    K, N, C, H, W, ph, pw, n_tw, n_tiles,
    sgK, sgC, sgH, sgW, siN, siC, siH, siW,
    TILE_H: tl.constexpr, TILE_W: tl.constexpr, BLOCK_C: tl.constexpr, CF: tl.constexpr,
):
    T = rois_ptr.dtype.element_ty
    n, p, i, j, r, s, c, cm, r_lo, r_hi, s_lo, s_hi, scale, acc = gather_tile(
        rois_ptr, scale_bits, ph, pw, n_tw, n_tiles, H, W, C, TILE_H, TILE_W, BLOCK_C, CF)
    for k in range(0, K.to(tl.int64)):  # int64: grad is indexed k * sgK
        ok, b, x1, y1, x2, y2 = load_roi(rois_ptr, k, N, scale)
        hs, he = _ps_axis(y1, y2, scale, i, ph, H.to(T))
        ws, we = _ps_axis(x1, x2, scale, j, pw, W.to(T))
        if ok & (b == n) & (he > hs) & (we > ws) & (hs <= r_hi) & (he > r_lo) & (ws <= s_hi) & (we > s_lo):
            g = tl.load(grad_ptr + k * sgK + c.to(tl.int64) * sgC + i * sgH + j * sgW, mask=cm, other=0.0).to(T)
            d = div_rn(g, ((he - hs) * (we - ws)).to(T))
            acc += tl.where(_p((r >= hs) & (r < he) & (s >= ws) & (s < we), CF), _c(d, CF), 0.0)

    store_gathered(gi_ptr, acc, n, p, r, s, c, cm, ph, pw, H, W, siN, siC, siH, siW, CF)


_check_forward = kernel_check("ps_roi_pool")
_check_backward = kernel_check("ps_roi_pool", "backward")


def ps_roi_pool_forward(input: torch.Tensor, rois: torch.Tensor, spatial_scale: float, pooled_height: int,
                        pooled_width: int) -> torch.Tensor:
    """Position-sensitive RoIPool forward: [K, C / (ph * pw), ph, pw] in the input's dtype and memory format."""
    _check_forward(input, rois, spatial_scale, pooled_height, pooled_width)
    check_device(input, _ps_pool_fwd_kernel)
    return launch_forward(_ps_pool_fwd_kernel, input, rois, spatial_scale, int(pooled_height), int(pooled_width))


def ps_roi_pool_backward(grad: torch.Tensor, rois: torch.Tensor, spatial_scale: float, pooled_height: int,
                         pooled_width: int, batch_size: int, channels: int, height: int, width: int,
                         channels_last: bool, *, deterministic: bool | None = None) -> torch.Tensor:
    """Gradient of ps_roi_pool_forward w.r.t. its input, [N, C, H, W] in grad's dtype.

    deterministic: None follows roiops.config.deterministic_backward, then torch's
    deterministic flag; see the module docstring for the two paths.
    """
    _check_backward(grad, rois, spatial_scale, pooled_height, pooled_width, batch_size, channels, height, width,
                    channels_last)
    check_device(grad, _ps_pool_bwd_kernel)
    return launch_backward(_ps_pool_bwd_kernel, _ps_pool_bwd_atomic_kernel, grad, rois, spatial_scale,
                           int(pooled_height), int(pooled_width), int(batch_size), int(channels), int(height),
                           int(width), bool(channels_last), deterministic)
