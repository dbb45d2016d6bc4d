"""What every operator must do, run for each spec of roiops.ops.SPECS and each of its option
sets (tests/cases.py's CASES): every dtype, layout and kernel set against the float64
reference oracle; gradcheck of every differentiable input; opcheck of every registered op;
torch.compile and torch.export; the Module; results that do not depend on the thread
count; the arguments every op refuses; no boxes; strided maps; the eager path against the
registered op; the C++ kernels' reused output blocks. An op's own maths and peers are in
its own test file."""

from __future__ import annotations

import inspect
import math
import multiprocessing
import os
import subprocess
import sys
import typing

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

import roiops
from cases import (BOX_FORMAT, BOX_GRAD_CASES, CASES, DTYPES, F32, F64, PER_BIN, POSITION_SENSITIVE_OPS, SCALE, VARIANTS,
                   C, H, N, RecordOps, W, backend_used, backward_paths, boxes_for, close, config_set, contract_args,
                   device_for, feature, forward_kernels, num_threads, odd_unit_strides, params, per_bin_tensors,
                   per_bin_values, per_image, run, schema, spec_params, takes_max, tol)
from roiops._boxes import AXIS_ALIGNED, ROTATED

SIZE = (2, 3)


def call(case, size=SIZE, scale=SCALE):
    """The case's public function of (map, boxes)."""
    return lambda x, b: case(x, b, size, scale)


def layout(channels_last):
    return torch.channels_last if channels_last else torch.contiguous_format


def box_dtype(dtype):
    """The kernels' coordinate type for a map of ``dtype``."""
    return F64 if dtype == F64 else F32


def assert_box_grad(case, grad_boxes, boxes):
    """A box-gradient case's boxes get a gradient of their shape (0 in the batch-index
    column); the others get none."""
    if case.box_grad:
        assert grad_boxes is not None and grad_boxes.shape == boxes.shape and grad_boxes.dtype == boxes.dtype
        assert not grad_boxes[:, 0].any()
    else:
        assert grad_boxes is None


def assert_same(got, want):
    """Two runs' (output, input gradient, box gradient): the same bits (no box gradient in both)."""
    for a, b in zip(got, want, strict=True):
        assert (a is None and b is None) or torch.equal(a, b)


def box_grad_close(actual, expected, dtype):
    """Box gradients are sums of terms of both signs over channels and bins: compared
    against the size of their terms, not of the result."""
    t = tol(dtype)["atol"]
    torch.testing.assert_close(actual, expected, rtol=t, atol=t * (1 + float(expected.abs().max())))


# ----------------------------------------------------------------------------- against the reference


def _dtype_id(dtype):
    return str(dtype)[6:]


def _reference_case(case, dtype, channels_last, backend):
    return pytest.param(case, dtype, channels_last, backend,
                        id=f"{case.id}-{_dtype_id(dtype)}-{'cl' if channels_last else 'nchw'}-{backend}")


