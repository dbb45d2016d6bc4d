"""ONNX export of the roiops ops with torch.onnx's dynamo exporter (ONNX opset >= 16).

Once ``roiops`` is imported, a plain ``torch.onnx.export(model, args, dynamo=True)``
translates the roiops ops: roiops adds the default translations below to the exporter's
own when torch loads its exporter (checked with torch 2.11, 2.12 and 2.14); ``import
roiops`` itself loads no ONNX code. Importing this module needs ``onnxscript`` (and
``onnx``). To choose other translations, or if a newer torch warns that roiops could not
add them, either export with [`roiops.onnx.export`][]:

    program = roiops.onnx.export(model, (images, boxes), dynamic_shapes=...)
    program.save("model.onnx")

or pass [`roiops.onnx.translation_table`][] to torch.onnx yourself (yours for the same
ops take precedence over ours):

    torch.onnx.export(model, args, dynamo=True,
                      custom_translation_table=roiops.onnx.translation_table())

What each op becomes (docs/ecosystem.md has the table and the reasons):

- ``roi_align`` mode ``"avg"``: the ONNX ``RoiAlign`` operator (``mode="avg"``;
  ``aligned`` -> ``coordinate_transformation_mode`` ``"half_pixel"`` /
  ``"output_half_pixel"``, ``sampling_ratio <= 0`` -> 0, the ``[K, 5]`` boxes split into
  int64 ``batch_indices`` and ``rois[K, 4]``). With ``aligned=True`` and adaptive
  sampling, boxes whose sample grid is empty (zero or negative size) are replaced by an
  empty box and their output set to 0: roiops defines them as 0, and onnxruntime's
  ``RoiAlign`` fails on them ("Integer overflow") when only the height is negative.
  onnxruntime's ``RoiAlign`` also computes samples outside the map as
  ``0 * x[b, c, 0, 0]``, so a NaN or inf in a map's top-left element spreads to them
  (roiops gives them 0); finite maps agree bit for bit.
  ``translation_table(align_avg="decompose")`` exports a decomposition instead (the
  samples of mode ``"max"``, summed in the kernels' order), exact in every case.
- ``roi_align`` mode ``"max"``: a decomposition into standard ops (Gather, ReduceMax).
  ONNX ``RoiAlign``'s max mode is a different formula (the maximum of the four weighted
  corners of each sample), so it is never used.
- ``roi_pool`` (both conventions): a decomposition (Gather, ReduceMax, GatherElements).
  ``MaxRoiPool`` (Caffe convention only) is not used: onnxruntime's kernel starts its
  running maximum at -FLT_MAX (older releases at +FLT_MIN, the smallest positive float,
  so all-negative bins came out positive), turning an all ``-inf`` bin into -FLT_MAX, and
  it propagates NaN only when the NaN is the last element of the bin.
- Every other op: no translation; exporting it raises an error naming the op and what
  ONNX lacks. docs/ecosystem.md lists them and why a
  decomposition is not exported (each would visit far more of the map than the kernels,
  or sum in an order ONNX's reductions do not guarantee).

Every decomposition reproduces the kernels' arithmetic (same float type, same operation
order) and matches roiops bit for bit, NaN and infinities included, up to the sign of a
zero maximum in mode "max" (ReduceMax may pick either of -0.0 and +0.0). Each op's second
output (the argmax used by its backward) is exported faithfully too. float16/bfloat16
inputs are computed in float32 and cast back, which is what roiops' kernels do.
"""

from __future__ import annotations

import inspect
import os
import warnings
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any, Literal

import numpy as np
import torch
from onnxscript import ir
from onnxscript import opset18

from . import ops
from ._geometry import align_axis, bilinear_taps, round_half_away, sample_position
from ._spec import Kernels

__all__ = ["MIN_OPSET", "export", "translation_table"]

MIN_OPSET = 16
"""The lowest ONNX opset roiops exports to: ``RoiAlign``'s ``coordinate_transformation_mode``
(needed for ``aligned``) came in opset 16."""

# onnxscript's opset stubs type values as its script-mode tensor classes; under the
# exporter's tracer the translations pass ir.Values, so the ops are used untyped.
op: Any = opset18

