"""Reference Bezier alignment (docs/semantics.md, "bezier_align")."""

from __future__ import annotations

import torch
from torch import Tensor

from .._geometry import bezier_bins, is_channels_last
from .._kernel_checks import kernel_check
from ._common import attach, axis_samples, layout, opmath_type, prepare_rois, sampling_grids
from .deform_roi_pool import _Bins, _corner_values

__all__ = ["bezier_align_backward", "bezier_align_forward"]

_check_forward = kernel_check("bezier_align")
_check_backward = kernel_check("bezier_align", "backward")


def _boxes(rois: Tensor, spatial_scale: float, ph: int, pw: int, sampling_ratio: int, aligned: bool, height: int,
           width: int) -> list[_Bins | None]:
    """Per-box bins (rois validated, opmath): every bin samples an axis-aligned grid of
    grid_h x grid_w points around its own centre on the curves; None for a box without
    sample points."""
    y_start, x_start, bin_h, bin_w, grid_h, grid_w = bezier_bins(rois, spatial_scale, ph, pw, sampling_ratio,
                                                                 aligned)
    zeros = torch.zeros(ph * pw, dtype=torch.int64, device=rois.device)  # each bin from its own start
    boxes: list[_Bins | None] = []
    for k, (gh, gw) in enumerate(sampling_grids(rois, grid_h, grid_w)):
        if gh <= 0 or gw <= 0:
            boxes.append(None)
            continue
        y = axis_samples(y_start[k].reshape(-1), bin_h[k], ph * pw, gh, height, bins=zeros)
        x = axis_samples(x_start[k].reshape(-1), bin_w[k], ph * pw, gw, width, bins=zeros)
        boxes.append(_Bins(y, x, ph * pw, gh * gw, bin_h[k], bin_w[k]))
    return boxes


def bezier_align_forward(input: Tensor, rois: Tensor, spatial_scale: float, pooled_height: int, pooled_width: int,
                         sampling_ratio: int, aligned: bool) -> Tensor:
    """``out[k, c, i, j]`` = the mean of the bilinear samples of bin (i, j) around its
    centre on box k's curves."""
    _check_forward(input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned)
    ph, pw = int(pooled_height), int(pooled_width)
    n, c, height, width = input.shape
    opmath = opmath_type(input.dtype)
    rois, batch = prepare_rois(rois, n, opmath)
    boxes = _boxes(rois, spatial_scale, ph, pw, int(sampling_ratio), bool(aligned), height, width)
    x = input.to(opmath)
    outs = []
    for b, box in zip(batch, boxes):
        if box is None:
            outs.append(x.new_zeros((c, ph, pw)))
            continue
        value = sum(w * v for (w, _, _), v in zip(box.corners(), _corner_values(x[b], box)))
        # Samples outside the map add 0 but count in the divisor.
        value = torch.where(box.valid(), value, 0.0)
        outs.append(value.sum(dim=(2, 3)).view(c, ph, pw) / box.count)
    out = torch.stack(outs) if outs else x.new_zeros((0, c, ph, pw))
    out = attach(out, input)
    return layout(out.to(input.dtype), is_channels_last(input))


def bezier_align_backward(grad: Tensor, rois: Tensor, spatial_scale: float, pooled_height: int, pooled_width: int,
                          batch_size: int, channels: int, height: int, width: int, sampling_ratio: int, aligned: bool,
                          channels_last: bool) -> Tensor:
    """Adjoint of :func:`bezier_align_forward`: each sample adds ``(grad * w) / count`` to
    its four neighbours."""
    _check_backward(grad, rois, spatial_scale, pooled_height, pooled_width, batch_size, channels, height, width,
                    sampling_ratio, aligned, channels_last)
    ph, pw = int(pooled_height), int(pooled_width)
    opmath = opmath_type(grad.dtype)
    rois, batch = prepare_rois(rois, batch_size, opmath)
    boxes = _boxes(rois, spatial_scale, ph, pw, int(sampling_ratio), bool(aligned), height, width)
    g_all = grad.to(opmath)
    grad_input = torch.zeros((batch_size, channels, height, width), dtype=opmath, device=grad.device)
    for k, (b, box) in enumerate(zip(batch, boxes)):
        if box is None:
            continue
        g = g_all[k].reshape(channels, ph * pw)[:, :, None, None]  # [C, bins, 1, 1]
        valid = box.valid()
        plane = grad_input[b].view(channels, height * width)
        for weight, rows, cols in box.corners():
            term = torch.where(valid, (g * weight) / box.count, 0.0)
            flat = (rows * width + cols).expand(valid.shape).reshape(-1)
            plane.index_add_(1, flat, term.reshape(channels, -1))
    return layout(grad_input.to(grad.dtype), bool(channels_last))