# Every dtype and layout on the C++ kernels. Triton's interpreter is slow: one pair per
# case, in turn (each of the eight pairs runs, both layouts for each op with several option
# sets; test_triton and the ops' own files run each op's Triton kernels in every dtype
# and layout).
REFERENCE_CASES = [_reference_case(c, d, cl, "cpu") for c in CASES for d in DTYPES for cl in (False, True)]
REFERENCE_CASES += [_reference_case(c, DTYPES[i // 2 % 4], bool(i % 2), "triton") for i, c in enumerate(CASES)]


@pytest.mark.parametrize("case, dtype, channels_last, backend", REFERENCE_CASES)
def test_matches_reference(case, dtype, channels_last, backend):
    """Output, input gradient and box gradient against the reference run on the same
    values: in the input's dtype and layout, to the dtype's rounding; an output that is a
    maximum is one sample's value, the same bits from the C++ kernels (which interpolate
    in the reference's order)."""
    x = feature(dtype, channels_last, channels=case.channels(C, SIZE))
    boxes = case.boxes(dtype=box_dtype(dtype))
    # Triton's two backward paths, each in both layouts: the atomic adds and the ordered gather.
    with config_set(deterministic_backward=dtype in (F64, torch.float16)):
        out, grad, grad_boxes = run(call(case), x, boxes, backend)
    ref_out, ref_grad, ref_boxes = run(call(case), x, boxes, "reference")
    assert out.shape == (len(boxes), case.out_channels(C), *SIZE) and out.dtype == grad.dtype == dtype
    assert out.is_contiguous(memory_format=layout(channels_last))
    assert grad.is_contiguous(memory_format=layout(channels_last))
    if takes_max(case) and backend == "cpu":
        assert torch.equal(out, ref_out)
    else:
        close(out, ref_out, dtype)
    close(grad, ref_grad, dtype)
    assert_box_grad(case, grad_boxes, boxes)
    if case.box_grad:
        box_grad_close(grad_boxes, ref_boxes, dtype)
    assert out.abs().sum() > 0 and grad.abs().sum() > 0


def _non_finite(case, channels_last):
    """A map with NaN, inf and -inf inside and on the last row and column, where a sample
    clamped to the border puts weight 0 on a tap (0 * inf is NaN in the per-sample formula)."""
    x = feature(channels=case.channels(C, SIZE))
    c = x.shape[1]
    x[0, 0, 3, 4], x[0, 1 % c, H - 1, 5], x[1, 2 % c, 6, W - 1] = float("inf"), float("inf"), float("-inf")
    x[0, c - 1, 2:5, 5:8], x[1, c // 2, 4, 2] = float("-inf"), float("nan")
    return x.contiguous(memory_format=layout(channels_last))


@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "cl"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_non_finite_values_match_reference(case, channels_last):
    x, boxes = _non_finite(case, channels_last), case.boxes()
    out, grad, grad_boxes = run(call(case), x, boxes, "cpu")
    ref_out, ref_grad, ref_boxes = run(call(case), x, boxes, "reference")
    assert out.isnan().any() and out.isinf().any()
    torch.testing.assert_close(out, ref_out, equal_nan=True)
    torch.testing.assert_close(grad, ref_grad, equal_nan=True)
    if case.box_grad:
        torch.testing.assert_close(grad_boxes, ref_boxes, equal_nan=True)


# ----------------------------------------------------------------------------- gradients


def _gradcheck(fn, inputs, backend, monkeypatch):
    # On the reference and under Triton's interpreter the full Jacobian takes minutes:
    # random projections of it.
    for deterministic, nondet_tol in backward_paths(backend):
        monkeypatch.setattr(roiops.config, "deterministic_backward", deterministic)
        assert torch.autograd.gradcheck(fn, inputs, atol=1e-8, nondet_tol=nondet_tol, fast_mode=backend != "cpu")


def _on(backend, fn):
    def within(*args):
        with backend_used(backend):
            return fn(*args)
    return within


@pytest.mark.parametrize("backend", ["reference", "cpu", "triton"])
@pytest.mark.parametrize("case", params(CASES))
def test_gradcheck_input(case, backend, monkeypatch):
    """float64 gradcheck of the input's gradient (and of any per-bin tensor's, a deformable
    offset), NCHW and channels_last (2 output channels: truly channels_last), over random
    boxes and nasty ones."""
    dev = device_for(backend)
    boxes = case.boxes(dtype=F64, seed=4, count=3, width=14, height=12)[:9].to(dev)
    shape = (N, case.channels(1, SIZE), 6, 7)
    x = feature(F64, seed=3, shape=shape).to(dev)
    extra = {n: t.requires_grad_() for n, t in case.tensors(x, boxes, SIZE).items() if t is not None}
    fn = _on(backend, lambda t, *e: case(t, boxes, SIZE, SCALE, **dict(zip(extra, e))))
    xcl = feature(F64, True, seed=3, shape=(N, 2 * shape[1], 6, 7)).to(dev)
    # The reference and Triton's interpreter, the slowest: one layout, each in turn.
    maps = (x, xcl) if backend == "cpu" else (xcl,) if CASES.index(case) % 2 else (x,)
    for t in maps:
        _gradcheck(fn, (t.requires_grad_(), *extra.values()), backend, monkeypatch)


@pytest.mark.parametrize("backend", ["reference", "cpu", "triton"])
@pytest.mark.parametrize("case", params(BOX_GRAD_CASES))
def test_gradcheck_boxes(case, backend, monkeypatch):
    """float64 gradcheck of the box coordinates' gradient together with the input's, on
    random boxes (a sample that crosses a cell edge within gradcheck's step would make a
    difference quotient jump: none does here)."""
    dev = device_for(backend)
    boxes = case.boxes(dtype=F64, seed=4, count=5, width=14, height=12, nasty=False).to(dev)
    index, coords = boxes[:, :1], boxes[:, 1:].clone().requires_grad_()
    fn = _on(backend, lambda t, c: case(t, torch.cat([index, c], 1), SIZE, SCALE))
    x = feature(F64, backend == "cpu", seed=3, shape=(N, case.channels(2, SIZE), 6, 7)).to(dev).requires_grad_()
    _gradcheck(fn, (x, coords), backend, monkeypatch)


@pytest.mark.parametrize("case", params(CASES))
def test_double_backward_is_refused(case):
    x = feature(F64, channels=case.channels(C, SIZE)).requires_grad_()
    boxes = case.boxes(dtype=F64).requires_grad_()
    wrt = (x, boxes) if case.box_grad else (x,)
    grads = torch.autograd.grad(case(x, boxes, SIZE, SCALE).square().sum(), wrt, create_graph=True)
    for g in grads:
        with pytest.raises(RuntimeError, match="has no double backward"):
            torch.autograd.grad(g.sum(), wrt, allow_unused=True)


# ----------------------------------------------------------------------------- registered ops


def _op_sample(op, variant):
    """The op's arguments: the variant over these defaults, and for a backward that takes
    an argmax, its forward's."""
    x = feature(channels=variant.get("channels", C))
    rois = boxes_for(BOX_FORMAT[op])
    if BOX_FORMAT[op] is ROTATED:
        rois[:, 5] = torch.deg2rad(rois[:, 5])  # the registered op takes radians
    grad = torch.randn(len(rois), variant.get("out_channels", C), 2, 3, generator=torch.Generator().manual_seed(2))
    values = dict(input=x, rois=rois, grad=grad, spatial_scale=SCALE, pooled_height=2, pooled_width=3,
                  sampling_ratio=2, aligned=True, continuous=False, batch_size=N, channels=C, height=H, width=W,
                  channels_last=False, gamma=0.1)
    values.update({name: per_bin_values(rois, (2, 3), c, x) for name, c in PER_BIN.get(op, {}).items()})
    values.update(variant)
    if any(a.name == "argmax" for a in schema(op).arguments):
        forward = op[1:-len("_backward")]
        values["argmax"] = getattr(torch.ops.roiops, forward)(*contract_args(forward, **values).values())[1]
    # A forward's differentiable arguments require grad; the box-gradient op, which also
    # takes the input, has no gradient of its own.
    if not schema(op).name.endswith("_backward"):
        values["input"] = x.requires_grad_()
        for name in PER_BIN.get(op, {}):
            values[name] = values[name].requires_grad_()
        if variant.get("rois_grad"):
            values["rois"] = values["rois"].requires_grad_()
    return contract_args(op, **values)


OPCHECK = [(op, v) for op, vs in VARIANTS.items() for v in vs]


@pytest.mark.parametrize("op, variant", OPCHECK,
                         ids=[op + "".join(f"-{k}={v}" for k, v in v.items()) for op, v in OPCHECK])
def test_opcheck(op, variant):
    if op in POSITION_SENSITIVE_OPS:
        assert variant["channels"] % (2 * 3) == 0  # 2 x 3 bins per output channel
    torch.library.opcheck(getattr(torch.ops.roiops, op).default, tuple(_op_sample(op, variant).values()))


@pytest.mark.parametrize("case", params(CASES))
def test_eager_calls_run_the_kernels_as_the_registered_ops_do(case):
    """A plain eager call runs its kernel without the dispatcher; under a dispatch mode (as
    FakeTensor, export and compile install) it calls the registered op. Both give the same
    bits, forward and backward, input and box gradients."""
    x = feature(F64, channels=case.channels(C, 3))
    b = case.boxes(dtype=F64, seed=3, count=7)
    ops = forward_kernels(case).ops()
    results = []
    for recorded in (False, True):
        xi, bi = x.clone().requires_grad_(), b.clone().requires_grad_()
        recorder = RecordOps()
        with recorder if recorded else backend_used(None):
            assert roiops.ops._declare.direct(xi, bi) is not recorded
            out = case(xi, bi, 3, SCALE)
            out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=out.dtype))
        if recorded:
            assert f"roiops.{ops['forward']}.default" in recorder.ops
            assert f"roiops.{ops['backward']}.default" in recorder.ops
            assert (f"roiops.{ops.get('rois_backward')}.default" in recorder.ops) == case.box_grad
        results.append((out, xi.grad, bi.grad))
    (out, gx, gb), (out_op, gx_op, gb_op) = results
    assert torch.equal(out, out_op) and torch.equal(gx, gx_op)
    assert_box_grad(case, gb, b)
    if case.box_grad:
        assert torch.equal(gb, gb_op)
    assert gx.abs().sum() > 0


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")  # the checks' shape tests, traced as constants
@pytest.mark.filterwarnings("ignore:`torch.jit.trace` is deprecated:FutureWarning")
@pytest.mark.parametrize("case", spec_params())
def test_traced_and_profiled_calls_see_the_registered_op(case):
    x, b = feature(channels=case.channels(C, 3)), case.boxes()
    op = f"roiops::{forward_kernels(case).name}"
    fn = lambda x: case(x, b, 3, SCALE)  # noqa: E731
    assert op in str(torch.jit.trace(fn, (x,), check_trace=False).graph)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn(x)
    assert op in {e.name for e in prof.events()}


def test_eager_path_is_for_plain_tensors_only():
    class PassThrough(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    x, b = feature(), boxes_for()
    direct = roiops.ops._declare.direct
    assert direct(x, b)
    with PassThrough():
        assert not direct(x, b)
    with torch._subclasses.FakeTensorMode() as mode:
        assert not direct(mode.from_tensor(x), mode.from_tensor(b))
    assert not direct(torch.nn.Parameter(x), b)
    assert not direct(x.to("meta"), b.to("meta"))
    assert torch.func.vmap(lambda t: t.sum() * 0 + direct(t, b))(x).eq(0).all()


# ----------------------------------------------------------------------------- compile and export


# Box counts 14 and 17 differ from every other dimension: with dynamic=True, dynamo's duck
# shaping would give K the same symbol as an equal static size and specialise it.
COUNTS = (4, 7)
# Compiled graphs reach the ops through the dispatcher, which runs CPU tensors on the C++
# kernels whatever backend is forced: Triton's run on a GPU only.
COMPILE = [pytest.param(c, "cpu", id=c.id) for c in CASES]
COMPILE += [pytest.param(c, "triton", id=f"{c.id}-triton",
                         marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"))
            for c in BOX_GRAD_CASES]


@pytest.mark.parametrize("case, backend", COMPILE)
def test_compile_fullgraph_dynamic_boxes(case, backend, fresh_dynamo):
    """torch.compile (fullgraph, AOT autograd, dynamic box count) through the op and its
    gradients: the eager results, bit for bit, and no recompile for another box count
    (the GPU's atomic backward would differ in last bits from run to run: the
    deterministic one)."""
    counter = CompileCounterWithBackend("aot_eager")
    names = list(per_bin_tensors(case.spec))  # made outside the compiled function, per box count
    op = torch.compile(lambda x, b, *e: case(x, b, SIZE, SCALE, **dict(zip(names, e))), backend=counter,
                       fullgraph=True, dynamic=True)

    def compiled(x, b):
        return op(x, b, *case.tensors(x, b, SIZE).values())

    x = feature(channels=case.channels(C, SIZE))
    frames = []
    with config_set(deterministic_backward=True):
        for count in COUNTS[:1] if backend == "triton" else COUNTS:  # the interpreter: one
            boxes = case.boxes(seed=count, count=count)
            got, want = run(compiled, x, boxes, backend), run(call(case), x, boxes, backend)
            assert_same(got, want)
            assert_box_grad(case, got[2], boxes)
            frames.append(counter.frame_count)
    assert frames[0] >= 1 and frames[-1] == frames[0], "another box count recompiled"


@pytest.mark.parametrize("case", params(CASES))
def test_export_dynamic_boxes(case):
    names = list(per_bin_tensors(case.spec))

    class Head(torch.nn.Module):
        def forward(self, x, boxes, extra):
            return case(x, boxes, SIZE, SCALE, **dict(zip(names, extra)))

    x = feature(channels=case.channels(C, SIZE))
    boxes, more = case.boxes(count=COUNTS[0]), case.boxes(seed=1, count=COUNTS[1])
    extra = tuple(case.tensors(x, boxes, SIZE).values())
    k = torch.export.Dim("k", min=2, max=1000)
    program = torch.export.export(Head(), (x, boxes, extra),
                                  dynamic_shapes=({}, {0: k}, tuple(None if t is None else {0: k} for t in extra)))
    assert f"roiops.{forward_kernels(case).name}.default" in str(program.graph)
    got = program.module()(x, more, tuple(case.tensors(x, more, SIZE).values()))
    assert torch.equal(got, case(x, more, SIZE, SCALE))


# ----------------------------------------------------------------------------- the Module


@pytest.mark.parametrize("case", params(CASES))
def test_module(case):
    """Constructed with the case's options, the Module shows all of its options (defaults
    from its signature) and gives the function's output and gradients, for a tensor of
    boxes and for a list of them."""
    m = case.module((3, 2), 0.25)
    shown = {"output_size": (3, 2), "spatial_scale": 0.25}
    for name, p in list(inspect.signature(case.spec.module.__init__).parameters.items())[3:]:
        shown[name] = case.options.get(name, p.default)
    assert repr(m) == f"{case.spec.module.__name__}({', '.join(f'{n}={v!r}' for n, v in shown.items())})"
    assert type(m).function is case.spec.function
    x, boxes = feature(channels=case.channels(C, (3, 2))), case.boxes()
    got = run(lambda t, b: m(t, b, *case.tensors(t, b, (3, 2)).values()), x, boxes)
    want = run(lambda t, b: case(t, b, (3, 2), 0.25), x, boxes)
    assert_same(got, want)
    lists, ordered = per_image(boxes)
    assert torch.equal(m(x, lists, *case.tensors(x, lists, (3, 2)).values()), case(x, ordered, (3, 2), 0.25))
    with pytest.raises(ValueError, match="output_size"):
        case.spec.module(0, 1.0, **case.keywords)
    with pytest.raises(ValueError, match="spatial_scale"):
        case.spec.module(2, 0.0, **case.keywords)


# ----------------------------------------------------------------------------- threads


@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "cl"])
@pytest.mark.parametrize("case", params(CASES))
def test_results_do_not_depend_on_the_thread_count(case, channels_last):
    """The C++ kernels split boxes, channels and rows over threads; each sum keeps its
    order: 1, 2 and 3 threads give the same bits, forward and backward."""
    size = (3, 3)
    x = feature(channels_last=channels_last, channels=case.channels(40, size))
    boxes = case.boxes(count=40)
    results = []
    for threads in (1, 2, 3):
        with num_threads(threads):
            results.append(run(call(case, size), x, boxes, "cpu"))
    assert results[0][1].abs().sum() > 0
    for other in results[1:]:
        assert_same(other, results[0])


# ----------------------------------------------------------------------------- arguments


def _bad_arguments(form):
    width, name = form.width, form.argument
    box = form.from_axis_aligned(torch.tensor([[0, 1.0, 1.0, 6.0, 5.0]]))

    def row(index, column, value):
        b = torch.cat([box, box]) if index else box.clone()
        b[index, column] = value
        return b

    x = torch.randn(2, 3, 8, 9)
    return [
        (x[0], box, {}, ValueError, r"4-D"),
        (x.long(), box, {}, ValueError, r"floating point"),
        (x.numpy(), box, {}, TypeError, r"input must be a Tensor"),
        (x[:, :, :0], box, {}, ValueError, r"height and width"),
        (x, box[:, 1:], {}, ValueError, rf"\[K, {width}\]"),
        (x, box.long(), {}, ValueError, rf"{name} must be floating point"),
        (x, box.to("meta"), {}, ValueError, r"is on meta but the input is on cpu"),
        (x, [box[:, 1:]], {}, ValueError, r"list of 1 tensors but the input has batch size 2"),
        (x, [box[:, 1:], box], {}, ValueError, rf"{name}\[1\] must have shape \[K, {width - 1}\]"),
        (x, "boxes", {}, TypeError, rf"{name} must be a Tensor"),
        (x, row(1, 0, 2.0), {}, ValueError, r"row 1 .*batch index 2.0 is not an integer in \[0, 2\)"),
        (x, row(0, 0, 0.5), {}, ValueError, r"row 0 .*not an integer"),
        (x, row(0, 0, -1.0), {}, ValueError, r"row 0 .*not an integer"),
        (x, row(0, 1, float("nan")), {}, ValueError, r"row 0 .*finite"),
        (x, row(1, 2, float("-inf")), {}, ValueError, r"row 1 .*finite"),
        (x, row(0, 4, 1e9), {}, ValueError, r"row 0 .*2\^24"),
        (x, box, {"output_size": 0}, ValueError, r"output_size"),
        (x, box, {"output_size": (2, -1)}, ValueError, r"output_size"),
        (x, box, {"output_size": (2.0, 2)}, ValueError, r"output_size"),
        (x, box, {"output_size": (1, 2, 3)}, ValueError, r"output_size"),
        (x, box, {"spatial_scale": 0.0}, ValueError, r"spatial_scale"),
        (x, box, {"spatial_scale": -0.25}, ValueError, r"spatial_scale"),
        (x, box, {"spatial_scale": float("inf")}, ValueError, r"spatial_scale"),
    ]


@pytest.mark.parametrize("case", spec_params())
def test_bad_arguments(case):
    """What every op refuses, with a message that names the argument (or the box row)."""
    for input, boxes, kwargs, error, match in _bad_arguments(case.spec.boxes):
        if isinstance(input, torch.Tensor) and input.dim() == 4 and input.dtype == torch.float32:
            input = input.repeat(1, case.channels(1, 2), 1, 1)  # position-sensitive: 2 x 2 bins per channel
        with pytest.raises(error, match=match):
            case.spec.function(input, boxes, *case.tensors(input, boxes, 2).values(), **{"output_size": 2, **kwargs})


@pytest.mark.parametrize("case", spec_params())
def test_bad_option_values(case):
    """Each option refuses a value outside its type, named: a choice outside its Literal,
    a flag that is not a bool, an int that is not one, a number that is not finite; the
    function and the Module alike."""
    hints = typing.get_type_hints(case.spec.function)
    x, boxes = feature(channels=case.channels(C, 2)), case.boxes()
    options = list(inspect.signature(case.spec.function).parameters)[4 + len(per_bin_tensors(case.spec)):]
    assert options == list(inspect.signature(case.spec.module.__init__).parameters)[3:]
    for name in options:
        hint = hints[name]
        if typing.get_origin(hint) is typing.Literal:
            bad, match = "nope", f"{name} must be one of {', '.join(map(repr, typing.get_args(hint)))}, got 'nope'"
        elif hint is bool:
            bad, match = 1, f"{name} must be a bool, got 1"
        elif hint is float:
            bad, match = float("nan"), f"{name} must be a finite number, got nan"
        else:
            assert hint is int, (name, hint)
            bad, match = 1.5, f"{name} must be an int"
        with pytest.raises(ValueError, match=match):
            case(x, boxes, 2, SCALE, **{name: bad})
        with pytest.raises(ValueError, match=match):
            case.spec.module(2, SCALE, **{name: bad})


@pytest.mark.parametrize("case", spec_params())
def test_channels_must_be_a_multiple_of_the_bins_where_position_sensitive(case):
    x, boxes = feature(channels=10 * case.fields), case.boxes()
    if case.spec.position_sensitive:
        with pytest.raises(ValueError, match=r"input has 10 channels, not a multiple of output_size's h \* w = 2 \* 2"):
            case(x, boxes, 2, SCALE)
    else:
        assert case(x, boxes, 2, SCALE).shape == (len(boxes), 10 * case.fields, 2, 2)


@pytest.mark.parametrize("case", params(CASES))
def test_argument_forms_agree(case):
    """output_size as an int, a tuple or a list; boxes in any float dtype (used in the
    kernels' coordinate type); meta tensors give the output's shape."""
    x, boxes = feature(channels=case.channels(C, 3)), case.boxes()
    out = case(x, boxes, 3, SCALE)
    assert torch.equal(out, case(x, boxes, (3, 3), SCALE)) and torch.equal(out, case(x, boxes, [3, 3], SCALE))
    assert torch.equal(out, case(x, boxes.double(), 3, SCALE))
    half = feature(torch.float16, channels=case.channels(C, 3))
    small = boxes.half().float()  # boxes float16 holds exactly
    assert torch.equal(case(half, small, 3, SCALE), case(half, small.half(), 3, SCALE))
    x = feature(channels=case.channels(C, (3, 4)))
    meta = case(x.to("meta"), boxes.to("meta"), (3, 4), SCALE)
    assert meta.shape == (len(boxes), case.out_channels(C), 3, 4) and meta.device.type == "meta"


# ----------------------------------------------------------------------------- no boxes, strides


@pytest.mark.parametrize("backend", ["reference", "cpu", "triton"])
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "cl"])
@pytest.mark.parametrize("case", params(CASES))
def test_no_boxes(case, channels_last, backend):
    """K = 0: an empty output of the right shape and layout, a zero input gradient, and an
    empty box gradient for the ops that give one."""
    x = feature(channels_last=channels_last, channels=case.channels(C, SIZE))
    boxes = case.boxes(count=0, nasty=False)
    assert boxes.shape[0] == 0
    out, grad, grad_boxes = run(call(case), x, boxes, backend)
    assert out.shape == (0, case.out_channels(C), *SIZE) and out.dtype == x.dtype
    assert out.is_contiguous(memory_format=layout(channels_last))
    assert torch.equal(grad, torch.zeros_like(x)) and grad.is_contiguous(memory_format=layout(channels_last))
    assert_box_grad(case, grad_boxes, boxes)


