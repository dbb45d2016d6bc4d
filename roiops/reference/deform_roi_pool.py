"""Reference deformable RoI pooling (docs/semantics.md, "deform_roi_pool")."""

from __future__ import annotations

import torch
from torch import Tensor

from .._geometry import align_axis, is_channels_last
from .._kernel_checks import kernel_check
from ._common import _Axis, attach, axis_samples, layout, opmath_type, prepare_rois, require_finite, sampling_grids

__all__ = ["deform_roi_pool_backward", "deform_roi_pool_forward", "deform_roi_pool_offset_backward"]

_check_forward = kernel_check("deform_roi_pool")
_check_backward = kernel_check("deform_roi_pool", "backward")
_check_offset_backward = kernel_check("deform_roi_pool", "offset_backward")


class _Bins:
    """One box's bins, each with its own start: per axis the inside samples of every bin
    (``[ph * pw, m]`` after :meth:`grid`), its slot validity, and the scale of the offset
    (``gamma`` times the box's side)."""

    def __init__(self, y: _Axis, x: _Axis, bins: int, count: int, reach_y: Tensor, reach_x: Tensor):
        self.y, self.x, self.bins, self.count = y, x, bins, count
        self.reach_y, self.reach_x = reach_y, reach_x

    def grid(self, t: Tensor, axis: str) -> Tensor:
        """``t`` of one axis as ``[bins, 1, m]`` (x) or ``[bins, m, 1]`` (y)."""
        t = t.view(self.bins, -1)
        return t[:, None, :] if axis == "x" else t[:, :, None]

    def valid(self) -> Tensor:
        return self.grid(self.y.valid, "y") & self.grid(self.x.valid, "x")

    def corners(self) -> list[tuple[Tensor, Tensor, Tensor]]:
        """(weight ``[bins, my, mx]``, row ``[bins, my, 1]``, column ``[bins, 1, mx]``) of the
        four bilinear neighbours, in the order w1..w4 of semantics.md."""
        y, x, g = self.y, self.x, self.grid
        return [(g(wy, "y") * g(wx, "x"), g(rows, "y"), g(cols, "x"))
                for wy, rows, wx, cols in ((y.h, y.low, x.h, x.low), (y.h, y.low, x.l, x.high),
                                           (y.l, y.high, x.h, x.low), (y.l, y.high, x.l, x.high))]


def _boxes(rois: Tensor, offset: Tensor | None, spatial_scale: float, ph: int, pw: int, sampling_ratio: int,
           gamma: float, height: int, width: int) -> list[_Bins | None]:
    """Per-box bins of semantics.md "deform_roi_pool" (rois validated, opmath); None for a
    box without sample points."""
    opmath = rois.dtype
    s = torch.tensor(spatial_scale, dtype=opmath, device=rois.device)
    g = torch.tensor(gamma, dtype=opmath, device=rois.device)
    x_start, roi_w, bin_w, grid_w, _ = align_axis(rois[:, 1], rois[:, 3], s, pw, sampling_ratio, True)
    y_start, roi_h, bin_h, grid_h, _ = align_axis(rois[:, 2], rois[:, 4], s, ph, sampling_ratio, True)
    require_finite(rois, [x_start, y_start, roi_w, roi_h], spatial_scale)
    off = offset.detach().to(opmath) if offset is not None else None
    rows = torch.arange(ph, device=rois.device).repeat_interleave(pw)
    cols = torch.arange(pw, device=rois.device).repeat(ph)
    boxes: list[_Bins | None] = []
    for k, (gh, gw) in enumerate(sampling_grids(rois, grid_h, grid_w)):
        if gh <= 0 or gw <= 0:
            boxes.append(None)
            continue
        reach_y, reach_x = g * roi_h[k], g * roi_w[k]
        # Each bin's start: the box's, moved by its offset (in this order).
        sy = y_start[k].expand(ph * pw) if off is None else y_start[k] + reach_y * off[k, 1].reshape(-1)
        sx = x_start[k].expand(ph * pw) if off is None else x_start[k] + reach_x * off[k, 0].reshape(-1)
        y = axis_samples(sy, bin_h[k], ph * pw, gh, height, bins=rows)
        x = axis_samples(sx, bin_w[k], ph * pw, gw, width, bins=cols)
        boxes.append(_Bins(y, x, ph * pw, gh * gw, reach_y, reach_x))
    return boxes


def _corner_values(plane: Tensor, box: _Bins) -> list[Tensor]:
    """The map ``[C, H, W]`` at the four neighbours of every sample slot: ``[C, bins, my, mx]``."""
    return [plane[:, rows, cols] for _, rows, cols in box.corners()]


def average_bins(x: Tensor, batch: list[int], boxes: list[_Bins | None], ph: int, pw: int) -> Tensor:
    """``[K, C, ph, pw]``: each bin's mean of its bilinear samples on ``x`` (opmath) of its
    box's image; 0 for a box without sample points."""
    c = x.shape[1]
    outs = []
    for b, box in zip(batch, boxes):
        if box is None:
            outs.append(x.new_zeros((c, ph, pw)))
            continue
        value = sum(w * v for (w, _, _), v in zip(box.corners(), _corner_values(x[b], box)))
        # Samples outside the map add 0 but count in the divisor.
        value = torch.where(box.valid(), value, 0.0)
        outs.append(value.sum(dim=(2, 3)).view(c, ph, pw) / box.count)
    return torch.stack(outs) if outs else x.new_zeros((0, c, ph, pw))


