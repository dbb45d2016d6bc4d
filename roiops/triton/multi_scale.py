"""Multi-level RoIAlign in Triton ("avg" mode, docs/semantics.md): box k pools from the
map of level levels[k], all levels in one launch. Each program reads its box's level and
picks that level's map, size and scale among up to MAX_LEVELS kernel arguments (pick in
_jit.py), so a launch needs no table in device memory. Otherwise the kernels are
roi_align.py's (its docstring: the work mapping and the two backward paths).
"""

from __future__ import annotations

import torch
import triton.language as tl

from .._geometry import dense, is_channels_last, memory_format
from ._align import bwd_atomic_tile, fwd_tile
from ._align_gather import gather_backward_levels
from ._common import (box_grid, check_device, forward_output, from_atomic, grad_input, kernel, level_args, opmath,
                      tile_budget, use_deterministic)
from ._jit import box_level, box_program, pick

__all__ = ["multi_scale_roi_align_backward", "multi_scale_roi_align_forward"]


@kernel
def _align_fwd_levels_kernel(
    x0, x1, x2, x3, x4, rois_ptr, lvl_ptr, out_ptr,
    sb0, sb1, sb2, sb3, sb4, H0, H1, H2, H3, H4, W0, W1, W2, W3, W4, n_levels,
    N, C, ph, pw, sampling_ratio, n_pblocks, soK, soC, soH, soW,
    ALIGNED: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr, CF: tl.constexpr,
):
    """Box k reads the map of level lvl[k] (a box whose level is outside [0, n_levels)
    pools to 0). CF: True or FLAT (NCHW maps)."""
    k, pb, cb = box_program(n_pblocks)
    valid, l, H, W, sxN, sxC, sxH, sxW, scale = box_level(
        lvl_ptr, k, n_levels, C, sb0, sb1, sb2, sb3, sb4, H0, H1, H2, H3, H4, W0, W1, W2, W3, W4,
        rois_ptr.dtype.element_ty, CF == 1)  # the maps are channels_last
    fwd_tile(pick(l, x0, x1, x2, x3, x4), rois_ptr, out_ptr, out_ptr, k, pb, cb, valid, scale,
             N, C, H, W, ph, pw, sampling_ratio, sxN, sxC, sxH, sxW, soK, soC, soH, soW,
             ALIGNED, False, BLOCK_P, BLOCK_C, CF)


@kernel
def _align_bwd_atomic_levels_kernel(
    grad_ptr, rois_ptr, lvl_ptr, g0, g1, g2, g3, g4,
    sb0, sb1, sb2, sb3, sb4, H0, H1, H2, H3, H4, W0, W1, W2, W3, W4, n_levels,
    N, C, ph, pw, sampling_ratio, n_pblocks, sgK, sgC, sgH, sgW,
    ALIGNED: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr, CF: tl.constexpr,
):
    """Atomic backward of _align_fwd_levels_kernel: box k scatters into level lvl[k]'s grad."""
    k, pb, cb = box_program(n_pblocks)
    valid, l, H, W, siN, siC, siH, siW, scale = box_level(
        lvl_ptr, k, n_levels, C, sb0, sb1, sb2, sb3, sb4, H0, H1, H2, H3, H4, W0, W1, W2, W3, W4,
        rois_ptr.dtype.element_ty, CF)
    bwd_atomic_tile(grad_ptr, grad_ptr, rois_ptr, pick(l, g0, g1, g2, g3, g4), k, pb, cb, valid, scale,
                    N, C, H, W, ph, pw, sampling_ratio, sgK, sgC, sgH, sgW, sgK, sgC, sgH, sgW, siN, siC, siH, siW,
                    ALIGNED, False, BLOCK_P, BLOCK_C, CF)


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
    ph, pw = int(pooled_height), int(pooled_width)
    rois = dense(rois, opmath(first.dtype))
    levels = dense(levels, torch.int64)
    out = forward_output(first, rois, C, ph, pw)
    if out.numel() == 0:
        return out
    ptrs, sbits, hs, ws = level_args(maps, spatial_scales, [x.shape[2] for x in maps], [x.shape[3] for x in maps])
    grid = box_grid(rois.shape[0], ph, pw, C, fmt == torch.channels_last, first.is_cpu, tile_budget(first.dtype),
                    flat=True)
    grid.launch(_align_fwd_levels_kernel, (*ptrs, rois, levels, out, *sbits, *hs, *ws, len(maps),
                                           N, C, ph, pw, int(sampling_ratio)),
                out.stride(), ALIGNED=bool(aligned))
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
    cl = bool(channels_last)
    det = use_deterministic(deterministic)
    # The gather writes every cell once; the scatter adds into zeros.
    grads = [grad_input(grad, N, C, int(h), int(w), cl, atomic=not det) for h, w in zip(heights, widths)]
    if K == 0 or all(v.numel() == 0 for v in grads):
        return [v.zero_() if det else from_atomic(v, grad.dtype) for v in grads]
    if det:
        gather_backward_levels(grad, rois, levels, grads, spatial_scales, N, C, ph, pw, sampling_ratio, aligned, cl)
        return grads
    ptrs, sbits, hs, ws = level_args(grads, spatial_scales, [v.shape[2] for v in grads], [v.shape[3] for v in grads])
    box_grid(K, ph, pw, C, cl, grad.is_cpu, tile_budget(grad.dtype)).launch(
        _align_bwd_atomic_levels_kernel, (grad, rois, levels, *ptrs, *sbits, *hs, *ws, len(grads),
                                          N, C, ph, pw, int(sampling_ratio)),
        grad.stride(), ALIGNED=bool(aligned))
    return [from_atomic(v, grad.dtype) for v in grads]