def _strided(case):
    """Maps that are neither NCHW nor channels_last: a permuted map (batch and channels
    swapped in memory), every other column of a wider map, every other channel."""
    c = case.channels(C, SIZE)
    swapped = feature(channels=c, shape=(c, N, H, W)).transpose(0, 1)
    wide = feature(channels=c, shape=(N, c, H, 2 * W))
    channels = feature(channels=c, shape=(N, 2 * c, H, W))
    return [swapped, wide[..., ::2], channels[:, ::2]]


# Triton's interpreter: each op with its first option set.
STRIDED = [pytest.param(c, "cpu", id=f"{c.id}-cpu") for c in CASES]
STRIDED += [pytest.param(c.values[0], "triton", id=f"{c.id}-triton") for c in spec_params()]


@pytest.mark.parametrize("case, backend", STRIDED)
def test_strided_input_is_its_contiguous_copy(case, backend):
    boxes = case.boxes()
    for x in _strided(case)[:1 if backend == "triton" else None]:  # the interpreter: one
        assert not x.is_contiguous() and not x.is_contiguous(memory_format=torch.channels_last)
        got, want = run(call(case), x, boxes, backend), run(call(case), x.contiguous(), boxes, backend)
        assert_same(got, want)


ODD_STRIDES = [((1, 1, H, 1), 3), ((1, 1, 1, W), 2), ((1, 1, H, W), 0), ((N, 1, H, W), 1)]


