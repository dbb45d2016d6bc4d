"""Reference rotated RoIAlign (docs/semantics.md, "roi_align_rotated")."""

from __future__ import annotations

import torch
from torch import Tensor

from .._geometry import align_size, bilinear_taps, is_channels_last, sample_position
from .._kernel_checks import kernel_check
from ._common import attach, layout, opmath_type, prepare_rois, require_finite, sampling_grids

__all__ = ["roi_align_rotated_backward", "roi_align_rotated_forward"]


class _RotatedBox:
    """Sampling geometry of one box (semantics.md "roi_align_rotated").

    In box coordinates sample (iy, ix) of bin (i, j) sits at (yy, xx) = (-H/2 + i*bh + (iy +
    0.5)*bh/gh, -W/2 + j*bw + (ix + 0.5)*bw/gw); on the map at y = yy*cos - xx*sin + cy,
    x = yy*sin + xx*cos + cx. Only candidates are generated: per bin, the samples whose yy
    (and xx) fall within the map's extent seen along the box's axes, widened by a margin
    that covers every rounding error; the exact border rule then decides each one. So
    memory and time follow the part of the map the box covers, not the box.

    ``yy``: [ph, my] positions, ``y_ok``: which slots are real samples; ``xx``, ``x_ok``:
    [pw, mx]; ``count``: samples per bin (the divisor), ``empty``: no samples at all.
    """

    def __init__(self, cx, cy, roi_w, roi_h, bin_w, bin_h, cos, sin, ph, pw, grid_h, grid_w, height, width):
        self.cx, self.cy, self.cos, self.sin = cx, cy, cos, sin
        self.count = max(grid_h * grid_w, 1)
        self.empty = grid_h <= 0 or grid_w <= 0
        if self.empty:
            return
        # The map [-1, height] x [-1, width] seen from the centre along the box's axes.
        corners = [(a - float(cy), b - float(cx)) for a in (-1.0, height) for b in (-1.0, width)]
        c, s = float(cos), float(sin)
        along_y = [a * c + b * s for a, b in corners]
        along_x = [-a * s + b * c for a, b in corners]
        # Rounding of the coordinate type is at most 2^-20 of the magnitudes involved.
        margin = 2.0 + 2.0**-20 * (abs(float(cx)) + abs(float(cy)) + abs(float(roi_w)) + abs(float(roi_h))
                                   + height + width)
        self.yy, self.y_ok = _axis(-roi_h / 2, bin_h, ph, grid_h, min(along_y) - margin, max(along_y) + margin)
        self.xx, self.x_ok = _axis(-roi_w / 2, bin_w, pw, grid_w, min(along_x) - margin, max(along_x) + margin)

    def taps(self, height: int, width: int):
        """The four bilinear neighbours of every candidate: (weight, row, column, live) each
        ``[ph, my, pw, mx]``, in the order w1..w4 of semantics.md; weight 0 off the map and on
        padding slots, which ``live`` marks so that they take no value (an inf neighbour times
        a 0 weight would be NaN)."""
        yy, xx = self.yy[:, :, None, None], self.xx[None, None, :, :]
        y = yy * self.cos - xx * self.sin + self.cy
        x = yy * self.sin + xx * self.cos + self.cx
        y_lo, y_hi, ly, hy, y_in = bilinear_taps(y, height)
        x_lo, x_hi, lx, hx, x_in = bilinear_taps(x, width)
        live = y_in & x_in & self.y_ok[:, :, None, None] & self.x_ok[None, None, :, :]
        return [(torch.where(live, wy * wx, 0.0), rows, cols, live)
                for wy, rows, wx, cols in ((hy, y_lo, hx, x_lo), (hy, y_lo, lx, x_hi),
                                           (ly, y_hi, hx, x_lo), (ly, y_hi, lx, x_hi))]


def _axis(start: Tensor, bin_size: Tensor, pooled: int, grid: int, lo: float, hi: float) -> tuple[Tensor, Tensor]:
    """Positions [pooled, m] of each bin's samples along one box axis that may lie in [lo, hi],
    and which of the m slots hold one. Sample s of bin b is at start + b*bin + (s + 0.5)*bin/grid:
    the candidates are the index range that inverts this for [lo, hi], two samples wider."""
    device = start.device
    b = torch.arange(pooled, device=device, dtype=torch.float64)
    step = float(bin_size) / grid
    if step == 0:  # all samples of a bin at one place: keep them all (grid <= sampling ratio)
        first = torch.zeros(pooled, dtype=torch.int64, device=device)
        last = torch.full((pooled,), grid - 1, dtype=torch.int64, device=device)
    else:
        base = float(start) + b * float(bin_size)
        ends = torch.stack([(lo - base) / step - 0.5, (hi - base) / step - 0.5])
        first = torch.floor(ends.min(dim=0).values).clamp(-2, grid).long() - 2
        last = torch.ceil(ends.max(dim=0).values).clamp(-1, grid + 1).long() + 2
        first, last = first.clamp(min=0), last.clamp(max=grid - 1)
    n = (last - first + 1).clamp(min=0)
    m = max(int(n.max()), 1)
    slot = torch.arange(m, device=device)
    ok = slot[None, :] < n[:, None]
    s = torch.minimum(first[:, None] + slot[None, :], torch.full_like(first[:, None], grid - 1))
    bins = torch.arange(pooled, device=device)[:, None]
    return sample_position(start, bin_size, grid, bins, s), ok


