"""The gradient of RoIAlign (modes "avg" and "max", docs/semantics.md) with respect to the
box coordinates, in Triton.

``roi_align_rois_backward`` and ``roi_align_max_rois_backward`` run on the forward's tiles.
A tile walks its bins' samples as the forward does (max mode: through the same loop,
``pool_bins`` in _align.py, so it picks the forward's sample, then differentiates that
one alone), and sums, over its bins and channels, grad times each sample's slope dv/dy
(dv/dx) times how the sample moves with y1 and y2 (x1 and x2). Its four sums go to its own row of a
[K, bin blocks, channel blocks, 4] buffer that torch then adds up in a fixed order: no
float atomics, so the result is bit-identical from run to run. An adaptive grid
(sampling_ratio <= 0) is held at the box's current size: its derivative ignores that the
grid would grow with the box. The slopes jump where a sample crosses a cell edge or the
border rule's limits, and where the 1-cell minimum size starts to hold.
"""

from __future__ import annotations

import torch
import triton.language as tl

from .._geometry import dense
from ._align import align_tile, argmax_taps, pool_bins
from .._kernel_checks import kernel_check
from ._common import box_grid, check_device, f64_bits, kernel, opmath, tile_budget
from ._jit import (axis_slides, bilinear_slopes, box_program, corner_slopes, div_rn, load_roi, map_spans, sample_taps,
                   scale_of, tap_slopes, with_flag)
from ._jit import along_c as _c  # per-channel vector -> tile axis
from ._jit import along_p as _p  # per-bin / per-pixel vector -> tile axis

__all__ = ["roi_align_max_rois_backward", "roi_align_rois_backward"]


@kernel
def _align_rois_bwd_kernel(
    grad_ptr, x_ptr, rois_ptr, part_ptr, scale_bits,
    N, C, H, W, ph, pw, sampling_ratio, n_pblocks,
    sgK, sgC, sgH, sgW, sxN, sxC, sxH, sxW,
    ALIGNED: tl.constexpr, MAX_MODE: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr,
    CF: tl.constexpr,
):
    """What bins [pb * BLOCK_P, +BLOCK_P) x channels [cb * BLOCK_C, +BLOCK_C) of box k give
    the gradient of its (x1, y1, x2, y2): four partial sums, stored in the program's own row
    of the [programs, 4] part_ptr (no float atomics). A bad box row gives 0."""
    T = rois_ptr.dtype.element_ty
    k, pb, cb = box_program(n_pblocks)
    scale = scale_of(scale_bits, T)
    k64 = k.to(tl.int64)
    ok, b, sx, sy, bw, bh, gwf, ghf, gw, gh, count, p, pm, i, j, c, cm, tile_m = align_tile(
        rois_ptr, k, pb, cb, k >= 0, scale, N, C, ph, pw, sampling_ratio, ALIGNED, MAX_MODE, BLOCK_P, BLOCK_C, CF)
    _, _, x1, y1, x2, y2 = load_roi(rois_ptr, k64, N, scale)  # the corners, for corner_slopes
    c64 = c.to(tl.int64)
    g = tl.load(grad_ptr + k64 * sgK + _c(c64 * sgC, CF) + _p(i.to(tl.int64) * sgH + j.to(tl.int64) * sgW, CF),
                mask=tile_m, other=0.0).to(T)
    x_base = x_ptr + b * sxN + _c(c64 * sxC, CF)
    ybase = sy + i.to(T) * bh
    xbase = sx + j.to(T) * bw

    if MAX_MODE:
        # The sample the forward chose, differentiated alone; none, or a NaN maximum: 0.
        acc, arg = pool_bins(x_base, tile_m, with_flag(pm, ok), ybase, xbase, bh, bw, ghf, gwf, gh, gw, H, W,
                              sxH, sxW, True, BLOCK_P, BLOCK_C, CF)
        iy, ix, ghs, gws, y, x, ly, hy, lx, hx, m, o1, o2, o3, o4 = argmax_taps(
            arg, tile_m & (arg >= 0) & (acc == acc), ybase, xbase, bh, bw, ghf, gwf, gw, H, W, sxH, sxW, CF)
        v1 = tl.load(x_base + o1, mask=m, other=0.0).to(T)
        v2 = tl.load(x_base + o2, mask=m, other=0.0).to(T)
        v3 = tl.load(x_base + o3, mask=m, other=0.0).to(T)
        v4 = tl.load(x_base + o4, mask=m, other=0.0).to(T)
        dvdy, dvdx = bilinear_slopes(v1, v2, v3, v4, ly, hy, lx, hx, m & axis_slides(y, H), m & axis_slides(x, W))
        dy1, dy2 = corner_slopes(y1, y2, scale, _p(i, CF), iy, ghs, ph, ALIGNED)
        dx1, dx2 = corner_slopes(x1, x2, scale, _p(j, CF), ix, gws, pw, ALIGNED)
        gy = g * dvdy
        gx = g * dvdx
        sx1 = tl.sum(tl.sum(gx * dx1, axis=1), axis=0)
        sy1 = tl.sum(tl.sum(gy * dy1, axis=1), axis=0)
        sx2 = tl.sum(tl.sum(gx * dx2, axis=1), axis=0)
        sy2 = tl.sum(tl.sum(gy * dy2, axis=1), axis=0)
    else:
        # Per (bin, channel), the samples' dv/dy and dv/dx weighted by how each sample moves
        # with each corner. A row of samples shares its y weights: dv/dy is summed over
        # the row first.
        fy, ey, ny, fx, ex, nx = map_spans(with_flag(pm, ok), ybase, xbase, bh, bw, ghf, gwf, H, W)
        ay1 = _p(tl.zeros([BLOCK_P], dtype=T), CF) + _c(tl.zeros([BLOCK_C], dtype=T), CF)
        ay2 = tl.zeros_like(ay1)
        ax1 = tl.zeros_like(ay1)
        ax2 = tl.zeros_like(ay1)
        for dy in range(0, tl.max(ny, axis=0)):
            iy = fy + dy
            y, oylo, oyhi, ly, hy, iny = sample_taps(ybase, iy, bh, ghf, H, sxH)
            slides_y = _p(axis_slides(y, H), CF)
            on_y = iny & (dy < ny)
            ry = tl.zeros_like(ay1)
            for dx in range(0, tl.max(nx, axis=0)):
                ix = fx + dx
                x, oxlo, oxhi, lx, hx, inx = sample_taps(xbase, ix, bw, gwf, W, sxW)
                m = tile_m & _p(on_y & inx & (dx < nx), CF)
                dvdy, dvdx = tap_slopes(x_base, m, oylo, oyhi, oxlo, oxhi, ly, hy, lx, hx, slides_y,
                                        _p(axis_slides(x, W), CF), CF)
                dx1, dx2 = corner_slopes(x1, x2, scale, j, ix, gwf, pw, ALIGNED)
                ry += dvdy
                ax1 += dvdx * _p(dx1, CF)
                ax2 += dvdx * _p(dx2, CF)
            dy1, dy2 = corner_slopes(y1, y2, scale, i, iy, ghf, ph, ALIGNED)
            ay1 += ry * _p(dy1, CF)
            ay2 += ry * _p(dy2, CF)
        sx1 = div_rn(tl.sum(tl.sum(g * ax1, axis=1), axis=0), count)
        sy1 = div_rn(tl.sum(tl.sum(g * ay1, axis=1), axis=0), count)
        sx2 = div_rn(tl.sum(tl.sum(g * ax2, axis=1), axis=0), count)
        sy2 = div_rn(tl.sum(tl.sum(g * ay2, axis=1), axis=0), count)

    out = part_ptr + (tl.program_id(0).to(tl.int64) * tl.num_programs(1) + cb) * 4
    tl.store(out, sx1)
    tl.store(out + 1, sy1)
    tl.store(out + 2, sx2)
    tl.store(out + 3, sy2)


