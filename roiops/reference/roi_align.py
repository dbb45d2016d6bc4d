"""Reference RoIAlign, modes "avg" and "max" (docs/semantics.md, "roi_align avg" and
"roi_align max")."""

from __future__ import annotations

import torch
from torch import Tensor

from .._geometry import bilinear_slope, bilinear_taps, is_channels_last, sample_position, sample_position_slope
from .._kernel_checks import kernel_check
from ._common import AlignBox, align_boxes, attach, first_max, layout, opmath_type, prepare_rois

__all__ = ["roi_align_backward", "roi_align_forward", "roi_align_max_backward", "roi_align_max_forward",
           "roi_align_max_rois_backward", "roi_align_rois_backward"]

# The kernel contract's checks; these kernels also take an empty map (height or width 0).
_check_avg = kernel_check("roi_align", empty_map=True)
_check_avg_backward = kernel_check("roi_align", "backward", empty_map=True)
_check_max = kernel_check("roi_align_max", empty_map=True)
_check_max_backward = kernel_check("roi_align_max", "backward", empty_map=True)
_check_rois_backward = {False: kernel_check("roi_align", "rois_backward"),
                        True: kernel_check("roi_align_max", "rois_backward")}


def _corner_values(plane: Tensor, box: AlignBox) -> list[Tensor]:
    """``F`` at the four bilinear neighbours of every sample slot, in :meth:`AlignBox.corners`'
    order (low row low column, low high, high low, high high): four ``[C, P, Q]``."""
    return [plane[:, rows[:, None], cols[None, :]] for _, rows, cols in box.corners()]


def _sample_values(plane: Tensor, box: AlignBox) -> Tensor:
    """Bilinear value of every inside sample slot of the box, for all channels: [C, P, Q].

    ``plane`` is one image ``[C, H, W]`` in opmath.  Per point, as torchvision orders it:
    ``w1*v1 + w2*v2 + w3*v3 + w4*v4``; a padding slot is exactly 0.
    """
    c, height, width = plane.shape
    if height == 0 or width == 0:  # every point is outside an empty map
        return plane.new_zeros((c, box.y.valid.numel(), box.x.valid.numel()))
    value = None
    for (weight, _, _), corner in zip(box.corners(), _corner_values(plane, box)):
        term = weight * corner
        value = term if value is None else value + term
    assert value is not None  # corners() yields the four corners
    return torch.where(box.valid(), value, 0.0)


# --------------------------------------------------------------------------------------
# roi_align, mode "avg" (semantics.md "roi_align avg")
# --------------------------------------------------------------------------------------


def roi_align_forward(input: Tensor, rois: Tensor, spatial_scale: float, pooled_height: int,
                      pooled_width: int, sampling_ratio: int, aligned: bool) -> Tensor:
    """RoIAlign average: ``out[k, c, i, j]`` = mean of the bin's bilinear samples."""
    _check_avg(input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned)
    ph, pw = int(pooled_height), int(pooled_width)
    n, c, height, width = input.shape
    opmath = opmath_type(input.dtype)
    rois, batch = prepare_rois(rois, n, opmath)
    boxes = align_boxes(rois, spatial_scale, ph, pw, int(sampling_ratio), bool(aligned), height, width)
    x = input.to(opmath)

    outs = []
    for b, box in zip(batch, boxes):
        if box.empty:  # grid <= 0: no sample points, the bin is 0
            outs.append(x.new_zeros((c, ph, pw)))
            continue
        # Outside samples add 0 but count in the divisor.
        v = _sample_values(x[b], box).view(c, ph, box.my, pw, box.mx)
        outs.append(v.sum(dim=(2, 4)) / box.count)
    out = torch.stack(outs) if outs else x.new_zeros((0, c, ph, pw))
    out = attach(out, input)
    return layout(out.to(input.dtype), is_channels_last(input))


def roi_align_backward(grad: Tensor, rois: Tensor, spatial_scale: float, pooled_height: int,
                       pooled_width: int, batch_size: int, channels: int, height: int, width: int,
                       sampling_ratio: int, aligned: bool, channels_last: bool) -> Tensor:
    """Adjoint of :func:`roi_align_forward`: each sample scatters ``grad * w / count``."""
    _check_avg_backward(grad, rois, spatial_scale, pooled_height, pooled_width, batch_size, channels, height, width,
                        sampling_ratio, aligned, channels_last)
    ph, pw = int(pooled_height), int(pooled_width)
    opmath = opmath_type(grad.dtype)
    rois, batch = prepare_rois(rois, batch_size, opmath)
    boxes = align_boxes(rois, spatial_scale, ph, pw, int(sampling_ratio), bool(aligned), height, width)
    g_all = grad.to(opmath)

    grad_input = torch.zeros((batch_size, channels, height, width), dtype=opmath, device=grad.device)
    for k, (b, box) in enumerate(zip(batch, boxes)):
        if box.empty or height * width == 0:  # no sample point inside the map: no gradient
            continue
        my, mx = box.my, box.mx
        # Every inside sample of bin (i, j) receives that bin's gradient.
        g = g_all[k][:, :, None, :, None].expand(channels, ph, my, pw, mx).reshape(channels, ph * my, pw * mx)
        valid = box.valid()
        plane = grad_input[b].view(channels, height * width)
        for weight, rows, cols in box.corners():
            contrib = torch.where(valid, g * weight / box.count, 0.0)
            flat = (rows[:, None] * width + cols[None, :]).reshape(-1)
            plane.index_add_(1, flat, contrib.reshape(channels, flat.numel()))
    return layout(grad_input.to(grad.dtype), bool(channels_last))