@pytest.mark.parametrize("case, shape, dim",
                         [pytest.param(c, s, d, id=f"{c.id}-{d}") for c in CASES for s, d in ODD_STRIDES
                          if d != 1 or not (c.spec.position_sensitive or c.fields > 1)])
def test_size_one_dimensions_with_any_stride(case, shape, dim):
    """A contiguous map may carry any stride on a dimension of size 1 (a transposed
    [N, C, 1, H] map is a contiguous [N, C, H, 1] with stride(3) = H); the kernels must not
    take it for a layout: the usual strides give the same bits, forward and backward.
    Position-sensitive ops get 2 x 49 channels and many boxes (their tiles and bands)."""
    channels = 1 if dim == 1 else case.channels(5, 7)
    shape = (shape[0], channels, *shape[2:])
    x = feature(shape=shape, seed=8)
    odd = odd_unit_strides(x, [dim])
    assert odd.is_contiguous() and odd.stride() != x.stride()
    count = 300 if case.spec.position_sensitive else 40
    boxes = case.boxes(seed=8, count=count, n=shape[0], width=2 * shape[3] / SCALE, height=2 * shape[2] / SCALE)
    got, want = run(call(case, 7), odd, boxes), run(call(case, 7), x, boxes)
    assert_same(got, want)


