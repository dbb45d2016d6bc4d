"""ONNX translations of the RoI pooling operators: RoIAlign (``RoiAlign`` or a decomposition),
and decompositions of the others that compute each bin's samples (or cells) as the kernels
do and sum them in the kernels' order (CumSum: a running sum)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from onnxscript import ir

from .._geometry import align_axis, align_size, bilinear_taps, round_half_away, sample_position
from ._blocks import Blocking, blocked
from ._graph import (op, _cos_sin, _largest_or_one, _take, _GraphOps, _FLOAT, _INT32, _In, _as, _columns,
                     _compute_type, _const, _dim, _i64, _map_once, _range, _restore, _scalar, _to_int)


# ---- roi_align ---------------------------------------------------------------------------


def _roi_align_native(
    input: _In, rois: _In, spatial_scale: float, pooled_height: int, pooled_width: int,
    sampling_ratio: int, aligned: bool,
) -> _In:
    x, t = _compute_type(input)
    batch, x1, y1, x2, y2 = _columns(rois, t)
    batch = _to_int(batch)
    coords = op.Concat(*(op.Unsqueeze(c, _i64(1)) for c in (x1, y1, x2, y2)), axis=1)
    scale_attr = spatial_scale
    if t == ir.DataType.DOUBLE:
        # RoiAlign scales by its float32 attribute; the float64 kernel by the double.
        coords = op.Mul(coords, _const(spatial_scale, t))
        scale_attr = 1.0
    empty = None
    if aligned and sampling_ratio <= 0:
        # An empty adaptive grid (box of size <= 0) gives 0 in roiops; onnxruntime's
        # RoiAlign can fail on it, so such rows get an empty box and a forced 0.
        ops, s = _GraphOps(t), _const(spatial_scale, t)
        grid_w = align_axis(x1, x2, s, pooled_width, sampling_ratio, aligned, ops)[3]
        grid_h = align_axis(y1, y2, s, pooled_height, sampling_ratio, aligned, ops)[3]
        zero = _const(0, t)
        empty = op.Or(op.LessOrEqual(grid_w, zero), op.LessOrEqual(grid_h, zero))
        start = op.Gather(coords, _i64(0, 1), axis=1)
        coords = op.Where(op.Unsqueeze(empty, _i64(1)), op.Concat(start, start, axis=1), coords)
    out = op.RoiAlign(
        x, coords, batch, mode="avg", output_height=pooled_height, output_width=pooled_width,
        sampling_ratio=max(sampling_ratio, 0), spatial_scale=scale_attr,
        coordinate_transformation_mode="half_pixel" if aligned else "output_half_pixel")
    if empty is not None:
        out = op.Where(op.Unsqueeze(empty, _i64(1, 2, 3)), _const(0, t), out)
    return _restore(out, input)


def _flat_planes(x: ir.Value, batch: ir.Value, ph: int, pw: int, position_sensitive: bool
                 ) -> tuple[ir.Value, ir.Value]:
    """The offset of each box's (and, position-sensitive, each bin's) plane in the map's
    rows (``_map_rows``), ``[K, ph, 1, pw, 1]``: cell (y, x) is row ``offset + y * W + x``.
    Position-sensitive, a plane is one bin's channels of one image (``(n * ph + i) * pw + j``)."""
    height, width = _dim(x, 2), _dim(x, 3)
    area = op.Mul(height, width)
    xf = _map_once(lambda: _map_rows(x, ph, pw, position_sensitive), x, x.dtype, "rows", ph, pw, position_sensitive)
    if not position_sensitive:
        return op.Unsqueeze(op.Mul(batch, area), _i64(1, 2, 3, 4)), xf
    i = op.Unsqueeze(op.Mul(_range(_scalar(ph)), _scalar(pw)), _i64(0, 2, 3, 4))            # [1, ph, 1, 1, 1]
    j = op.Unsqueeze(_range(_scalar(pw)), _i64(0, 1, 2, 4))                                 # [1, 1, 1, pw, 1]
    plane = op.Add(op.Add(op.Mul(op.Unsqueeze(batch, _i64(1, 2, 3, 4)), _scalar(ph * pw)), i), j)
    return op.Mul(plane, area), xf


def _map_rows(x: ir.Value, ph: int, pw: int, position_sensitive: bool) -> ir.Value:
    """The map as rows of channels, ``[planes * H * W, C]``, so that one Gather reads every
    channel of a cell; position-sensitive, each bin's channel group is a plane of its own."""
    if not position_sensitive:
        return op.Reshape(op.Transpose(x, perm=[0, 2, 3, 1]), op.Concat(_i64(-1), op.Shape(x, start=1, end=2),
                                                                         axis=0))
    c_out = op.Div(op.Shape(x, start=1, end=2), _i64(ph * pw))
    x6 = op.Reshape(x, op.Concat(op.Shape(x, start=0, end=1), c_out, _i64(ph, pw), op.Shape(x, start=2), axis=0))
    return op.Reshape(op.Transpose(x6, perm=[0, 2, 3, 4, 5, 1]), op.Concat(_i64(-1), c_out, axis=0))


def _along(v: ir.Value, at: int) -> ir.Value:
    """A vector onto axis ``at`` of the five sample axes ``[K, ph, Gh, pw, Gw]``."""
    return op.Unsqueeze(v, _i64(*(a for a in range(5) if a != at)))


class _Grid:
    """One box axis's samples (semantics.md "roi_align avg"): their positions from the
    boxes' starts (``[K, 1, 1, 1, 1]``, or ``[K, ph, 1, pw, 1]`` where each bin has its own,
    as in deformable pooling), ``start + b * bin + (s + 0.5) * bin / grid`` (b = 0 with
    ``own_starts``: the starts are the bins' own, as in Bezier alignment), and which slots
    of the padded grid are real samples, as ``[K, ph, Gh, pw, Gw]`` arrays with size 1 on
    the other axis's bin and sample axes (unless the starts add them)."""

    def __init__(self, start: ir.Value, bin_size: ir.Value, grid: ir.Value, big_grid: ir.Value,
                 adaptive: bool, pooled: int, t: ir.DataType, rows: bool, own_starts: bool = False) -> None:
        box = _i64(1, 2, 3, 4)
        g = _along(_range(big_grid), 2 if rows else 4)
        grid5 = op.Unsqueeze(grid, box)
        # Past the box's own grid (adaptive sampling pads to the largest grid), repeat
        # its last sample: harmless for a maximum, masked out of a sum by `inside`.
        self.inside = op.Less(g, grid5)
        if adaptive:
            g = op.Max(op.Min(g, op.Sub(grid5, _i64(1))), _i64(0))
        # Bins whose starts are their own (Bezier alignment) are each bin 0 of their start.
        p = _scalar(0) if own_starts else _along(_range(_scalar(pooled)), 1 if rows else 3)
        self.at = sample_position(start, op.Unsqueeze(bin_size, box), grid5, p, g, _GraphOps(t))


