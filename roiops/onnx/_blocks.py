"""Decompositions run over blocks of boxes, so that their memory is bounded by a block and
not by the box count: an ONNX ``Loop`` whose body is the op's own translation applied to
one block of boxes; the blocks' results are concatenated and put back in box order.

A decomposition pads every box's grid of samples (or cells) per bin to the largest in the
block. The boxes are therefore sorted into classes by their samples per bin, rounded up
to a power of two along each axis (so a box is padded to at most twice its grid along
each axis), and each class is cut into blocks whose largest intermediate holds at most
``block_values`` values. Each box is computed exactly as without blocks, so the results
are the same bits."""

from __future__ import annotations

import functools
import inspect
import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from onnxscript import evaluator, ir
from torch.onnx._internal.exporter import _building

from ._graph import op, _FLOAT, _INT64, _Constants, _maps_outside

BLOCK_VALUES = 1 << 22
"""The default of the most values a block's largest intermediate holds (16 MB in float32)."""

_LEVELS = 24  # classes along an axis: 1, 2, 4, ... 2**23 samples per bin, and more
_AXIS_CLASSES = _LEVELS + 1

_RECORDER: Any = _building.OpRecorder  # records the body's nodes as the exporter records the graph's
_loops = itertools.count()  # names the loops' values apart (ONNX values are named once per model)


@dataclass(frozen=True)
class Blocking:
    """How an op's translation runs over blocks of boxes.

    ``sides(arguments)`` gives each box's height and width in map cells (float32 ``[K]``,
    from the translation's bound arguments); a box's samples (or cells) per bin along an
    axis are taken as ``ceil(side / pooled) + 2`` (a bound for every op blocked here),
    or ``sampling_ratio`` where the op has a positive one. ``per_box`` names the arguments
    with one row per box (gathered per block). Position-sensitive ops have ``C / (ph * pw)``
    output channels. ``outputs`` are the output types (None: the input's)."""

    sides: Callable[[Mapping[str, Any]], tuple[ir.Value, ir.Value]]
    per_box: tuple[str, ...] = ("rois",)
    position_sensitive: bool = False
    outputs: tuple[ir.DataType | None, ...] = (None,)


