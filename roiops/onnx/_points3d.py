"""ONNX translations of the point-cloud operators: points in boxes, RoIAware and RoIPoint
pooling (docs/semantics.md, "Point clouds"). Every (box, point) pair is tested at once, a
``[boxes, points]`` matrix, each rounding step of the inside test one node in the kernels'
coordinate type. The orders the kernels follow (a box's first points, a voxel's first
points) come from running counts (CumSum) and a sort on unique keys (TopK)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from onnxscript import ir

from ._graph import op, _DOUBLE, _FLOAT, _INT32, _INT64, _Constants, _In, _as, _compute_type, _cos_sin


class _Frame:
    """Points ``[B, N, 3]`` against boxes ``[B, M, 7]`` (docs/semantics.md, "Inside") as
    ``[B, M, N]`` arrays: whether each box holds each point and the point's coordinates
    (``lx``, ``ly``) in the box's frame, in the kernels' coordinate type ``t``: float64 for
    float64 points, float32 otherwise (float16/bfloat16 convert exactly)."""

    def __init__(self, points: ir.Value, boxes: ir.Value, c: _Constants) -> None:
        points, t = _compute_type(points)
        self.t = t
        rows = op.Transpose(points, perm=[0, 2, 1])
        px, py, self.pz = (op.Gather(rows, c.i64(i), axis=1) for i in range(3))          # [B, 1, N] each
        b = _as(boxes, t)
        x, y, self.z, dx, dy, dz, yaw = (op.Gather(b, c.i64(i), axis=2) for i in range(7))  # [B, M, 1] each
        self.dx, self.dy, self.dz = dx, dy, dz
        two = c(2, t)
        # The centre height: the sum in float64, rounded once.
        zc = _as(op.Add(_as(self.z, _DOUBLE), op.Div(_as(dz, _DOUBLE), c(2, _DOUBLE))), t)
        # cos(-yaw) and sin(-yaw) in float64, rounded once to t. onnxruntime's float64 Cos
        # and Sin are not libm's (up to 5.7e-16 off); rounded to float32 they were equal
        # for every one of 12 million angles measured.
        cos, sin = _cos_sin(op.Neg(_as(yaw, _DOUBLE)), t)
        sx, sy = op.Sub(px, x), op.Sub(py, y)
        # Each product and sum its own node, rounded as the kernels' (no fused multiply-add).
        self.lx = op.Add(op.Mul(sx, cos), op.Mul(sy, op.Neg(sin)))
        self.ly = op.Add(op.Mul(sx, sin), op.Mul(sy, cos))
        self.hx, self.hy = op.Div(dx, two), op.Div(dy, two)
        # Inclusive on the top and bottom faces, strict on the sides; a NaN height passes.
        self.inside = op.And(op.Not(op.Greater(op.Abs(op.Sub(self.pz, zc)), op.Div(dz, two))),
                             op.And(op.Less(op.Abs(self.lx), self.hx), op.Less(op.Abs(self.ly), self.hy)))

    def voxel(self, grid: tuple[int, int, int], c: _Constants) -> ir.Value:
        """The voxel ``(ix * oy + iy) * oz + iz`` (int64) of each (box, point)."""
        t = self.t
        zero = c(0, t)

        def cell(q: ir.Value, n: int) -> ir.Value:
            # trunc(q) clamped to [0, n - 1] before the conversion: NaN and q <= 0 give 0
            # (floor is trunc for q > 0), infinities n - 1.
            return op.Cast(op.Min(op.Where(op.Greater(q, zero), op.Floor(q), zero), c(n - 1, t)), to=_INT64)

        ox, oy, oz = grid
        ix = cell(op.Div(op.Add(self.lx, self.hx), op.Div(self.dx, c(ox, t))), ox)
        iy = cell(op.Div(op.Add(self.ly, self.hy), op.Div(self.dy, c(oy, t))), oy)
        iz = cell(op.Div(op.Sub(self.pz, self.z), op.Div(self.dz, c(oz, t))), oz)
        return op.Add(op.Mul(op.Add(op.Mul(ix, c.scalar(oy)), iy), c.scalar(oz)), iz)


# ---- points_in_boxes -----------------------------------------------------------------------


def _points_in_boxes(points: _In, boxes: _In, all_boxes: bool) -> _In:
    """``all_boxes``: the membership matrix ``[B, N, M]``. Else each point's first box (int64
    ``[B, N]``, -1 for none): the first maximum (ArgMax) of its memberships followed by a 1,
    which is the 1 (index M) when no box holds it."""
    c = _Constants()
    inside = _Frame(points, boxes, c).inside                                         # [B, M, N]
    if all_boxes:
        return op.Transpose(inside, perm=[0, 2, 1])
    inside = op.Cast(inside, to=_INT32)
    ones = op.Expand(c(1, _INT32), op.Concat(op.Shape(points, start=0, end=1), c.i64(1),
                                             op.Shape(points, start=1, end=2), axis=0))
    first = op.ArgMax(op.Concat(inside, ones, axis=1), axis=1, keepdims=0)
    return op.Where(op.Equal(first, c.size(boxes, 1)), c.scalar(-1), first)


# ---- roipoint_pool3d -----------------------------------------------------------------------


def _roipoint_pool3d(points: _In, features: _In, boxes: _In, num_samples: int) -> tuple[_In, _In, _In]:
    """Each box's first ``n = min(count, S)`` inside points: the inside point whose running
    count in point order is r (from 1) goes to slot r when r <= S, the others to slot 0;
    row j copies slot ``j mod n + 1``. ScatterElements adds each point's index to a zero,
    so each slot from 1 gets exactly the index of its point."""
    c = _Constants()
    frame = _Frame(points, boxes, c)
    inside = op.Cast(frame.inside, to=_INT64)                                          # [B, M, N]
    n, s = c.size(points, 1), c.scalar(num_samples)
    rank = op.CumSum(inside, c.scalar(2))
    slot = op.Where(op.And(frame.inside, op.LessOrEqual(rank, s)), rank, c.scalar(0))
    scene = op.Shape(inside, start=0, end=2)
    point = op.Expand(op.Unsqueeze(c.range(n), c.i64(0, 1)), op.Shape(inside))
    first = op.ScatterElements(op.Expand(c.scalar(0), op.Concat(scene, c.i64(num_samples + 1), axis=0)), slot, point,
                               axis=2, reduction="add")                                  # [B, M, S + 1]
    taken = op.Min(op.ReduceSum(inside, c.i64(2), keepdims=0), s)                        # [B, M]
    empty = op.Equal(taken, c.scalar(0))
    cyclic = op.Mod(op.Unsqueeze(c.range(s), c.i64(0, 1)), op.Unsqueeze(op.Max(taken, c.scalar(1)), c.i64(2)))
    index = op.GatherElements(first, op.Add(cyclic, c.scalar(1)), axis=2)                     # [B, M, S]
    # Each scene's rows (x, y, z, *features) and a zero row (row N, for the empty boxes),
    # as one table [B * (N + 1), 3 + C].
    rows = op.Concat(points, features, axis=2)
    width = op.Shape(rows, start=2)
    rows = op.Concat(rows, op.Expand(op.CastLike(c(0, _FLOAT), rows),
                                     op.Concat(op.Shape(rows, start=0, end=1), c.i64(1), width, axis=0)), axis=1)
    base = op.Unsqueeze(op.Mul(c.range(c.size(points, 0)), op.Add(n, c.scalar(1))), c.i64(1, 2))
    none = op.Unsqueeze(empty, c.i64(2))
    pooled = op.Gather(op.Reshape(rows, op.Concat(c.i64(-1), width, axis=0)), op.Add(base, op.Where(none, n, index)),
                       axis=0)
    return pooled, empty, op.Cast(op.Where(none, c.scalar(-1), index), to=_INT32)


# ---- roiaware_pool3d -----------------------------------------------------------------------


def _roiaware_pool3d(points: _In, features: _In, boxes: _In, out_x: int, out_y: int, out_z: int, max_points: int,
                     max_mode: bool) -> tuple[_In, _In]:
    """The kept (box, point) pairs listed in (box, voxel, point) order, then per voxel the
    first maximum or the sum in point order.

    The pairs with the point inside the box are sorted (TopK) by the unique keys
    ``(box * V + voxel) * N + point``, which lines up each voxel's points in point order;
    only those pairs: a box holds few of the points. A pair's rank in its voxel is its
    position less the voxel's start (an exclusive running count of the voxels' counts),
    and the pairs of rank below ``max_points`` are kept. Max: a segmented scan of
    ``ceil(log2(max_points))`` doubling steps (:func:`_first_max`). Avg: ScatterElements adds
    the kept features into their voxels in list order, which is point order per voxel
    (onnxruntime applies the updates in order)."""
    c = _Constants()
    grid = (out_x, out_y, out_z)
    v = out_x * out_y * out_z
    frame = _Frame(op.Unsqueeze(points, c.i64(0)), op.Unsqueeze(boxes, c.i64(0)), c)
    voxel = op.Squeeze(frame.voxel(grid, c), c.i64(0))                                  # [K, N]
    n, k = c.size(points, 0), op.Shape(boxes, start=0, end=1)
    box_voxel = op.Add(op.Unsqueeze(op.Mul(c.range(op.Squeeze(k, c.i64(0))), c.scalar(v)), c.i64(1)), voxel)
    pair = op.Squeeze(op.NonZero(op.Reshape(op.Squeeze(frame.inside, c.i64(0)), c.i64(-1))), c.i64(0))  # [I]
    group, point = op.Gather(op.Reshape(box_voxel, c.i64(-1)), pair), op.Mod(pair, op.Max(n, c.scalar(1)))  # N >= 1
    _, order = op.TopK(op.Add(op.Mul(group, n), point), op.Shape(pair), largest=0, sorted=1)
    group, point = op.Gather(group, order), op.Gather(point, order)
    count = op.ScatterElements(op.Expand(c.scalar(0), op.Mul(k, c.i64(v))), group,
                               op.Expand(c.scalar(1), op.Shape(group)), reduction="add")      # [K * V]
    rank = op.Sub(c.range(c.size(group, 0)), op.Gather(op.CumSum(count, c.scalar(0), exclusive=1), group))
    cap = c.scalar(max_points)
    kept = op.Less(rank, cap)
    group, member = op.Compress(group, kept), op.Compress(point, kept)                 # [P]
    taken = op.Min(count, cap)                                                          # [K * V]
    first = op.CumSum(taken, c.scalar(0), exclusive=1)  # each voxel's first pair in the list
    full = op.Greater(taken, c.scalar(0))
    # Each voxel's last pair in the list; an empty voxel's is pair P, a padding entry.
    last = op.Where(full, op.Sub(op.Add(first, taken), c.scalar(1)), op.Shape(member))
    channels = op.Shape(features, start=1, end=2)
    out_shape = op.Concat(k, c.i64(*grid), channels, axis=0)
    a = _DOUBLE if features.dtype == _DOUBLE else _FLOAT  # the kernels' accumulation type
    values = _as(op.Gather(features, member, axis=0), a)                               # [P, C]
    if max_mode:
        who = _first_max(values, member, op.Gather(first, group), max_points, a, c)
        who = op.Concat(who, op.Expand(c.scalar(-1), op.Concat(c.i64(1), channels, axis=0)), axis=0)
        at = op.Expand(op.Unsqueeze(last, c.i64(1)), op.Concat(op.Shape(last), channels, axis=0))
        who = op.GatherElements(who, at, axis=0)                                         # [K * V, C]
        # The values are read from the features by the argmax (onnxruntime's Where turns a
        # -0.0 it selects into +0.0): element N * C, after the features, is the 0 of the
        # voxels that take none.
        width = op.Squeeze(channels, c.i64(0))
        flat = op.Concat(op.Reshape(features, c.i64(-1)), op.CastLike(c((0,), _FLOAT), features), axis=0)
        at = op.Add(op.Mul(who, width), op.Unsqueeze(c.range(width), c.i64(0)))
        out = op.Gather(flat, op.Where(op.Less(who, c.scalar(0)), op.Mul(n, width), at), axis=0)
        return op.Reshape(out, out_shape), op.Cast(op.Reshape(who, out_shape), to=_INT32)
    sums = op.ScatterElements(op.Expand(c(0, a), op.Concat(op.Shape(taken), channels, axis=0)),
                              op.Expand(op.Unsqueeze(group, c.i64(1)), op.Shape(values)), values, axis=0,
                              reduction="add")
    mean = op.Div(sums, op.Unsqueeze(op.Cast(op.Max(taken, c.scalar(1)), to=a), c.i64(1)))
    out = op.Where(op.Unsqueeze(full, c.i64(1)), mean, c(0, a))  # a sum from +0.0 is never -0.0
    last_point = op.Gather(op.Concat(member, c.i64(-1), axis=0), last)
    saved = op.Concat(op.Unsqueeze(taken, c.i64(1)), op.Unsqueeze(last_point, c.i64(1)), axis=1)
    return (_as(op.Reshape(out, out_shape), features.dtype),
            op.Cast(op.Reshape(saved, op.Concat(k, c.i64(*grid, 2), axis=0)), to=_INT32))


def _first_max(values: ir.Value, point: ir.Value, start: ir.Value, max_points: int, a: ir.DataType, c: _Constants
               ) -> ir.Value:
    """For the list ``values [P, C]`` cut into runs of at most ``max_points`` entries
    (``start [P]``: the first position of each entry's run), the ``point`` of each entry's
    first maximum of its run up to itself, -1 when there is none. Each doubling step lets an
    entry take its partner's (value, point) ``step`` places left when that lies in its run
    and is at least as large: the earlier of equal values wins, as the kernels' "strictly
    greater" does. NaN and -inf count as -inf, which is never taken. (onnxruntime's Where
    may turn the -0.0 of a carried value into +0.0: equal for the comparisons.)"""
    ninf = c(-np.inf, a)
    best = op.Where(op.IsNaN(values), ninf, values)
    who = op.Where(op.Greater(best, ninf), op.Unsqueeze(point, c.i64(1)), c.scalar(-1))
    at = c.range(c.size(values, 0))
    step = 1
    while step < max_points:  # ceil(log2(max_points)) steps cover a whole run
        src = op.Sub(at, c.scalar(step))
        same = op.Unsqueeze(op.GreaterOrEqual(src, start), c.i64(1))
        src = op.Max(src, c.scalar(0))
        left, left_who = op.Gather(best, src, axis=0), op.Gather(who, src, axis=0)
        take = op.And(same, op.GreaterOrEqual(left, best))
        best, who = op.Where(take, left, best), op.Where(take, left_who, who)
        step *= 2
    return who


TRANSLATIONS: dict[str, Callable[..., Any]] = {
    "points_in_boxes": _points_in_boxes, "roiaware_pool3d": _roiaware_pool3d, "roipoint_pool3d": _roipoint_pool3d}
