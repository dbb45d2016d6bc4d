"""Reference position-sensitive RoIAlign (docs/semantics.md, "ps_roi_align")."""

from __future__ import annotations

import torch
from torch import Tensor

from .._geometry import is_channels_last
from .._kernel_checks import kernel_check
from ._common import AlignBox, align_boxes, attach, layout, opmath_type, prepare_rois

__all__ = ["ps_roi_align_backward", "ps_roi_align_forward"]

_check_forward = kernel_check("ps_roi_align")
_check_backward = kernel_check("ps_roi_align", "backward")


def _taps(box: AlignBox, ph: int, pw: int):
    """The four bilinear neighbours of every sample slot, per bin: (weight [ph, my, pw, mx],
    row index [ph, my, 1, 1], column index [1, 1, pw, mx], which slots hold an inside
    sample); the other slots weigh 0, and take no value at all (an inf neighbour times a 0
    weight would be NaN)."""
    my, mx = box.my, box.mx
    valid = box.valid().view(ph, my, pw, mx)
    for weight, rows, cols in box.corners():
        yield (torch.where(valid, weight.view(ph, my, pw, mx), 0.0), rows.view(ph, my, 1, 1),
               cols.view(1, 1, pw, mx), valid)


def _bins(ph: int, pw: int, device) -> tuple[Tensor, Tensor]:
    """Bin row i and column j indices, broadcast against the [ph, my, pw, mx] sample slots."""
    return (torch.arange(ph, device=device).view(ph, 1, 1, 1), torch.arange(pw, device=device).view(1, 1, pw, 1))


def ps_roi_align_forward(input: Tensor, rois: Tensor, spatial_scale: float, pooled_height: int,
                         pooled_width: int, sampling_ratio: int) -> Tensor:
    """``out[k, c, i, j]``: the mean of bin (i, j)'s bilinear samples of input channel
    ``(c * ph + i) * pw + j``, the box shifted by -0.5 cell (roi_align's aligned geometry)."""
    _check_forward(input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio)
    ph, pw = int(pooled_height), int(pooled_width)
    n, c, height, width = input.shape
    c_out = c // (ph * pw)
    opmath = opmath_type(input.dtype)
    rois, batch = prepare_rois(rois, n, opmath)
    boxes = align_boxes(rois, spatial_scale, ph, pw, int(sampling_ratio), True, height, width)
    # [N, C_out, ph, pw, H, W]: the channel that bin (i, j) of output channel c reads.
    x = input.to(opmath).view(n, c_out, ph, pw, height, width)
    i, j = _bins(ph, pw, input.device)

    outs = []
    for b, box in zip(batch, boxes):
        if box.empty:  # no sample points: the bin is 0 (the count is at least 1)
            outs.append(x.new_zeros((c_out, ph, pw)))
            continue
        total = None
        for weight, rows, cols, valid in _taps(box, ph, pw):
            term = torch.where(valid, weight * x[b][:, i, j, rows, cols], 0.0)  # [C_out, ph, my, pw, mx]
            total = term if total is None else total + term
        assert total is not None
        outs.append(total.sum(dim=(2, 4)) / box.count)  # outside samples count in the divisor
    out = torch.stack(outs) if outs else x.new_zeros((0, c_out, ph, pw))
    out = attach(out, input)
    return layout(out.to(input.dtype), is_channels_last(input))


def ps_roi_align_backward(grad: Tensor, rois: Tensor, spatial_scale: float, pooled_height: int,
                          pooled_width: int, batch_size: int, channels: int, height: int, width: int,
                          sampling_ratio: int, channels_last: bool) -> Tensor:
    """Adjoint of :func:`ps_roi_align_forward`: each sample of bin (i, j) sends
    ``grad * w / count`` to its neighbours in channel ``(c * ph + i) * pw + j``."""
    _check_backward(grad, rois, spatial_scale, pooled_height, pooled_width, batch_size, channels, height, width,
                    sampling_ratio, channels_last)
    ph, pw = int(pooled_height), int(pooled_width)
    c_out = channels // (ph * pw)
    opmath = opmath_type(grad.dtype)
    rois, batch = prepare_rois(rois, batch_size, opmath)
    boxes = align_boxes(rois, spatial_scale, ph, pw, int(sampling_ratio), True, height, width)
    g_all = grad.to(opmath)
    i, j = _bins(ph, pw, grad.device)
    chan = torch.arange(c_out, device=grad.device).view(c_out, 1, 1, 1, 1) * (ph * pw)

    grad_input = torch.zeros((batch_size, channels * height * width), dtype=opmath, device=grad.device)
    for k, (b, box) in enumerate(zip(batch, boxes)):
        if box.empty:
            continue
        g = g_all[k][:, :, None, :, None]  # [C_out, ph, 1, pw, 1]
        for weight, rows, cols, _ in _taps(box, ph, pw):
            flat = ((chan + i * pw + j) * height + rows) * width + cols  # [C_out, ph, my, pw, mx]
            contrib = (g * weight / box.count).expand(flat.shape)
            grad_input[b].index_add_(0, flat.reshape(-1), contrib.reshape(-1))
    grad_input = grad_input.view(batch_size, channels, height, width)
    return layout(grad_input.to(grad.dtype), bool(channels_last))