def scatter_bins(grad: Tensor, batch: list[int], boxes: list[_Bins | None], shape: tuple[int, int, int, int],
                 divide_first: bool) -> Tensor:
    """The adjoint of :func:`average_bins`: a ``shape`` gradient (grad's dtype) to which each
    sample adds ``(grad / count) * w`` (``divide_first``, mmcv's deformable order) or
    ``(grad * w) / count`` (RoIAlign's) at its four neighbours."""
    _, channels, height, width = shape
    grad_input = torch.zeros(shape, dtype=grad.dtype, device=grad.device)
    for k, (b, box) in enumerate(zip(batch, boxes)):
        if box is None:
            continue
        g = grad[k].reshape(channels, box.bins)[:, :, None, None]  # [C, bins, 1, 1]
        valid = box.valid()
        plane = grad_input[b].view(channels, height * width)
        for weight, rows, cols in box.corners():
            term = (g / box.count) * weight if divide_first else (g * weight) / box.count
            flat = (rows * width + cols).expand(valid.shape).reshape(-1)
            plane.index_add_(1, flat, torch.where(valid, term, 0.0).flatten(1))
    return grad_input


def deform_roi_pool_forward(input: Tensor, rois: Tensor, offset: Tensor | None, spatial_scale: float,
                            pooled_height: int, pooled_width: int, sampling_ratio: int, gamma: float) -> Tensor:
    """``out[k, c, i, j]`` = the mean of the bilinear samples of bin (i, j), placed at the
    bin's moved start."""
    _check_forward(input, rois, offset, spatial_scale, pooled_height, pooled_width, sampling_ratio, gamma)
    ph, pw = int(pooled_height), int(pooled_width)
    n, _, height, width = input.shape
    opmath = opmath_type(input.dtype)
    rois, batch = prepare_rois(rois, n, opmath)
    boxes = _boxes(rois, offset, spatial_scale, ph, pw, int(sampling_ratio), float(gamma), height, width)
    out = attach(average_bins(input.to(opmath), batch, boxes, ph, pw), input)
    return layout(out.to(input.dtype), is_channels_last(input))


def deform_roi_pool_backward(grad: Tensor, rois: Tensor, offset: Tensor | None, spatial_scale: float,
                             pooled_height: int, pooled_width: int, batch_size: int, channels: int, height: int,
                             width: int, sampling_ratio: int, gamma: float, channels_last: bool) -> Tensor:
    """Adjoint of :func:`deform_roi_pool_forward`: each sample adds ``(grad / count) * w`` to
    its four neighbours."""
    _check_backward(grad, rois, offset, spatial_scale, pooled_height, pooled_width, batch_size, channels, height,
                    width, sampling_ratio, gamma, channels_last)
    ph, pw = int(pooled_height), int(pooled_width)
    opmath = opmath_type(grad.dtype)
    rois, batch = prepare_rois(rois, batch_size, opmath)
    boxes = _boxes(rois, offset, spatial_scale, ph, pw, int(sampling_ratio), float(gamma), height, width)
    grad_input = scatter_bins(grad.to(opmath), batch, boxes, (batch_size, channels, height, width), True)
    return layout(grad_input.to(grad.dtype), bool(channels_last))


def deform_roi_pool_offset_backward(grad: Tensor, input: Tensor, rois: Tensor, offset: Tensor | None,
                                    spatial_scale: float, pooled_height: int, pooled_width: int, sampling_ratio: int,
                                    gamma: float) -> Tensor:
    """Gradient of :func:`deform_roi_pool_forward` with respect to the offset: per bin, the
    sum over channels and samples of ``(grad / count) * dv/dx`` (channel 0) and ``dv/dy``
    (channel 1), times ``gamma`` and the box's side. ``dv/dx = slope_x * (hy * (v2 - v1) +
    ly * (v4 - v3))``, the slope 0 where the border rule holds the sample (semantics.md)."""
    _check_offset_backward(grad, input, rois, offset, spatial_scale, pooled_height, pooled_width, sampling_ratio,
                           gamma)
    if offset is None:
        return input.new_empty(0)
    ph, pw = int(pooled_height), int(pooled_width)
    n, c, height, width = input.shape
    opmath = opmath_type(input.dtype)
    rois, batch = prepare_rois(rois, n, opmath)
    boxes = _boxes(rois, offset, spatial_scale, ph, pw, int(sampling_ratio), float(gamma), height, width)
    x, g_all = input.detach().to(opmath), grad.to(opmath)
    grad_offset = torch.zeros((rois.shape[0], 2, ph * pw), dtype=opmath, device=input.device)
    for k, (b, box) in enumerate(zip(batch, boxes)):
        if box is None:
            continue
        q = (g_all[k].reshape(c, ph * pw) / box.count)[:, :, None, None]
        v1, v2, v3, v4 = _corner_values(x[b], box)
        y, xa, grid = box.y, box.x, box.grid
        dx = grid(xa.dl, "x") * (grid(y.h, "y") * (v2 - v1) + grid(y.l, "y") * (v4 - v3))
        dy = grid(y.dl, "y") * (grid(xa.h, "x") * (v3 - v1) + grid(xa.l, "x") * (v4 - v2))
        valid = box.valid()
        for axis, (d, reach) in enumerate(((dx, box.reach_x), (dy, box.reach_y))):
            grad_offset[k, axis] = reach * torch.where(valid, q * d, 0.0).sum(dim=(0, 2, 3))
    return grad_offset.view(-1, 2, ph, pw).to(offset.dtype)
