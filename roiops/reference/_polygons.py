"""Polygon masks cropped to a box, as detectron2's ``PolygonMasks.crop_and_resize`` makes them
(``rasterize_polygons_within_box``: shift, scale, pycocotools' ``frPyObjects``, ``merge``,
``decode``), in NumPy; bit for bit detectron2's result under NumPy 2. csrc/polygon_raster.h
is the same rule in C++.

Which pixels are inside. The box is mapped onto the M x M grid: its corner ``(x0, y0)`` to
0, its width and height to M (a side under 0.1 counts as 0.1); pixel ``(row r, column c)``
has its centre at ``(c + 1/2, r + 1/2)``. pycocotools traces each polygon's outline on a
lattice of 1/5 pixel: a vertex coordinate ``v`` goes to ``int(5 v + 1/2)``, truncated
toward zero (so coordinates down to -0.3 go to 0), and each edge is stepped one lattice
unit at a time along its longer axis, the other coordinate rounded the same way. Where two
consecutive trace points lie on either side of a column's centre line ``x = c + 1/2``, the
outline crosses that column at the upper point of the two (the smaller y). A pixel is
inside the polygon when an odd number of crossings of its column lie above its centre
(even-odd rule: self-intersecting outlines alternate; a crossing above the grid counts for
the whole column); the mask is the union of the instance's polygons. Only the traced
outline counts: a pixel whose centre lies within about 0.3 pixel of an edge can fall
either way, and a sliver thinner than that can cover nothing.

Outside pycocotools' domain (a scaled coordinate or edge beyond about 4e8 pixels, where its
C ints overflow) lattice coordinates are clamped to +-2^40, NaN to -2^40, as in the C++
kernel. The trace is never materialised: each edge is visited at its crossings of the M
column centres only, so huge coordinates cost no more than small ones.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["rasterize_in_box"]

# Lattice coordinates are clamped here (see the module docstring).
_LATTICE_LIMIT = 2**40
# C's (int) of NaN on x86 (the trace's minor coordinate along a zero-length edge): the most
# negative value, whose row clamps to 0.
_NAN_WALK = -(2**62)


def rasterize_in_box(polygons: list[np.ndarray], box: np.ndarray, mask_size: int) -> np.ndarray:
    """detectron2's ``rasterize_polygons_within_box(polygons, box, mask_size)``: bool ``[M, M]``
    indexed ``[y, x]``. ``polygons`` are flat ``[x0, y0, x1, y1, ...]`` (float64), ``box`` is
    ``(x0, y0, x1, y1)`` read as float32, as detectron2 gets it from its boxes tensor."""
    m = int(mask_size)
    mask = np.zeros((m, m), dtype=bool)
    if not polygons:
        return mask
    box = np.asarray(box, dtype=np.float32)
    with np.errstate(all="ignore"):  # inf and NaN coordinates have their defined lattice values
        x0, y0, sx, sy = _box_map(box, m)
        for polygon in polygons:
            p = np.array(polygon, dtype=np.float64).reshape(-1)
            xs = _lattice((p[0::2] - x0) * sx)
            ys = _lattice((p[1::2] - y0) * sy)
            if xs.size:  # no vertices, no outline
                mask |= _polygon_mask(xs.tolist(), ys.tolist(), m)
    return mask


def _box_map(box: np.ndarray, m: int) -> tuple[np.float64, np.float64, np.float64, np.float64]:
    """The box corner and the x and y scales, all float64 as NumPy applies them to the
    float64 polygons (float32 values promote exactly)."""
    w = box[2] - box[0]  # float32 scalars subtract in float32
    h = box[3] - box[1]
    ratio_w, ratio_h = _ratio(w, m), _ratio(h, m)
    # ratio_h == ratio_w: NumPy 2 compares a Python float with a float32 scalar in float32
    # (NumPy 1.x: in float64). Equal ratios scale both axes by ratio_h.
    if isinstance(ratio_w, float) == isinstance(ratio_h, float):
        same = bool(ratio_w == ratio_h)
    else:
        same = bool(np.float32(ratio_w) == np.float32(ratio_h))
    sy = np.float64(ratio_h)
    return np.float64(box[0]), np.float64(box[1]), sy if same else np.float64(ratio_w), sy


def _ratio(side: np.float32, m: int) -> np.float32 | float:
    """``mask_size / max(side, 0.1)``. Python's max keeps the float32 side unless
    ``0.1 > side`` (NumPy 2 compares in float32, which picks the same sides as float64
    would; NaN is kept). NumPy 2 divides a Python int by a float32 scalar in float32 (NumPy
    1.x did it in float64); Python divides by 0.1 in double."""
    if np.float32(0.1) > side:
        return m / 0.1
    return np.float32(m) / side


def _lattice(v: np.ndarray) -> np.ndarray:
    """C's ``(int)(5 * v + .5)`` (two roundings, then truncation toward zero), clamped to
    +-2^40 with NaN at the negative end: int64."""
    z = 5.0 * v
    z = z + 0.5
    z = np.where(np.isnan(z), -float(_LATTICE_LIMIT), np.clip(z, -float(_LATTICE_LIMIT), float(_LATTICE_LIMIT)))
    return np.trunc(z).astype(np.int64)


def _trunc_walk(z: np.ndarray) -> np.ndarray:
    """C's ``(int)z`` of trace values (within +-2^42), NaN to the most negative value."""
    z = np.where(np.isnan(z), float(_NAN_WALK), z)
    return np.trunc(z).astype(np.int64)