def _rotated_boxes(rois: Tensor, spatial_scale: float, ph: int, pw: int, sampling_ratio: int, aligned: bool,
                   height: int, width: int) -> list[_RotatedBox]:
    """Per-box geometry of semantics.md "roi_align_rotated" (rois validated, opmath)."""
    opmath = rois.dtype
    s = torch.tensor(spatial_scale, dtype=opmath, device=rois.device)
    # Scale first, then shift by the offset.
    o = 0.5 if aligned else 0.0
    cx = rois[:, 1] * s - o
    cy = rois[:, 2] * s - o
    roi_w, bin_w, grid_w, _ = align_size(rois[:, 3] * s, pw, sampling_ratio, aligned)
    roi_h, bin_h, grid_h, _ = align_size(rois[:, 4] * s, ph, sampling_ratio, aligned)
    require_finite(rois, [cx, cy, roi_w, roi_h], spatial_scale)
    # cos and sin of the opmath angle, computed in float64 and rounded once.
    theta = rois[:, 5].double()
    cos, sin = torch.cos(theta).to(opmath), torch.sin(theta).to(opmath)
    return [_RotatedBox(cx[k], cy[k], roi_w[k], roi_h[k], bin_w[k], bin_h[k], cos[k], sin[k], ph, pw, gh, gw, height,
                        width)
            for k, (gh, gw) in enumerate(sampling_grids(rois, grid_h, grid_w))]


_check_forward = kernel_check("roi_align_rotated")
_check_backward = kernel_check("roi_align_rotated", "backward")


def roi_align_rotated_forward(input: Tensor, rois: Tensor, spatial_scale: float, pooled_height: int,
                              pooled_width: int, sampling_ratio: int, aligned: bool) -> Tensor:
    """``out[k, c, i, j]`` = sum over bin (i, j)'s samples of ``w1*v1 + w2*v2 + w3*v3 + w4*v4``,
    divided by the bin's sample count."""
    _check_forward(input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned)
    ph, pw = int(pooled_height), int(pooled_width)
    n, c, height, width = input.shape
    opmath = opmath_type(input.dtype)
    rois, batch = prepare_rois(rois, n, opmath)
    boxes = _rotated_boxes(rois, spatial_scale, ph, pw, int(sampling_ratio), bool(aligned), height, width)
    x = input.to(opmath)
    outs = []
    for b, box in zip(batch, boxes):
        if box.empty:  # no sample points: the bins are 0
            outs.append(x.new_zeros((c, ph, pw)))
            continue
        value = None
        for weight, rows, cols, live in box.taps(height, width):
            term = torch.where(live, weight * x[b][:, rows, cols], 0.0)  # [C, ph, my, pw, mx]
            value = term if value is None else value + term
        assert value is not None
        outs.append(value.sum(dim=(2, 4)) / box.count)
    out = torch.stack(outs) if outs else x.new_zeros((0, c, ph, pw))
    out = attach(out, input)
    return layout(out.to(input.dtype), is_channels_last(input))


def roi_align_rotated_backward(grad: Tensor, rois: Tensor, spatial_scale: float, pooled_height: int,
                               pooled_width: int, batch_size: int, channels: int, height: int, width: int,
                               sampling_ratio: int, aligned: bool, channels_last: bool) -> Tensor:
    """Adjoint of :func:`roi_align_rotated_forward`: each sample adds ``grad * w / count`` to
    each of its four neighbours."""
    _check_backward(grad, rois, spatial_scale, pooled_height, pooled_width, batch_size, channels, height, width,
                    sampling_ratio, aligned, channels_last)
    ph, pw = int(pooled_height), int(pooled_width)
    opmath = opmath_type(grad.dtype)
    rois, batch = prepare_rois(rois, batch_size, opmath)
    boxes = _rotated_boxes(rois, spatial_scale, ph, pw, int(sampling_ratio), bool(aligned), height, width)
    g_all = grad.to(opmath)
    grad_input = torch.zeros((batch_size, channels, height, width), dtype=opmath, device=grad.device)
    for k, (b, box) in enumerate(zip(batch, boxes)):
        if box.empty:
            continue
        g = g_all[k][:, :, None, :, None]  # [C, ph, 1, pw, 1]
        plane = grad_input[b].view(channels, height * width)
        for weight, rows, cols, _ in box.taps(height, width):
            plane.index_add_(1, (rows * width + cols).reshape(-1), (g * weight / box.count).flatten(1))
    return layout(grad_input.to(grad.dtype), bool(channels_last))

