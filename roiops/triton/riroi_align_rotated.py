"""Rotation-invariant RoIAlign in Triton (docs/semantics.md, "riroi_align_rotated"),
forward and backward.

A box's blend weights are constant over its bins, so the forward is rotated RoIAlign
(roi_align_rotated.py, aligned=False) of every channel followed by a blend pass over its
output, and the backward the adjoint blend of grad (in the opmath type) followed by
rotated RoIAlign's backward, whose deterministic and atomic paths it keeps. Each box's
orientation bin and weights come from torch on the device (_geometry.orientation_blend,
no host sync), so they are the reference's bits.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._geometry import dense, is_channels_last, memory_format, orientation_blend
from .._kernel_checks import kernel_check
from ._common import LAUNCH_OPTS, cdiv, check_device, kernel, opmath
from .roi_align_rotated import roi_align_rotated_backward, roi_align_rotated_forward

__all__ = ["riroi_align_rotated_backward", "riroi_align_rotated_forward"]

_BLOCK = 1024


@kernel
def _riroi_blend_kernel(
    src_ptr, ind_ptr, r_ptr, l_ptr, dst_ptr, K, C, ph, pw, num_orientations,
    CHANNELS_LAST: tl.constexpr, ADJOINT: tl.constexpr, BLOCK: tl.constexpr,
):
    """dst[k, c' O + o] = r_k * src[k, c' O + i0] + l_k * src[k, c' O + i1] in the opmath
    type, src and dst dense [K, C, ph, pw] in one layout, element by element in memory
    order. Forward: i0 = (o - ind_k) mod O, i1 = i0 + 1; adjoint: i0 = (o + ind_k) mod O,
    i1 = i0 - 1 (mod O)."""
    T = r_ptr.dtype.element_ty
    O = num_orientations
    P = ph.to(tl.int64) * pw
    CP = P * C
    m = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    live = m < K * CP
    k = m // CP
    if CHANNELS_LAST:
        step = 1
        c = m % C
    else:
        step = P
        c = (m // P) % C
    o = c % O
    ind = tl.load(ind_ptr + k, mask=live, other=0)
    if ADJOINT:
        i0 = (o + ind) % O
        i1 = (i0 + O - 1) % O
    else:
        i0 = (o - ind + O) % O
        i1 = (i0 + 1) % O
    base = m - o * step
    v0 = tl.load(src_ptr + base + i0 * step, mask=live, other=0.0).to(T)
    v1 = tl.load(src_ptr + base + i1 * step, mask=live, other=0.0).to(T)
    r = tl.load(r_ptr + k, mask=live, other=0.0)
    w = tl.load(l_ptr + k, mask=live, other=0.0)
    tl.store(dst_ptr + m, (r * v0 + w * v1).to(dst_ptr.dtype.element_ty), mask=live)


def _blend(src: torch.Tensor, rois: torch.Tensor, dst: torch.Tensor, num_orientations: int, clockwise: bool,
           adjoint: bool) -> None:
    """dst = the blend (adjoint: its transpose) of src, both dense [K, C, ph, pw] in one layout."""
    K, C, ph, pw = src.shape
    if dst.numel() == 0:
        return
    ind, r, l = orientation_blend(rois[:, 5], int(num_orientations), bool(clockwise))
    _riroi_blend_kernel[(cdiv(dst.numel(), _BLOCK),)](
        src, ind, r, l, dst, K, C, ph, pw, int(num_orientations), CHANNELS_LAST=is_channels_last(src),
        ADJOINT=adjoint, BLOCK=_BLOCK, **LAUNCH_OPTS)


_check_forward = kernel_check("riroi_align_rotated")
_check_backward = kernel_check("riroi_align_rotated", "backward")


def riroi_align_rotated_forward(input: torch.Tensor, rois: torch.Tensor, spatial_scale: float, pooled_height: int,
                                pooled_width: int, sampling_ratio: int, num_orientations: int,
                                clockwise: bool) -> torch.Tensor:
    """[K, C, ph, pw] in the input's dtype and memory format."""
    _check_forward(input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, num_orientations,
                   clockwise)
    check_device(input, _riroi_blend_kernel)
    rois = dense(rois, opmath(input.dtype))
    a = roi_align_rotated_forward(input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, False)
    out = torch.empty_like(a)
    _blend(a, rois, out, num_orientations, clockwise, adjoint=False)
    return out


def riroi_align_rotated_backward(grad: torch.Tensor, rois: torch.Tensor, spatial_scale: float, pooled_height: int,
                                 pooled_width: int, batch_size: int, channels: int, height: int, width: int,
                                 sampling_ratio: int, num_orientations: int, clockwise: bool, channels_last: bool, *,
                                 deterministic: bool | None = None) -> torch.Tensor:
    """Gradient of riroi_align_rotated_forward w.r.t. its input, [N, C, H, W] in grad's dtype.

    deterministic: None follows roiops.config.deterministic_backward, then torch's deterministic flag.
    """
    _check_backward(grad, rois, spatial_scale, pooled_height, pooled_width, batch_size, channels, height, width,
                    sampling_ratio, num_orientations, clockwise, channels_last)
    check_device(grad, _riroi_blend_kernel)
    rois = dense(rois, opmath(grad.dtype))
    fmt = memory_format(bool(channels_last))
    g = grad.contiguous(memory_format=fmt)
    grad_a = torch.empty(g.shape, dtype=rois.dtype, device=g.device, memory_format=fmt)
    _blend(g, rois, grad_a, num_orientations, clockwise, adjoint=True)
    gi = roi_align_rotated_backward(grad_a, rois, spatial_scale, pooled_height, pooled_width, batch_size, channels,
                                    height, width, sampling_ratio, False, channels_last, deterministic=deterministic)
    return gi if gi.dtype == grad.dtype else gi.to(grad.dtype)