class _Edge:
    """One edge's trace as ``rleFrPoly`` sets it up: endpoints swapped ("flip") so that the
    major coordinate grows, steps ``t = 0..n`` along it; ``points(d)`` gives trace point
    ``d`` in vertex order (``d = 0`` at the edge's first vertex)."""

    def __init__(self, x0: int, y0: int, x1: int, y1: int) -> None:
        dx, dy = abs(x1 - x0), abs(y1 - y0)
        self.steep = dx < dy
        self.flip = y0 > y1 if self.steep else x0 > x1
        if self.flip:
            x0, y0, x1, y1 = x1, y1, x0, y0
        self.xs, self.ys = x0, y0
        self.n = dy if self.steep else dx
        if self.steep:
            self.slope = float(x1 - x0) / float(dy)
        else:  # 0 / 0 in C for a zero-length edge
            self.slope = float(y1 - y0) / float(dx) if dx else math.nan

    def points(self, d: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        t = self.n - d if self.flip else d
        # (int)(start + slope * t + .5): three roundings, each a separate NumPy operation.
        start = float(self.xs if self.steep else self.ys)
        minor = _trunc_walk(start + self.slope * t.astype(np.float64) + 0.5)
        if self.steep:
            return minor, self.ys + t
        return self.xs + t, minor


def _marks(ua: np.ndarray, va: np.ndarray, ub: np.ndarray, vb: np.ndarray, m: int) -> np.ndarray:
    """pycocotools' marks of consecutive trace points ``a -> b``: where u changes and the
    smaller u (the later u - 1 when u grows) is a column centre ``5c + 2`` of the grid, the
    column-major index ``c * M + row``, row ``ceil((min(va, vb) - 2) / 5)`` in ``[0, M]``."""
    xd = np.where(ub < ua, ub, ub - 1)
    keep = (ua != ub) & (xd >= 2) & ((xd - 2) % 5 == 0) & ((xd - 2) // 5 <= m - 1)
    c = (xd[keep] - 2) // 5
    row = np.clip(-((2 - np.minimum(va, vb)[keep]) // 5), 0, m)
    return c * m + row


def _edge_marks(e: _Edge, m: int) -> np.ndarray:
    """Marks of the pairs inside one edge. Only a pair with u values ``{X, X + 1}``,
    ``X = 5c + 2``, can mark; u is monotone along the trace, so each X has one candidate:
    the pair ending at the first point past X (``u >= X + 1`` rising, ``u <= X`` falling).
    Along an x-major edge u moves one step per point; along a y-major one it is found by
    bisection."""
    if e.n == 0:
        return np.zeros(0, np.int64)
    ends = np.array([0, e.n], np.int64)
    u_first, u_last = e.points(ends)[0].tolist()
    if u_first == u_last:
        return np.zeros(0, np.int64)
    rising = u_last > u_first
    lo, hi = min(u_first, u_last), max(u_first, u_last)
    # Candidates X = 5c + 2 in [lo, hi - 1], c in [0, M - 1].
    c = np.arange(max(-((2 - lo) // 5), 0), min((hi - 3) // 5, m - 1) + 1, dtype=np.int64)
    x = 5 * c + 2
    if not e.steep:
        d = x + 1 - u_first if rising else u_first - x
    else:
        a = np.zeros_like(x)
        b = np.full_like(x, e.n)  # the predicate holds at n
        while np.any(a < b):
            mid = a + (b - a) // 2
            u = e.points(mid)[0]
            past = u >= x + 1 if rising else u <= x
            a, b = np.where(past, a, mid + 1), np.where(past, mid, b)
        d = a
    return _marks(*e.points(d - 1), *e.points(d), m)


def _polygon_mask(xs: list[int], ys: list[int], m: int) -> np.ndarray:
    """One polygon (lattice vertices) rasterised: bool ``[M, M]``, ``[y, x]``."""
    marks = []
    last = None  # the previous edge's last trace point
    k = len(xs)
    for j in range(k):
        e = _Edge(xs[j], ys[j], xs[(j + 1) % k], ys[(j + 1) % k])
        first = e.points(np.zeros(1, np.int64))
        if last is not None:  # the trace runs on from edge to edge (not from the last to the first)
            marks.append(_marks(*last, *first, m))
        marks.append(_edge_marks(e, m))
        last = e.points(np.array([e.n], np.int64))
    toggles = np.bincount(np.concatenate(marks), minlength=m * m + 1)[: m * m]
    # Column-major parity (index M * M lies past the last pixel).
    inside = (np.cumsum(toggles) & 1).astype(bool)
    return inside.reshape(m, m).T