# The translations' tensor parameters are ir.Values. Annotated Any because the exporter
# infers an ONNX signature from the annotations and cannot read ir.Value's.
_In = Any
_INT64 = ir.DataType.INT64
_INT32 = ir.DataType.INT32
_I64_MAX = np.iinfo(np.int64).max


def translation_table(
    *, align_avg: Literal["RoiAlign", "decompose"] = "RoiAlign"
) -> dict[Callable[..., Any], Callable[..., Any]]:
    """Translations of ``torch.ops.roiops.*`` for ``torch.onnx.export(custom_translation_table=...)``.

    The forward ops ``roi_align``, ``roi_align_max`` and ``roi_pool`` are translated; every
    other op maps to a translation that refuses the export with an error naming the op
    (ONNX has no such operator).

    Args:
        align_avg: ``"RoiAlign"`` (default) exports ``roi_align`` mode ``"avg"`` as the ONNX
            ``RoiAlign`` operator; ``"decompose"`` as standard ops computing the same
            samples: a larger graph and more memory, exact on non-finite maps too, for
            runtimes whose ``RoiAlign`` differs.

    Returns:
        A dict from each registered op overload (``torch.ops.roiops.<op>.default``) to its
        translation.

    Raises:
        ValueError: ``align_avg`` is neither ``"RoiAlign"`` nor ``"decompose"``.

    Examples:
        >>> import roiops.onnx
        >>> table = roiops.onnx.translation_table(align_avg="decompose")
        >>> torch.ops.roiops.roi_align.default in table
        True
    """
    if align_avg not in ("RoiAlign", "decompose"):
        raise ValueError(f"align_avg must be 'RoiAlign' or 'decompose', got {align_avg!r}")
    translations: dict[str, Callable[..., Any]] = {
        "roi_align": _roi_align_native if align_avg == "RoiAlign" else _roi_align_decomposed,
        "roi_align_max": _roi_align_max, "roi_pool": _roi_pool}
    return {getattr(torch.ops.roiops, k.name).default: translations[k.name] if k.onnx is None else _refused(k)
            for spec in ops.SPECS for k in spec.kernels}


def export(
    model: torch.nn.Module | torch.export.ExportedProgram,
    args: tuple[Any, ...] = (),
    f: str | os.PathLike[str] | None = None,
    *,
    opset_version: int | None = None,
    custom_translation_table: Mapping[Callable[..., Any], Callable[..., Any]] | None = None,
    align_avg: Literal["RoiAlign", "decompose"] = "RoiAlign",
    **kwargs: Any,
) -> torch.onnx.ONNXProgram:
    """``torch.onnx.export(..., dynamo=True)`` with the roiops translations added.

    A model's roiops ops are exported as [`translation_table`][roiops.onnx.translation_table]
    says; the export needs onnxscript (and onnx). docs/ecosystem.md, "ONNX", has a whole
    export and what each op becomes.

    Args:
        model: the module (or exported program) to export.
        args: its example inputs.
        f: where to save the ONNX file; None keeps it in the returned program only.
        opset_version: the ONNX opset, at least [`MIN_OPSET`][roiops.onnx.MIN_OPSET]; None
            is torch.onnx's default.
        custom_translation_table: translations of your own, added to roiops' (yours win
            for the same op).
        align_avg: how ``roi_align`` mode ``"avg"`` is exported: ``"RoiAlign"`` or
            ``"decompose"`` (see [`translation_table`][roiops.onnx.translation_table]).
        **kwargs: any other keyword of ``torch.onnx.export`` (``dynamic_shapes``,
            ``input_names``, ``optimize``...).

    Returns:
        The ``torch.onnx.ONNXProgram``; ``program.save(path)`` writes it.

    Raises:
        ValueError: ``opset_version`` below ``MIN_OPSET``, or ``dynamo=False``.

    Examples:
        >>> import roiops.onnx
        >>> roiops.onnx.export(torch.nn.Identity(), (torch.zeros(1),), opset_version=15)
        Traceback (most recent call last):
            ...
        ValueError: roiops exports need ONNX opset >= 16 (...), got opset_version=15
    """
    if opset_version is not None and opset_version < MIN_OPSET:
        raise ValueError(f"roiops exports need ONNX opset >= {MIN_OPSET} (RoiAlign's "
                         f"coordinate_transformation_mode), got opset_version={opset_version}")
    if kwargs.pop("dynamo", True) is not True:
        raise ValueError("roiops ops export only with the dynamo exporter (dynamo=True)")
    table: dict[Callable[..., Any], Any] = translation_table(align_avg=align_avg)  # torch types the values variously
    table.update(custom_translation_table or {})
    program = torch.onnx.export(model, args, f, dynamo=True, opset_version=opset_version,
                                custom_translation_table=table, **kwargs)
    assert program is not None  # always returned by the dynamo exporter
    return program


