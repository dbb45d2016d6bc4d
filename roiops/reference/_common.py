"""What the reference kernels share: the opmath type, the layout of results, the scans of
box rows every op makes the same way (docs/architecture.md, "Kernel contract"), and
RoIAlign's sampling geometry. The kernels' argument checks are the kernel contract's,
roiops._kernel_checks, which each kernel runs first."""

from __future__ import annotations

import torch
from torch import Tensor

from .._geometry import (MAX_ARGMAX_GRID, align_axis, bilinear_slope, bilinear_taps, memory_format, sample_position,
                         sample_position_slope)


def opmath_type(dtype: torch.dtype) -> torch.dtype:
    if dtype == torch.float64:
        return torch.float64
    if dtype in (torch.float32, torch.float16, torch.bfloat16):
        return torch.float32
    raise TypeError(f"roiops: unsupported dtype {dtype}; expected a floating dtype")


def layout(t: Tensor, channels_last: bool) -> Tensor:
    return t.contiguous(memory_format=memory_format(channels_last))


def prepare_rois(rois: Tensor, batch_size: int, opmath: torch.dtype) -> tuple[Tensor, list[int]]:
    """Validate the rows of ``rois`` (semantics.md "Inputs"; its shape, dtype and device are
    checked already) and return them in opmath with the batch indices; rotated rows
    ``(batch_index, cx, cy, w, h, theta)`` need a finite theta too.

    Runs before any indexing, so a bad row can never cause an out-of-bounds access.
    """
    rois = rois.detach().to(dtype=opmath)
    if rois.size(0) == 0:
        return rois, []
    idx = rois[:, 0]
    idx_ok = torch.isfinite(idx) & (idx == torch.floor(idx)) & (idx >= 0) & (idx < batch_size)
    coords_ok = torch.isfinite(rois[:, 1:]).all(dim=1)
    bad = ~(idx_ok & coords_ok)
    if bool(bad.any()):
        row = int(bad.nonzero()[0, 0])
        values = rois[row].tolist()
        if not bool(idx_ok[row]):
            raise ValueError(
                f"roiops: rois row {row}: batch index {values[0]!r} is not an integer "
                f"in [0, {batch_size}) (row = {values})"
            )
        raise ValueError(f"roiops: rois row {row}: coordinates must be finite (row = {values})")
    return rois, [int(b) for b in idx.tolist()]


def require_finite(rois: Tensor, quantities: list[Tensor], spatial_scale: float) -> None:
    # Finite coordinates can still overflow once scaled (float32 x * s); refuse those rows
    # too rather than let an infinity reach a grid size or an index.
    ok = torch.isfinite(torch.stack(quantities, dim=1)).all(dim=1)
    if not bool(ok.all()):
        row = int((~ok).nonzero()[0, 0])
        raise ValueError(
            f"roiops: rois row {row}: coordinates are not finite after spatial_scale "
            f"{spatial_scale} (row = {rois[row].tolist()})"
        )


def attach(out: Tensor, input: Tensor) -> Tensor:
    # When no box samples anything, ``out`` is built from fresh zeros and is cut off from
    # ``input``; hook it back on (adding an exact 0) so autograd yields a zero gradient
    # instead of complaining that the output does not require grad.
    if torch.is_grad_enabled() and input.requires_grad and not out.requires_grad:
        out = out + input.reshape(-1)[:0].sum().to(out.dtype)
    return out


def first_max(values: Tensor, member: Tensor) -> Tensor:
    """Index along the last dim of the first maximal member (row-major), or M if none.

    Same result as the scan of the kernel contract: start at the first member, move to a
    later one only if it is strictly greater, or if it is NaN while the running max is
    not.  So: any NaN member -> the first NaN; otherwise the first member equal to the
    max (ties keep the earliest).  ``member`` is a bool tensor broadcastable to ``values``.
    """
    m = values.size(-1)
    running = torch.where(member, values, float("-inf")).amax(dim=-1, keepdim=True)
    best = member & ((values == running) | (torch.isnan(values) & torch.isnan(running)))
    position = torch.arange(m, device=values.device)
    return torch.where(best, position, m).amin(dim=-1)


# --------------------------------------------------------------------------------------
# RoIAlign's sampling geometry (semantics.md "roi_align avg"): roi_align's avg and max
# modes and ps_roi_align sample the same points
# --------------------------------------------------------------------------------------

