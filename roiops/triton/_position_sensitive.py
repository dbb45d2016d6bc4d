"""What the position-sensitive Triton kernels (ps_roi_align.py, ps_roi_pool.py) share: the
gather backward's program tile and the launches. Their kernels take the same arguments
but for op-specific ones (`extra`, after ph and pw)."""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from .._geometry import dense
from ._common import (LAUNCH_OPTS, box_forward, box_grid, cdiv, f64_bits, from_atomic, gather_grid, grad_input, opmath,
                      tile_budget, use_deterministic)
from ._jit import along_c as _c  # per-channel vector -> tile axis
from ._jit import along_p as _p  # per-bin / per-pixel vector -> tile axis
from ._jit import pixel_tile, scale_of, store_tile


@triton.jit
def channel_base(ptr, b, p, c, ph, pw, sN, sC, CF: tl.constexpr):
    """Pointers [tile] to where bin p of output channel c reads or writes in image b of a
    map: input channel c * ph * pw + p."""
    P = (ph * pw).to(tl.int64)
    return ptr + b * sN + (_c(c.to(tl.int64) * P, CF) + _p(p.to(tl.int64), CF)) * sC


@triton.jit
def gather_tile(rois_ptr, scale_bits, ph, pw, n_tw, n_tiles, H, W, C, TILE_H: tl.constexpr, TILE_W: tl.constexpr,
                BLOCK_C: tl.constexpr, CF: tl.constexpr):
    """The prologue of a deterministic backward: the program's part, the tile t of image n
    of input channels c * ph * pw + p for the output channels c of block program_id(1) (C
    of them) and bin p = (i, j). Returns n, p, i, j, pixel_tile's r, s, c, cm and limits,
    the scale in the rois' type, and the zeroed accumulator (see store_gathered)."""
    T = rois_ptr.dtype.element_ty
    P = ph * pw
    pid = tl.program_id(0)
    n = pid // (P * n_tiles)
    rest = pid - n * (P * n_tiles)
    p = rest // n_tiles
    t = rest - p * n_tiles
    th = t // n_tw
    i = p // pw
    r, s, c, cm, r_lo, r_hi, s_lo, s_hi = pixel_tile(th, t - th * n_tw, tl.program_id(1), H, W, C, TILE_H, TILE_W,
                                                     BLOCK_C)
    j = p - i * pw
    scale = scale_of(scale_bits, T)
    acc = _p(tl.zeros([TILE_H * TILE_W], dtype=T), CF) + _c(tl.zeros([BLOCK_C], dtype=T), CF)
    return n, p, i, j, r, s, c, cm, r_lo, r_hi, s_lo, s_hi, scale, acc


@triton.jit
def store_gathered(gi_ptr, acc, n, p, r, s, c, cm, ph, pw, H, W, siN, siC, siH, siW, CF: tl.constexpr):
    """Writes a gather_tile's sums into input channels c * ph * pw + p of image n."""
    store_tile(gi_ptr + p.to(tl.int64) * siC, acc, n, r, s, c * (ph * pw).to(tl.int64), cm, H, W, siN, siC, siH, siW,
               CF)


def launch_forward(kernel: Any, input: torch.Tensor, rois: torch.Tensor, spatial_scale: float, ph: int, pw: int,
                   *extra: Any) -> torch.Tensor:
    """out [K, C / (ph * pw), ph, pw] in the input's dtype and memory format, from one
    program per (box, block of bins, block of output channels)."""
    f = box_forward(input, rois, ph, pw, position_sensitive=True)
    if f.out.numel():
        f.grid.launch(kernel, (input, f.rois, f.out, f64_bits(spatial_scale), *f.sizes, *extra),
                      (*input.stride(), *f.out.stride()))
    return f.out


def launch_backward(gather: Any, atomic: Any, grad: torch.Tensor, rois: torch.Tensor, spatial_scale: float, ph: int,
                    pw: int, N: int, C: int, H: int, W: int, channels_last: bool, deterministic: bool | None,
                    *extra: Any) -> torch.Tensor:
    """grad_input [N, C, H, W]. Deterministic (use_deterministic): from one program per
    (image, bin, tile, block of output channels), each writing its part once. Else one
    program per (box, block of bins, block of output channels) scatters with atomic adds,
    into a float32 scratch for half types."""
    K, c_out = grad.shape[0], grad.shape[1]
    rois = dense(rois, opmath(grad.dtype))
    if use_deterministic(deterministic):
        gi = grad_input(grad, N, C, H, W, channels_last)
        if gi.numel() == 0:
            return gi
        tile_h, tile_w, block_c, n_tw, n_tiles = gather_grid(grad, H, W, c_out, channels_last)
        gather[(N * ph * pw * n_tiles, cdiv(c_out, block_c))](
            grad, rois, gi, f64_bits(spatial_scale), K, N, c_out, H, W, ph, pw, *extra, n_tw, n_tiles,
            *grad.stride(), *gi.stride(), TILE_H=tile_h, TILE_W=tile_w, BLOCK_C=block_c, CF=True, **LAUNCH_OPTS)
        return gi

    gi = grad_input(grad, N, C, H, W, channels_last, atomic=True)
    if K == 0 or gi.numel() == 0:
        return from_atomic(gi, grad.dtype)
    box_grid(K, ph, pw, c_out, channels_last, grad.is_cpu, tile_budget(grad.dtype)).launch(
        atomic, (grad, rois, gi, f64_bits(spatial_scale), N, c_out, H, W, ph, pw, *extra),
        (*grad.stride(), *gi.stride()))
    return from_atomic(gi, grad.dtype)
