"""What every ONNX translation is built from: the opset the translations call, constants,
shape helpers and ``_GraphOps``, roiops._geometry's array operations as graph nodes.
The translations run under the exporter's tracer: every ``op.*`` call adds a node."""

from __future__ import annotations

from typing import Any

import numpy as np
from onnxscript import ir
from onnxscript import opset18

# onnxscript's opset stubs type values as its script-mode tensor classes; under the
# exporter's tracer the translations pass ir.Values, so the ops are used untyped.
op: Any = opset18

# The translations' tensor parameters are ir.Values. Annotated Any because the exporter
# infers an ONNX signature from the annotations and cannot read ir.Value's.
_In = Any
_INT64 = ir.DataType.INT64
_INT32 = ir.DataType.INT32
_I64_MAX = np.iinfo(np.int64).max

def _const(value: Any, dtype: ir.DataType) -> ir.Value:
    return op.Constant(value=ir.tensor(np.array(value, dtype=dtype.numpy())))


def _i64(*values: int) -> ir.Value:
    return op.Constant(value=ir.tensor(np.array(values, dtype=np.int64)))


def _compute_type(input: ir.Value) -> tuple[ir.Value, ir.DataType]:
    """The kernels' opmath type: float64 for float64 input, float32 otherwise."""
    if input.dtype == ir.DataType.DOUBLE:
        return input, ir.DataType.DOUBLE
    if input.dtype == ir.DataType.FLOAT:
        return input, ir.DataType.FLOAT
    return op.Cast(input, to=ir.DataType.FLOAT), ir.DataType.FLOAT


def _restore(out: ir.Value, input: ir.Value) -> ir.Value:
    return out if input.dtype in (ir.DataType.FLOAT, ir.DataType.DOUBLE) else op.Cast(out, to=input.dtype)


def _columns(rois: ir.Value, t: ir.DataType, width: int = 5) -> list[ir.Value]:
    """The columns of ``rois[K, width]`` as ``[K]`` vectors of type ``t``."""
    if rois.dtype != t:
        rois = op.Cast(rois, to=t)
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


def _to_int(v: ir.Value) -> ir.Value:
    return op.Cast(v, to=_INT64)


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
