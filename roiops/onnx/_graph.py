"""What every ONNX translation is built from: the opset the translations call, constants,
shape helpers and ``_GraphOps``, roiops._geometry's array operations as graph nodes.
The translations run under the exporter's tracer: every ``op.*`` call adds a node."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
from onnxscript import evaluator, ir
from onnxscript import opset18

# onnxscript's opset stubs type values as its script-mode tensor classes; under the
# exporter's tracer the translations pass ir.Values, so the ops are used untyped.
op: Any = opset18

# The translations' tensor parameters are ir.Values. Annotated Any because the exporter
# infers an ONNX signature from the annotations and cannot read ir.Value's.
_In = Any
_INT64 = ir.DataType.INT64
_INT32 = ir.DataType.INT32
_FLOAT = ir.DataType.FLOAT
_DOUBLE = ir.DataType.DOUBLE
_I64_MAX = np.iinfo(np.int64).max


def _const(value: Any, dtype: ir.DataType) -> ir.Value:
    return op.Constant(value=ir.tensor(np.array(value, dtype=dtype.numpy())))


def _i64(*values: int) -> ir.Value:
    return op.Constant(value=ir.tensor(np.array(values, dtype=np.int64)))


def _as(x: ir.Value, t: ir.DataType) -> ir.Value:
    """``x`` as type ``t``: cast only if it has another type."""
    return x if x.dtype == t else op.Cast(x, to=t)


def _compute_type(input: ir.Value) -> tuple[ir.Value, ir.DataType]:
    """The input in the kernels' opmath type, and that type: float64 for float64 input,
    float32 otherwise."""
    t = _DOUBLE if input.dtype == _DOUBLE else _FLOAT
    return _map_once(lambda: _as(input, t), input, t, "compute"), t


# Loops over blocks of boxes being traced, innermost last: the graph outside the loop, the
# maps there (by id, with the values) and what was built from them, by key.
_hoisting: list[tuple[Any, dict[int, ir.Value], dict[tuple[Any, ...], ir.Value]]] = []


@contextlib.contextmanager
def _maps_outside(map: ir.Value) -> Iterator[None]:
    """While a loop over blocks of boxes of ``map`` is traced, what ``_map_once`` builds from
    the map is built once, in the graph being traced now (outside the loop)."""
    _hoisting.append((evaluator.default(), {id(map): map}, {}))
    try:
        yield
    finally:
        _hoisting.pop()


def _map_once(build: Callable[[], ir.Value], x: ir.Value, dtype: ir.DataType | None, *key: Any) -> ir.Value:
    """``build()``, a function of the map ``x`` alone (a cast, a layout) of type ``dtype``
    named by ``key``: inside a loop over blocks of boxes of ``x``, built once outside the
    loop rather than at every block. Its type is set: the loop's body declares it."""
    for outside, maps, made in reversed(_hoisting):
        if id(x) in maps:
            k = (id(x), *key)
            if k not in made:
                with evaluator.default_as(outside):
                    made[k] = build()
                made[k].dtype = made[k].dtype or dtype
                maps[id(made[k])] = made[k]
            return made[k]
    return build()


def _restore(out: ir.Value, input: ir.Value) -> ir.Value:
    return out if input.dtype in (_FLOAT, _DOUBLE) else op.Cast(out, to=input.dtype)


def _columns(rois: ir.Value, t: ir.DataType, width: int = 5) -> list[ir.Value]:
    """The columns of ``rois[K, width]`` as ``[K]`` vectors of type ``t``."""
    rois = _as(rois, t)
    return [_take(rois, i, axis=1) for i in range(width)]


def _take(x: ir.Value, index: int, axis: int) -> ir.Value:
    """``x``'s slice ``index`` along ``axis``, that axis dropped: one Gather, where Slice +
    Squeeze take two nodes and four constants (torch.onnx's optimiser takes time quadratic
    in a graph's nodes)."""
    return op.Gather(x, _scalar(index), axis=axis)


def _scalar(value: int) -> ir.Value:
    """A 0-d int64 constant."""
    return op.Constant(value=ir.tensor(np.array(value, dtype=np.int64)))


def _range(n: ir.Value) -> ir.Value:
    """``[0, 1, ..., n - 1]`` for an int64 scalar ``n``."""
    return op.Range(_scalar(0), n, _scalar(1))


def _dim(x: ir.Value, axis: int) -> ir.Value:
    """``x.shape[axis]`` as an int64 scalar."""
    return op.Squeeze(op.Shape(x, start=axis, end=axis + 1), _i64(0))


def _largest_or_one(x: ir.Value) -> ir.Value:
    """The largest element of the int64 tensor ``x`` and 1, as a scalar (1 when ``x`` is empty)."""
    flat = op.Concat(op.Reshape(x, _i64(-1)), _i64(1), axis=0)
    return op.Gather(flat, op.ArgMax(flat, axis=0, keepdims=0))