# Adaptive grid per axis: the kernels' coordinate range (2^24 cells) gives at most 2^25 + 1;
# the reference also takes larger boxes, but its sample indices must stay exact.
_MAX_ADAPTIVE_GRID = 2**26


class AlignBox:
    """Sampling geometry of one box: the bins, the grid and, per axis, the sample points
    that lie inside the map.

    Only inside samples are kept (an outside one has value 0 and no gradient), so memory
    and time follow the part of the map the box touches, not the box: a box 10^4 cells
    wide on an 8 x 8 map has at most about 20 inside samples per axis. Per axis, bin b's
    inside samples are the run ``s0[b] .. s0[b] + n[b] - 1`` of its ``grid`` samples,
    padded to ``m = max(n)`` slots: axis y has ``P = pooled_height * my`` rows, ordered
    (bin i, slot), axis x ``Q = pooled_width * mx`` columns. Bilinear weights factor per
    axis: ``w1 = hy*hx, w2 = hy*lx, w3 = ly*hx, w4 = ly*lx``.
    """

    def __init__(self, y_start, x_start, bin_h, bin_w, grid_h, grid_w, ph, pw, height, width, clamped_h=False,
                 clamped_w=False):
        self.grid_h, self.grid_w = grid_h, grid_w
        # The box was widened to 1 cell along the axis: its size no longer follows the corners.
        self.clamped_h, self.clamped_w = clamped_h, clamped_w
        self.y_start, self.x_start, self.bin_h, self.bin_w = y_start, x_start, bin_h, bin_w
        self.empty = grid_h <= 0 or grid_w <= 0  # no sample points (semantics.md "roi_align avg")
        self.count = max(grid_h * grid_w, 1)
        if self.empty:
            return
        self.y = axis_samples(y_start, bin_h, ph, grid_h, height)
        self.x = axis_samples(x_start, bin_w, pw, grid_w, width)
        self.my, self.mx = self.y.m, self.x.m

    def corners(self):
        """The four bilinear neighbours: (weight [P, Q], row index [P], column index [Q])."""
        y, x = self.y, self.x
        return (
            (y.h[:, None] * x.h[None, :], y.low, x.low),
            (y.h[:, None] * x.l[None, :], y.low, x.high),
            (y.l[:, None] * x.h[None, :], y.high, x.low),
            (y.l[:, None] * x.l[None, :], y.high, x.high),
        )

    def valid(self) -> Tensor:
        """[P, Q]: the slot holds an inside sample (padding otherwise)."""
        return self.y.valid[:, None] & self.x.valid[None, :]

    def first_outside(self) -> Tensor:
        """[ph, pw] int64: row-major index ``iy * grid_w + ix`` of each bin's first sample
        outside the map, -1 if none. Row 0's first outside column comes first, unless a
        whole sample row before it is outside."""
        fy, fx = self.y.first_out[:, None], self.x.first_out[None, :]
        row = torch.where(fy >= 0, fy * self.grid_w, -1)
        col = fx.expand(row.shape[0], fx.shape[1])
        both = (row >= 0) & (col >= 0)
        return torch.where(both, torch.minimum(row, col), torch.where(row >= 0, row, col))


class _Axis:
    """Inside samples of one axis (see AlignBox): per slot low, high, l, h, valid, and the
    derivatives of l and of the position ``dl`` and ``dbin`` ([pooled * m]); per bin s0
    (first inside sample) and first_out (first outside sample, -1 if none)."""

    def __init__(self, low, high, l, h, valid, dl, dbin, s0, first_out, m):
        self.low, self.high, self.l, self.h, self.valid = low, high, l, h, valid
        self.dl, self.dbin = dl, dbin
        self.s0, self.first_out, self.m = s0, first_out, m


