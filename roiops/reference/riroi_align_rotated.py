"""Reference rotation-invariant RoIAlign (docs/semantics.md, "riroi_align_rotated"):
rotated RoIAlign without the half-cell offset (:mod:`.roi_align_rotated`, ``aligned=False``)
of every channel, then each box's blend of orientations."""

from __future__ import annotations

import torch
from torch import Tensor

from .._geometry import is_channels_last, orientation_blend
from .._kernel_checks import kernel_check
from ._common import layout, opmath_type, prepare_rois
from .roi_align_rotated import roi_align_rotated_backward, roi_align_rotated_forward

__all__ = ["riroi_align_rotated_backward", "riroi_align_rotated_forward"]


def _blend(x: Tensor, rois: Tensor, num_orientations: int, clockwise: bool, adjoint: bool) -> Tensor:
    """``out[k, c' O + o] = r_k * x[k, c' O + i0] + l_k * x[k, c' O + i1]`` in x's dtype, with
    ``i0 = (o - ind_k) mod O`` and ``i1 = i0 + 1`` (mod O); ``adjoint``: the transpose,
    ``i0 = (o + ind_k) mod O`` and ``i1 = i0 - 1``, each output's parts sent back to the
    orientations it read."""
    k, c, ph, pw = x.shape
    o = num_orientations
    ind, r, l = orientation_blend(rois[:, 5], o, clockwise)
    step = 1 if adjoint else -1
    i0 = (torch.arange(o, device=x.device)[None, :] + step * ind[:, None]) % o  # [K, O]
    i1 = (i0 - step) % o
    fields = x.reshape(k, c // o, o, ph, pw)

    def pick(index: Tensor) -> Tensor:
        return torch.gather(fields, 2, index[:, None, :, None, None].expand(k, c // o, o, ph, pw))

    w0, w1 = r.to(x.dtype)[:, None, None, None, None], l.to(x.dtype)[:, None, None, None, None]
    return (w0 * pick(i0) + w1 * pick(i1)).reshape(k, c, ph, pw)


_check_forward = kernel_check("riroi_align_rotated")
_check_backward = kernel_check("riroi_align_rotated", "backward")


def riroi_align_rotated_forward(input: Tensor, rois: Tensor, spatial_scale: float, pooled_height: int,
                                pooled_width: int, sampling_ratio: int, num_orientations: int,
                                clockwise: bool) -> Tensor:
    """``A`` = rotated RoIAlign (no offset, 1-cell minimum) in the input's dtype; ``out`` =
    its blend, computed in opmath and rounded to the input's dtype."""
    _check_forward(input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, num_orientations,
                   clockwise)
    a = roi_align_rotated_forward(input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, False)
    opmath = opmath_type(input.dtype)
    rois, _ = prepare_rois(rois, input.shape[0], opmath)
    out = _blend(a.to(opmath), rois, int(num_orientations), bool(clockwise), adjoint=False)
    return layout(out.to(input.dtype), is_channels_last(input))


def riroi_align_rotated_backward(grad: Tensor, rois: Tensor, spatial_scale: float, pooled_height: int,
                                 pooled_width: int, batch_size: int, channels: int, height: int, width: int,
                                 sampling_ratio: int, num_orientations: int, clockwise: bool,
                                 channels_last: bool) -> Tensor:
    """The adjoint blend of ``grad`` in opmath, then rotated RoIAlign's backward of it,
    rounded once to grad's dtype."""
    _check_backward(grad, rois, spatial_scale, pooled_height, pooled_width, batch_size, channels, height, width,
                    sampling_ratio, num_orientations, clockwise, channels_last)
    opmath = opmath_type(grad.dtype)
    rois, _ = prepare_rois(rois, batch_size, opmath)
    grad_a = _blend(grad.to(opmath), rois, int(num_orientations), bool(clockwise), adjoint=True)
    gi = roi_align_rotated_backward(grad_a, rois, spatial_scale, pooled_height, pooled_width, batch_size, channels,
                                    height, width, sampling_ratio, False, channels_last)
    return gi.to(grad.dtype)