class _Taps:
    """The bilinear taps (semantics.md, border rule) of sample coordinates along one map axis."""

    def __init__(self, coord: ir.Value, size: ir.Value, t: ir.DataType) -> None:
        self.lo, self.hi, self.l, self.h, self.valid = bilinear_taps(coord, size, _GraphOps(t))


def _grids(grid_h: ir.Value | int, grid_w: ir.Value | int, sampling_ratio: int, like: ir.Value
           ) -> tuple[ir.Value, ir.Value, ir.Value, ir.Value]:
    """The per-box grids ``[K]`` (int64) and the padded grid sizes (scalars)."""
    if isinstance(grid_h, int) or isinstance(grid_w, int):  # a fixed sampling_ratio
        grid = op.Expand(_i64(sampling_ratio), op.Shape(like))
        return grid, grid, _scalar(sampling_ratio), _scalar(sampling_ratio)
    grid_h, grid_w = _to_int(grid_h), _to_int(grid_w)
    # At least one sample slot, also with no boxes.
    big_h, big_w = _largest_or_one(grid_h), _largest_or_one(grid_w)
    return grid_h, grid_w, big_h, big_w


def _align_samples(input: ir.Value, rois: ir.Value, spatial_scale: float, ph: int, pw: int,
                   sampling_ratio: int, aligned: bool, position_sensitive: bool = False,
                   offset: ir.Value | None = None, gamma: float = 0.0
                   ) -> tuple[ir.Value, ir.Value, ir.Value, ir.Value, ir.Value, ir.Value, ir.DataType]:
    """Every bilinear sample of every bin: ``[K, C, ph, pw, Gh * Gw]`` (0 outside the map),
    with the mask of real (not padding) samples, the per-box grids ``[K]``, the padded grid
    sizes (scalars) and the compute type. ``position_sensitive``: bin (i, j) of output
    channel c reads input channel ``(c * ph + i) * pw + j`` only (C is then ``C_in / (ph * pw)``).
    ``offset`` (``[K, 2, ph, pw]``): each bin's start moved by ``gamma`` times the box's side
    times its offset, as deformable RoI pooling does."""
    x, t = _compute_type(input)
    b, x1, y1, x2, y2 = _columns(rois, t)
    ops, s = _GraphOps(t), _const(spatial_scale, t)
    x_start, roi_w, bin_w, grid_w, _ = align_axis(x1, x2, s, pw, sampling_ratio, aligned, ops)
    y_start, roi_h, bin_h, grid_h, _ = align_axis(y1, y2, s, ph, sampling_ratio, aligned, ops)
    if offset is not None:
        off = op.Cast(offset, to=t)

        def moved(start: ir.Value, side: ir.Value, column: int) -> ir.Value:  # [K, ph, 1, pw, 1]
            reach = op.Unsqueeze(op.Mul(_const(gamma, t), side), _i64(1, 2))
            shift = _take(off, column, axis=1)
            return op.Unsqueeze(op.Add(op.Unsqueeze(start, _i64(1, 2)), op.Mul(reach, shift)), _i64(2, 4))

        x_start, y_start = moved(x_start, roi_w, 0), moved(y_start, roi_h, 1)
    else:
        x_start, y_start = op.Unsqueeze(x_start, _i64(1, 2, 3, 4)), op.Unsqueeze(y_start, _i64(1, 2, 3, 4))
    grid_h, grid_w, big_h, big_w = _grids(grid_h, grid_w, sampling_ratio, b)
    gy = _Grid(y_start, bin_h, grid_h, big_h, sampling_ratio <= 0, ph, t, rows=True)
    gx = _Grid(x_start, bin_w, grid_w, big_w, sampling_ratio <= 0, pw, t, rows=False)
    ty, tx = _Taps(gy.at, _dim(x, 2), t), _Taps(gx.at, _dim(x, 3), t)
    val, inside = _bilinear_samples(x, _to_int(b), ty, tx, op.And(gy.inside, gx.inside), big_h, big_w, ph, pw,
                                    position_sensitive, t)
    return val, inside, grid_h, grid_w, big_h, big_w, t


def _bilinear(xf: ir.Value, base: ir.Value, ty: _Taps, tx: _Taps, width: ir.Value, t: ir.DataType) -> ir.Value:
    """The bilinear values at taps ``ty`` and ``tx`` of the map rows ``xf`` (``[cells, C]``; a
    point's cells are rows ``base + y * width + x``), channels on a new last axis, 0 off the
    map: ``w1*v1 + w2*v2 + w3*v3 + w4*v4``, left to right as in the kernels."""
    ylo, yhi = op.Mul(ty.lo, width), op.Mul(ty.hi, width)

    def corner(yy: ir.Value, xx: ir.Value, wy: ir.Value, wx: ir.Value) -> ir.Value:
        return op.Mul(op.Unsqueeze(op.Mul(wy, wx), _i64(-1)), op.Gather(xf, op.Add(base, op.Add(yy, xx)), axis=0))

    val = op.Add(op.Add(op.Add(corner(ylo, tx.lo, ty.h, tx.h), corner(ylo, tx.hi, ty.h, tx.l)),
                        corner(yhi, tx.lo, ty.l, tx.h)), corner(yhi, tx.hi, ty.l, tx.l))
    return op.Where(op.Unsqueeze(op.And(ty.valid, tx.valid), _i64(-1)), val, _const(0, t))