def blocked(translate: Callable[..., Any], blocking: Blocking, values: int) -> Callable[..., Any]:
    """``translate`` run over blocks of boxes whose largest intermediate holds at most
    ``values`` values (or one box); the same signature and results."""
    signature = inspect.signature(translate)

    @functools.wraps(translate)
    def translation(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return _loop(translate, blocking, values, bound.arguments)

    return translation


def _loop(translate: Callable[..., Any], blocking: Blocking, values: int, arguments: Mapping[str, Any]) -> Any:
    """One Loop over the blocks: each block's results are appended to a sequence, which
    shares their buffers (a tensor carried from one iteration to the next and updated
    would be copied whole at every block); the concatenated blocks, in class order, are
    put back in box order."""
    c = _Constants()
    input, rois = arguments["input"], arguments["rois"]
    ph, pw = arguments["pooled_height"], arguments["pooled_width"]
    count = op.Shape(rois, start=0, end=1)                                        # [1]
    channels = op.Shape(input, start=1, end=2)
    if blocking.position_sensitive:
        channels = op.Div(channels, c.i64(ph * pw))
    key, size, classes = _classes(blocking, arguments, values, count, channels, c)
    k = c.size(rois, 0)
    # Unique sort keys: class, then box index (TopK's order of equal keys is unspecified).
    order = op.TopK(op.Add(op.Mul(key, k), c.range(k)), count, largest=0, sorted=1)[1]
    boxes = op.ReduceSum(op.Cast(op.Equal(op.Unsqueeze(key, c.i64(1)), c.i64(*range(classes))), to=_INT64),
                         c.i64(0), keepdims=0)
    blocks = op.Div(op.Add(boxes, op.Sub(size, c.scalar(1))), size)
    trips = op.ReduceSum(blocks, c.i64(0), keepdims=0)
    plan = (op.CumSum(boxes, c.scalar(0), exclusive=1), boxes, size, op.CumSum(blocks, c.scalar(0), exclusive=1),
            op.CumSum(blocks, c.scalar(0)))
    for value in (order, *plan):  # the body declares the types of what it reads
        value.dtype = _INT64

    dtypes = [input.dtype if t is None else t for t in blocking.outputs]
    tag = f"roiops_blocks{next(_loops)}_"
    iteration = ir.Value(name=tag + "iteration", type=ir.TensorType(_INT64), shape=ir.Shape([]))
    cond = ir.Value(name=tag + "cond", type=ir.TensorType(ir.DataType.BOOL), shape=ir.Shape([]))
    done = [ir.Value(name=f"{tag}done{n}", type=ir.SequenceType(ir.TensorType(t))) for n, t in enumerate(dtypes)]
    outside: Any = evaluator.default()  # the exporter's OpRecorder: its nodes are the graph's
    recorder = _RECORDER(outside.opset, {})
    with _maps_outside(input), evaluator.default_as(recorder):
        inner = _Constants()
        ids = _block(iteration, order, *plan, inner)
        given = {name: op.Gather(arguments[name], ids, axis=0) for name in blocking.per_box
                 if arguments[name] is not None}
        results = translate(**{**arguments, **given})
        results = results if isinstance(results, tuple) else (results,)
        following = [op.SequenceInsert(seq, out) for seq, out in zip(done, results, strict=True)]
        go_on = op.Identity(cond)
    go_on.type, go_on.shape = cond.type, cond.shape
    for value, seq in zip(following, done):
        value.type = seq.type
    for n, node in enumerate(recorder.nodes):
        node.name = f"{tag}node{n}"
        for m, value in enumerate(node.outputs):
            value.name = f"{tag}value{n}_{m}"
    outer, passed = _pass_in(recorder.nodes, [iteration, cond, *done], tag)
    body = ir.Graph(inputs=[iteration, cond, *done, *passed], outputs=[go_on, *following, *passed],
                    nodes=recorder.nodes, name=tag + "body")
    # Each sequence starts with no rows, so that no boxes concatenate to [0, C, ph, pw].
    empty = op.Concat(c.i64(0), channels, c.i64(ph, pw), axis=0)
    initial = [op.SequenceConstruct(op.Expand(c(0, t), empty)) for t in dtypes]
    # Every one of the trips runs: the condition is true and the body passes it on.
    loop = ir.Node("", "Loop", inputs=[trips, c(True, ir.DataType.BOOL), *initial, *outer],
                   attributes=[ir.AttrGraph("body", body)], num_outputs=len(dtypes) + len(passed))
    outside.nodes.append(loop)
    for value, like in zip(loop.outputs, [*done, *passed], strict=True):
        value.name = f"{tag}out{value.index()}"
        value.type, value.shape = like.type, like.shape
    inverse = op.ScatterElements(c.range(k), order, c.range(k), axis=0)     # box -> its row in class order
    outs = tuple(op.Gather(op.ConcatFromSequence(seq, axis=0), inverse, axis=0) for seq in loop.outputs[:len(dtypes)])
    return outs[0] if len(outs) == 1 else outs


def _pass_in(nodes: list[ir.Node], own: list[ir.Value], tag: str) -> tuple[list[ir.Value], list[ir.Value]]:
    """Every value from outside that the body ``nodes`` read, made a value carried through
    the Loop unchanged (the body reads its own input in its place): the outer values and
    the body's inputs. onnxruntime 1.32 can drop an outer value that a Loop body only
    reads from the outer scope (one that its optimiser replaces, as a cast chain), so the
    body reads none."""
    inside = {id(v) for v in own} | {id(v) for node in nodes for v in node.outputs}
    passed: dict[int, tuple[ir.Value, ir.Value]] = {}
    for node in nodes:
        for i, value in enumerate(node.inputs):
            if value is None or id(value) in inside:
                continue
            if id(value) not in passed:
                assert value.type is not None, f"the type of {value.name}, which a loop body reads, is unknown"
                passed[id(value)] = value, ir.Value(name=f"{tag}in{len(passed)}", type=value.type, shape=value.shape)
            node.replace_input_with(i, passed[id(value)][1])
    return [outer for outer, _ in passed.values()], [inner for _, inner in passed.values()]


def _block(iteration: ir.Value, order: ir.Value, first: ir.Value, boxes: ir.Value, size: ir.Value,
           first_block: ir.Value, through: ir.Value, c: _Constants) -> ir.Value:
    """The boxes of block ``iteration`` (``[B]``): the class whose blocks reach past it, and
    its ``(iteration - the class's first block)``-th run of ``size`` boxes."""
    q = op.ReduceSum(op.Cast(op.LessOrEqual(through, iteration), to=_INT64), c.i64(0), keepdims=0)

    def of_class(table: ir.Value) -> ir.Value:
        return op.Gather(table, q)

    start = op.Add(of_class(first), op.Mul(op.Sub(iteration, of_class(first_block)), of_class(size)))
    stop = op.Min(op.Add(start, of_class(size)), op.Add(of_class(first), of_class(boxes)))
    return op.Slice(order, op.Unsqueeze(start, c.i64(0)), op.Unsqueeze(stop, c.i64(0)), c.i64(0))


def _classes(blocking: Blocking, arguments: Mapping[str, Any], values: int, count: ir.Value, channels: ir.Value,
             c: _Constants) -> tuple[ir.Value, ir.Value, int]:
    """Each box's class (``[K]``), each class's boxes per block and the number of classes."""
    ph, pw = arguments["pooled_height"], arguments["pooled_width"]
    ratio = arguments.get("sampling_ratio", 0)
    if ratio > 0:  # every box alike: one class
        key = op.Expand(c.i64(0), count)
        rows, cols = np.array([ratio]), np.array([ratio])
    else:
        height, width = blocking.sides(arguments)

        def level(side: ir.Value, pooled: int) -> ir.Value:
            """The least ``l`` with ``2**l >= ceil(side / pooled) + 2`` (NaN: 0), ``[K]``."""
            per_bin = op.Add(op.Ceil(op.Div(op.Abs(side), c(pooled, _FLOAT))), c(2, _FLOAT))
            powers = c(tuple(2.0 ** n for n in range(_LEVELS)), _FLOAT)
            below = op.Less(op.Unsqueeze(powers, c.i64(0)), op.Unsqueeze(per_bin, c.i64(1)))
            return op.ReduceSum(op.Cast(below, to=_INT64), c.i64(1), keepdims=0)

        key = op.Add(op.Mul(level(height, ph), c.scalar(_AXIS_CLASSES)), level(width, pw))
        grid = 2.0 ** np.arange(_AXIS_CLASSES)
        rows, cols = np.repeat(grid, _AXIS_CLASSES), np.tile(grid, _AXIS_CLASSES)
    # Per class, the values of a box's largest intermediate.
    per_box = op.Mul(c(tuple(ph * pw * rows * cols), _FLOAT), op.Cast(channels, to=_FLOAT))
    size = op.Max(op.Cast(op.Floor(op.Div(c(values, _FLOAT), per_box)), to=_INT64), c.scalar(1))
    return key, size, len(rows)