@pytest.mark.parametrize("case", params(CASES))
def test_list_of_boxes_equals_tensor(case):
    """A list of each image's boxes is the tensor of their rows in that order, and each
    listed tensor gets its rows' gradient."""
    x, boxes = feature(F64, channels=case.channels(C, 3)), case.boxes(dtype=F64)
    lists, ordered = per_image(boxes)
    lists = [b.clone().requires_grad_() for b in lists]
    ordered.requires_grad_()
    out = case(x, lists, 3, SCALE)
    assert torch.equal(out, case(x, ordered, 3, SCALE))
    if case.box_grad:
        out.square().sum().backward()
        case(x, ordered, 3, SCALE).square().sum().backward()
        assert ordered.grad[:, 1:].abs().sum() > 0
        assert torch.equal(torch.cat([b.grad for b in lists]), ordered.grad[:, 1:])


# ----------------------------------------------------------------------------- the C++ kernels' output blocks
# Outputs of 4 MiB or more come from blocks the C++ kernels keep when freed (memory.h,
# OutputCache): each must still be written in full, whatever a freed block held.

linux_only = pytest.mark.skipif(sys.platform != "linux", reason="the kernels keep freed output blocks on Linux only")


def _big(case, channels_last=False):
    """(function, map, boxes) of a forward output of at least 4 MiB (and gradient of the map
    as large)."""
    c_out = 256 if not case.spec.position_sensitive else 6
    x = feature(channels_last=channels_last, seed=5, shape=(2, case.channels(c_out, 7), 64, 64))
    count = math.ceil((9 << 19) / (c_out * 49 * 4))  # 4.5 MiB
    boxes = case.boxes(seed=6, count=count, width=128.0, height=128.0)
    return call(case, 7), x, boxes