def _bilinear_samples(x: ir.Value, batch: ir.Value, ty: _Taps, tx: _Taps, inside: ir.Value, big_h: ir.Value,
                      big_w: ir.Value, ph: int, pw: int, position_sensitive: bool, t: ir.DataType
                      ) -> tuple[ir.Value, ir.Value]:
    """The samples whose taps are ``ty`` and ``tx`` (broadcasting to ``[K, ph, Gh, pw, Gw]``) as
    ``[K, C, ph, pw, Gh * Gw]``, 0 outside the map, and ``inside`` (the real samples of the
    padded grid, ``[K, 1, Gh, 1, Gw]``) as ``[K, 1, 1, 1, Gh * Gw]``."""
    base, xf = _flat_planes(x, batch, ph, pw, position_sensitive)
    val = _bilinear(xf, base, ty, tx, _dim(x, 3), t)                              # [K, ph, Gh, pw, Gw, C]
    val = op.Transpose(val, perm=[0, 5, 1, 3, 2, 4])                              # [K, C, ph, pw, Gh, Gw]
    inside = op.Transpose(inside, perm=[0, 1, 3, 2, 4])                           # [K, 1, 1, Gh, Gw]
    # Explicit sizes, no -1: Reshape cannot infer a dimension when K = 0.
    grid_size = op.Unsqueeze(op.Mul(big_h, big_w), _i64(0))
    val = op.Reshape(val, op.Concat(op.Shape(val, start=0, end=4), grid_size, axis=0))
    inside = op.Reshape(inside, op.Concat(op.Shape(inside, start=0, end=3), grid_size, axis=0))
    return val, op.Unsqueeze(inside, _i64(1))


def _empty_grid(grid_h: ir.Value, grid_w: ir.Value) -> ir.Value:
    """``[K, 1, 1, 1]``: the box has no sample points (its bins are 0)."""
    zero = _i64(0)
    return op.Unsqueeze(op.Or(op.LessOrEqual(grid_h, zero), op.LessOrEqual(grid_w, zero)), _i64(1, 2, 3))


def _nan_aware_max(val: ir.Value, axis: int, t: ir.DataType) -> tuple[ir.Value, ir.Value, ir.Value]:
    """Maximum along ``axis`` where any NaN makes the result NaN (onnxruntime's ReduceMax
    keeps a NaN only in some positions), the index of the first maximum (of the first NaN
    if there is one; ArgMax keeps the first of equal values) and the NaN flag."""
    nan = op.IsNaN(val)
    clean = op.Where(nan, _const(np.inf, t), val)
    nan_i = op.Cast(nan, to=_INT32)
    has_nan = op.Greater(op.ReduceSum(nan_i, _i64(axis), keepdims=0), _const(0, _INT32))
    at = op.ArgMax(clean, axis=axis, keepdims=1)
    best = op.Where(has_nan, _const(np.nan, t), op.Squeeze(op.GatherElements(clean, at, axis=axis), _i64(axis)))
    first = op.Where(has_nan, op.ArgMax(nan_i, axis=axis, keepdims=0), op.Squeeze(at, _i64(axis)))
    return best, first, has_nan


def _roi_align_max(
    input: _In, rois: _In, spatial_scale: float, pooled_height: int, pooled_width: int,
    sampling_ratio: int, aligned: bool,
) -> tuple[_In, _In]:
    val, _, grid_h, grid_w, _, big_w, t = _align_samples(input, rois, spatial_scale, pooled_height, pooled_width,
                                                      sampling_ratio, aligned)
    best, first, _ = _nan_aware_max(val, -1, t)
    # Index in the padded grid -> iy * grid_w + ix. The first maximum is never a padding
    # slot: padding repeats an earlier sample of the same bin.
    gw = op.Unsqueeze(grid_w, _i64(1, 2, 3))
    argmax = op.Add(op.Mul(op.Div(first, big_w), gw), op.Mod(first, big_w))
    empty = _empty_grid(grid_h, grid_w)
    out = op.Where(empty, _const(0, t), best)
    argmax = op.Cast(op.Where(empty, _i64(-1), argmax), to=_INT32)
    return _restore(out, input), argmax


def _roi_align_decomposed(
    input: _In, rois: _In, spatial_scale: float, pooled_height: int, pooled_width: int,
    sampling_ratio: int, aligned: bool,
) -> _In:
    return _restore(_sample_mean(*_align_samples(input, rois, spatial_scale, pooled_height, pooled_width,
                                                 sampling_ratio, aligned)), input)


def _sample_mean(val: ir.Value, inside: ir.Value, grid_h: ir.Value, grid_w: ir.Value, big_h: ir.Value,
                 big_w: ir.Value, t: ir.DataType) -> ir.Value:
    """Each bin's mean of its samples (0 for a box without sample points)."""
    # The kernels add the samples one after the other in row-major order; a running sum
    # (CumSum) adds in that order, so the result is bit for bit the kernels' (+0 for the
    # padding and outside samples changes nothing). ReduceSum would reassociate.
    val = op.CumSum(op.Where(inside, val, _const(0, t)), _scalar(-1))
    total = op.Gather(val, op.Sub(op.Mul(big_h, big_w), _scalar(1)), axis=-1)
    count = op.Cast(op.Max(op.Mul(grid_h, grid_w), _i64(1)), to=t)
    out = op.Div(total, op.Unsqueeze(count, _i64(1, 2, 3)))
    return op.Where(_empty_grid(grid_h, grid_w), _const(0, t), out)


# ---- rotated RoIAlign ----------------------------------------------------------------------


def _rotated_samples(input: ir.Value, rois: ir.Value, spatial_scale: float, ph: int, pw: int,
                     sampling_ratio: int, aligned: bool
                     ) -> tuple[ir.Value, ir.Value, ir.Value, ir.Value, ir.Value, ir.Value, ir.DataType]:
    """:func:`_align_samples` for rotated boxes ``(batch_index, cx, cy, w, h, theta)``, theta
    in counter-clockwise radians (semantics.md "roi_align_rotated"): sample (yy, xx) of the
    box's own axes, centred, lies on the map at ``y = yy * cos - xx * sin + cy`` and
    ``x = yy * sin + xx * cos + cx``."""
    x, t = _compute_type(input)
    b, cx, cy, w, h, theta = _columns(rois, t, 6)
    ops, s = _GraphOps(t), _const(spatial_scale, t)
    if aligned:  # scale first, then shift
        cx, cy = op.Sub(op.Mul(cx, s), _const(0.5, t)), op.Sub(op.Mul(cy, s), _const(0.5, t))
    else:
        cx, cy = op.Mul(cx, s), op.Mul(cy, s)
    roi_w, bin_w, grid_w, _ = align_size(op.Mul(w, s), pw, sampling_ratio, aligned, ops)
    roi_h, bin_h, grid_h, _ = align_size(op.Mul(h, s), ph, sampling_ratio, aligned, ops)
    cos, sin = _cos_sin(theta, t)
    grid_h, grid_w, big_h, big_w = _grids(grid_h, grid_w, sampling_ratio, b)
    box = _i64(1, 2, 3, 4)
    half = _const(2, t)
    gy = _Grid(op.Unsqueeze(op.Div(op.Neg(roi_h), half), box), bin_h, grid_h, big_h, sampling_ratio <= 0, ph, t,
               rows=True)
    gx = _Grid(op.Unsqueeze(op.Div(op.Neg(roi_w), half), box), bin_w, grid_w, big_w, sampling_ratio <= 0, pw, t,
               rows=False)
    cos, sin, cx, cy = (op.Unsqueeze(v, box) for v in (cos, sin, cx, cy))
    y = op.Add(op.Sub(op.Mul(gy.at, cos), op.Mul(gx.at, sin)), cy)
    xs = op.Add(op.Add(op.Mul(gy.at, sin), op.Mul(gx.at, cos)), cx)
    ty, tx = _Taps(y, _dim(x, 2), t), _Taps(xs, _dim(x, 3), t)
    val, inside = _bilinear_samples(x, _to_int(b), ty, tx, op.And(gy.inside, gx.inside), big_h, big_w, ph, pw,
                                    False, t)
    return val, inside, grid_h, grid_w, big_h, big_w, t


