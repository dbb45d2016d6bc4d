"""Reference position-sensitive RoIPool (docs/semantics.md, "ps_roi_pool")."""

from __future__ import annotations

import torch
from torch import Tensor

from .._geometry import is_channels_last, pool_bin_edges, round_half_away
from .._kernel_checks import kernel_check
from ._common import attach, layout, opmath_type, prepare_rois, require_finite

__all__ = ["ps_roi_pool_backward", "ps_roi_pool_forward"]

_check_forward = kernel_check("ps_roi_pool")
_check_backward = kernel_check("ps_roi_pool", "backward")


def _ps_pool_bins(rois: Tensor, spatial_scale: float, ph: int, pw: int, height: int, width: int):
    """Bin limits [K, ph] rows and [K, pw] columns, clipped to [0, size], as int64.

    Corners rounded (C's round) after scaling; the box is at least 1 cell (no + 1, unlike
    roi_pool); bins as RoIPool's.
    """
    s = torch.tensor(spatial_scale, dtype=rois.dtype, device=rois.device)
    x1, y1, x2, y2 = (round_half_away(rois[:, c] * s)[:, None] for c in (1, 2, 3, 4))
    roi_w = (x2 - x1).clamp(min=1)
    roi_h = (y2 - y1).clamp(min=1)
    require_finite(rois, [x1[:, 0], y1[:, 0], roi_w[:, 0], roi_h[:, 0]], spatial_scale)
    h0, h1 = pool_bin_edges(y1, roi_h / ph, ph, height, start_after=True)
    w0, w1 = pool_bin_edges(x1, roi_w / pw, pw, width, start_after=True)
    return h0, h1, w0, w1


def ps_roi_pool_forward(input: Tensor, rois: Tensor, spatial_scale: float, pooled_height: int,
                        pooled_width: int) -> Tensor:
    """``out[k, c, i, j]``: the mean of input channel ``(c * ph + i) * pw + j`` over the
    cells of bin (i, j); 0 for an empty bin."""
    _check_forward(input, rois, spatial_scale, pooled_height, pooled_width)
    ph, pw = int(pooled_height), int(pooled_width)
    n, c, height, width = input.shape
    c_out = c // (ph * pw)
    opmath = opmath_type(input.dtype)
    rois, batch = prepare_rois(rois, n, opmath)
    h0, h1, w0, w1 = _ps_pool_bins(rois, spatial_scale, ph, pw, height, width)
    x = input.to(opmath).view(n, c_out, ph, pw, height, width)

    out = x.new_zeros((len(batch), c_out, ph, pw))
    for k, b in enumerate(batch):
        for i in range(ph):
            for j in range(pw):
                r0, r1, c0, c1 = int(h0[k, i]), int(h1[k, i]), int(w0[k, j]), int(w1[k, j])
                if r1 > r0 and c1 > c0:
                    out[k, :, i, j] = x[b, :, i, j, r0:r1, c0:c1].sum(dim=(1, 2)) / ((r1 - r0) * (c1 - c0))
    out = attach(out, input)
    return layout(out.to(input.dtype), is_channels_last(input))


def ps_roi_pool_backward(grad: Tensor, rois: Tensor, spatial_scale: float, pooled_height: int,
                         pooled_width: int, batch_size: int, channels: int, height: int, width: int,
                         channels_last: bool) -> Tensor:
    """Adjoint of :func:`ps_roi_pool_forward`: each cell of bin (i, j) receives ``grad /
    area`` in channel ``(c * ph + i) * pw + j``."""
    _check_backward(grad, rois, spatial_scale, pooled_height, pooled_width, batch_size, channels, height, width,
                    channels_last)
    ph, pw = int(pooled_height), int(pooled_width)
    c_out = channels // (ph * pw)
    opmath = opmath_type(grad.dtype)
    rois, batch = prepare_rois(rois, batch_size, opmath)
    h0, h1, w0, w1 = _ps_pool_bins(rois, spatial_scale, ph, pw, height, width)
    g = grad.to(opmath)

    grad_input = torch.zeros((batch_size, c_out, ph, pw, height, width), dtype=opmath, device=grad.device)
    for k, b in enumerate(batch):
        for i in range(ph):
            for j in range(pw):
                r0, r1, c0, c1 = int(h0[k, i]), int(h1[k, i]), int(w0[k, j]), int(w1[k, j])
                if r1 > r0 and c1 > c0:
                    grad_input[b, :, i, j, r0:r1, c0:c1] += (g[k, :, i, j] / ((r1 - r0) * (c1 - c0)))[:, None, None]
    grad_input = grad_input.view(batch_size, channels, height, width)
    return layout(grad_input.to(grad.dtype), bool(channels_last))