@linux_only
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "cl"])
@pytest.mark.parametrize("case", params(CASES))
def test_large_outputs_are_written_in_full_in_reused_blocks(case, channels_last):
    fn, x, boxes = _big(case, channels_last)
    x.requires_grad_()
    out = fn(x, boxes)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(7)).contiguous(
        memory_format=layout(channels_last))
    makers = {"forward": lambda: fn(x.detach(), boxes),
              "backward": lambda: torch.autograd.grad(out, x, grad, retain_graph=True)[0]}
    for direction, make in makers.items():
        # Once first, so that the kernel's own large temporaries (freed when it returns) have
        # taken the kept blocks of their sizes: the output's is then the block freed last.
        make()
        first = make()
        assert first.nbytes >= 4 << 20, (direction, first.nbytes)
        expected, where = first.clone(), first.data_ptr()
        first.fill_(float("nan"))
        del first
        second = make()
        assert second.data_ptr() == where, direction  # the block freed last came back
        assert torch.equal(second, expected), direction


# An op on axis-aligned boxes that takes any channel count and no per-bin tensor.
PLAIN = next(c for c in CASES if c.spec.boxes is AXIS_ALIGNED and not c.spec.position_sensitive
             and not per_bin_tensors(c.spec))


@linux_only
def test_freed_output_blocks_kept_are_bounded():
    from roiops import cpu
    no_boxes = PLAIN.boxes(count=0, nasty=False)
    grads = []
    for h in range(200, 272, 12):  # six gradients of 52-68 MiB, each its own size
        x = torch.randn(1, 256, h, 256).requires_grad_()
        out = PLAIN(x, no_boxes, 7, 1.0)
        grads.append(torch.autograd.grad(out, x, torch.zeros(out.shape))[0])
        assert torch.equal(grads[-1], torch.zeros_like(x))
    del grads
    assert 0 < cpu.output_cache_bytes() <= 256 << 20


