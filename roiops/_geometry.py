"""Geometry primitives of the ops, defined once for the Python side: the limits, the
layout rule, C's rounding, sample positions, the bilinear border rule, RoIAlign's
box-to-grid rule and RoIPool's bin edges (docs/semantics.md). The validation layer, the
registered ops, the reference, the Triton launchers, the demo and the ONNX translations
use these; the C++ kernels have their own in csrc/geometry.h (limits: csrc/bounds.h), the
Triton kernels in triton/_jit.py.

The arithmetic primitives are written against ArrayOps, a few elementwise operations: by
default torch's (TORCH), and roiops/onnx/_graph.py passes operations that add ONNX graph nodes,
so an exported graph computes each primitive with the reference's expressions, in the
same order, and gives the same bits.

Each is a primitive, not a plan: an op that samples along rotated or non-separable
grids reuses them as they are.
"""

from __future__ import annotations

import math
from typing import Any, Protocol, TypeVar

import torch
from torch import Tensor

# ---- limits (docs/semantics.md, "Limits"); the C++ and Triton kernels refuse the same values

MAX_COORDINATE = 2.0**24  # |x * spatial_scale| in feature-map cells: float32 places samples exactly up to here
MAX_MAP_SIDE = 2**24  # H and W: no box can reach cells beyond the coordinate range
MAX_OUTPUT_SIZE = 2**16  # per side: bin indices exact in float32, <= 2^32 bins per box and channel
MAX_SAMPLING_RATIO = 1024  # a fixed ratio costs ratio^2 samples per bin, whatever the box
MAX_ARGMAX_GRID = 2**31 - 1  # samples per bin in mode "max": its argmax is int32 iy * grid_w + ix
MIN_SCALE, MAX_SCALE = 2.0**-64, 2.0**64  # the kernels use spatial_scale as a float32
MAX_POOL_SIZE = 1024  # border align: each output value takes pool_size + 1 samples, as a fixed sampling ratio
MAX_LEVELS = 5  # feature maps of a multi-level op: pick() in triton/_jit.py selects among five arguments
MAX_VOXEL_SIDE = 1024  # RoIAwarePool3d: voxels per box side; ox * oy * oz < 2^31 (int32 voxel indices)
MAX_POINTS = 2**31 - 1  # point-cloud ops: point indices are int32
MAX_ORIENTATIONS = 2**16  # per channel field of rotation-invariant RoIAlign: angle * O exact in float64 for float32


# ---- layout

def is_channels_last(t: Tensor) -> bool:
    """The kernels' layout rule: channels_last strides, unless they are also NCHW-contiguous
    (C == 1, or a 1 x 1 map), which counts as NCHW."""
    return t.is_contiguous(memory_format=torch.channels_last) and not t.is_contiguous()


def memory_format(channels_last: bool) -> torch.memory_format:
    return torch.channels_last if channels_last else torch.contiguous_format


def dense(t: Tensor, dtype: torch.dtype) -> Tensor:
    """``t`` contiguous in ``dtype``. Asked first: to() and contiguous() go through the
    dispatcher even when they return their tensor unchanged."""
    t = t if t.dtype == dtype else t.to(dtype)
    return t if t.is_contiguous() else t.contiguous()


# ---- arithmetic

A = TypeVar("A")


class ArrayOps(Protocol[A]):
    """The array operations the primitives use, elementwise with broadcasting. A Python
    number operand takes the type of the array it meets; comparisons give bool arrays.
    onnxruntime's Where turns a -0.0 taken from its first value operand into +0.0 (one
    taken from the second stays -0.0), so the primitives never select a -0.0 there."""

    def floor(self, x: A) -> A: ...
    def ceil(self, x: A) -> A: ...
    def abs(self, x: A) -> A: ...
    def add(self, x: A, y: A | float) -> A: ...
    def sub(self, x: A | float, y: A) -> A: ...
    def mul(self, x: A, y: A | float) -> A: ...
    def div(self, x: A, y: A | float) -> A: ...
    def less(self, x: A, y: A | float) -> A: ...
    def greater(self, x: A, y: A | float) -> A: ...
    def less_equal(self, x: A, y: A | float) -> A: ...
    def greater_equal(self, x: A, y: A | float) -> A: ...
    def logical_and(self, x: A, y: A) -> A: ...
    def where(self, cond: A, x: A | float, y: A | float) -> A: ...
    def cast(self, x: A, like: A) -> A:
        """``x`` (integers) converted to the floating type of ``like``."""
    def full(self, value: float, like: A) -> A:
        """A scalar array holding ``value`` in the type of ``like``."""
    def to_index(self, x: A) -> A:
        """Integral floating values as int64."""