def _roi_align_rotated(
    input: _In, rois: _In, spatial_scale: float, pooled_height: int, pooled_width: int, sampling_ratio: int,
    aligned: bool,
) -> _In:
    return _restore(_sample_mean(*_rotated_samples(input, rois, spatial_scale, pooled_height, pooled_width,
                                                   sampling_ratio, aligned)), input)


def _riroi_align_rotated(
    input: _In, rois: _In, spatial_scale: float, pooled_height: int, pooled_width: int, sampling_ratio: int,
    num_orientations: int, clockwise: bool,
) -> _In:
    """Rotated RoIAlign without the half-cell offset, rounded to the input's dtype, then each
    box's blend of orientations (semantics.md "riroi_align_rotated";
    ``roiops._geometry.orientation_blend``): ``out[k, c' O + o] = r * A[k, c' O + i0] +
    l * A[k, c' O + i1]``, ``i0 = (o - ind) mod O``, ``i1 = (i0 + 1) mod O``."""
    _, t = _compute_type(input)
    a = _roi_align_rotated(input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, False)
    if input.dtype != t:  # rounded to the input's dtype, then blended in the compute type
        a = op.Cast(a, to=t)
    o = num_orientations
    f64 = ir.DataType.DOUBLE
    theta = _columns(rois, f64, 6)[5]
    if clockwise:
        theta = op.Neg(theta)
    f = op.Div(op.Mul(theta, _const(o, f64)), _const(2 * np.pi, f64))
    largest = float(np.finfo(np.float64).max)
    f = op.Min(op.Max(op.Where(op.IsNaN(f), _const(0, f64), f), _const(-largest, f64)), _const(largest, f64))
    whole = op.Floor(f)
    frac = op.Sub(f, whole)
    ind = op.Mod(whole, _const(o, f64), fmod=1)
    ind = _to_int(op.Where(op.Less(ind, _const(0, f64)), op.Add(ind, _const(o, f64)), ind))
    r, l = op.Cast(op.Sub(_const(1, f64), frac), to=t), op.Cast(frac, to=t)
    i0 = op.Mod(op.Add(op.Sub(_range(_scalar(o)), op.Unsqueeze(ind, _i64(1))), _scalar(o)), _scalar(o))  # [K, O]
    i1 = op.Mod(op.Add(i0, _scalar(1)), _scalar(o))
    shape = op.Shape(a)
    fields = op.Concat(op.Shape(a, start=0, end=1), op.Div(op.Shape(a, start=1, end=2), _i64(o)), _i64(o),
                       op.Shape(a, start=2), axis=0)
    a5 = op.Reshape(a, fields)

    def pick(index: ir.Value) -> ir.Value:
        return op.GatherElements(a5, op.Expand(op.Unsqueeze(index, _i64(1, 3, 4)), fields), axis=2)

    def weight(w: ir.Value) -> ir.Value:
        return op.Unsqueeze(w, _i64(1, 2, 3, 4))

    out = op.Add(op.Mul(weight(r), pick(i0)), op.Mul(weight(l), pick(i1)))
    return _restore(op.Reshape(out, shape), input)


# ---- deformable RoI pooling ---------------------------------------------------------------


def _deform_roi_pool(
    input: _In, rois: _In, offset: _In | None, spatial_scale: float, pooled_height: int, pooled_width: int,
    sampling_ratio: int, gamma: float,
) -> _In:
    return _restore(_sample_mean(*_align_samples(input, rois, spatial_scale, pooled_height, pooled_width,
                                                 sampling_ratio, True, offset=offset, gamma=gamma)), input)


# ---- position-sensitive ops -----------------------------------------------------------------


def _ps_roi_align(
    input: _In, rois: _In, spatial_scale: float, pooled_height: int, pooled_width: int, sampling_ratio: int,
) -> _In:
    return _restore(_sample_mean(*_align_samples(input, rois, spatial_scale, pooled_height, pooled_width,
                                                 sampling_ratio, True, position_sensitive=True)), input)


def _bin_cells(x: ir.Value, b: ir.Value, h0: ir.Value, h1: ir.Value, w0: ir.Value, w1: ir.Value, ph: int, pw: int,
               position_sensitive: bool) -> tuple[ir.Value, ir.Value, ir.Value, ir.Value]:
    """The cells of each bin (rows ``[h0, h1)``, columns ``[w0, w1)``, ``[K, ph]`` and ``[K, pw]``)
    as ``[K, C, ph, pw, Gh * Gw]`` in row-major order, each bin a window of the largest bin's
    size: a padding slot repeats the bin's last row or column (a cell before it in row-major
    order, read inside the map). Also which slots are the bin's own cells
    (``[K, 1, ph, pw, Gh * Gw]``), and ``Gw`` and ``Gh * Gw`` (scalars)."""
    def window(lo: ir.Value, hi: ir.Value, size: ir.Value) -> tuple[ir.Value, ir.Value, ir.Value]:
        big = _largest_or_one(op.Sub(hi, lo))
        at = op.Add(op.Unsqueeze(lo, _i64(2)), op.Unsqueeze(_range(big), _i64(0, 1)))        # [K, P, G]
        last = op.Sub(op.Unsqueeze(hi, _i64(2)), _i64(1))
        return op.Min(op.Max(op.Min(at, last), _i64(0)), op.Sub(size, _i64(1))), op.LessOrEqual(at, last), big

    width = _dim(x, 3)
    rows, rows_in, big_h = window(h0, h1, _dim(x, 2))
    cols, cols_in, big_w = window(w0, w1, width)
    cell = op.Add(op.Unsqueeze(op.Mul(rows, width), _i64(3, 4)), op.Unsqueeze(cols, _i64(1, 2)))  # [K, ph, Gh, pw, Gw]
    base, xf = _flat_planes(x, _to_int(b), ph, pw, position_sensitive)
    val = op.Transpose(op.Gather(xf, op.Add(base, cell), axis=0), perm=[0, 5, 1, 3, 2, 4])  # [K, C, ph, pw, Gh, Gw]
    inside = op.Transpose(op.And(op.Unsqueeze(rows_in, _i64(3, 4)), op.Unsqueeze(cols_in, _i64(1, 2))),
                          perm=[0, 1, 3, 2, 4])                                             # [K, ph, pw, Gh, Gw]
    grid = op.Mul(big_h, big_w)
    # Explicit sizes, no -1: Reshape cannot infer a dimension when K = 0.
    flat = op.Unsqueeze(grid, _i64(0))
    val = op.Reshape(val, op.Concat(op.Shape(val, start=0, end=4), flat, axis=0))
    inside = op.Unsqueeze(op.Reshape(inside, op.Concat(op.Shape(inside, start=0, end=3), flat, axis=0)), _i64(1))
    return val, inside, big_w, grid


