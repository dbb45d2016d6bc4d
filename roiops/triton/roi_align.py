"""RoIAlign in Triton: modes "avg" and "max" (docs/semantics.md), forward and backward, on
one feature-map level (multi_scale.py: several in one launch; roi_align_box_grad.py: the
gradient with respect to the boxes).

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
  over a few channels (flat tiles measured slower there; tile_blocks in _common.py).

Backward
--------
Fast path: each tile scatters ``grad * weight / count`` to the four taps of every sample
with atomic adds (into a float32 scratch for half types, then one cast pass). The order
of the atomics varies between runs, so the last bits of the gradient do too.

Deterministic path (``torch.are_deterministic_algorithms_enabled()``,
``roiops.config.deterministic_backward`` or ``deterministic=True``): a gather with no
atomics, bit-identical from run to run (_align_gather.py).
"""

from __future__ import annotations

import torch
import triton.language as tl

from .._geometry import dense
from .._kernel_checks import kernel_check
from ._align import bwd_atomic_tile, fwd_tile
from ._align_gather import gather_backward
from ._common import (GPU_TILE, box_forward, box_grid, check_device, f64_bits, from_atomic, grad_input, kernel, opmath,
                      tile_budget, use_deterministic)
from ._jit import box_program, scale_of

__all__ = ["roi_align_backward", "roi_align_forward", "roi_align_max_backward", "roi_align_max_forward"]


@kernel
def _align_fwd_kernel(
    x_ptr, rois_ptr, out_ptr, arg_ptr, scale_bits,
    N, C, H, W, ph, pw, sampling_ratio, n_pblocks,
    sxN, sxC, sxH, sxW, soK, soC, soH, soW,
    ALIGNED: tl.constexpr, MAX_MODE: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr,
    CF: tl.constexpr,
):
    k, pb, cb = box_program(n_pblocks)
    scale = scale_of(scale_bits, rois_ptr.dtype.element_ty)
    fwd_tile(x_ptr, rois_ptr, out_ptr, arg_ptr, k, pb, cb, k >= 0, scale, N, C, H, W, ph, pw, sampling_ratio,
             sxN, sxC, sxH, sxW, soK, soC, soH, soW, ALIGNED, MAX_MODE, BLOCK_P, BLOCK_C, CF)


@kernel
def _align_bwd_atomic_kernel(
    grad_ptr, arg_ptr, rois_ptr, gi_ptr, scale_bits,
    N, C, H, W, ph, pw, sampling_ratio, n_pblocks,
    sgK, sgC, sgH, sgW, saK, saC, saH, saW, siN, siC, siH, siW,
    ALIGNED: tl.constexpr, MAX_MODE: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr,
    CF: tl.constexpr,
):
    k, pb, cb = box_program(n_pblocks)
    scale = scale_of(scale_bits, rois_ptr.dtype.element_ty)
    bwd_atomic_tile(grad_ptr, arg_ptr, rois_ptr, gi_ptr, k, pb, cb, k >= 0, scale, N, C, H, W, ph, pw, sampling_ratio,
                    sgK, sgC, sgH, sgW, saK, saC, saH, saW, siN, siC, siH, siW, ALIGNED, MAX_MODE, BLOCK_P, BLOCK_C, CF)


# ----------------------------------------------------------------------------- launchers

_check_avg, _check_max = kernel_check("roi_align"), kernel_check("roi_align_max")
_check_avg_backward = kernel_check("roi_align", "backward")
_check_max_backward = kernel_check("roi_align_max", "backward")


def _forward(input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned, max_mode):
    (_check_max if max_mode else _check_avg)(input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio,
                                             aligned)
    check_device(input, _align_fwd_kernel)
    f = box_forward(input, rois, pooled_height, pooled_width, tile_budget(input.dtype), flat=True, argmax=max_mode)
    if f.out.numel():
        f.grid.launch(_align_fwd_kernel, (input, f.rois, f.out, f.argmax, f64_bits(spatial_scale), *f.sizes,
                                          int(sampling_ratio)),
                      (*input.stride(), *f.out.stride()), ALIGNED=bool(aligned), MAX_MODE=max_mode)
    return f.out, f.argmax


def _backward(grad, argmax, rois, spatial_scale, pooled_height, pooled_width, batch_size, channels, height, width,
              sampling_ratio, aligned, channels_last, max_mode, deterministic):
    if max_mode:
        _check_max_backward(grad, argmax, rois, spatial_scale, pooled_height, pooled_width, batch_size, channels,
                            height, width, sampling_ratio, aligned, channels_last)
    else:
        _check_avg_backward(grad, rois, spatial_scale, pooled_height, pooled_width, batch_size, channels, height,
                            width, sampling_ratio, aligned, channels_last)
    check_device(grad, _align_bwd_atomic_kernel)
    N, C, H, W = int(batch_size), int(channels), int(height), int(width)
    K = rois.shape[0]
    ph, pw = int(pooled_height), int(pooled_width)
    rois = dense(rois, opmath(grad.dtype))
    arg = argmax if max_mode else grad
    if K == 0 or N * C * H * W == 0:
        return grad_input(grad, N, C, H, W, bool(channels_last)).zero_()
    if use_deterministic(deterministic):
        return gather_backward(grad, arg, rois, spatial_scale, N, C, H, W, ph, pw, sampling_ratio, aligned,
                               bool(channels_last), max_mode)
    gi = grad_input(grad, N, C, H, W, bool(channels_last), atomic=True)
    # Max mode carries per-element sample coordinates: smaller tiles.
    budget = GPU_TILE // 2 if max_mode or grad.dtype == torch.float64 else GPU_TILE
    grid = box_grid(K, ph, pw, C, bool(channels_last), grad.is_cpu, budget)
    grid.launch(_align_bwd_atomic_kernel, (grad, arg, rois, gi, f64_bits(spatial_scale),
                                           N, C, H, W, ph, pw, int(sampling_ratio)),
                (*grad.stride(), *arg.stride(), *gi.stride()), ALIGNED=bool(aligned), MAX_MODE=max_mode)
    return from_atomic(gi, grad.dtype)


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
    see _align_gather.py's docstring for what the deterministic path costs.
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