def axis_samples(start: Tensor, bin_size: Tensor, pooled: int, grid: int, size: int,
                 bins: Tensor | None = None) -> _Axis:
    """The samples of one axis inside ``[-1, size]``, found without visiting the others.

    A sample's position is monotonic in its index s (each rounding step of the formula is),
    so the inside samples of a bin are one run ``[s0, s1)``: both ends are found by
    bisection over the bins at once. ``start`` is the bins' common start, or with ``bins``
    (each entry's bin index, ``[pooled]``) one start per entry: entries are then bins that
    each start elsewhere (deformable pooling); a non-finite start has no inside sample.
    """
    device = start.device
    b = torch.arange(pooled, device=device) if bins is None else bins
    rising = bool(bin_size >= 0)

    def first(pred):  # per bin, the first s in [0, grid) with pred(position), or grid
        lo = torch.zeros(pooled, dtype=torch.int64, device=device)
        hi = torch.full((pooled,), grid, dtype=torch.int64, device=device)
        while bool((lo < hi).any()):
            mid = (lo + hi) // 2
            ok = pred(sample_position(start, bin_size, grid, b, mid.clamp(max=grid - 1)))
            active = lo < hi
            hi = torch.where(active & ok, mid, hi)
            lo = torch.where(active & ~ok, mid + 1, lo)
        return lo

    if size <= 0:  # an empty map has no inside sample
        s0 = s1 = torch.zeros(pooled, dtype=torch.int64, device=device)
    elif rising:
        s0 = first(lambda v: v >= -1)
        s1 = torch.maximum(s0, first(lambda v: v > size))
    else:
        s0 = first(lambda v: v <= size)
        s1 = torch.maximum(s0, first(lambda v: v < -1))
    n = s1 - s0
    first_out = torch.where(s0 > 0, 0, torch.where(s1 < grid, s1, -1))
    m = max(int(n.max()), 1) if pooled else 1
    slot = torch.arange(m, device=device)
    valid = slot[None, :] < n[:, None]  # [pooled, m]
    s = torch.minimum(s0[:, None] + slot[None, :], (s1[:, None] - 1).clamp(min=0))
    pos = sample_position(start if start.dim() == 0 else start[:, None], bin_size, grid, b[:, None], s)
    low, high, l, h, _ = bilinear_taps(pos, size)
    dl = bilinear_slope(pos, size)
    dbin = sample_position_slope(grid, b[:, None], s, start).expand(pooled, m)
    return _Axis(low.reshape(-1), high.reshape(-1), l.reshape(-1), h.reshape(-1), valid.reshape(-1), dl.reshape(-1),
                 dbin.reshape(-1), s0, first_out, m)


def sampling_grids(rois: Tensor, grid_h: int | Tensor, grid_w: int | Tensor,
                   argmax: bool = False) -> list[tuple[int, int]]:
    """Each box's samples per bin ``(grid_h, grid_w)`` from the grids of
    ``_geometry.align_size``: a fixed ratio, or the boxes' adaptive ones. ``argmax``
    (RoIAlign mode "max"): a grid must also fit the int32 index of its samples."""
    n = rois.size(0)
    per_axis = [[g] * n if isinstance(g, int) else [int(v) for v in g.tolist()] for g in (grid_h, grid_w)]
    grids = list(zip(*per_axis))
    for k, (gh, gw) in enumerate(grids):
        if max(gh, gw) > _MAX_ADAPTIVE_GRID:
            raise ValueError(f"roiops: rois row {k}: adaptive sampling grid {gh} x {gw} is beyond "
                             f"{_MAX_ADAPTIVE_GRID} per axis (row = {rois[k].tolist()})")
        if argmax and gh > 0 and gw > 0 and gh * gw > MAX_ARGMAX_GRID:
            raise ValueError(f"roiops: rois row {k}: mode 'max' with adaptive sampling gives bins of {gh} x {gw} "
                             f"samples, more than its int32 argmax holds (2^31 - 1) (row = {rois[k].tolist()})")
    return grids


def align_boxes(rois: Tensor, spatial_scale: float, ph: int, pw: int, sampling_ratio: int, aligned: bool, height: int,
                width: int, max_mode: bool = False) -> list[AlignBox]:
    """Per-box geometry of semantics.md "roi_align avg" for all boxes (rois already validated, opmath)."""
    s = torch.tensor(spatial_scale, dtype=rois.dtype, device=rois.device)
    x_start, roi_w, bin_w, grid_w, stretched_w = align_axis(rois[:, 1], rois[:, 3], s, pw, sampling_ratio, aligned)
    y_start, roi_h, bin_h, grid_h, stretched_h = align_axis(rois[:, 2], rois[:, 4], s, ph, sampling_ratio, aligned)
    require_finite(rois, [x_start, y_start, roi_w, roi_h], spatial_scale)
    grids = sampling_grids(rois, grid_h, grid_w, argmax=max_mode)

    def per_box(stretched: Tensor | bool) -> list[bool]:
        return stretched.tolist() if isinstance(stretched, Tensor) else [stretched] * len(grids)

    return [AlignBox(y_start[k], x_start[k], bin_h[k], bin_w[k], gh, gw, ph, pw, height, width, ch, cw)
            for k, ((gh, gw), ch, cw) in enumerate(zip(grids, per_box(stretched_h), per_box(stretched_w)))]