_NOT_AUTOMATIC = (
    f"roiops could not add its ONNX translations to torch.onnx.export's defaults (torch {torch.__version__}): "
    "to export a model using roiops ops, call roiops.onnx.export(...) or pass "
    "custom_translation_table=roiops.onnx.translation_table() to torch.onnx.export")


def _extend_default_registry(registration: ModuleType) -> None:
    """Makes every ``torch.onnx.export(..., dynamo=True)`` translate the roiops ops.

    Called with ``torch.onnx._internal.exporter._registration`` once torch has loaded it
    (roiops/_onnx_hook.py waits for that, so ``import roiops`` imports no ONNX code).
    torch.onnx has no public way to extend its default translations. Each export builds its
    registry with the private ``ONNXRegistry.from_torchlib`` (torch 2.11 to 2.14), then adds
    the ``custom_translation_table`` entries with ``register_op``, each ahead of those
    before it; wrapping the former to add ours with the latter keeps a user's own
    translation of a roiops op first. If torch moves either, exports go on without ours and
    a warning names the explicit routes.
    """
    try:
        registry_cls = registration.ONNXRegistry
        build = vars(registry_cls)["from_torchlib"].__func__
    except (AttributeError, KeyError):
        warnings.warn(_NOT_AUTOMATIC, stacklevel=2)
        return

    def from_torchlib(cls: type, *args: Any, **kwargs: Any) -> Any:
        registry = build(cls, *args, **kwargs)
        try:
            for target, translation in translation_table().items():
                registry.register_op(target, translation)
        except Exception:  # a change in torch's registry must not break exports of other models
            warnings.warn(_NOT_AUTOMATIC, stacklevel=2)
        return registry

    registry_cls.from_torchlib = classmethod(from_torchlib)


# ---- small graph helpers -----------------------------------------------------------------
# The translations run under the exporter's tracer: every op.* call adds a node.


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


def _columns(rois: ir.Value, t: ir.DataType) -> list[ir.Value]:
    """The five columns of ``rois[K, 5]`` as ``[K]`` vectors of type ``t``."""
    if rois.dtype != t:
        rois = op.Cast(rois, to=t)
    return [op.Squeeze(op.Slice(rois, _i64(i), _i64(i + 1), _i64(1)), _i64(1)) for i in range(5)]


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
        start = op.Slice(coords, _i64(0), _i64(2), _i64(1))
        coords = op.Where(op.Unsqueeze(empty, _i64(1)), op.Concat(start, start, axis=1), coords)
    out = op.RoiAlign(
        x, coords, batch, mode="avg", output_height=pooled_height, output_width=pooled_width,
        sampling_ratio=max(sampling_ratio, 0), spatial_scale=scale_attr,
        coordinate_transformation_mode="half_pixel" if aligned else "output_half_pixel")
    if empty is not None:
        out = op.Where(op.Unsqueeze(empty, _i64(1, 2, 3)), _const(0, t), out)
    return _restore(out, input)