class TorchOps:
    """:class:`ArrayOps` on torch tensors, each a single torch operation."""

    def floor(self, x: Tensor) -> Tensor:
        return torch.floor(x)

    def ceil(self, x: Tensor) -> Tensor:
        return torch.ceil(x)

    def abs(self, x: Tensor) -> Tensor:
        return torch.abs(x)

    def add(self, x: Tensor, y: Tensor | float) -> Tensor:
        return x + y

    def sub(self, x: Tensor | float, y: Tensor) -> Tensor:
        return x - y

    def mul(self, x: Tensor, y: Tensor | float) -> Tensor:
        return x * y

    def div(self, x: Tensor, y: Tensor | float) -> Tensor:
        return x / y

    def less(self, x: Tensor, y: Tensor | float) -> Tensor:
        return x < y

    def greater(self, x: Tensor, y: Tensor | float) -> Tensor:
        return x > y

    def less_equal(self, x: Tensor, y: Tensor | float) -> Tensor:
        return x <= y

    def greater_equal(self, x: Tensor, y: Tensor | float) -> Tensor:
        return x >= y

    def logical_and(self, x: Tensor, y: Tensor) -> Tensor:
        return x & y

    def where(self, cond: Tensor, x: Tensor | float, y: Tensor | float) -> Tensor:
        return torch.where(cond, x, y)

    def cast(self, x: Tensor, like: Tensor) -> Tensor:
        return x.to(like.dtype)

    def full(self, value: float, like: Tensor) -> Tensor:
        return torch.full((), value, dtype=like.dtype, device=like.device)

    def to_index(self, x: Tensor) -> Tensor:
        return x.long()


# Typed for any A, so that it can be every primitive's default namespace.
TORCH: ArrayOps[Any] = TorchOps()


def round_half_away(v: A, ops: ArrayOps[A] = TORCH) -> A:
    """C's round(), as a float: halves away from zero (torch.round and ONNX Round round
    them to even). The magnitude is floor(|v|), plus 1 where |v| - floor(|v|) >= 0.5: that
    difference is exact, unlike floor(|v| + 0.5), which rounds 0.49999997 up. A zero
    result is v * 0, which keeps v's sign (round(-0.3) is -0.0, as in C) and NaN."""
    a = ops.abs(v)
    f = ops.floor(a)
    r = ops.where(ops.greater_equal(ops.sub(a, f), 0.5), ops.add(f, 1), f)
    nonzero = ops.where(ops.less(v, 0), ops.mul(r, -1), r)
    return ops.where(ops.greater_equal(a, 0.5), nonzero, ops.mul(v, 0))


def sample_position(start: A, bin_size: A, grid: int | A, b: A, s: A, ops: ArrayOps[A] = TORCH) -> A:
    """Position of sample s of bin b along one axis, start + b*bin + (s + 0.5) * bin / grid,
    evaluated left to right as torchvision does (so float32 results agree to the bit); b, s
    and an array grid are integers, converted to start's type first."""
    if not isinstance(grid, int):
        grid = ops.cast(grid, start)
    offset = ops.div(ops.mul(ops.add(ops.cast(s, start), 0.5), bin_size), grid)
    return ops.add(ops.add(start, ops.mul(ops.cast(b, start), bin_size)), offset)


def sample_position_slope(grid: int, b: A, s: A, like: A, ops: ArrayOps[A] = TORCH) -> A:
    """Derivative of :func:`sample_position` with respect to ``bin_size`` (with respect to
    ``start`` it is 1): ``b + (s + 0.5) / grid``; b and s are integers, converted to the
    type of ``like``."""
    return ops.add(ops.cast(b, like), ops.div(ops.add(ops.cast(s, like), 0.5), grid))


