"""Reference RoIPool, Caffe and mmdetection conventions (docs/semantics.md, "roi_pool")."""

from __future__ import annotations

import torch
from torch import Tensor

from .._geometry import is_channels_last, pool_bin_edges, round_half_away
from .._kernel_checks import kernel_check
from ._common import attach, first_max, layout, opmath_type, prepare_rois, require_finite

__all__ = ["roi_pool_backward", "roi_pool_forward"]

# The kernel contract's checks; these kernels also take an empty map (height or width 0),
# and the backward an int64 argmax.
_check_forward = kernel_check("roi_pool", empty_map=True)
_check_backward = kernel_check("roi_pool", "backward", empty_map=True, int64_argmax=True)

# --------------------------------------------------------------------------------------
# roi_pool (semantics.md "roi_pool")
# --------------------------------------------------------------------------------------


def _pool_bins(rois, spatial_scale, ph, pw, continuous, height, width):
    """Bin limits [K, ph] rows and [K, pw] columns, clipped to the map, as int64, computed
    in the opmath type in torchvision's order, so float32/float64 results are bit-identical
    to it."""
    s = torch.tensor(spatial_scale, dtype=rois.dtype, device=rois.device)
    if not continuous:
        # Caffe / torchvision: round the scaled corners, force malformed boxes to 1x1.
        x1 = round_half_away(rois[:, 1] * s)[:, None]
        y1 = round_half_away(rois[:, 2] * s)[:, None]
        x2 = round_half_away(rois[:, 3] * s)[:, None]
        y2 = round_half_away(rois[:, 4] * s)[:, None]
        roi_w = (x2 - x1 + 1).clamp(min=1)
        roi_h = (y2 - y1 + 1).clamp(min=1)
        require_finite(rois, [x1[:, 0], y1[:, 0], roi_w[:, 0], roi_h[:, 0]], spatial_scale)
        h_start, h_end = pool_bin_edges(y1, roi_h / ph, ph, height, start_after=True)
        w_start, w_end = pool_bin_edges(x1, roi_w / pw, pw, width, start_after=True)
        return h_start, h_end, w_start, w_end
    # mmdetection: no rounding, the box ends at (x2 + 1) * s.
    x_start = (rois[:, 1] * s)[:, None]
    y_start = (rois[:, 2] * s)[:, None]
    roi_w = (rois[:, 3] + 1) * s - x_start[:, 0]
    roi_h = (rois[:, 4] + 1) * s - y_start[:, 0]
    require_finite(rois, [x_start[:, 0], y_start[:, 0], roi_w, roi_h], spatial_scale)
    h_start, h_end = pool_bin_edges(y_start, (roi_h / ph)[:, None], ph, height, start_after=False)
    w_start, w_end = pool_bin_edges(x_start, (roi_w / pw)[:, None], pw, width, start_after=False)
    # An empty box has every bin empty.
    box_empty = (roi_w <= 0) | (roi_h <= 0)
    return h_start, torch.where(box_empty[:, None], h_start, h_end), w_start, w_end


