"""Reference Precise RoI Pooling (docs/semantics.md, "prroi_pool").

Per box, each axis gives a weight matrix: the integral of cell w's hat over bin j's window
(``[pw, cells]``), zero for the cells outside the bin's range floor(start)..ceil(end).
A bin's integral is then ``Iy @ F @ Ix^T``. The gradients use the same matrices, with
the hat's value at a window edge in place of its integral for the edge derivatives.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .._geometry import hat, hat_antiderivative, is_channels_last, prroi_bins
from .._kernel_checks import kernel_check
from ._common import attach, layout, opmath_type, prepare_rois, require_finite

__all__ = ["prroi_pool_backward", "prroi_pool_forward", "prroi_pool_rois_backward"]

_check_forward = kernel_check("prroi_pool")
_check_backward = kernel_check("prroi_pool", "backward")
_check_rois_backward = kernel_check("prroi_pool", "rois_backward")


def _windows(rois: Tensor, spatial_scale: float, ph: int, pw: int):
    """Bin windows of every box: (dw [K, 1], xs, xe [K, pw], dh [K, 1], ys, ye [K, ph])."""
    s = torch.tensor(spatial_scale, dtype=rois.dtype, device=rois.device)
    dw, xs, xe = prroi_bins(rois[:, 1:2], rois[:, 3:4], s, pw)
    dh, ys, ye = prroi_bins(rois[:, 2:3], rois[:, 4:5], s, ph)
    require_finite(rois, [xs[:, 0], xe[:, -1], ys[:, 0], ye[:, -1]], spatial_scale)
    return dw, xs, xe, dh, ys, ye


class _Axis:
    """One box's windows along one axis over the cells they can weigh: ``cells`` (the range
    [first, last] of the map side, clipped), ``member`` [P, cells] (cell in bin p's range
    floor(start)..ceil(end)), ``integral`` (the hat's integral over the window), ``at_start``
    and ``at_end`` (the hat's value at each edge), all zero outside ``member``."""

    def __init__(self, start: Tensor, end: Tensor, size: int):
        first = int(torch.floor(start.min()).clamp(0, size)) if start.numel() else 0
        last = int(torch.ceil(end.max()).clamp(-1, size - 1)) if end.numel() else -1
        self.first, self.last = first, max(last, first - 1)
        w = torch.arange(self.first, self.last + 1, dtype=start.dtype, device=start.device)
        s, e = start[:, None], end[:, None]
        self.member = (w >= torch.floor(s)) & (w <= torch.ceil(e))
        zero = torch.zeros((), dtype=start.dtype, device=start.device)
        self.integral = torch.where(self.member, hat_antiderivative(e - w) - hat_antiderivative(s - w), zero)
        self.at_start = torch.where(self.member, hat(s - w), zero)
        self.at_end = torch.where(self.member, hat(e - w), zero)

    @property
    def cells(self) -> slice:
        return slice(self.first, self.last + 1)


def _weighted_sum(f: Tensor, wy: Tensor, wx: Tensor, y: _Axis, x: _Axis) -> Tensor:
    """``[C, ph, pw]``: the sum over member cells (h, w) of f[c, h, w] * wy[i, h] * wx[j, w].
    A non-finite value takes part only in the bins whose range holds its cell (a matrix
    product would also multiply it by the zero weights of the other bins)."""
    finite = torch.isfinite(f)
    out = wy @ torch.where(finite, f, 0.0) @ wx.T
    if not bool(finite.all()):
        c, h, w = (~finite).nonzero(as_tuple=True)
        term = f[c, h, w][:, None, None] * wy[:, h].T[:, :, None] * wx[:, w].T[:, None, :]
        live = y.member[:, h].T[:, :, None] & x.member[:, w].T[:, None, :]
        out = out.index_add(0, c, torch.where(live, term, 0.0))
    return out


def prroi_pool_forward(input: Tensor, rois: Tensor, spatial_scale: float, pooled_height: int,
                       pooled_width: int) -> Tensor:
    """``out[k, c, i, j]``: the integral of the bilinear interpolation of channel c over bin
    (i, j)'s window, divided by the window's area; 0 for a window of area 0."""
    _check_forward(input, rois, spatial_scale, pooled_height, pooled_width)
    ph, pw = int(pooled_height), int(pooled_width)
    n, c, height, width = input.shape
    opmath = opmath_type(input.dtype)
    rois, batch = prepare_rois(rois, n, opmath)
    dw, xs, xe, dh, ys, ye = _windows(rois, spatial_scale, ph, pw)
    area = dw * dh
    x = input.to(opmath)

    outs = []
    for k, b in enumerate(batch):
        if float(area[k]) == 0:
            outs.append(x.new_zeros((c, ph, pw)))
            continue
        ay, ax = _Axis(ys[k], ye[k], height), _Axis(xs[k], xe[k], width)
        integral = _weighted_sum(x[b, :, ay.cells, ax.cells], ay.integral, ax.integral, ay, ax)
        outs.append(integral / area[k])
    out = torch.stack(outs) if outs else x.new_zeros((0, c, ph, pw))
    out = attach(out, input)
    return layout(out.to(input.dtype), is_channels_last(input))


def prroi_pool_backward(grad: Tensor, rois: Tensor, spatial_scale: float, pooled_height: int,
                        pooled_width: int, batch_size: int, channels: int, height: int, width: int,
                        channels_last: bool) -> Tensor:
    """Adjoint of :func:`prroi_pool_forward`: cell (h, w) of the box's image receives
    ``grad * Ix(w) * Iy(h) / (dw * dh)`` from each bin whose range holds it."""
    _check_backward(grad, rois, spatial_scale, pooled_height, pooled_width, batch_size, channels, height, width,
                    channels_last)
    ph, pw = int(pooled_height), int(pooled_width)
    opmath = opmath_type(grad.dtype)
    rois, batch = prepare_rois(rois, batch_size, opmath)
    dw, xs, xe, dh, ys, ye = _windows(rois, spatial_scale, ph, pw)
    area = dw * dh
    g_all = grad.to(opmath)

    grad_input = torch.zeros((batch_size, channels, height, width), dtype=opmath, device=grad.device)
    for k, b in enumerate(batch):
        if float(area[k]) == 0:
            continue
        ay, ax = _Axis(ys[k], ye[k], height), _Axis(xs[k], xe[k], width)
        g = g_all[k] / area[k]  # [C, ph, pw]
        finite = torch.isfinite(g)
        region = ay.integral.T @ torch.where(finite, g, 0.0) @ ax.integral
        if not bool(finite.all()):  # as in _weighted_sum: only into the bin's own cells
            c, i, j = (~finite).nonzero(as_tuple=True)
            term = g[c, i, j][:, None, None] * ay.integral[i][:, :, None] * ax.integral[j][:, None, :]
            live = ay.member[i][:, :, None] & ax.member[j][:, None, :]
            region = region.index_add(0, c, torch.where(live, term, 0.0))
        grad_input[b, :, ay.cells, ax.cells] += region
    return layout(grad_input.to(grad.dtype), bool(channels_last))


def prroi_pool_rois_backward(grad: Tensor, input: Tensor, rois: Tensor, spatial_scale: float,
                             pooled_height: int, pooled_width: int) -> Tensor:
    """Gradient of :func:`prroi_pool_forward` with respect to ``rois`` ``[K, 5]`` (rois'
    dtype, zero batch-index column). Window edge derivatives, e.g. for the right edge
    ``d out / d xe = (integral over y of f(xe, y) - out * dh) / (dw * dh)``, chained to the
    box corners: ``xs = x1 * s + j * dw`` and ``xe = xs + dw`` with ``dw = (x2 - x1) * s / pw``.
    A window of area 0 (x2 <= x1 or y2 <= y1) gives 0."""
    _check_rois_backward(grad, input, rois, spatial_scale, pooled_height, pooled_width)
    ph, pw = int(pooled_height), int(pooled_width)
    n, c, height, width = input.shape
    opmath = opmath_type(input.dtype)
    out_dtype = rois.dtype
    rois, batch = prepare_rois(rois, n, opmath)
    dw, xs, xe, dh, ys, ye = _windows(rois, spatial_scale, ph, pw)
    area = dw * dh
    x = input.detach().to(opmath)
    g_all = grad.to(opmath)
    s = torch.tensor(spatial_scale, dtype=opmath, device=input.device)
    # d xs / d x2 = s * j / pw and d xe / d x2 = s * (j + 1) / pw (d / d x1: 1 minus these).
    jx = torch.arange(pw, dtype=opmath, device=input.device) / pw
    jx1 = torch.arange(1, pw + 1, dtype=opmath, device=input.device) / pw
    iy = torch.arange(ph, dtype=opmath, device=input.device) / ph
    iy1 = torch.arange(1, ph + 1, dtype=opmath, device=input.device) / ph

    grad_rois = torch.zeros((len(batch), 5), dtype=opmath, device=input.device)
    for k, b in enumerate(batch):
        if float(area[k]) == 0:
            continue
        ay, ax = _Axis(ys[k], ye[k], height), _Axis(xs[k], xe[k], width)
        f = x[b, :, ay.cells, ax.cells]
        a = area[k]
        out = _weighted_sum(f, ay.integral, ax.integral, ay, ax) / a
        g = g_all[k]
        # Per window edge: the sum over channels of grad * d out / d edge, [ph, pw].
        d_xe = (g * (_weighted_sum(f, ay.integral, ax.at_end, ay, ax) - out * dh[k]) / a).sum(0)
        d_xs = (g * (out * dh[k] - _weighted_sum(f, ay.integral, ax.at_start, ay, ax)) / a).sum(0)
        d_ye = (g * (_weighted_sum(f, ay.at_end, ax.integral, ay, ax) - out * dw[k]) / a).sum(0)
        d_ys = (g * (out * dw[k] - _weighted_sum(f, ay.at_start, ax.integral, ay, ax)) / a).sum(0)
        grad_rois[k, 1] = s * (d_xs * (1 - jx) + d_xe * (1 - jx1)).sum()
        grad_rois[k, 3] = s * (d_xs * jx + d_xe * jx1).sum()
        grad_rois[k, 2] = s * (d_ys * (1 - iy)[:, None] + d_ye * (1 - iy1)[:, None]).sum()
        grad_rois[k, 4] = s * (d_ys * iy[:, None] + d_ye * iy1[:, None]).sum()
    return grad_rois.to(out_dtype)
