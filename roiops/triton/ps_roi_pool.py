"""Position-sensitive RoIPool in Triton (docs/semantics.md, "ps_roi_pool").

Forward: one program per (box, block of bins, block of output channels); bin edges are
computed once per tile, bin p of output channel c reads input channel c * ph * pw + p, and
the loop over a bin's cells (rows, then columns: the CPU kernels' order of the sum) is
bounded by the tile's largest bin, clipped to the map.

Backward: a gather as in ps_roi_align.py: one program per (image, bin, tile of map cells,
block of output channels) walks all boxes in increasing index and adds grad / area to the
cells of its tile that the box's bin covers, then writes the tile once: deterministic, and
equal to the CPU kernels' gradient bit for bit.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._geometry import is_channels_last, memory_format
from ._common import (LAUNCH_OPTS, cdiv, check_device, check_ps_backward, check_ps_forward, f64_bits, gather_blocks,
                      kernel, opmath, tile_blocks)
from ._jit import bin_tile, c_round, div_rn, load_roi, pixel_tile, scale_of, store_tile, with_flag
from ._jit import along_c as _c  # per-channel vector -> tile axis
from ._jit import along_p as _p  # per-bin / per-pixel vector -> tile axis

__all__ = ["ps_roi_pool_backward", "ps_roi_pool_forward"]


@triton.jit
def _ps_axis(c1, c2, scale, idx, pooled, size):
    """Bin edges [lo, hi) along one axis, clipped to [0, size]: corners rounded (C's round),
    the box at least one cell, edges floor(idx * bin) and ceil((idx + 1) * bin) plus the
    rounded start."""
    st = c_round(c1 * scale)
    length = tl.maximum(c_round(c2 * scale) - st, 1.0)
    bin = div_rn(length, pooled.to(length.dtype))
    lo = tl.floor(idx.to(length.dtype) * bin) + st
    hi = tl.ceil((idx + 1).to(length.dtype) * bin) + st
    lo = tl.minimum(tl.maximum(lo, 0.0), size)
    hi = tl.minimum(tl.maximum(hi, 0.0), size)
    return lo.to(tl.int32), hi.to(tl.int32)


@kernel
def _ps_pool_fwd_kernel(
    x_ptr, rois_ptr, out_ptr, scale_bits,
    N, C, H, W, ph, pw, n_pblocks,
    sxN, sxC, sxH, sxW, soK, soC, soH, soW,
    BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr, CF: tl.constexpr,
):
    """Bins [pb * BLOCK_P, +BLOCK_P) x output channels [cb * BLOCK_C, +BLOCK_C) of box k (C
    is the output's channel count)."""
    T = rois_ptr.dtype.element_ty
    pid = tl.program_id(0)
    k = pid // n_pblocks
    pb = pid - k * n_pblocks
    cb = tl.program_id(1)
    scale = scale_of(scale_bits, T)
    ok, b, x1, y1, x2, y2 = load_roi(rois_ptr, k.to(tl.int64), N, scale)

    p, pm, i, j, c, cm = bin_tile(pb, cb, ph, pw, C, BLOCK_P, BLOCK_C)
    hs, he = _ps_axis(y1, y2, scale, i, ph, H.to(T))
    ws, we = _ps_axis(x1, x2, scale, j, pw, W.to(T))
    live = with_flag(pm, ok) & (he > hs) & (we > ws)
    he = tl.where(live, he, hs)
    we = tl.where(live, we, ws)
    P = (ph * pw).to(tl.int64)
    x_base = x_ptr + b * sxN + (_c(c.to(tl.int64) * P, CF) + _p(p.to(tl.int64), CF)) * sxC
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
    res = tl.where(_p(live, CF), div_rn(acc, _p(tl.maximum(area, 1.0), CF)), 0.0)
    o = k.to(tl.int64) * soK + _c(c.to(tl.int64) * soC, CF) + _p(p.to(tl.int64) * soW, CF)
    tl.store(out_ptr + o, res.to(out_ptr.dtype.element_ty), mask=_p(pm, CF) & cmask)


@kernel
def _ps_pool_bwd_kernel(
    grad_ptr, rois_ptr, gi_ptr, scale_bits,
    K, N, C, H, W, ph, pw, n_tw, n_tiles,
    sgK, sgC, sgH, sgW, siN, siC, siH, siW,
    TILE_H: tl.constexpr, TILE_W: tl.constexpr, BLOCK_C: tl.constexpr, CF: tl.constexpr,
):
    """Tile t of image n, input channels c * ph * pw + p for output channels c of block cb
    (C is the output's channel count)."""
    T = rois_ptr.dtype.element_ty
    P = ph * pw
    pid = tl.program_id(0)
    n = pid // (P * n_tiles)
    rest = pid - n * (P * n_tiles)
    p = rest // n_tiles
    t = rest - p * n_tiles
    th = t // n_tw
    tw = t - th * n_tw
    i = p // pw
    j = p - i * pw
    scale = scale_of(scale_bits, T)

    r, s, c, cm, r_lo, r_hi, s_lo, s_hi = pixel_tile(th, tw, tl.program_id(1), H, W, C, TILE_H, TILE_W, BLOCK_C)
    acc = _p(tl.zeros([TILE_H * TILE_W], dtype=T), CF) + _c(tl.zeros([BLOCK_C], dtype=T), CF)
    for k in range(0, K.to(tl.int64)):  # int64: grad is indexed k * sgK
        ok, b, x1, y1, x2, y2 = load_roi(rois_ptr, k, N, scale)
        hs, he = _ps_axis(y1, y2, scale, i, ph, H.to(T))
        ws, we = _ps_axis(x1, x2, scale, j, pw, W.to(T))
        if ok & (b == n) & (he > hs) & (we > ws) & (hs <= r_hi) & (he > r_lo) & (ws <= s_hi) & (we > s_lo):
            g = tl.load(grad_ptr + k * sgK + c.to(tl.int64) * sgC + i * sgH + j * sgW, mask=cm, other=0.0).to(T)
            d = div_rn(g, ((he - hs) * (we - ws)).to(T))
            acc += tl.where(_p((r >= hs) & (r < he) & (s >= ws) & (s < we), CF), _c(d, CF), 0.0)

    store_tile(gi_ptr + p.to(tl.int64) * siC, acc, n, r, s, c * P.to(tl.int64), cm, H, W, siN, siC, siH, siW, CF)


def ps_roi_pool_forward(input: torch.Tensor, rois: torch.Tensor, spatial_scale: float, pooled_height: int,
                        pooled_width: int) -> torch.Tensor:
    """Position-sensitive RoIPool forward: [K, C / (ph * pw), ph, pw] in the input's dtype and memory format."""
    check_ps_forward(input, rois, spatial_scale, pooled_height, pooled_width)
    check_device(input, _ps_pool_fwd_kernel)
    N, C, H, W = input.shape
    K = rois.shape[0]
    ph, pw = int(pooled_height), int(pooled_width)
    c_out = C // (ph * pw)
    rois = rois.to(opmath(input.dtype)).contiguous()
    fmt = memory_format(is_channels_last(input))
    out = torch.empty((K, c_out, ph, pw), dtype=input.dtype, device=input.device, memory_format=fmt)
    if out.numel() == 0:
        return out
    lanes_c = input.stride(1) < input.stride(3)
    block_p, block_c = tile_blocks(ph * pw, c_out, lanes_c, input.device.type == "cpu")
    n_pb = triton.cdiv(ph * pw, block_p)
    assert ph == 1 or out.stride(2) == pw * out.stride(3)
    _ps_pool_fwd_kernel[(K * n_pb, cdiv(c_out, block_c))](
        input, rois, out, f64_bits(spatial_scale), N, c_out, H, W, ph, pw, n_pb,
        *input.stride(), *out.stride(), BLOCK_P=block_p, BLOCK_C=block_c, CF=lanes_c, **LAUNCH_OPTS)
    return out


def ps_roi_pool_backward(grad: torch.Tensor, rois: torch.Tensor, spatial_scale: float, pooled_height: int,
                         pooled_width: int, batch_size: int, channels: int, height: int, width: int,
                         channels_last: bool) -> torch.Tensor:
    """Gradient of ps_roi_pool_forward (deterministic: see the module docstring)."""
    check_ps_backward(grad, rois, spatial_scale, pooled_height, pooled_width, batch_size, channels, height, width,
                      channels_last)
    check_device(grad, _ps_pool_bwd_kernel)
    N, C, H, W = int(batch_size), int(channels), int(height), int(width)
    ph, pw = int(pooled_height), int(pooled_width)
    K, c_out = grad.shape[0], grad.shape[1]
    rois = rois.to(opmath(grad.dtype)).contiguous()
    gi = torch.empty((N, C, H, W), dtype=grad.dtype, device=grad.device, memory_format=memory_format(channels_last))
    if gi.numel() == 0:
        return gi
    tile_h, tile_w, block_c = gather_blocks(H, W, c_out, bool(channels_last), grad.device.type == "cpu",
                                            grad.dtype == torch.float64)
    n_tw = cdiv(W, tile_w)
    n_tiles = cdiv(H, tile_h) * n_tw
    _ps_pool_bwd_kernel[(N * ph * pw * n_tiles, cdiv(c_out, block_c))](
        grad, rois, gi, f64_bits(spatial_scale), K, N, c_out, H, W, ph, pw, n_tw, n_tiles,
        *grad.stride(), *gi.stride(), TILE_H=tile_h, TILE_W=tile_w, BLOCK_C=block_c, CF=True, **LAUNCH_OPTS)
    return gi