def pool_bin_edges(start: Tensor, bin_size: Tensor, pooled: int, size: int, start_after: bool) -> tuple[Tensor, Tensor]:
    """RoIPool bins along one axis: bin p of each box covers cells [lo, hi), ``[K, pooled]``
    int64 each, clipped to [0, size]. ``start`` and ``bin_size`` are ``[K, 1]``. Rounded
    corners (Caffe, torchvision, position-sensitive) add the integer start after
    floor(p * bin) and ceil((p + 1) * bin) (``start_after``); mmdetection adds its real start
    before. Values stay floating until clipped, so huge coordinates cannot overflow an
    integer (a sum that overflows to +-inf clips to the map's edge)."""
    p = torch.arange(pooled, dtype=bin_size.dtype, device=bin_size.device)
    lo, hi = p * bin_size, (p + 1) * bin_size
    if start_after:
        lo, hi = torch.floor(lo) + start, torch.ceil(hi) + start
    else:
        lo, hi = torch.floor(lo + start), torch.ceil(hi + start)
    return lo.clamp(0, size).long(), hi.clamp(0, size).long()


def bilinear_taps(coord: A, size: int | A, ops: ArrayOps[A] = TORCH) -> tuple[A, A, A, A, A]:
    """Border rule of one axis: (low, high, l, h = 1 - l, inside). A point outside [-1, size]
    has value 0 (inside is False); otherwise it is clamped at 0 and, from the last cell on,
    snapped to it. low and high (int64) lie in [0, max(size - 1, 0)] for every point,
    outside, NaN or infinite ones included, so indexing with them is always safe. An array
    size holds an integer, as a Python one does."""
    size = ops.full(size, coord) if isinstance(size, int) else ops.cast(size, coord)
    nonempty = ops.greater(size, 0)
    inside = ops.logical_and(ops.logical_and(ops.greater_equal(coord, -1), ops.less_equal(coord, size)), nonempty)
    last = ops.where(nonempty, ops.add(size, -1), 0)
    c = ops.where(ops.greater(coord, 0), coord, 0)  # -0.0 becomes +0.0 as in the C++ rule; NaN 0 too
    low = ops.floor(c)
    at_edge = ops.greater_equal(low, last)
    low = ops.where(at_edge, last, low)
    c = ops.where(at_edge, low, c)
    high = ops.where(at_edge, low, ops.add(low, 1))
    l = ops.sub(c, low)
    return ops.to_index(low), ops.to_index(high), l, ops.sub(1, l), inside


def bilinear_slope(coord: A, size: int | A, ops: ArrayOps[A] = TORCH) -> A:
    """Derivative of :func:`bilinear_taps`' ``l`` with respect to ``coord`` (``h`` has the
    opposite): 1 where ``l`` follows the point (inside the map, above 0, before the last
    cell), 0 where the border rule holds it constant (clamped at 0, snapped to the last
    cell, or outside, where the value is 0). The derivative jumps at every integer
    coordinate (the taps change) and at the borders; there it is one of its one-sided
    values."""
    low, high, _, _, inside = bilinear_taps(coord, size, ops)
    follows = ops.logical_and(ops.logical_and(inside, ops.greater(coord, 0)), ops.less(low, high))
    return ops.where(follows, ops.full(1.0, coord), ops.full(0.0, coord))


# ---- RoIAlign's box-to-grid rule (docs/semantics.md, "roi_align avg")

def align_axis(lo: A, hi: A, scale: A | float, pooled: int | A, sampling_ratio: int, aligned: bool,
               ops: ArrayOps[A] = TORCH) -> tuple[A, A, A, int | A, A | bool]:
    """RoIAlign's box-to-grid rule along one axis, for boxes whose sides are ``lo`` and ``hi``
    in input coordinates: ``(start, size, bin, grid, stretched)`` in feature-map cells.
    start = lo * scale - o and size = (hi * scale - o) - start, o = 0.5 when aligned, in
    torchvision's order (so float32 results agree to the bit); the rest is
    :func:`align_size`'s."""
    start, end = ops.mul(lo, scale), ops.mul(hi, scale)
    if aligned:  # x + -0.5 is x - 0.5; x - 0.0 is x (-0.0 included), so o = 0 needs no operation
        start, end = ops.add(start, -0.5), ops.add(end, -0.5)
    return (start, *align_size(ops.sub(end, start), pooled, sampling_ratio, aligned, ops))