class _Taps:
    """Bilinear taps of one box axis (semantics.md "roi_align avg"), each ``[K, pooled, G]``."""

    def __init__(self, start: ir.Value, bin_size: ir.Value, grid: ir.Value, big_grid: ir.Value,
                 adaptive: bool, pooled: int, size: ir.Value, t: ir.DataType) -> None:
        g = op.Unsqueeze(_range(big_grid), _i64(0, 1))                         # [1, 1, G]
        grid3 = op.Unsqueeze(grid, _i64(1, 2))                                 # [K, 1, 1]
        # Past the box's own grid (adaptive sampling pads to the largest grid), repeat
        # its last sample: harmless for a maximum, masked out of a sum by `inside`.
        self.inside = op.Less(g, grid3)
        if adaptive:
            g = op.Max(op.Min(g, op.Sub(grid3, _i64(1))), _i64(0))
        p = op.Unsqueeze(_range(_scalar(pooled)), _i64(0, 2))                  # [1, P, 1]
        ops = _GraphOps(t)
        v = sample_position(op.Unsqueeze(start, _i64(1, 2)), op.Unsqueeze(bin_size, _i64(1, 2)), grid3, p, g, ops)
        self.lo, self.hi, self.l, self.h, self.valid = bilinear_taps(v, size, ops)


def _align_samples(input: ir.Value, rois: ir.Value, spatial_scale: float, ph: int, pw: int,
                   sampling_ratio: int, aligned: bool) -> tuple[ir.Value, ir.Value, ir.Value, ir.Value, ir.Value,
                                                             ir.Value, ir.DataType]:
    """Every bilinear sample of every bin: ``[K, C, ph, pw, Gh * Gw]`` (0 outside the map),
    with the mask of real (not padding) samples, the per-box grids ``[K]``, the padded grid
    sizes (scalars) and the compute type."""
    x, t = _compute_type(input)
    b, x1, y1, x2, y2 = _columns(rois, t)
    ops, s = _GraphOps(t), _const(spatial_scale, t)
    x_start, _, bin_w, grid_w, _ = align_axis(x1, x2, s, pw, sampling_ratio, aligned, ops)
    y_start, _, bin_h, grid_h, _ = align_axis(y1, y2, s, ph, sampling_ratio, aligned, ops)
    adaptive = sampling_ratio <= 0
    if isinstance(grid_h, int) or isinstance(grid_w, int):  # a fixed sampling_ratio
        grid_h = grid_w = op.Expand(_i64(sampling_ratio), op.Shape(b))  # [K]
        big_h = big_w = _scalar(sampling_ratio)
    else:
        grid_h, grid_w = _to_int(grid_h), _to_int(grid_w)
        # ReduceMax of no boxes is the int64 minimum: keep at least one sample slot.
        big_h = op.Max(op.ReduceMax(grid_h, keepdims=0), _scalar(1))
        big_w = op.Max(op.ReduceMax(grid_w, keepdims=0), _scalar(1))
    height, width = _dim(x, 2), _dim(x, 3)
    ty = _Taps(y_start, bin_h, grid_h, big_h, adaptive, ph, height, t)
    tx = _Taps(x_start, bin_w, grid_w, big_w, adaptive, pw, width, t)

    def rows(v: ir.Value) -> ir.Value:  # [K, ph, Gh] -> [K, ph, Gh, 1, 1]
        return op.Unsqueeze(v, _i64(3, 4))

    def cols(v: ir.Value) -> ir.Value:  # [K, pw, Gw] -> [K, 1, 1, pw, Gw]
        return op.Unsqueeze(v, _i64(1, 2))

    base = op.Unsqueeze(op.Mul(_to_int(b), op.Mul(height, width)), _i64(1, 2, 3, 4))
    ylo, yhi = op.Mul(rows(ty.lo), width), op.Mul(rows(ty.hi), width)
    xlo, xhi = cols(tx.lo), cols(tx.hi)
    # x as [N * H * W, C]: one Gather per corner reads all channels of a sample.
    flat_shape = op.Concat(_i64(-1), op.Shape(x, start=1, end=2), axis=0)
    xf = op.Reshape(op.Transpose(x, perm=[0, 2, 3, 1]), flat_shape)

    def corner(yy: ir.Value, xx: ir.Value, wy: ir.Value, wx: ir.Value) -> ir.Value:
        w = op.Unsqueeze(op.Mul(rows(wy), cols(wx)), _i64(5))                    # [K, ph, Gh, pw, Gw, 1]
        return op.Mul(w, op.Gather(xf, op.Add(base, op.Add(yy, xx)), axis=0))   # [K, ph, Gh, pw, Gw, C]

    # w1*v1 + w2*v2 + w3*v3 + w4*v4, left to right as in the kernels
    val = op.Add(op.Add(op.Add(corner(ylo, xlo, ty.h, tx.h), corner(ylo, xhi, ty.h, tx.l)),
                        corner(yhi, xlo, ty.l, tx.h)), corner(yhi, xhi, ty.l, tx.l))
    valid = op.Unsqueeze(op.And(rows(ty.valid), cols(tx.valid)), _i64(5))
    val = op.Where(valid, val, _const(0, t))
    inside = op.And(rows(ty.inside), cols(tx.inside))                            # [K, 1, Gh, 1, Gw]
    val = op.Transpose(val, perm=[0, 5, 1, 3, 2, 4])                              # [K, C, ph, pw, Gh, Gw]
    inside = op.Transpose(inside, perm=[0, 1, 3, 2, 4])                           # [K, 1, 1, Gh, Gw]
    # Explicit sizes, no -1: Reshape cannot infer a dimension when K = 0.
    grid_size = op.Unsqueeze(op.Mul(big_h, big_w), _i64(0))
    val = op.Reshape(val, op.Concat(op.Shape(val, start=0, end=4), grid_size, axis=0))
    inside = op.Reshape(inside, op.Concat(op.Shape(inside, start=0, end=3), grid_size, axis=0))
    inside = op.Unsqueeze(inside, _i64(1))                                        # [K, 1, 1, 1, Gh*Gw]
    return val, inside, grid_h, grid_w, big_h, big_w, t


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
    has_nan = op.Greater(op.ReduceMax(nan_i, _i64(axis), keepdims=0), _const(0, _INT32))
    best = op.Where(has_nan, _const(np.nan, t), op.ReduceMax(clean, _i64(axis), keepdims=0))
    first = op.Where(has_nan, op.ArgMax(nan_i, axis=axis, keepdims=0), op.ArgMax(clean, axis=axis, keepdims=0))
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
    val, inside, grid_h, grid_w, big_h, big_w, t = _align_samples(input, rois, spatial_scale, pooled_height, pooled_width,
                                                       sampling_ratio, aligned)
    # The kernels add the samples one after the other in row-major order; a running sum
    # (CumSum) adds in that order, so the result is bit for bit the kernels' (+0 for the
    # padding and outside samples changes nothing). ReduceSum would reassociate.
    val = op.CumSum(op.Where(inside, val, _const(0, t)), _scalar(-1))
    total = op.Gather(val, op.Sub(op.Mul(big_h, big_w), _scalar(1)), axis=-1)
    count = op.Cast(op.Max(op.Mul(grid_h, grid_w), _i64(1)), to=t)
    out = op.Div(total, op.Unsqueeze(count, _i64(1, 2, 3)))
    return _restore(op.Where(_empty_grid(grid_h, grid_w), _const(0, t), out), input)