def _cos_sin(angle: ir.Value, t: ir.DataType) -> tuple[ir.Value, ir.Value]:
    """The cosine and sine of ``angle`` computed in float64 and rounded once to ``t``, as the
    kernels compute them."""
    wide = _as(angle, _DOUBLE)
    return _as(op.Cos(wide), t), _as(op.Sin(wide), t)


def _to_int(v: ir.Value) -> ir.Value:
    return op.Cast(v, to=_INT64)


class _Constants:
    """The constants of one translation call, each one node however often it is used: the
    translations use the same few axes, sizes and numbers dozens of times, and torch.onnx's
    optimiser takes time quadratic in a graph's nodes. Made per call (a value belongs to
    the graph being traced); ``t`` is the type of ``c(value)`` given none (the compute type)."""

    def __init__(self, t: ir.DataType = _INT64) -> None:
        self.t = t
        self._made: dict[tuple[ir.DataType, tuple[int, ...], bytes], ir.Value] = {}

    def __call__(self, value: Any, dtype: ir.DataType | None = None) -> ir.Value:
        """A constant of ``dtype`` (``t`` if None) of ``value``'s shape: 0-d for a number, 1-d
        for a tuple."""
        dtype = self.t if dtype is None else dtype
        array = np.array(value, dtype=dtype.numpy())
        key = (dtype, array.shape, array.tobytes())  # the bits: -0.0 is not 0.0, NaN is NaN
        if key not in self._made:
            self._made[key] = op.Constant(value=ir.tensor(array))
        return self._made[key]

    def i64(self, *values: int) -> ir.Value:
        """A 1-d int64 constant (shapes, axes)."""
        return self(values, _INT64)

    def scalar(self, value: int) -> ir.Value:
        """A 0-d int64 constant."""
        return self(value, _INT64)

    def range(self, n: ir.Value) -> ir.Value:
        """``[0, 1, ..., n - 1]`` for a 0-d int64 ``n``, as ``_range``."""
        return op.Range(self.scalar(0), n, self.scalar(1))

    def size(self, x: ir.Value, axis: int) -> ir.Value:
        """``x.shape[axis]`` as a 0-d int64, as ``_dim``."""
        return op.Squeeze(op.Shape(x, start=axis, end=axis + 1), self.i64(0))


class _GraphOps:
    """roiops._geometry's array operations as graph nodes, so that the translations build
    the geometry primitives from the same expressions as the reference. Floating values
    have the compute type ``t``: Python numbers become constants of it and ``cast``
    converts to it."""

    def __init__(self, t: ir.DataType) -> None:
        self.t = t

    def _value(self, x: ir.Value | float) -> ir.Value:
        return _const(x, self.t) if isinstance(x, (int, float)) else x

    def floor(self, x: ir.Value) -> ir.Value:
        return op.Floor(x)

    def ceil(self, x: ir.Value) -> ir.Value:
        return op.Ceil(x)

    def abs(self, x: ir.Value) -> ir.Value:
        return op.Abs(x)

    def add(self, x: ir.Value, y: ir.Value | float) -> ir.Value:
        return op.Add(x, self._value(y))

    def sub(self, x: ir.Value | float, y: ir.Value) -> ir.Value:
        return op.Sub(self._value(x), y)

    def mul(self, x: ir.Value, y: ir.Value | float) -> ir.Value:
        return op.Mul(x, self._value(y))

    def div(self, x: ir.Value, y: ir.Value | float) -> ir.Value:
        return op.Div(x, self._value(y))

    def less(self, x: ir.Value, y: ir.Value | float) -> ir.Value:
        return op.Less(x, self._value(y))

    def greater(self, x: ir.Value, y: ir.Value | float) -> ir.Value:
        return op.Greater(x, self._value(y))

    def less_equal(self, x: ir.Value, y: ir.Value | float) -> ir.Value:
        return op.LessOrEqual(x, self._value(y))

    def greater_equal(self, x: ir.Value, y: ir.Value | float) -> ir.Value:
        return op.GreaterOrEqual(x, self._value(y))

    def logical_and(self, x: ir.Value, y: ir.Value) -> ir.Value:
        return op.And(x, y)

    def where(self, cond: ir.Value, x: ir.Value | float, y: ir.Value | float) -> ir.Value:
        return op.Where(cond, self._value(x), self._value(y))

    def cast(self, x: ir.Value, like: ir.Value) -> ir.Value:
        return op.Cast(x, to=self.t)

    def full(self, value: float, like: ir.Value) -> ir.Value:
        return _const(value, self.t)

    def to_index(self, x: ir.Value) -> ir.Value:
        return _to_int(x)
