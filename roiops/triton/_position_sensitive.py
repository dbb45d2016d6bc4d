"""What the position-sensitive Triton kernels (ps_roi_align.py, ps_roi_pool.py) share: the
gather backward's program tile and the launches. Their kernels take the same arguments
but for op-specific ones (`extra`, after ph and pw)."""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from .._geometry import dense, is_channels_last, memory_format
from ._common import GPU_TILE, LAUNCH_OPTS, cdiv, f64_bits, gather_blocks, opmath, tile_blocks, use_deterministic
from ._jit import along_c as _c  # per-channel vector -> tile axis
from ._jit import along_p as _p  # per-bin / per-pixel vector -> tile axis
from ._jit import pixel_tile


@triton.jit
def channel_base(ptr, b, p, c, ph, pw, sN, sC, CF: tl.constexpr):
    """Pointers [tile] to where bin p of output channel c reads or writes in image b of a
    map: input channel c * ph * pw + p."""
    P = (ph * pw).to(tl.int64)
    return ptr + b * sN + (_c(c.to(tl.int64) * P, CF) + _p(p.to(tl.int64), CF)) * sC


@triton.jit
def gather_tile(ph, pw, n_tw, n_tiles, H, W, C, TILE_H: tl.constexpr, TILE_W: tl.constexpr,
                BLOCK_C: tl.constexpr):
    """A backward program's part: image n, bin p = (i, j), map tile (pixel_tile's r, s,
    limits) and output channels c of block program_id(1), with C output channels."""
    pid = tl.program_id(0)
    P = ph * pw
    n = pid // (P * n_tiles)
    rest = pid - n * (P * n_tiles)
    p = rest // n_tiles
    t = rest - p * n_tiles
    th = t // n_tw
    i = p // pw
    r, s, c, cm, r_lo, r_hi, s_lo, s_hi = pixel_tile(th, t - th * n_tw, tl.program_id(1), H, W, C, TILE_H, TILE_W,
                                                     BLOCK_C)
    return n, p, i, p - i * pw, r, s, c, cm, r_lo, r_hi, s_lo, s_hi


def launch_forward(kernel: Any, input: torch.Tensor, rois: torch.Tensor, spatial_scale: float, ph: int, pw: int,
                   *extra: Any) -> torch.Tensor:
    """out [K, C / (ph * pw), ph, pw] in the input's dtype and memory format, from one
    program per (box, block of bins, block of output channels)."""
    N, C, H, W = input.shape
    K, c_out = rois.shape[0], C // (ph * pw)
    rois = dense(rois, opmath(input.dtype))
    out = torch.empty((K, c_out, ph, pw), dtype=input.dtype, device=input.device,
                      memory_format=memory_format(is_channels_last(input)))
    if out.numel() == 0:
        return out
    lanes_c = input.stride(1) < input.stride(3)
    block_p, block_c, n_pb, n_cb, cf = tile_blocks(ph * pw, c_out, lanes_c, input.is_cpu)
    assert ph == 1 or out.stride(2) == pw * out.stride(3)  # the kernels store bin p at p * soW
    kernel[(K * n_pb, n_cb)](
        input, rois, out, f64_bits(spatial_scale), N, c_out, H, W, ph, pw, *extra, n_pb,
        *input.stride(), *out.stride(), BLOCK_P=block_p, BLOCK_C=block_c, CF=cf, **LAUNCH_OPTS)
    return out


def launch_backward(gather: Any, atomic: Any, grad: torch.Tensor, rois: torch.Tensor, spatial_scale: float, ph: int,
                    pw: int, N: int, C: int, H: int, W: int, channels_last: bool, deterministic: bool | None,
                    *extra: Any) -> torch.Tensor:
    """grad_input [N, C, H, W]. Deterministic (use_deterministic): from one program per
    (image, bin, tile, block of output channels), each writing its part once. Else one
    program per (box, block of bins, block of output channels) scatters with atomic adds,
    into a float32 scratch for half types."""
    K, c_out = grad.shape[0], grad.shape[1]
    rois = dense(rois, opmath(grad.dtype))
    fmt = memory_format(channels_last)
    on_cpu = grad.is_cpu
    if use_deterministic(deterministic):
        gi = torch.empty((N, C, H, W), dtype=grad.dtype, device=grad.device, memory_format=fmt)
        if gi.numel() == 0:
            return gi
        tile_h, tile_w, block_c = gather_blocks(H, W, c_out, channels_last, on_cpu, grad.dtype == torch.float64)
        n_tw = cdiv(W, tile_w)
        n_tiles = cdiv(H, tile_h) * n_tw
        gather[(N * ph * pw * n_tiles, cdiv(c_out, block_c))](
            grad, rois, gi, f64_bits(spatial_scale), K, N, c_out, H, W, ph, pw, *extra, n_tw, n_tiles,
            *grad.stride(), *gi.stride(), TILE_H=tile_h, TILE_W=tile_w, BLOCK_C=block_c, CF=True, **LAUNCH_OPTS)
        return gi

    acc_dtype = grad.dtype if grad.dtype in (torch.float32, torch.float64) else torch.float32
    gi = torch.empty((N, C, H, W), dtype=acc_dtype, device=grad.device, memory_format=fmt).zero_()
    if K == 0 or gi.numel() == 0:
        return gi.to(grad.dtype)
    budget = GPU_TILE // 2 if grad.dtype == torch.float64 else GPU_TILE
    block_p, block_c, n_pb, n_cb, cf = tile_blocks(ph * pw, c_out, channels_last, on_cpu, budget)
    atomic[(K * n_pb, n_cb)](
        grad, rois, gi, f64_bits(spatial_scale), N, c_out, H, W, ph, pw, *extra, n_pb,
        *grad.stride(), *gi.stride(), BLOCK_P=block_p, BLOCK_C=block_c, CF=cf, **LAUNCH_OPTS)
    return gi if acc_dtype == grad.dtype else gi.to(grad.dtype)
