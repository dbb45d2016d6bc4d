"""Mask targets in Triton (docs/semantics.md, "mask_targets"): RoIAlign's forward tile
(_align.py) over the masks as a map of one channel, read as stored (bool as uint8, uint8,
floating) and converted to the compute type per sample; one program per (proposal, block
of bins)."""

from __future__ import annotations

import torch
import triton.language as tl

from .. import _kernel_checks as checks
from ._align import fwd_tile
from ._common import box_grid, check_device, f64_bits, kernel, opmath, tile_budget
from ._jit import box_program, scale_of

__all__ = ["mask_targets_forward"]


@kernel
def _targets_kernel(
    x_ptr, rois_ptr, out_ptr, scale_bits,
    N, C, H, W, ph, pw, sampling_ratio, n_pblocks,
    sxN, sxC, sxH, sxW, soK, soC, soH, soW,
    ALIGNED: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr, CF: tl.constexpr,
):
    k, pb, cb = box_program(n_pblocks)
    scale = scale_of(scale_bits, rois_ptr.dtype.element_ty)
    fwd_tile(x_ptr, rois_ptr, out_ptr, out_ptr, k, pb, cb, k >= 0, scale, N, C, H, W, ph, pw, sampling_ratio,
             sxN, sxC, sxH, sxW, soK, soC, soH, soW, ALIGNED, False, BLOCK_P, BLOCK_C, CF)


def mask_targets_forward(masks: torch.Tensor, rois: torch.Tensor, pooled_height: int, pooled_width: int,
                         sampling_ratio: int, aligned: bool, threshold: float, binary: bool) -> torch.Tensor:
    """``[P, ph, pw]``: floating masks' dtype, float32 for bool and uint8 masks; bool with
    ``binary`` (the value in the compute type ``>= threshold``)."""
    checks.mask_targets(masks, rois, pooled_height, pooled_width, sampling_ratio, threshold, binary)
    check_device(masks, _targets_kernel)
    ph, pw = int(pooled_height), int(pooled_width)
    compute = opmath(masks.dtype)
    out_dtype = compute if binary or not masks.is_floating_point() else masks.dtype
    rois = rois.to(compute).contiguous()
    K, (G, H, W) = rois.shape[0], masks.shape
    out = torch.zeros((K, 1, ph, pw), dtype=out_dtype, device=masks.device)
    if K and H and W:
        x = (masks.view(torch.uint8) if masks.dtype == torch.bool else masks)[:, None]
        grid = box_grid(K, ph, pw, 1, False, masks.is_cpu, tile_budget(compute), flat=True)
        grid.launch(_targets_kernel, (x, rois, out, f64_bits(1.0), G, 1, H, W, ph, pw, int(sampling_ratio)),
                    (*x.stride(), *out.stride()), ALIGNED=bool(aligned))
    out = out[:, 0]
    return out >= torch.tensor(threshold, dtype=compute) if binary else out
