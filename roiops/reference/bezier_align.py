"""Reference Bezier alignment (docs/semantics.md, "bezier_align")."""

from __future__ import annotations

import torch
from torch import Tensor

from .._geometry import bezier_bins, is_channels_last
from .._kernel_checks import kernel_check
from ._common import attach, axis_samples, layout, opmath_type, prepare_rois, sampling_grids
from .deform_roi_pool import _Bins, average_bins, scatter_bins

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
    n, _, height, width = input.shape
    opmath = opmath_type(input.dtype)
    rois, batch = prepare_rois(rois, n, opmath)
    boxes = _boxes(rois, spatial_scale, ph, pw, int(sampling_ratio), bool(aligned), height, width)
    out = attach(average_bins(input.to(opmath), batch, boxes, ph, pw), input)
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
    grad_input = scatter_bins(grad.to(opmath), batch, boxes, (batch_size, channels, height, width), False)
    return layout(grad_input.to(grad.dtype), bool(channels_last))