# ---- position-sensitive ops -----------------------------------------------------------------


_SCHEMA_TYPES = {"float": float, "int": int, "bool": bool}


def _refused(kernels: Kernels) -> Callable[..., Any]:
    """The translation of an op ONNX cannot express (``kernels.onnx`` names what ONNX lacks):
    it raises an error naming the op. Its parameters spell out the op's, since the exporter
    matches a translation to a node by them."""
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(
            f"roiops.{kernels.title or kernels.name} cannot be exported to ONNX: ONNX has no {kernels.onnx} operator "
            "and roiops exports no decomposition of it; keep it out of the exported graph (e.g. export the network "
            "up to the pooling)")

    params = [("input", _In), ("rois", _In), *((n, _In) for n, _ in kernels.tensors),
              *((n, _SCHEMA_TYPES[t]) for t, n in kernels.args)]
    refuse.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=t) for n, t in params])
    refuse.__annotations__ = dict(params)
    return refuse


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

    # Each bin is gathered as a padded window of the largest bin's size; padding repeats
    # the bin's last row/column (a maximum is unchanged by repeats).
    def window(lo: ir.Value, hi: ir.Value, size: ir.Value) -> tuple[ir.Value, ir.Value]:
        big = op.Max(op.ReduceMax(op.Sub(hi, lo), keepdims=0), _scalar(1))
        g = op.Unsqueeze(_range(big), _i64(0, 1))                                               # [1, 1, G]
        idx = op.Min(op.Add(op.Unsqueeze(lo, _i64(2)), g), op.Sub(op.Unsqueeze(hi, _i64(2)), _i64(1)))
        return op.Min(op.Max(idx, _i64(0)), op.Sub(size, _i64(1))), big                        # [K, P, G]

    rows, _ = window(h0, h1, height)
    cols, big_w = window(w0, w1, width)

    # Stage 1, rows: x as [N * H, C, W]; gather each bin's rows and reduce them.
    xt = op.Reshape(op.Transpose(x, perm=[0, 2, 1, 3]),
                    op.Concat(_i64(-1), op.Shape(x, start=1, end=2), op.Shape(x, start=3, end=4), axis=0))
    ridx = op.Add(op.Unsqueeze(op.Mul(_to_int(b), height), _i64(1, 2)), rows)                 # [K, ph, Gh]
    m1, a1, _ = _nan_aware_max(op.Gather(xt, ridx, axis=0), 2, t)                            # [K, ph, C, W]
    row1 = op.Add(op.Unsqueeze(h0, _i64(2, 3)), a1)  # row of each column's first maximum

    # Stage 2, columns of each bin, per box: GatherElements along W.
    k_ph_c = op.Shape(m1, start=0, end=3)
    # Explicit sizes, no -1: Reshape cannot infer a dimension when K = 0.
    gw = op.Unsqueeze(big_w, _i64(0))
    num_k = op.Shape(cols, start=0, end=1)
    cidx = op.Reshape(cols, op.Concat(num_k, _i64(1, 1), op.Mul(_i64(pooled_width), gw), axis=0))
    cidx = op.Expand(cidx, op.Concat(k_ph_c, op.Shape(cidx, start=3, end=4), axis=0))        # [K, ph, C, pw*Gw]
    split = op.Concat(k_ph_c, _i64(pooled_width), gw, axis=0)

    def gather_cols(v: ir.Value) -> ir.Value:  # [K, ph, C, W] -> [K, ph, C, pw, Gw]
        return op.Reshape(op.GatherElements(v, cidx, axis=3), split)

    m2, row2 = gather_cols(m1), gather_cols(row1)
    best, _, has_nan = _nan_aware_max(m2, 4, t)
    # The bin's maximum is hit by the columns equal to it; in a NaN bin, by its NaN columns.
    nan_bin = op.Unsqueeze(has_nan, _i64(4))  # (onnxruntime has no Where for bool values)
    hit = op.Or(op.And(nan_bin, op.IsNaN(m2)), op.And(op.Not(nan_bin), op.Equal(m2, op.Unsqueeze(best, _i64(4)))))
    # First maximum in row-major order = the smallest h * W + w among the hits.
    col_w = op.Reshape(cols, op.Concat(num_k, _i64(1, 1, pooled_width), gw, axis=0))
    key = op.Add(op.Mul(row2, width), col_w)
    argmax = op.ReduceMin(op.Where(hit, key, _i64(_I64_MAX)), _i64(4), keepdims=0)      # [K, ph, C, pw]

    empty_bin = op.Unsqueeze(op.Or(op.Unsqueeze(op.LessOrEqual(h1, h0), _i64(2)),
                                   op.Unsqueeze(op.LessOrEqual(w1, w0), _i64(1))), _i64(1))  # [K, 1, ph, pw]
    out = op.Where(empty_bin, _const(0, t), op.Transpose(best, perm=[0, 2, 1, 3]))
    argmax = op.Where(empty_bin, _i64(-1), op.Transpose(argmax, perm=[0, 2, 1, 3]))
    return _restore(out, input), op.Cast(argmax, to=_INT32)