# --------------------------------------------------------------------------------------
# roi_align, mode "max" (semantics.md "roi_align max")
# --------------------------------------------------------------------------------------


def _max_choice(plane: Tensor, box: AlignBox, ph: int, pw: int) -> tuple[Tensor, Tensor]:
    """Each bin's largest sample of one box on ``plane`` ``[C, H, W]`` (opmath): its value
    and its row-major index ``iy * grid_w + ix`` (-1 for a bin with no sample points), both
    ``[C, ph, pw]``; the first largest wins, outside samples counting as 0."""
    c = plane.shape[0]
    if box.empty:
        return plane.new_zeros((c, ph, pw)), torch.full((c, ph, pw), -1, dtype=torch.int64, device=plane.device)
    my, mx = box.my, box.mx
    # [C, ph, pw, my*mx]: each bin's inside samples in row-major (iy, ix) order.
    v = _sample_values(plane, box).view(c, ph, my, pw, mx).permute(0, 1, 3, 2, 4).reshape(c, ph, pw, my * mx)
    member = (box.y.valid.view(ph, 1, my, 1) & box.x.valid.view(1, pw, 1, mx)).reshape(ph, pw, my * mx)
    pos = first_max(v, member)  # my*mx: no inside sample
    inside = pos < my * mx
    # Gather rather than amax so autograd sends the gradient to the winner only.
    best = v.gather(-1, pos.clamp(max=my * mx - 1).unsqueeze(-1)).squeeze(-1)
    iy = box.y.s0.view(1, ph, 1) + pos // mx
    ix = box.x.s0.view(1, 1, pw) + pos % mx
    idx = torch.where(inside, iy * box.grid_w + ix, -1)
    # Outside samples are 0: the first one competes with the inside winner, the
    # earlier index winning a tie, and a NaN winner staying.
    out_idx = box.first_outside().expand(c, ph, pw)
    take = (out_idx >= 0) & (~inside | (~torch.isnan(best) & ((best < 0) | ((best == 0) & (out_idx < idx)))))
    return torch.where(take, 0.0, best), torch.where(take, out_idx, idx)


def roi_align_max_forward(input: Tensor, rois: Tensor, spatial_scale: float, pooled_height: int,
                          pooled_width: int, sampling_ratio: int, aligned: bool) -> tuple[Tensor, Tensor]:
    """RoIAlign max: the largest bilinear sample of the bin (outside points count as 0).

    ``argmax`` is ``iy * grid_w + ix`` of the first largest sample, -1 for a bin with no
    sample points (whose value is 0).
    """
    _check_max(input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned)
    ph, pw = int(pooled_height), int(pooled_width)
    n, c, height, width = input.shape
    opmath = opmath_type(input.dtype)
    rois, batch = prepare_rois(rois, n, opmath)
    boxes = align_boxes(rois, spatial_scale, ph, pw, int(sampling_ratio), bool(aligned), height, width,
                         max_mode=True)
    x = input.to(opmath)

    outs, argmaxes = [], []
    for b, box in zip(batch, boxes):
        out, idx = _max_choice(x[b], box, ph, pw)
        outs.append(out)
        argmaxes.append(idx)
    if outs:
        out, argmax = torch.stack(outs), torch.stack(argmaxes)
    else:
        out = x.new_zeros((0, c, ph, pw))
        argmax = torch.zeros((0, c, ph, pw), dtype=torch.int64, device=x.device)
    out = attach(out, input)
    cl = is_channels_last(input)
    return layout(out.to(input.dtype), cl), layout(argmax.to(torch.int32), cl)