_check_avg, _check_max = kernel_check("roi_align", "rois_backward"), kernel_check("roi_align_max", "rois_backward")


def _rois_backward(grad, input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned, max_mode):
    (_check_max if max_mode else _check_avg)(grad, input, rois, spatial_scale, pooled_height, pooled_width,
                                             sampling_ratio, aligned)
    check_device(input, _align_rois_bwd_kernel)
    N, C, H, W = input.shape
    K = rois.shape[0]
    ph, pw = int(pooled_height), int(pooled_width)
    acc = opmath(input.dtype)
    out = torch.zeros((K, 5), dtype=acc, device=input.device)
    if K == 0 or C == 0:
        return out.to(rois.dtype)
    # Four accumulators per tile element (max mode: per-element sample coordinates).
    grid = box_grid(K, ph, pw, C, input.stride(1) < input.stride(3), input.is_cpu, tile_budget(input.dtype, 2))
    # One row of partial sums per program, added up in a fixed order: bit-identical runs.
    part = torch.empty((K, grid.n_pb, grid.n_cb, 4), dtype=acc, device=input.device)
    grid.launch(_align_rois_bwd_kernel, (grad, input, dense(rois, acc), part, f64_bits(spatial_scale),
                                         N, C, H, W, ph, pw, int(sampling_ratio)),
                (*grad.stride(), *input.stride()), ALIGNED=bool(aligned), MAX_MODE=max_mode)
    out[:, 1:] = part.sum(dim=(1, 2))
    return out.to(rois.dtype)


def roi_align_rois_backward(grad: torch.Tensor, input: torch.Tensor, rois: torch.Tensor, spatial_scale: float,
                            pooled_height: int, pooled_width: int, sampling_ratio: int,
                            aligned: bool) -> torch.Tensor:
    """Gradient of roi_align_forward w.r.t. the box coordinates: [K, 5] in rois' dtype, the
    batch-index column 0 (see the module docstring)."""
    return _rois_backward(grad, input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned,
                          False)


def roi_align_max_rois_backward(grad: torch.Tensor, input: torch.Tensor, rois: torch.Tensor, spatial_scale: float,
                                pooled_height: int, pooled_width: int, sampling_ratio: int,
                                aligned: bool) -> torch.Tensor:
    """Gradient of roi_align_max_forward w.r.t. the box coordinates: that of each bin's
    chosen sample, recomputed as the forward chooses it."""
    return _rois_backward(grad, input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned,
                          True)


