"""Reference border align (BorderDet; docs/semantics.md, "border_align").

The input's channels are four groups of C, one per border of each box (top, left, bottom,
right); output ``[n, c, k, e]`` is the maximum of ``pool_size + 1`` bilinear samples of
channel ``e * C + c`` spaced along border e of box ``rois[n, k]``. The samples walk from
the border's start by repeated addition of one step (not ``start + i * step``); the
backward replays that walk up to the argmax, so it scatters at the very point the forward
sampled.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor

from .._geometry import MAX_COORDINATE, bilinear_taps, is_channels_last
from .._kernel_checks import kernel_check
from ._common import attach, layout, opmath_type

__all__ = ["border_align_backward", "border_align_forward"]

_check_forward = kernel_check("border_align")
_check_backward = kernel_check("border_align", "backward")


def _boxes(rois: Tensor, opmath: torch.dtype) -> Tensor:
    """The boxes in opmath, refusing a coordinate that is not finite or lies beyond 2^24
    cells before any indexing."""
    rois = rois.detach().to(opmath)
    bad = ~(rois.abs() <= MAX_COORDINATE).all(dim=2)
    if bool(bad.any()):
        n, k = (int(i) for i in bad.nonzero()[0])
        raise ValueError(f"roiops: rois[{n}, {k}] has a coordinate that is not finite or beyond 2^24 feature-map cells")
    return rois


def _walks(rois: Tensor, pool_size: int) -> list[tuple[Tensor, Tensor, Tensor, bool]]:
    """Per border (top, left, bottom, right): the start point's x and y ``[N, K]``, the
    step ``[N, K]`` and whether the step moves x (else y)."""
    x1, y1, x2, y2 = rois.unbind(2)
    steps = torch.full_like(x1, pool_size)  # a tensor: torch may multiply by the inverse of a scalar
    sx = (x2 - x1) / steps
    sy = (y2 - y1) / steps
    return [(x1, y1, sx, True), (x1, y1, sy, False), (x2, y2, -sx, True), (x2, y2, -sy, False)]


def _positions(walk: tuple[Tensor, Tensor, Tensor, bool], pool_size: int) -> Iterator[tuple[int, Tensor, Tensor]]:
    """Sample i's point (x, y) for i = 0..pool_size, by repeated addition in opmath."""
    x, y, step, along_x = walk
    for i in range(pool_size + 1):
        yield i, x, y
        if along_x:
            x = x + step
        else:
            y = y + step


def _taps(y: Tensor, x: Tensor, height: int, width: int) -> tuple[list[Tensor], list[Tensor], Tensor]:
    """The four taps' flat cell indices and weights of points (y, x), in the order of the
    bilinear sum, and whether each point is inside the map (else its value is 0)."""
    ylo, yhi, ly, hy, yin = bilinear_taps(y, height)
    xlo, xhi, lx, hx, xin = bilinear_taps(x, width)
    cells = [ylo * width + xlo, ylo * width + xhi, yhi * width + xlo, yhi * width + xhi]
    return cells, [hy * hx, hy * lx, ly * hx, ly * lx], yin & xin


def border_align_forward(input: Tensor, rois: Tensor, pool_size: int) -> tuple[Tensor, Tensor]:
    """Border align: ``(out, argmax)``, both ``[N, C, K, 4]``; argmax (int32) is the index
    of the first largest sample along the border's walk (a NaN sample wins: the first)."""
    _check_forward(input, rois, pool_size)
    n, c4, height, width = input.shape
    c, k = c4 // 4, rois.shape[1]
    opmath = opmath_type(input.dtype)
    boxes = _boxes(rois, opmath)
    x = input.to(opmath)
    outs, args = [], []
    for e, walk in enumerate(_walks(boxes, pool_size)):
        plane = x[:, e * c:(e + 1) * c].reshape(n, c, height * width)
        best = x.new_zeros((n, c, k))
        arg = torch.zeros((n, c, k), dtype=torch.int64, device=x.device)
        for i, px, py in _positions(walk, pool_size):
            cells, weights, inside = _taps(py, px, height, width)
            value = x.new_zeros((n, c, k))
            for cell, w in zip(cells, weights):
                value = value + plane.gather(2, cell[:, None, :].expand(n, c, k)) * w[:, None, :]
            # An outside sample is 0, whatever the map holds at its (clamped) taps.
            value = torch.where(inside[:, None, :], value, 0.0)
            take = (value > best) | (value.isnan() & ~best.isnan()) if i else torch.ones_like(best, dtype=torch.bool)
            best = torch.where(take, value, best)
            arg = torch.where(take, i, arg)
        outs.append(best)
        args.append(arg)
    out = attach(torch.stack(outs, dim=3), input)
    cl = is_channels_last(input)
    return layout(out.to(input.dtype), cl), layout(torch.stack(args, dim=3).to(torch.int32), cl)


def border_align_backward(grad: Tensor, argmax: Tensor, rois: Tensor, pool_size: int, batch_size: int,
                          channels: int, height: int, width: int, channels_last: bool) -> Tensor:
    """Adjoint of :func:`border_align_forward`: each output's grad goes to the four taps
    of the sample its argmax names, at the point the forward's walk reached."""
    _check_backward(grad, argmax, rois, pool_size, batch_size, channels, height, width, channels_last)
    n, c, k = batch_size, channels // 4, rois.shape[1]
    opmath = opmath_type(grad.dtype)
    boxes = _boxes(rois, opmath)
    am = argmax.long()
    if bool(((am < 0) | (am > pool_size)).any()):
        raise ValueError(f"roiops: argmax must be in [0, pool_size = {pool_size}]")
    g = grad.to(opmath)
    grad_input = torch.zeros((n, channels, height * width), dtype=opmath, device=grad.device)
    for e, walk in enumerate(_walks(boxes, pool_size)):
        a = am[..., e]
        # The walk's point at each output's argmax: [N, C, K].
        px = py = g.new_zeros(a.shape)
        for i, x, y in _positions(walk, pool_size):
            hit = a == i
            px = torch.where(hit, x[:, None, :], px)
            py = torch.where(hit, y[:, None, :], py)
        cells, weights, inside = _taps(py, px, height, width)
        dst = grad_input[:, e * c:(e + 1) * c]
        for cell, w in zip(cells, weights):  # an outside point adds nothing
            dst.scatter_add_(2, cell, torch.where(inside, g[..., e] * w, 0.0))
    out = grad_input.view(n, channels, height, width)
    return layout(out.to(grad.dtype), bool(channels_last))