def roi_align_max_backward(grad: Tensor, argmax: Tensor, rois: Tensor, spatial_scale: float,
                           pooled_height: int, pooled_width: int, batch_size: int, channels: int,
                           height: int, width: int, sampling_ratio: int, aligned: bool,
                           channels_last: bool) -> Tensor:
    """Adjoint of :func:`roi_align_max_forward`: the winning sample sends ``grad * w`` to
    each of its four bilinear neighbours (no division by the sample count)."""
    _check_max_backward(grad, argmax, rois, spatial_scale, pooled_height, pooled_width, batch_size, channels, height,
                        width, sampling_ratio, aligned, channels_last)
    ph, pw = int(pooled_height), int(pooled_width)
    opmath = opmath_type(grad.dtype)
    rois, batch = prepare_rois(rois, batch_size, opmath)
    boxes = align_boxes(rois, spatial_scale, ph, pw, int(sampling_ratio), bool(aligned), height, width,
                         max_mode=True)
    g_all = grad.to(opmath)
    am_all = argmax.long()

    grad_input = torch.zeros((batch_size, channels, height, width), dtype=opmath, device=grad.device)
    i = torch.arange(ph, device=grad.device)[:, None]
    j = torch.arange(pw, device=grad.device)[None, :]
    chan = torch.arange(channels, device=grad.device)[:, None, None] * (height * width)
    for k, (b, box) in enumerate(zip(batch, boxes)):
        am = am_all[k]
        limit = 0 if box.empty else box.grid_h * box.grid_w
        if bool(((am < -1) | (am >= limit)).any()):
            raise ValueError(f"roiops: argmax of box {k} is outside [-1, {limit})")
        if box.empty or height * width == 0:
            continue
        won = am >= 0
        a = am.clamp(min=0)
        # The winning sample (iy, ix) of bin (i, j), placed by the forward's formula.
        y = sample_position(box.y_start, box.bin_h, box.grid_h, i, a // box.grid_w)
        x = sample_position(box.x_start, box.bin_w, box.grid_w, j, a % box.grid_w)
        y_lo, y_hi, ly, hy, y_in = bilinear_taps(y, height)
        x_lo, x_hi, lx, hx, x_in = bilinear_taps(x, width)
        live = won & y_in & x_in  # an outside winner has value 0 and no gradient
        g = g_all[k]
        plane = grad_input[b].view(-1)
        for wy, rows, wx, cols in ((hy, y_lo, hx, x_lo), (hy, y_lo, lx, x_hi),
                                   (ly, y_hi, hx, x_lo), (ly, y_hi, lx, x_hi)):
            contrib = torch.where(live, g * (wy * wx), 0.0)
            flat = chan + rows * width + cols
            plane.index_add_(0, flat.reshape(-1), contrib.reshape(-1))
    return layout(grad_input.to(grad.dtype), bool(channels_last))


# --------------------------------------------------------------------------------------
# roi_align gradient with respect to the boxes (semantics.md "roi_align box gradient")
# --------------------------------------------------------------------------------------


def _box_gradient(box: AlignBox, scale: float, ph: int, pw: int, gy_start: Tensor, gy_bin: Tensor,
                  gx_start: Tensor, gx_bin: Tensor) -> Tensor:
    """``[0, d/dx1, d/dy1, d/dx2, d/dy2]`` from the sums over the samples of ``grad * dv/dy``
    (``gy_start``) and of ``grad * dv/dy * dy/d bin_h`` (``gy_bin``), and likewise in x.

    start = c1*s - o and bin = (c2*s - c1*s) / pooled, so d/dc1 = s*(G_start - G_bin/pooled)
    and d/dc2 = s*G_bin/pooled; a box widened to 1 cell has a constant bin: d/dc1 = s*G_start,
    d/dc2 = 0."""
    zero = torch.zeros_like(gx_start)
    d_x2 = zero if box.clamped_w else scale * gx_bin / pw
    d_y2 = zero if box.clamped_h else scale * gy_bin / ph
    return torch.stack([zero, scale * gx_start - d_x2, scale * gy_start - d_y2, d_x2, d_y2])


def _prepare_rois_backward(grad, input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned,
                           max_mode):
    _check_rois_backward[max_mode](grad, input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio,
                                   aligned)
    ph, pw = int(pooled_height), int(pooled_width)
    n, c, height, width = input.shape
    opmath = opmath_type(input.dtype)
    dtype = rois.dtype
    rois, batch = prepare_rois(rois, n, opmath)
    boxes = align_boxes(rois, spatial_scale, ph, pw, int(sampling_ratio), bool(aligned), height, width,
                         max_mode=max_mode)
    return ph, pw, dtype, batch, boxes, input.detach().to(opmath), grad.to(opmath)


def roi_align_rois_backward(grad: Tensor, input: Tensor, rois: Tensor, spatial_scale: float, pooled_height: int,
                            pooled_width: int, sampling_ratio: int, aligned: bool) -> Tensor:
    """Gradient of :func:`roi_align_forward` with respect to ``rois``: ``[K, 5]`` of the rois'
    dtype, 0 in the batch-index column. Each sample's value v(y, x) changes with its
    position at the rate ``dv/dy = dl_y * (h_x*(F[yh,xl] - F[yl,xl]) + l_x*(F[yh,xh] - F[yl,xh]))``
    (``dl_y`` from the border rule), and likewise in x; the position with the box's start
    (rate 1) and bin size (rate ``i + (iy + 0.5)/grid``). A grid that depends on the box
    (``sampling_ratio <= 0``) is held at the box's current one."""
    ph, pw, dtype, batch, boxes, x, g_all = _prepare_rois_backward(
        grad, input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned, False)
    c, height, width = x.shape[1:]
    rows = []
    for k, (b, box) in enumerate(zip(batch, boxes)):
        if box.empty or height * width == 0:  # no sample point inside the map: no gradient
            rows.append(x.new_zeros(5))
            continue
        my, mx = box.my, box.mx
        f_ll, f_lh, f_hl, f_hh = _corner_values(x[b], box)
        y, xa = box.y, box.x
        dv_dy = y.dl[:, None] * (xa.h[None, :] * (f_hl - f_ll) + xa.l[None, :] * (f_hh - f_lh))
        dv_dx = xa.dl[None, :] * (y.h[:, None] * (f_lh - f_ll) + y.l[:, None] * (f_hh - f_hl))
        # Every inside sample of bin (i, j) carries that bin's gradient / count.
        g = g_all[k][:, :, None, :, None].expand(c, ph, my, pw, mx).reshape(c, ph * my, pw * mx) / box.count
        valid = box.valid()
        gy = torch.where(valid, g * dv_dy, 0.0).sum(dim=(0, 2))  # [P]
        gx = torch.where(valid, g * dv_dx, 0.0).sum(dim=(0, 1))  # [Q]
        rows.append(_box_gradient(box, spatial_scale, ph, pw, gy.sum(), (gy * y.dbin).sum(), gx.sum(),
                                  (gx * xa.dbin).sum()))
    out = torch.stack(rows) if rows else x.new_zeros((0, 5))
    return out.to(dtype)


def roi_align_max_rois_backward(grad: Tensor, input: Tensor, rois: Tensor, spatial_scale: float,
                                pooled_height: int, pooled_width: int, sampling_ratio: int, aligned: bool) -> Tensor:
    """Gradient of :func:`roi_align_max_forward` with respect to ``rois``: each bin's chosen
    sample (recomputed as the forward chooses it) moves with the box as in
    :func:`roi_align_rois_backward`; a bin with no sample point, or whose chosen value is
    NaN, adds nothing."""
    ph, pw, dtype, batch, boxes, x, g_all = _prepare_rois_backward(
        grad, input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned, True)
    c, height, width = x.shape[1:]
    i = torch.arange(ph, device=x.device)[:, None]
    j = torch.arange(pw, device=x.device)[None, :]
    rows = []
    for k, (b, box) in enumerate(zip(batch, boxes)):
        if box.empty or height * width == 0:
            rows.append(x.new_zeros(5))
            continue
        best, idx = _max_choice(x[b], box, ph, pw)
        a = idx.clamp(min=0)
        iy, ix = a // box.grid_w, a % box.grid_w
        # The chosen sample of bin (i, j), placed by the forward's formula.
        y = sample_position(box.y_start, box.bin_h, box.grid_h, i, iy)
        xs = sample_position(box.x_start, box.bin_w, box.grid_w, j, ix)
        y_lo, y_hi, ly, hy, y_in = bilinear_taps(y, height)
        x_lo, x_hi, lx, hx, x_in = bilinear_taps(xs, width)
        plane = x[b].reshape(c, height * width)

        def at(rows_, cols_):
            return plane.gather(1, (rows_ * width + cols_).reshape(c, -1)).view(c, ph, pw)

        f_ll, f_lh, f_hl, f_hh = at(y_lo, x_lo), at(y_lo, x_hi), at(y_hi, x_lo), at(y_hi, x_hi)
        dv_dy = bilinear_slope(y, height) * (hx * (f_hl - f_ll) + lx * (f_hh - f_lh))
        dv_dx = bilinear_slope(xs, width) * (hy * (f_lh - f_ll) + ly * (f_hh - f_hl))
        # An outside winner has value 0 whatever its neighbours hold.
        live = (idx >= 0) & y_in & x_in & ~torch.isnan(best)
        gy = torch.where(live, g_all[k] * dv_dy, 0.0)
        gx = torch.where(live, g_all[k] * dv_dx, 0.0)
        dbin_y = sample_position_slope(box.grid_h, i, iy, y)
        dbin_x = sample_position_slope(box.grid_w, j, ix, xs)
        rows.append(_box_gradient(box, spatial_scale, ph, pw, gy.sum(), (gy * dbin_y).sum(), gx.sum(),
                                  (gx * dbin_x).sum()))
    out = torch.stack(rows) if rows else x.new_zeros((0, 5))
    return out.to(dtype)