def _ps_roi_pool(input: _In, rois: _In, spatial_scale: float, pooled_height: int, pooled_width: int) -> _In:
    x, t = _compute_type(input)
    b, x1, y1, x2, y2 = _columns(rois, t)
    s = _const(spatial_scale, t)
    height, width = _dim(x, 2), _dim(x, 3)
    ops = _GraphOps(t)
    xr, yr, xr2, yr2 = (_to_int(round_half_away(op.Mul(c, s), ops)) for c in (x1, y1, x2, y2))
    one = _i64(1)
    roi_w, roi_h = op.Max(op.Sub(xr2, xr), one), op.Max(op.Sub(yr2, yr), one)  # no + 1, unlike roi_pool
    h0, h1 = _pool_bins(yr, op.Div(op.Cast(roi_h, to=t), _const(pooled_height, t)), pooled_height, height, t, yr,
                        None)
    w0, w1 = _pool_bins(xr, op.Div(op.Cast(roi_w, to=t), _const(pooled_width, t)), pooled_width, width, t, xr, None)

    val, inside, _, grid = _bin_cells(x, b, h0, h1, w0, w1, pooled_height, pooled_width, True)
    val = op.Where(inside, val, _const(0, t))  # padding slots add nothing
    # The kernels add a bin's cells row by row, in order: a running sum does the same.
    total = op.Gather(op.CumSum(val, _scalar(-1)), op.Sub(grid, _scalar(1)), axis=-1)
    count = op.Mul(op.Unsqueeze(op.Sub(h1, h0), _i64(2)), op.Unsqueeze(op.Sub(w1, w0), _i64(1)))  # [K, ph, pw]
    count = op.Unsqueeze(count, _i64(1))
    out = op.Div(total, op.Cast(op.Max(count, _i64(1)), to=t))
    return _restore(op.Where(op.LessOrEqual(count, _i64(0)), _const(0, t), out), input)


# ---- Bezier alignment ----------------------------------------------------------------------


def _bezier_point(q: list[ir.Value], u: ir.Value, t: ir.DataType) -> ir.Value:
    """``roiops._geometry.bezier_point`` in the graph: the first three Bernstein terms in
    float64, the last in ``t``, summed left to right in float64 and rounded once to ``t``."""
    d = ir.DataType.DOUBLE

    def wide(v: ir.Value) -> ir.Value:
        return v if t == d else op.Cast(v, to=d)

    ud = wide(u)
    om = op.Sub(_const(1, d), ud)
    three = _const(3, d)
    a = op.Mul(op.Mul(op.Mul(om, om), om), wide(q[0]))
    b = op.Mul(op.Mul(op.Mul(op.Mul(three, ud), om), om), wide(q[1]))
    c = op.Mul(op.Mul(op.Mul(op.Mul(three, ud), ud), om), wide(q[2]))
    last = wide(op.Mul(op.Mul(op.Mul(u, u), u), q[3]))
    total = op.Add(op.Add(op.Add(a, b), c), last)
    return total if t == d else op.Cast(total, to=t)


def _bezier_curves(rois: ir.Value, spatial_scale: float, t: ir.DataType
                   ) -> tuple[list[tuple[ir.Value, ir.Value]], list[tuple[ir.Value, ir.Value]]]:
    """The top and bottom curves' control points ``(x, y)``, ``[K, 1]`` each, scaled, both
    left to right (the bottom curve is stored right to left)."""
    s = _const(spatial_scale, t)
    pts = [op.Unsqueeze(op.Mul(c, s), _i64(1)) for c in _columns(rois, t, 17)[1:]]
    return [(pts[2 * n], pts[2 * n + 1]) for n in range(4)], [(pts[14 - 2 * n], pts[15 - 2 * n]) for n in range(4)]


def _bezier_spans(top: list[tuple[ir.Value, ir.Value]], bottom: list[tuple[ir.Value, ir.Value]]
                  ) -> tuple[ir.Value, ir.Value]:
    """The box's height and width, ``[K]``: the larger of the curves' end-to-end spans."""
    def span(axis: int) -> ir.Value:
        return op.Squeeze(op.Max(op.Abs(op.Sub(top[0][axis], top[3][axis])),
                                 op.Abs(op.Sub(bottom[0][axis], bottom[3][axis]))), _i64(1))

    return span(1), span(0)