@linux_only
def test_freed_output_blocks_kept_are_none_with_the_cache_off():
    """ROIOPS_CPU_CACHE_MIB=0: a 16 MiB gradient comes from torch's allocator, and nothing is kept."""
    code = "\n".join([
        "import torch, roiops",
        "x = torch.randn(1, 256, 64, 256).requires_grad_()",
        f"out = roiops.{PLAIN.spec.name}(x, torch.zeros(0, 5), 7, 1.0)",
        "g = torch.autograd.grad(out, x, torch.zeros(out.shape))[0]",
        "assert g.nbytes >= 4 << 20 and torch.equal(g, torch.zeros_like(x))",
        "del g",
        "assert roiops.cpu.output_cache_bytes() == 0, roiops.cpu.output_cache_bytes()",
    ])
    env = dict(os.environ, ROIOPS_CPU_CACHE_MIB="0")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120, env=env)


def test_large_outputs_after_fork():
    """A child forked while the parent keeps freed blocks allocates and frees its own."""
    fn, x, boxes = _big(PLAIN)
    freed = fn(x, boxes)
    del freed  # its block is kept, and the child inherits the cache
    expected = fn(x, boxes)
    ctx = multiprocessing.get_context("fork")
    result = ctx.Queue()

    def child():
        torch.set_num_threads(1)  # the parent's OpenMP threads do not survive a fork
        result.put([torch.equal(fn(x, boxes), expected) for _ in range(3)])

    p = ctx.Process(target=child)
    p.start()
    got = result.get(timeout=120)
    p.join(60)
    assert p.exitcode == 0 and got == [True] * 3