def align_size(size: A, pooled: int | A, sampling_ratio: int, aligned: bool,
               ops: ArrayOps[A] = TORCH) -> tuple[A, A, int | A, A | bool]:
    """RoIAlign's bins along one axis of boxes ``size`` cells long: ``(size, bin, grid,
    stretched)``. aligned=False widens a side under 1 cell to 1 (``stretched``, False when
    aligned); bin = size / pooled; grid, the samples per bin along the axis, is
    ``sampling_ratio`` if positive, else ceil(bin) (adaptive), which is <= 0 for an empty
    or reversed aligned box: such a box has no sample points."""
    stretched: A | bool = False
    if not aligned:
        small = ops.less(size, 1)
        size, stretched = ops.where(small, 1.0, size), small
    bin_size = ops.div(size, pooled)
    grid = sampling_ratio if sampling_ratio > 0 else ops.ceil(bin_size)
    return size, bin_size, grid, stretched


# ---- rotation-invariant RoIAlign (docs/semantics.md, "riroi_align_rotated")

def orientation_blend(theta: Tensor, num_orientations: int, clockwise: bool) -> tuple[Tensor, Tensor, Tensor]:
    """Each box's orientation bin and blend weights from its sampling angle ``theta`` (the
    boxes' column 5 as the kernels get it, negated when ``clockwise``): ``(ind, r, l)``,
    ``ind`` int64 in ``[0, O)``, ``r`` and ``l`` in theta's dtype.

    f = t * O / (2 pi) of the orientation angle t (theta, or -theta when clockwise: exact)
    in float64, its non-finite values made finite (NaN 0, +-inf the largest float64);
    ind = floor(f) mod O (fmod is exact), l = f - floor(f) (exact), r = 1 - l, each
    rounded once to theta's dtype. The division is by a tensor: torch divides by a Python
    scalar as a multiplication by its reciprocal on CUDA, which is not the quotient's bits."""
    t = theta.double()
    if clockwise:
        t = -t
    f = torch.nan_to_num(torch.div(t * num_orientations, torch.full_like(t, 2 * math.pi)), nan=0.0)
    whole = torch.floor(f)
    frac = f - whole
    ind = torch.fmod(whole, num_orientations)
    ind = torch.where(ind < 0, ind + num_orientations, ind).long()
    return ind, (1.0 - frac).to(theta.dtype), frac.to(theta.dtype)


# ---- precise RoI pooling (docs/semantics.md, "prroi_pool")

def prroi_bins(lo: Tensor, hi: Tensor, scale: Tensor, pooled: int) -> tuple[Tensor, Tensor, Tensor]:
    """PrRoIPool windows along one axis: ``(size, start, end)`` from box sides ``lo``, ``hi``
    (``[K, 1]``): size = max(hi - lo, 0) * scale / pooled ``[K, 1]``, bin p's window starts
    at lo * scale + p * size and ends at start + size ``[K, pooled]``."""
    size = (hi - lo).clamp(min=0) * scale / pooled
    p = torch.arange(pooled, dtype=lo.dtype, device=lo.device)
    start = lo * scale + p * size
    return size, start, start + size


def hat(t: Tensor) -> Tensor:
    """The bilinear interpolation kernel max(0, 1 - |t|): a cell's weight at distance t."""
    return (1 - t.abs()).clamp(min=0)


def hat_antiderivative(t: Tensor) -> Tensor:
    """The integral of :func:`hat` from -inf to t: 0 up to -1, (1 + t)^2 / 2 up to 0,
    1 - (1 - t)^2 / 2 up to 1, then 1. A cell's weight over a window [a, b] is
    hat_antiderivative(b - w) - hat_antiderivative(a - w)."""
    u = t.clamp(-1, 1)
    return torch.where(u <= 0, (1 + u) * (1 + u) / 2, 1 - (1 - u) * (1 - u) / 2)