def roi_pool_forward(input: Tensor, rois: Tensor, spatial_scale: float, pooled_height: int,
                     pooled_width: int, continuous: bool) -> tuple[Tensor, Tensor]:
    """RoIPool: max over each bin's pixels; ``argmax`` is ``h * W + w`` in the image plane.

    ``continuous=False`` is Caffe/torchvision, ``True`` is mmdetection (semantics.md "roi_pool").
    An empty bin gives 0 and argmax -1.
    """
    _check_forward(input, rois, spatial_scale, pooled_height, pooled_width, continuous)
    ph, pw = int(pooled_height), int(pooled_width)
    n, c, height, width = input.shape
    opmath = opmath_type(input.dtype)
    rois, batch = prepare_rois(rois, n, opmath)
    h_start, h_end, w_start, w_end = _pool_bins(rois, spatial_scale, ph, pw, bool(continuous), height, width)
    x = input.to(opmath)
    device = x.device

    outs, argmaxes = [], []
    for k, b in enumerate(batch):
        hs, he, ws, we = h_start[k], h_end[k], w_start[k], w_end[k]
        empty = (he <= hs)[:, None] | (we <= ws)[None, :]  # [ph, pw]
        out = x.new_zeros((c, ph, pw))
        argmax = torch.full((c, ph, pw), -1, dtype=torch.int64, device=device)
        if not bool(empty.all()):
            # Bin row by bin row, so that memory follows the window the box covers (times C
            # and pw), not the window times the bins. The first maximum in row-major order
            # is: NaN if any (else the max), at the smallest flat index h * W + w among the
            # cells holding it. Each column's first maximum over the bin row's rows comes
            # first; then, per bin, the smallest flat index among its columns that hold it.
            c0, c1 = int(ws.min()), int(we.max())
            cols = torch.arange(c0, c1, device=device)
            in_col = (cols >= ws[:, None]) & (cols < we[:, None])  # [pw, S]
            flat = torch.zeros((c, ph, pw), dtype=torch.int64, device=device)
            for i in range(ph):
                r0, r1 = int(hs[i]), int(he[i])
                if r1 <= r0:
                    continue
                rows = x[b, :, r0:r1, c0:c1]  # [C, R, S]
                pos = first_max(rows.transpose(1, 2), torch.ones((), dtype=torch.bool, device=device))  # [C, S]
                col_val = rows.gather(1, pos[:, None, :]).squeeze(1)[:, None, :]  # [C, 1, S]
                col_flat = ((r0 + pos) * width + cols)[:, None, :]
                running = torch.where(in_col, col_val, float("-inf")).amax(dim=-1, keepdim=True)  # [C, pw, 1]
                best = in_col & ((col_val == running) | (torch.isnan(col_val) & torch.isnan(running)))
                flat[:, i] = torch.where(best, col_flat, torch.iinfo(torch.int64).max).amin(dim=-1).clamp(
                    max=height * width - 1)  # an empty bin's: any in-range index, masked below
            picked = x[b].reshape(c, height * width).gather(1, flat.reshape(c, ph * pw)).view(c, ph, pw)
            out = torch.where(empty, 0.0, picked)
            argmax = torch.where(empty, -1, flat)
        outs.append(out)
        argmaxes.append(argmax)
    if outs:
        out, argmax = torch.stack(outs), torch.stack(argmaxes)
    else:
        out = x.new_zeros((0, c, ph, pw))
        argmax = torch.zeros((0, c, ph, pw), dtype=torch.int64, device=device)
    out = attach(out, input)
    cl = is_channels_last(input)
    return layout(out.to(input.dtype), cl), layout(argmax.to(torch.int32), cl)


def roi_pool_backward(grad: Tensor, argmax: Tensor, rois: Tensor, batch_size: int, channels: int,
                      height: int, width: int, channels_last: bool) -> Tensor:
    """Adjoint of :func:`roi_pool_forward`: each bin's grad goes to its argmax element."""
    _check_backward(grad, argmax, rois, batch_size, channels, height, width, channels_last)
    opmath = opmath_type(grad.dtype)
    rois, batch = prepare_rois(rois, batch_size, opmath)
    g_all = grad.to(opmath)
    am_all = argmax.long()

    grad_input = torch.zeros((batch_size, channels, height, width), dtype=opmath, device=grad.device)
    chan = torch.arange(channels, device=grad.device)[:, None, None] * (height * width)
    for k, b in enumerate(batch):
        am = am_all[k]
        if bool(((am < -1) | (am >= height * width)).any()):
            raise ValueError(f"roiops: argmax of box {k} is outside [-1, {height * width})")
        if height * width == 0:
            continue
        won = am >= 0
        contrib = torch.where(won, g_all[k], 0.0)
        flat = chan + am.clamp(min=0)
        grad_input[b].view(-1).index_add_(0, flat.reshape(-1), contrib.reshape(-1))
    return layout(grad_input.to(grad.dtype), bool(channels_last))
