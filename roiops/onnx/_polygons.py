"""ONNX translation of ``polygon_targets`` (mask targets rasterised from polygons by pycocotools'
rule, csrc/polygon_raster.h), vectorised and bit for bit the kernel's: every edge of every
target's instance is checked against every column centre at once, the pairs of trace points
where the traced outline crosses a centre become column-major marks, and each polygon's
marks toggle its pixels through a running count (CumSum) whose parity is the even-odd rule.

The graph takes the op's packed polygons: ``coords`` ``[2V]`` (x, y pairs, float64),
``vertex_offsets`` ``[n + 1]`` (polygon i's vertices), ``polygon_offsets`` ``[G + 1]``
(instance g's polygons), ``boxes`` ``[P, 4]`` (float32) and ``indices`` ``[P]`` in
``[0, G)`` (not checked: a graph cannot raise), with V, n, G and P dynamic. Per target, its
instance's edges lie along a padded axis E (the most vertices of the targets' instances)
and its polygons along Q (the most polygons). Memory: arrays ``[P, E]`` per edge, a bool
``[P, E, M]`` of the (edge, column) candidates, arrays ``[K]`` per candidate crossing (K is
about two per column per polygon for ordinary outlines, at most P E M) and the parity
counts ``[P, Q, M * M + 1]`` (int32).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
from onnxscript import ir

from ._graph import (op, _DOUBLE, _FLOAT, _I64_MAX, _INT32, _INT64, _Constants, _In, _as, _columns, _largest_or_one,
                     _take)

# Lattice coordinates are clamped to +-2^40 (NaN to the negative end), so every edge has at
# most 2^41 steps; C's (int) of a NaN trace value is taken as -2^62 (polygon_raster.h).
_LATTICE_LIMIT = float(2**40)
_NAN_WALK = float(-(2**62))


def _clamp(z: ir.Value, low: float, high: ir.Value | float, c: _Constants) -> ir.Value:
    """C's ``(int)z`` as the kernel guards it: NaN and values below ``low`` give ``low``, values
    above ``high`` give ``high`` (the Where keeps NaN away from the Cast)."""
    top = c(high) if isinstance(high, float) else high
    return op.Cast(op.Where(op.GreaterOrEqual(z, c(low)), op.Min(z, top), c(low)), to=_INT64)


def _lattice(v: ir.Value, c: _Constants) -> ir.Value:
    """``(int)(5 * v + 0.5)`` in two roundings (separate nodes, never fused), clamped."""
    return _clamp(op.Add(op.Mul(v, c(5.0)), c(0.5)), -_LATTICE_LIMIT, _LATTICE_LIMIT, c)


def _ratio(side: ir.Value, size: int, c: _Constants) -> ir.Value:
    """``M / max(side, 0.1)`` in float64 as NumPy 2 computes it: a float32 division, unless the
    float32 side is under 0.1 (then ``M / 0.1`` in double)."""
    small = op.Less(side, c(np.float32(0.1), _FLOAT))
    return op.Where(small, c(size / 0.1), op.Cast(op.Div(c(float(size), _FLOAT), side), to=_DOUBLE))


def _mark(ua: ir.Value, va: ir.Value, ub: ir.Value, vb: ir.Value, size: int, c: _Constants) -> ir.Value:
    """pycocotools' mark of consecutive trace points a -> b (polygon_raster.h ``mark``): the
    column-major index ``c * M + row`` in ``[0, M * M]``, or ``M * M`` (past the grid) for
    none."""
    xd = op.Where(op.Less(ub, ua), ub, op.Sub(ub, c.scalar(1)))
    off = op.Sub(xd, c.scalar(2))
    column = op.Div(op.Max(off, c.scalar(0)), c.scalar(5))  # non-negative operands only
    valid = op.And(op.And(op.Not(op.Equal(ua, ub)), op.GreaterOrEqual(off, c.scalar(0))),
                   op.And(op.Equal(op.Mod(op.Max(off, c.scalar(0)), c.scalar(5)), c.scalar(0)),
                          op.Less(column, c.scalar(size))))
    # ceil((min(va, vb) - 2) / 5) clamped to [0, M]: whatever is <= 0 clamps to 0.
    above = op.Max(op.Sub(op.Min(va, vb), c.scalar(2)), c.scalar(0))
    row = op.Min(op.Div(op.Add(above, c.scalar(4)), c.scalar(5)), c.scalar(size))
    return op.Where(valid, op.Add(op.Mul(op.Min(column, c.scalar(size)), c.scalar(size)), row), c.scalar(size * size))


class _Edges:
    """Edges set up as rleFrPoly sets them up: endpoints swapped ("flip") so that the major
    coordinate grows, steps ``t = 0..n`` along it; each field an array of one shape (``c``:
    the translation's constants)."""

    def __init__(self, c: _Constants, steep: ir.Value, flip: ir.Value, xs: ir.Value, ys: ir.Value, n: ir.Value,
                 minor: ir.Value) -> None:
        self.c = c
        self.steep, self.flip, self.xs, self.ys, self.n, self.minor = steep, flip, xs, ys, n, minor
        self.minor_f, self.n_f = op.Cast(minor, to=_DOUBLE), op.Cast(n, to=_DOUBLE)
        # Minor coordinate per step; 0 / 0 = NaN along a zero-length edge, as in C.
        self.slope = op.Div(self.minor_f, self.n_f)
        self.base = op.Cast(op.Where(steep, xs, ys), to=_DOUBLE)

    @staticmethod
    def between(c: _Constants, x0: ir.Value, y0: ir.Value, x1: ir.Value, y1: ir.Value) -> _Edges:
        dx, dy = op.Abs(op.Sub(x1, x0)), op.Abs(op.Sub(y1, y0))
        steep = op.Less(dx, dy)
        # (onnxruntime has no Where for bool values)
        flip = op.Or(op.And(steep, op.Greater(y0, y1)), op.And(op.Not(steep), op.Greater(x0, x1)))
        xs, ys = op.Where(flip, x1, x0), op.Where(flip, y1, y0)
        xe, ye = op.Where(flip, x0, x1), op.Where(flip, y0, y1)
        minor = op.Where(steep, op.Sub(xe, xs), op.Sub(ye, ys))
        return _Edges(c, steep, flip, xs, ys, op.Where(steep, dy, dx), minor)

    def take(self, index: ir.Value) -> _Edges:
        """The edges at ``index`` of the flattened arrays."""
        def take(v: ir.Value) -> ir.Value:
            return op.Gather(op.Reshape(v, self.c.i64(-1)), index)
        return _Edges(self.c, *(take(v) for v in (self.steep, self.flip, self.xs, self.ys, self.n, self.minor)))

    def t(self, d: ir.Value) -> ir.Value:
        """Step of trace point d in vertex order (the flipped walk runs t = n - d)."""
        return op.Where(self.flip, op.Sub(self.n, d), d)

    def walk(self, t: ir.Value) -> ir.Value:
        """``start + slope * t + 0.5`` with C's three roundings (before the truncation)."""
        return op.Add(op.Add(self.base, op.Mul(self.slope, op.Cast(t, to=_DOUBLE))), self.c(0.5))

    def point(self, d: ir.Value) -> tuple[ir.Value, ir.Value]:
        """Trace point d (in vertex order) as (u, v) = (x, y) on the lattice."""
        t = self.t(d)
        w = _clamp(self.walk(t), _NAN_WALK, -_NAN_WALK, self.c)
        return op.Where(self.steep, w, op.Add(self.xs, t)), op.Where(self.steep, op.Add(self.ys, t), w)

    def first(self) -> tuple[ir.Value, ir.Value]:
        return self.point(op.Expand(self.c.scalar(0), op.Shape(self.n)))

    def last(self) -> tuple[ir.Value, ir.Value]:
        return self.point(self.n)


def _search_steps(size: int) -> tuple[float, int]:
    """How far (in steps) the kernel's crossing of a column centre along a y-major edge can lie
    from the real-valued one computed here, and the binary search steps covering that window.

    Along such an edge (n = dy <= 2^41 steps, 1 <= |minor| < n, t in [0, n]) the kernel's
    trace value z(t) = fl(fl(xs + fl(fl(minor / n) t)) + 0.5) differs from its real value
    r(t) = xs + minor t / n + 0.5 by at most 2.0001u (|minor| + |r| + 1.5), u = 2^-53, so z
    lies on r's side of the threshold T = X + 1 <= 5M - 2 wherever |r - T| exceeds
    2.0002u (|minor| + T + 1.5): at every step more than 2.0002u n (T + 2.5) <= 1.0001 (5M + 0.5) / 2048
    from the real crossing t* = (T - 0.5 - xs) n / minor (r moves |minor| / n per step). The
    computed t* (and n - t*) is within 2^-10 of it (|t*| <= n + 1: z(0) = r(0) exactly)."""
    reach = (5 * size + 1) / 2048 * 1.001 + 1
    return reach, max(1, math.ceil(math.log2(2 * reach + 4)))


def _crossings(e: _Edges, column: ir.Value, u_first: ir.Value, rising: ir.Value, size: int) -> ir.Value:
    """The mark of each edge's candidate pair for its column c (arrays of one shape): the pair
    of trace points whose u values are ``{X, X + 1}``, ``X = 5c + 2``, which the edge's
    u range holds."""
    c = e.c
    x = op.Add(op.Mul(column, c.scalar(5)), c.scalar(2))
    # The pair ends at the first trace point d past X: u >= X + 1 rising, u <= X falling.
    # Along an x-major edge u moves one step per point.
    d_flat = op.Where(rising, op.Sub(op.Add(x, c.scalar(1)), u_first), op.Sub(u_first, x))
    # Along a y-major edge u = (int)z is monotone in d (each rounding is), so that point is
    # found by a binary search on the kernel's own float64 evaluations of z (u >= X + 1 iff
    # z >= X + 1, as X + 1 > 0), over the few steps around the real-valued crossing where
    # rounding can move it (_search_steps). The search starts from a point that passes
    # (or from n, which does); points before the edge (d < 0) continue the monotone u on the
    # near side of X and never pass.
    reach, steps = _search_steps(size)
    threshold = op.Cast(op.Add(x, c.scalar(1)), to=_DOUBLE)
    t_star = op.Div(op.Mul(op.Sub(op.Sub(threshold, c(0.5)), e.base), e.n_f), e.minor_f)
    d_star = op.Where(e.flip, op.Sub(e.n_f, t_star), t_star)
    d = _clamp(op.Ceil(op.Add(d_star, c(reach))), 0.0, e.n_f, c)
    for bit in reversed(range(steps)):
        trial = op.Sub(d, c.scalar(1 << bit))
        passed = op.Equal(op.GreaterOrEqual(e.walk(e.t(trial)), threshold), rising)
        d = op.Where(passed, trial, d)
    d = op.Where(e.steep, d, d_flat)
    return _mark(*e.point(op.Sub(d, c.scalar(1))), *e.point(d), size, c)


def _polygon_targets(coords: _In, vertex_offsets: _In, polygon_offsets: _In, boxes: _In, indices: _In,
                     size: int) -> _In:
    m, area = size, size * size
    c = _Constants(_DOUBLE)  # c(v): a float64 constant
    coords = _as(coords, _DOUBLE)
    vo, po = op.Cast(vertex_offsets, to=_INT64), op.Cast(polygon_offsets, to=_INT64)
    g = op.Cast(indices, to=_INT64)
    num_p = c.size(boxes, 0)

    # Per vertex (and one dummy vertex V, standing in for padding): its polygon, the
    # polygon's next vertex (the last one closes on the first) and whether it is the first.
    xy = op.Reshape(coords, c.i64(-1, 2))
    num_v = c.size(xy, 0)
    xy = op.Concat(xy, c(np.zeros((1, 2)), _DOUBLE), axis=0)          # [V + 1, 2]
    vertex = c.range(op.Add(num_v, c.scalar(1)))
    ends = op.Slice(vo, c.i64(1), c.i64(_I64_MAX))                           # [n], in [0, V]
    hits = op.ScatterElements(op.Mul(vertex, c.scalar(0)), ends, op.Expand(c.scalar(1), op.Shape(ends)),
                              reduction="add")
    polygon = op.CumSum(hits, c.scalar(0))  # polygons ending at or before the vertex
    vo_ext = op.Concat(vo, op.Gather(vo, c.i64(-1)), axis=0)                 # [n + 2]
    start, end = op.Gather(vo_ext, polygon), op.Gather(vo_ext, op.Add(polygon, c.scalar(1)))
    after = op.Add(vertex, c.scalar(1))
    following = op.Where(op.Less(after, end), after, start)
    first = op.Equal(vertex, start)

    # Per target p: its instance's vertices and polygons, padded to E and Q slots.
    p_begin, p_end = op.Gather(po, g), op.Gather(po, op.Add(g, c.scalar(1)))
    v_begin, v_end = op.Gather(vo, p_begin), op.Gather(vo, p_end)
    v_count, p_count = op.Sub(v_end, v_begin), op.Sub(p_end, p_begin)
    num_e, num_q = _largest_or_one(v_count), _largest_or_one(p_count)  # a slot even without targets
    slot = op.Unsqueeze(c.range(num_e), c.i64(0))                             # [1, E]
    begin = op.Unsqueeze(v_begin, c.i64(1))
    real = op.Less(slot, op.Unsqueeze(v_count, c.i64(1)))                     # [P, E]
    i = op.Where(real, op.Add(begin, slot), num_v)
    next_slot = op.Where(real, op.Sub(op.Gather(following, i), begin), slot)
    opens = op.Or(op.Gather(first, i), op.Not(real))  # no mark carried into this edge
    q = op.Where(real, op.Sub(op.Gather(polygon, i), op.Unsqueeze(p_begin, c.i64(1))), c.scalar(0))

    # The box map, as detectron2 computes it (float32 sides and ratios, float64 scaling).
    x0, y0, x1, y1 = _columns(boxes, _FLOAT, width=4)
    ratio_w, ratio_h = _ratio(op.Sub(x1, x0), m, c), _ratio(op.Sub(y1, y0), m, c)
    # Equal ratios (compared in float32) scale both axes by ratio_h.
    same = op.Equal(op.Cast(ratio_w, to=_FLOAT), op.Cast(ratio_h, to=_FLOAT))
    scale_x, scale_y = op.Where(same, ratio_h, ratio_w), ratio_h

    def lattice(column: int, origin: ir.Value, scale: ir.Value) -> ir.Value:
        values = op.Gather(_take(xy, column, axis=1), i)
        shifted = op.Sub(values, op.Unsqueeze(op.Cast(origin, to=_DOUBLE), c.i64(1)))
        return _lattice(op.Mul(shifted, op.Unsqueeze(scale, c.i64(1))), c)

    lx, ly = lattice(0, x0, scale_x), lattice(1, y0, scale_y)                  # [P, E]
    edges = _Edges.between(c, lx, ly, op.GatherElements(lx, next_slot, axis=1),
                           op.GatherElements(ly, next_slot, axis=1))
    u_first, v_first = edges.first()
    u_last, v_last = edges.last()
    plane = op.Add(op.Mul(op.Unsqueeze(c.range(num_p), c.i64(1)), num_q), q)   # (target, polygon) of each slot

    # The trace runs on from each edge's last point to the next edge's first (the same
    # vertex, but recomputed: they can differ), within a polygon.
    before = op.Max(op.Sub(c.range(num_e), c.scalar(1)), c.scalar(0))  # slot 0 opens a polygon: any will do
    u_prev, v_prev = op.Gather(u_last, before, axis=1), op.Gather(v_last, before, axis=1)
    carried = op.Where(opens, c.scalar(area), _mark(u_prev, v_prev, u_first, v_first, m, c))

    # Within the edges: per column c, a candidate pair where X = 5c + 2 lies in [lo, hi - 1]
    # of the edge's u values (none along an edge of constant u). Only the candidates are
    # computed on (NonZero), so the work grows with the crossings, not with edges x M.
    lo, hi = op.Unsqueeze(op.Min(u_first, u_last), c.i64(2)), op.Unsqueeze(op.Max(u_first, u_last), c.i64(2))
    x = c(np.arange(size, dtype=np.int64) * 5 + 2, _INT64)                # [M]
    candidate = op.And(op.And(op.GreaterOrEqual(x, lo), op.Less(x, hi)), op.Unsqueeze(real, c.i64(2)))  # [P, E, M]
    found = op.NonZero(candidate)                                              # [3, K]: target, slot, column

    edge = op.Add(op.Mul(_take(found, 0, axis=0), num_e), _take(found, 1, axis=0))   # into the flattened [P, E]

    def take(v: ir.Value) -> ir.Value:
        return op.Gather(op.Reshape(v, c.i64(-1)), edge)

    within = _crossings(edges.take(edge), _take(found, 2, axis=0), take(u_first), take(op.Greater(u_last, u_first)),
                        m)

    # Each polygon's marks toggle its pixels in column-major order (the parity runs through
    # the whole grid; index M * M lies past it); the instance is the union of its polygons.
    flat = op.Concat(op.Reshape(op.Add(op.Mul(plane, c.scalar(area + 1)), carried), c.i64(-1)),
                     op.Add(op.Mul(take(plane), c.scalar(area + 1)), within), axis=0)
    # int32 counts: only their parity matters.
    planes = op.Unsqueeze(op.Mul(op.Mul(num_p, num_q), c.scalar(area + 1)), c.i64(0))
    counts = op.ScatterElements(op.Expand(c(0, _INT32), planes), flat,
                                op.Expand(c(1, _INT32), op.Shape(flat)), reduction="add")
    counts = op.Reshape(counts, op.Concat(op.Unsqueeze(num_p, c.i64(0)), op.Unsqueeze(num_q, c.i64(0)),
                                          c.i64(area + 1), axis=0))
    inside = op.Mod(op.CumSum(counts, c.scalar(2)), c(2, _INT32))
    # (ReduceSum, not ReduceMax: its axes input is opset 13's, ReduceMax's opset 18's)
    union = op.ReduceSum(op.Slice(inside, c.i64(0), c.i64(area), c.i64(2)), c.i64(1), keepdims=0)   # [P, M * M]
    columns = op.Reshape(union, op.Concat(op.Unsqueeze(num_p, c.i64(0)), c.i64(m, m), axis=0))
    return op.Greater(op.Transpose(columns, perm=[0, 2, 1]), c(0, _INT32))


TRANSLATIONS: dict[str, Callable[..., Any]] = {"polygon_targets": _polygon_targets}