# ---- Bezier alignment (docs/semantics.md, "Bezier alignment of ABCNet")

def bezier_point(p0: Tensor, p1: Tensor, p2: Tensor, p3: Tensor, u: Tensor) -> Tensor:
    """The cubic Bezier curve of control points p0..p3 (one coordinate, the type T of the
    boxes) at u (T), in AdelaiDet's and mmcv's arithmetic: the first three Bernstein terms
    ((1 - u)^3 p0, 3u(1 - u)^2 p1, 3u^2(1 - u) p2, each multiplied left to right) in
    float64, the last one (u^3 p3) in T, then summed left to right in float64 and rounded
    once to T. For T = float64 this is plain float64 arithmetic."""
    t = p0.dtype
    d, ud = torch.float64, u.to(torch.float64)
    om = 1.0 - ud
    a = om * om * om * p0.to(d)
    b = 3.0 * ud * om * om * p1.to(d)
    c = 3.0 * ud * ud * om * p2.to(d)
    last = (u * u * u * p3).to(d)
    return (a + b + c + last).to(t)


def bezier_bins(rois: Tensor, scale: float, ph: int, pw: int, sampling_ratio: int,
                aligned: bool) -> tuple[Tensor, Tensor, Tensor, Tensor, Any, Any]:
    """The bins of bezier boxes ``rois [K, 17]`` (type T, rows checked):
    ``(y_start, x_start, bin_h, bin_w, grid_h, grid_w)``: each bin's first sample row and
    column start ``[K, ph, pw]`` (its centre minus half a bin), the bin sizes ``[K]`` and
    the grids (a fixed ratio, or ``[K]`` adaptive ones).

    Bin (i, j) is centred at ``c = T(T(bottom(u) * v) + top(u) * (1 - v) - o)`` with
    ``u = j / pw`` and ``v = i / ph`` in T, the sum in float64 (``o`` = 0.5 when aligned),
    top and bottom the curves at u (:func:`bezier_point`). The bins are as wide as the
    larger x span of the two curves' end points over pw, as high as the larger y span
    over ph (a horizontal text line has bins of height 0), widened to 1 cell when not
    aligned: :func:`align_size`."""
    t = rois.dtype
    p = rois[:, 1:] * torch.tensor(scale, dtype=t, device=rois.device)  # [K, 16]
    top = [p[:, 2 * n:2 * n + 2] for n in range(4)]  # P0..P3, left to right
    bottom = [p[:, 14 - 2 * n:16 - 2 * n] for n in range(4)]  # stored right to left
    roi_w = torch.maximum((top[0][:, 0] - top[3][:, 0]).abs(), (bottom[0][:, 0] - bottom[3][:, 0]).abs())
    roi_h = torch.maximum((top[0][:, 1] - top[3][:, 1]).abs(), (bottom[0][:, 1] - bottom[3][:, 1]).abs())
    _, bin_w, grid_w, _ = align_size(roi_w, pw, sampling_ratio, aligned)
    _, bin_h, grid_h, _ = align_size(roi_h, ph, sampling_ratio, aligned)
    u = torch.arange(pw, dtype=t, device=rois.device) / pw
    v = (torch.arange(ph, dtype=t, device=rois.device) / ph)[:, None]
    v_rest = 1.0 - v.to(torch.float64)
    o = 0.5 if aligned else 0.0
    starts = []
    for axis, half in ((1, 0.5 * bin_h), (0, 0.5 * bin_w)):
        t0, t1, t2, t3 = (q[:, axis:axis + 1] for q in top)
        b0, b1, b2, b3 = (q[:, axis:axis + 1] for q in bottom)
        at_top = bezier_point(t0, t1, t2, t3, u)[:, None, :]  # [K, 1, pw]
        at_bottom = bezier_point(b0, b1, b2, b3, u)[:, None, :]
        centre = ((at_bottom * v).to(torch.float64) + at_top.to(torch.float64) * v_rest - o).to(t)
        starts.append(centre - half[:, None, None])
    return starts[0], starts[1], bin_h, bin_w, grid_h, grid_w