def _bezier_align(
    input: _In, rois: _In, spatial_scale: float, pooled_height: int, pooled_width: int, sampling_ratio: int,
    aligned: bool,
) -> _In:
    """Each bin centred between the two curves (``roiops._geometry.bezier_bins``), the mean of
    its own grid of bilinear samples, as deformable pooling's bins."""
    x, t = _compute_type(input)
    b = _take(_as(rois, t), 0, axis=1)
    top, bottom = _bezier_curves(rois, spatial_scale, t)
    ops = _GraphOps(t)

    span_h, span_w = _bezier_spans(top, bottom)
    _, bin_w, grid_w, _ = align_size(span_w, pooled_width, sampling_ratio, aligned, ops)
    _, bin_h, grid_h, _ = align_size(span_h, pooled_height, sampling_ratio, aligned, ops)
    u = op.Unsqueeze(op.Div(op.Cast(_range(_scalar(pooled_width)), to=t), _const(pooled_width, t)), _i64(0))
    v = op.Unsqueeze(op.Div(op.Cast(_range(_scalar(pooled_height)), to=t), _const(pooled_height, t)), _i64(0, 2))
    d = ir.DataType.DOUBLE
    v_rest = op.Sub(_const(1, d), v if t == d else op.Cast(v, to=d))

    def start(axis: int, bin_size: ir.Value) -> ir.Value:  # [K, ph, 1, pw, 1]
        at_top = op.Unsqueeze(_bezier_point([q[axis] for q in top], u, t), _i64(1))        # [K, 1, pw]
        at_bottom = op.Unsqueeze(_bezier_point([q[axis] for q in bottom], u, t), _i64(1))
        centre = op.Add(op.Cast(op.Mul(at_bottom, v), to=d), op.Mul(op.Cast(at_top, to=d), v_rest))
        if aligned:
            centre = op.Sub(centre, _const(0.5, d))
        centre = op.Cast(centre, to=t)
        half = op.Unsqueeze(op.Mul(_const(0.5, t), bin_size), _i64(1, 2))
        return op.Unsqueeze(op.Sub(centre, half), _i64(2, 4))

    y_start, x_start = start(1, bin_h), start(0, bin_w)
    grid_h, grid_w, big_h, big_w = _grids(grid_h, grid_w, sampling_ratio, b)
    gy = _Grid(y_start, bin_h, grid_h, big_h, sampling_ratio <= 0, pooled_height, t, rows=True, own_starts=True)
    gx = _Grid(x_start, bin_w, grid_w, big_w, sampling_ratio <= 0, pooled_width, t, rows=False, own_starts=True)
    ty, tx = _Taps(gy.at, _dim(x, 2), t), _Taps(gx.at, _dim(x, 3), t)
    val, inside = _bilinear_samples(x, _to_int(b), ty, tx, op.And(gy.inside, gx.inside), big_h, big_w,
                                    pooled_height, pooled_width, False, t)
    return _restore(_sample_mean(val, inside, grid_h, grid_w, big_h, big_w, t), input)


# ---- Precise RoI Pooling ---------------------------------------------------------------------


def _hat_integral(a: ir.Value, length: ir.Value, t: ir.DataType) -> ir.Value:
    """The hat's integral over ``[a, a + length]`` as the kernels compute it (prroi.h): the
    sum over its two linear pieces of the length inside the piece times the hat at the
    middle of that part."""
    zero, one, half = _const(0, t), _const(1, t), _const(0.5, t)
    b = op.Add(a, length)
    l0 = op.Max(op.Sub(op.Sub(length, op.Max(op.Sub(_const(-1, t), a), zero)), op.Max(b, zero)), zero)
    l1 = op.Max(op.Sub(op.Sub(length, op.Max(op.Neg(a), zero)), op.Max(op.Sub(b, one), zero)), zero)
    rise = op.Mul(l0, op.Add(op.Add(one, op.Max(a, _const(-1, t))), op.Mul(l0, half)))
    fall = op.Mul(l1, op.Sub(op.Sub(one, op.Max(a, zero)), op.Mul(l1, half)))
    return op.Add(rise, fall)


def _prroi_axis(p1: ir.Value, p2: ir.Value, s: ir.Value, pooled: int, size: ir.Value, t: ir.DataType
                ) -> tuple[ir.Value, ir.Value, ir.Value, ir.Value]:
    """One box side's bins: the bin side ``[K]``, and per bin ``[K, pooled, G]`` the cells its
    window reaches (clipped into the map, for reading), which of the G slots are such cells,
    and their weights (the hat's integral over the window over the bin side; 0 elsewhere)."""
    bin_size = op.Div(op.Mul(op.Max(op.Sub(p2, p1), _const(0, t)), s), _const(pooled, t))
    b = op.Unsqueeze(op.Cast(_range(_scalar(pooled)), to=t), _i64(0))
    start = op.Add(op.Unsqueeze(op.Mul(p1, s), _i64(1)), op.Mul(b, op.Unsqueeze(bin_size, _i64(1))))  # [K, P]
    first = op.Max(_to_int(op.Floor(start)), _i64(0))
    last = op.Min(_to_int(op.Ceil(op.Add(start, op.Unsqueeze(bin_size, _i64(1))))), op.Sub(size, _i64(1)))
    count = op.Sub(op.Add(last, _i64(1)), first)
    big = _largest_or_one(count)
    g = op.Unsqueeze(_range(big), _i64(0, 1))
    cell = op.Add(op.Unsqueeze(first, _i64(2)), g)                                         # [K, P, G]
    member = op.Less(g, op.Unsqueeze(count, _i64(2)))
    a = op.Sub(op.Unsqueeze(start, _i64(2)), op.Cast(cell, to=t))  # the window from the cell's centre
    side = op.Unsqueeze(bin_size, _i64(1, 2))
    weight = op.Where(member, op.Div(_hat_integral(a, side, t), side), _const(0, t))
    return bin_size, op.Min(cell, op.Sub(size, _i64(1))), member, weight


def _prroi_pool(input: _In, rois: _In, spatial_scale: float, pooled_height: int, pooled_width: int) -> _In:
    """Each bin's average of the bilinear interpolation over its window, as the kernels sum
    it: per bin row, each column's running sum of its rows' weighted values, then the bin's
    running sum of its columns' weighted sums (prroi_pool.cpp), both as CumSum."""
    x, t = _compute_type(input)
    b, x1, y1, x2, y2 = _columns(rois, t)
    s = _const(spatial_scale, t)
    height, width = _dim(x, 2), _dim(x, 3)
    dh, rows, rows_in, wy = _prroi_axis(y1, y2, s, pooled_height, height, t)
    dw, cols, cols_in, wx = _prroi_axis(x1, x2, s, pooled_width, width, t)
    base, xf = _flat_planes(x, _to_int(b), pooled_height, pooled_width, False)
    cell = op.Add(base, op.Add(op.Unsqueeze(op.Mul(rows, width), _i64(3, 4)), op.Unsqueeze(cols, _i64(1, 2))))
    val = op.Gather(xf, cell, axis=0)                                                   # [K, ph, Gh, pw, Gw, C]
    zero = _const(0, t)
    # Slots that are not cells of the bin add nothing (their value may be NaN or inf).
    terms = op.Where(op.Unsqueeze(rows_in, _i64(3, 4, 5)), op.Mul(op.Unsqueeze(wy, _i64(3, 4, 5)), val), zero)
    big_h = op.Shape(wy, start=2, end=3)
    row = op.Squeeze(op.Gather(op.CumSum(terms, _scalar(2)), op.Sub(big_h, _i64(1)), axis=2),
                     _i64(2))                                                           # [K, ph, pw, Gw, C]
    cols_live = op.Unsqueeze(cols_in, _i64(1, 4))                                       # [K, 1, pw, Gw, 1]
    terms = op.Where(cols_live, op.Mul(op.Unsqueeze(wx, _i64(1, 4)), row), zero)
    big_w = op.Shape(wx, start=2, end=3)
    out = op.Squeeze(op.Gather(op.CumSum(terms, _scalar(3)), op.Sub(big_w, _i64(1)), axis=3), _i64(3))  # [K, ph, pw, C]
    out = op.Transpose(out, perm=[0, 3, 1, 2])
    # A box of zero area (x2 <= x1 or y2 <= y1) gives 0.
    flat = op.Not(op.Greater(op.Mul(dw, dh), zero))
    return _restore(op.Where(op.Unsqueeze(flat, _i64(1, 2, 3)), zero, out), input)


# ---- border align --------------------------------------------------------------------------


def _border_align(input: _In, rois: _In, pool_size: int) -> tuple[_In, _In]:
    """Per box and border (top, left, bottom, right), the first maximum of ``pool_size + 1``
    bilinear samples of that border's channel group (semantics.md "border_align"). The
    samples walk from the border's start by repeated addition of one step: a running sum
    (CumSum) adds in that order, so every position has the kernels' bits."""
    x, t = _compute_type(input)
    boxes = _as(rois, t)
    x1, y1, x2, y2 = (_take(boxes, i, axis=2) for i in range(4))
    n = _const(pool_size, t)
    sx, sy = op.Div(op.Sub(x2, x1), n), op.Div(op.Sub(y2, y1), n)

    def walk(start: ir.Value, step: ir.Value) -> ir.Value:  # [N, K, pool_size + 1]
        steps = op.Expand(op.Unsqueeze(step, _i64(2)), op.Concat(op.Shape(step), _i64(pool_size), axis=0))
        return op.CumSum(op.Concat(op.Unsqueeze(start, _i64(2)), steps, axis=2), _scalar(2))

    def still(v: ir.Value) -> ir.Value:  # [N, K, 1]
        return op.Unsqueeze(v, _i64(2))

    borders = [(walk(x1, sx), still(y1)), (still(x1), walk(y1, sy)),
               (walk(x2, op.Neg(sx)), still(y2)), (still(x2), walk(y2, op.Neg(sy)))]
    shape = op.Concat(op.Shape(x1), _i64(1, pool_size + 1), axis=0)
    px = op.Concat(*(op.Expand(op.Unsqueeze(bx, _i64(2)), shape) for bx, _ in borders), axis=2)  # [N, K, 4, S]
    py = op.Concat(*(op.Expand(op.Unsqueeze(by, _i64(2)), shape) for _, by in borders), axis=2)
    height, width = _dim(x, 2), _dim(x, 3)
    ty, tx = _Taps(py, height, t), _Taps(px, width, t)
    # x as [N * 4 * H * W, C]: border e of image n reads plane n * 4 + e.
    c = op.Div(op.Shape(x, start=1, end=2), _i64(4))
    x5 = op.Reshape(x, op.Concat(op.Shape(x, start=0, end=1), _i64(4), c, op.Shape(x, start=2), axis=0))
    xf = op.Reshape(op.Transpose(x5, perm=[0, 1, 3, 4, 2]), op.Concat(_i64(-1), c, axis=0))
    plane = op.Add(op.Mul(op.Unsqueeze(_range(_dim(x, 0)), _i64(1, 2, 3)), _scalar(4)),
                   op.Unsqueeze(_range(_scalar(4)), _i64(0, 1, 3)))                    # [N, 1, 4, 1]
    val = _bilinear(xf, op.Mul(plane, op.Mul(height, width)), ty, tx, width, t)      # [N, K, 4, S, C]
    best, first, _ = _nan_aware_max(op.Transpose(val, perm=[0, 4, 1, 2, 3]), -1, t)     # [N, C, K, 4]
    return _restore(best, input), op.Cast(first, to=_INT32)


# ---- multi-scale RoIAlign ------------------------------------------------------------------


def _multi_scale(roi_align: Callable[..., Any]) -> Callable[..., Any]:
    """The translation of ``multi_scale_roi_align``: each level's boxes (their levels are
    computed in the graph from the boxes, as the public function does) gathered, pooled by
    ``roi_align``'s translation from that level's map, and scattered back in box order; a
    box of no level (negative area) stays 0."""
    def multi_scale_roi_align(inputs: Sequence[_In], rois: _In, levels: _In, spatial_scales: Sequence[float],
                              pooled_height: int, pooled_width: int, sampling_ratio: int, aligned: bool) -> _In:
        first = inputs[0]
        shape = op.Concat(op.Shape(rois, start=0, end=1), op.Shape(first, start=1, end=2),
                          _i64(pooled_height, pooled_width), axis=0)
        out = op.Expand(_const(0, first.dtype), shape)
        for level, (x, scale) in enumerate(zip(inputs, spatial_scales)):
            chosen = op.NonZero(op.Equal(levels, op.CastLike(_scalar(level), levels)))       # [1, M]
            boxes = op.Gather(rois, op.Squeeze(chosen, _i64(0)), axis=0)
            boxes.dtype = rois.dtype  # the tracer leaves it unset; a loop over blocks declares it
            pooled = roi_align(x, boxes, scale, pooled_height, pooled_width, sampling_ratio, aligned)
            out = op.ScatterND(out, op.Transpose(chosen, perm=[1, 0]), pooled)
        return out

    return multi_scale_roi_align


# ---- roi_pool ----------------------------------------------------------------------------


def _pool_bins(start: ir.Value, bin_size: ir.Value, pooled: int, size: ir.Value, t: ir.DataType,
               int_start: ir.Value | None, empty: ir.Value | None) -> tuple[ir.Value, ir.Value]:
    """Bin ``p`` of each box covers ``[lo, hi)``, ``[K, pooled]`` each, clipped to ``[0, size]``.
    Caffe (``int_start`` given) adds the integer start after floor/ceil; mmdetection adds
    the real start before."""
    p = op.Unsqueeze(op.Cast(_range(_scalar(pooled)), to=t), _i64(0))        # [1, P]
    bin2 = op.Unsqueeze(bin_size, _i64(1))
    a, b = op.Mul(p, bin2), op.Mul(op.Add(p, _const(1, t)), bin2)
    if int_start is not None:
        s = op.Unsqueeze(int_start, _i64(1))
        lo, hi = op.Add(_to_int(op.Floor(a)), s), op.Add(_to_int(op.Ceil(b)), s)
    else:
        s = op.Unsqueeze(start, _i64(1))
        lo, hi = _to_int(op.Floor(op.Add(a, s))), _to_int(op.Ceil(op.Add(b, s)))
    zero = _i64(0)
    lo = op.Min(op.Max(lo, zero), size)
    hi = op.Min(op.Max(hi, zero), size)
    if empty is not None:
        hi = op.Where(op.Unsqueeze(empty, _i64(1)), lo, hi)
    return lo, hi


def _roi_pool(
    input: _In, rois: _In, spatial_scale: float, pooled_height: int, pooled_width: int,
    continuous: bool,
) -> tuple[_In, _In]:
    x, t = _compute_type(input)
    b, x1, y1, x2, y2 = _columns(rois, t)
    s = _const(spatial_scale, t)
    height, width = _dim(x, 2), _dim(x, 3)
    if continuous:
        one = _const(1, t)
        xs, ys = op.Mul(x1, s), op.Mul(y1, s)
        roi_w = op.Sub(op.Mul(op.Add(x2, one), s), xs)
        roi_h = op.Sub(op.Mul(op.Add(y2, one), s), ys)
        zero = _const(0, t)
        empty = op.Or(op.LessOrEqual(roi_w, zero), op.LessOrEqual(roi_h, zero))
        h0, h1 = _pool_bins(ys, op.Div(roi_h, _const(pooled_height, t)), pooled_height, height, t, None, empty)
        w0, w1 = _pool_bins(xs, op.Div(roi_w, _const(pooled_width, t)), pooled_width, width, t, None, empty)
    else:
        ops = _GraphOps(t)
        xr, yr, xr2, yr2 = (_to_int(round_half_away(op.Mul(c, s), ops)) for c in (x1, y1, x2, y2))
        one = _i64(1)
        roi_w = op.Max(op.Add(op.Sub(xr2, xr), one), one)
        roi_h = op.Max(op.Add(op.Sub(yr2, yr), one), one)
        h0, h1 = _pool_bins(yr, op.Div(op.Cast(roi_h, to=t), _const(pooled_height, t)), pooled_height, height, t,
                            yr, None)
        w0, w1 = _pool_bins(xr, op.Div(op.Cast(roi_w, to=t), _const(pooled_width, t)), pooled_width, width, t,
                            xr, None)

    val, _, big_w, _ = _bin_cells(x, b, h0, h1, w0, w1, pooled_height, pooled_width, False)
    # A maximum is unchanged by the padding's repeats, and the first maximum is never a
    # padding slot but a cell of the bin: slot (gy, gx) is (h0 + gy, w0 + gx).
    best, first, _ = _nan_aware_max(val, -1, t)
    y = op.Add(op.Unsqueeze(h0, _i64(1, 3)), op.Div(first, big_w))
    argmax = op.Add(op.Mul(y, width), op.Add(op.Unsqueeze(w0, _i64(1, 2)), op.Mod(first, big_w)))
    empty_bin = op.Unsqueeze(op.Or(op.Unsqueeze(op.LessOrEqual(h1, h0), _i64(2)),
                                   op.Unsqueeze(op.LessOrEqual(w1, w0), _i64(1))), _i64(1))  # [K, 1, ph, pw]
    out = op.Where(empty_bin, _const(0, t), best)
    argmax = op.Where(empty_bin, _i64(-1), argmax)
    return _restore(out, input), op.Cast(argmax, to=_INT32)


# ---- blocks of boxes --------------------------------------------------------------------------
# Each box's height and width in map cells, from which the decompositions are run over
# blocks of boxes of similar size (_blocks.py).


def _axis_aligned_sides(arguments: Mapping[str, Any]) -> tuple[ir.Value, ir.Value]:
    _, x1, y1, x2, y2 = _columns(arguments["rois"], _FLOAT)
    s = _const(arguments["spatial_scale"], _FLOAT)
    return op.Mul(op.Sub(y2, y1), s), op.Mul(op.Sub(x2, x1), s)


def _rotated_sides(arguments: Mapping[str, Any]) -> tuple[ir.Value, ir.Value]:
    w, h = _columns(arguments["rois"], _FLOAT, 6)[3:5]
    s = _const(arguments["spatial_scale"], _FLOAT)
    return op.Mul(h, s), op.Mul(w, s)


def _bezier_sides(arguments: Mapping[str, Any]) -> tuple[ir.Value, ir.Value]:
    return _bezier_spans(*_bezier_curves(arguments["rois"], arguments["spatial_scale"], _FLOAT))


_ARGMAX = (None, _INT32)


def translations(align_avg: str, block_values: int | None) -> dict[str, Callable[..., Any]]:
    """Each op's translation by op name; ``align_avg`` and ``block_values`` as
    ``roiops.onnx.translation_table``'s."""
    def run(translate: Callable[..., Any], sides: Callable[[Mapping[str, Any]], tuple[ir.Value, ir.Value]],
            **how: Any) -> Callable[..., Any]:
        return translate if block_values is None else blocked(translate, Blocking(sides, **how), block_values)

    roi_align = _roi_align_native if align_avg == "RoiAlign" else run(_roi_align_decomposed, _axis_aligned_sides)
    return {"roi_align": roi_align, "roi_align_max": run(_roi_align_max, _axis_aligned_sides, outputs=_ARGMAX),
            "roi_pool": run(_roi_pool, _axis_aligned_sides, outputs=_ARGMAX),
            "ps_roi_align": run(_ps_roi_align, _axis_aligned_sides, position_sensitive=True),
            "ps_roi_pool": run(_ps_roi_pool, _axis_aligned_sides, position_sensitive=True),
            "deform_roi_pool": run(_deform_roi_pool, _axis_aligned_sides, per_box=("rois", "offset")),
            "roi_align_rotated": run(_roi_align_rotated, _rotated_sides),
            "riroi_align_rotated": run(_riroi_align_rotated, _rotated_sides),
            "border_align": _border_align, "bezier_align": run(_bezier_align, _bezier_sides),
            "prroi_pool": run(_prroi_pool, _axis_aligned_sides), "multi_scale_roi_align": _multi_scale(roi_align)}
