"""Every kernel set implements the kernel contract (docs/architecture.md) of every op
registered under torch.ops.roiops: op ``<name>`` calls ``<name>_forward`` and op
``_<name>_backward`` calls ``<name>_backward``, each taking the op schema's arguments in
the schema's order. The multi-level pair is optional: checked where a kernel set has it.
And every kernel set refuses a bad direct call with the same exception and message."""

from __future__ import annotations

import importlib
import inspect
import os
import re
import types

import pytest
import torch

import roiops
from cases import (OPTIONAL_OPS, PER_BIN, PER_IMAGE_OPS, ROI_SPECS, VARIANTS, contract_ops, kernel_name, registered_ops,
                   schema)
from roiops import _registry
from roiops._boxes import ROTATED
from roiops._kernel_checks import parameters
from roiops._requirements import triton_too_old
from roiops.ops import SPECS

KERNEL_SETS = {"cpu": "roiops.cpu", "triton": "roiops.triton", "reference": "roiops.reference"}

POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)

def dispatcher_problems(fn, op: str) -> list[str]:
    """A C++ kernel is the op's own CPU kernel, called through the dispatcher (which binds
    the schema's arguments itself): ``fn`` must call op ``op``'s overload."""
    overload = getattr(getattr(fn, "func", None), "__self__", None)
    if not isinstance(overload, torch._ops.OpOverload):
        return ["is neither a Python function nor a call of a registered op"]
    if overload._schema.name != f"roiops::{op}":
        return [f"calls {overload._schema.name}"]
    return []


def python_problems(fn, want: list[tuple[str, str]]) -> list[str]:
    """The schema's names, in order, as the positional parameters; beyond them only
    keyword-only options with a default (Triton's ``deterministic``)."""
    params = list(inspect.signature(fn).parameters.values())
    names = [p.name for p in params if p.kind in POSITIONAL]
    problems = []
    if names != [n for n, _ in want]:
        problems.append(f"parameters ({', '.join(names)}), the schema's ({', '.join(n for n, _ in want)})")
    for p in params:
        if p.kind not in POSITIONAL and (p.kind != inspect.Parameter.KEYWORD_ONLY or p.default is p.empty):
            problems.append(f"parameter {p}: only keyword-only ones with a default may follow the schema's")
    return problems


def contract_problems(module, ops: list[str]) -> list[str]:
    """What ``module`` lacks or gets wrong of the kernel functions of ``ops``."""
    problems = []
    for op in ops:
        name = kernel_name(op)
        fn = getattr(module, name, None)
        if fn is None:
            if op not in OPTIONAL_OPS:
                problems.append(f"{name} (op {op}) is missing")
            continue
        want = [(a.name, str(a.type)) for a in schema(op).arguments]
        found = python_problems(fn, want) if inspect.isfunction(fn) else dispatcher_problems(fn, op)
        problems += [f"{name}: {p}" for p in found]
    return problems


@pytest.mark.parametrize("backend", list(KERNEL_SETS))
def test_kernel_set_implements_every_registered_op(backend):
    module = importlib.import_module(KERNEL_SETS[backend])
    assert contract_problems(module, registered_ops()) == []


def test_tables_match_the_registered_ops():
    """The optional ops exist, and the shared case tables cover every contract op."""
    assert set(OPTIONAL_OPS) <= set(registered_ops())
    # The ops without an OpSpec are not RoI-shaped: tests/test_masks.py and
    # tests/test_points3d.py check their errors.
    plain = set(_registry.plain_kernels().values())
    assert contract_ops() and sorted(VARIANTS) == [op for op in contract_ops()
                                                   if op not in PER_IMAGE_OPS and op not in plain]


# ---- the checker itself, on stand-in kernel sets


def stand_in(names: list[str], keyword_only: dict | None = None):
    """A function whose signature is ``names`` plus keyword-only parameters (with their
    defaults, or none for ``inspect.Parameter.empty``)."""
    def fn(*args, **kwargs):
        raise AssertionError("never called")

    params = [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in names]
    params += [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=d)
               for n, d in (keyword_only or {}).items()]
    fn.__signature__ = inspect.Signature(params)
    return fn


def kernel_set(**changes) -> types.ModuleType:
    """A module with a conforming stand-in for every registered op, then ``changes``
    (None removes a function)."""
    module = types.ModuleType("stand_in_kernels")
    for op in registered_ops():
        setattr(module, kernel_name(op), stand_in([a.name for a in schema(op).arguments]))
    for name, fn in changes.items():
        if fn is None:
            delattr(module, name)
        else:
            setattr(module, name, fn)
    return module


def roi_pool_backward_names() -> list[str]:
    return [a.name for a in schema("_roi_pool_backward").arguments]


def test_checker_accepts_a_conforming_kernel_set_and_the_allowed_extras():
    assert contract_problems(kernel_set(), registered_ops()) == []
    names = roi_pool_backward_names()
    assert contract_problems(kernel_set(roi_pool_backward=stand_in(names, {"deterministic": None})),
                             registered_ops()) == []
    optional = {kernel_name(op): None for op in OPTIONAL_OPS}
    assert contract_problems(kernel_set(**optional), registered_ops()) == []


def test_checker_finds_each_breach():
    names = roi_pool_backward_names()
    renamed = ["grad_output" if n == "grad" else n for n in names]
    swapped = [names[1], names[0], *names[2:]]
    breaches = {
        "missing": kernel_set(roi_align_max_backward=None),
        "renamed": kernel_set(roi_pool_backward=stand_in(renamed)),
        "reordered": kernel_set(roi_pool_backward=stand_in(swapped)),
        "one too few": kernel_set(roi_pool_backward=stand_in(names[:-1])),
        "positional extra": kernel_set(roi_pool_backward=stand_in(names + ["deterministic"])),
        "keyword-only extra without default": kernel_set(
            roi_pool_backward=stand_in(names, {"deterministic": inspect.Parameter.empty})),
        "optional but wrong": kernel_set(
            multi_scale_roi_align_forward=stand_in([a.name for a in schema("multi_scale_roi_align").arguments][1:])),
    }
    for what, module in breaches.items():
        problems = contract_problems(module, registered_ops())
        assert len(problems) == 1, (what, problems)


def test_checker_reads_dispatcher_calls():
    cpu = pytest.importorskip("roiops.cpu")
    assert contract_problems(kernel_set(roi_pool_forward=cpu.roi_pool_forward), registered_ops()) == []
    # Another op's kernel under this op's name.
    problems = contract_problems(kernel_set(roi_align_forward=cpu.roi_pool_forward), registered_ops())
    assert problems == ["roi_align_forward: calls roiops::roi_pool"]
    problems = contract_problems(kernel_set(roi_align_forward=len), registered_ops())
    assert problems == ["roi_align_forward: is neither a Python function nor a call of a registered op"]


# ---- one argument check, the same errors on every backend
#
# A direct op call skips the public API's validation: each kernel set refuses bad arguments
# itself, the Triton and reference kernels with the one check built from the op's
# declaration (roiops/_kernel_checks.py), the C++ kernels with the same checks in the same
# order (csrc/checks.h). For every kernel function of every declared op (roiops.ops.SPECS)
# a table of bad calls, each one argument away from a call every backend runs, must raise
# the same exception type with the same message everywhere.

BATCH, CHANNELS, HEIGHT, WIDTH, PH, PW = 2, 3, 7, 9, 2, 3
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


def kernel_functions() -> list[tuple[str, str, object]]:
    """(op, role, its OpSpec) of every kernel function the declarations give: each
    Kernels' forward, backward and, with a box gradient, rois_backward."""
    # RoI-shaped ops: an op with boxes per image has its table of bad calls in its own test file.
    return [(k.name, role, spec) for spec in ROI_SPECS for k in spec.kernels for role in k.ops()]


FUNCTIONS = kernel_functions()
FUNCTION_IDS = [f"{name}_{role}" for name, role, _ in FUNCTIONS]


def good_args(name: str, role: str, spec, device: str = "cpu") -> dict:
    """A call of kernel function <name>_<role> that every backend runs: its arguments by
    name, in its order."""
    per_bin = PH * PW if spec.position_sensitive else 1
    c = CHANNELS * per_bin
    g = torch.Generator().manual_seed(3)
    rows = ([[0, 3.0, 3.0, 4.0, 4.0, 0.25], [1, 1.5, 2.0, 3.0, 4.0, -0.5]] if spec.boxes is ROTATED else
            [[0, 1.0, 1.0, 5.0, 5.0], [1, 0.0, 0.5, 3.0, 4.0]])
    rois = torch.tensor(rows) if spec.boxes is ROTATED else spec.boxes.from_axis_aligned(torch.tensor(rows))
    values = dict(input=torch.randn(BATCH, c, HEIGHT, WIDTH, generator=g), rois=rois,
                  grad=torch.randn(len(rows), CHANNELS, PH, PW, generator=g),
                  argmax=torch.zeros(len(rows), CHANNELS, PH, PW, dtype=torch.int32), spatial_scale=0.5,
                  pooled_height=PH, pooled_width=PW, sampling_ratio=2, aligned=True, continuous=False,
                  batch_size=BATCH, channels=c, height=HEIGHT, width=WIDTH, channels_last=False, gamma=0.1,
                  num_orientations=1, clockwise=False)
    values |= {t: torch.randn(len(rows), n, PH, PW, generator=g) for t, n in PER_BIN.get(name, {}).items()}
    values = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in values.items()}
    return {n: values.get(n) for n, _ in parameters(name, role)}  # an extra Tensor? input: None


def kernel(backend: str, name: str, role: str):
    return getattr(importlib.import_module(KERNEL_SETS[backend]), f"{name}_{role}")


def runnable(backend: str, device: str) -> bool:
    """Whether the backend's kernels run on tensors of the device (the checks run first on
    any: a bad call is refused on CPU tensors by compiled Triton kernels too)."""
    return device == "cpu" if backend == "cpu" else not (backend == "triton" and device == "cpu" and not INTERPRETED)


def devices() -> list[str]:
    return ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]


def backends(device: str) -> list[str]:
    """The kernel sets that run on the device's tensors here (Triton's where it is recent
    enough: tests/conftest.py)."""
    names = ["cpu", "triton", "reference"] if device == "cpu" else ["triton", "reference"]
    return [b for b in names if b != "triton" or not triton_too_old()]


def outcome(fn, args: tuple, no_sync: bool = False) -> tuple[str, str] | None:
    """(exception type, message) of fn(*args), None if it returns. ``no_sync``: a GPU sync
    is an error (the Triton launchers' checks read no value from the GPU)."""
    if no_sync:
        torch.cuda.set_sync_debug_mode("error")
    try:
        fn(*args)
    except Exception as e:  # noqa: BLE001 - the test compares what each backend raises
        return type(e).__name__, str(e)
    finally:
        if no_sync:
            torch.cuda.set_sync_debug_mode("default")
    return None


def spec_of(name: str):
    return next(s for s in SPECS if any(k.name == name for k in s.kernels))


def map_name(a: dict) -> str:
    return "input" if "input" in a else "grad"


def with_map(a: dict, f) -> dict:
    """The change of the map tensor f(map) (a box gradient's grad follows its input's dtype)."""
    m = map_name(a)
    change = {m: f(a[m])}
    if m == "input" and "grad" in a:
        changed = change["input"]
        if changed.dtype != a["input"].dtype and changed.is_floating_point():
            change["grad"] = a["grad"].to(changed.dtype)
    return change


def no_bins(a: dict) -> dict:
    """Pooled width 0: the argument, or (roi_pool's backward) grad's and argmax's last size."""
    if "pooled_width" in a:
        return {"pooled_width": 0}
    return {k: a[k][..., :0] for k in ("grad", "argmax") if k in a}


def no_winner(a: dict) -> dict:
    """An argmax of -1 throughout (no bin took a value), valid for any map."""
    return {"argmax": torch.full_like(a["argmax"], -1)} if "argmax" in a else {}


def wider_grad(a: dict) -> dict:
    """grad with one channel too many: from channels (a backward; position-sensitive:
    ph * pw input channels more), or grad itself (a box gradient)."""
    if "channels" in a:
        return {"channels": a["channels"] + a["channels"] // CHANNELS}
    return {"grad": torch.cat([a["grad"], a["grad"][:, :1]], dim=1)}


OTHER = "meta"  # a device no kernel runs on: each check must refuse it before reading data
# (case, applies(args, role, spec), change(args) -> the changed arguments, exception,
# message pattern: what the case must hit, the same message on every backend).
BAD = [
    ("map_3d", lambda a, r, s: True, lambda a: with_map(a, lambda t: t[0]), ValueError, r"must be 4-D"),
    ("map_int", lambda a, r, s: True, lambda a: with_map(a, lambda t: t.long()), ValueError,
     r"(input|grad) must be floating point, got torch.int64"),
    ("map_float8", lambda a, r, s: True, lambda a: with_map(a, lambda t: t.to(torch.float8_e4m3fn)),
     ValueError, r"(input|grad) dtype torch.float8_e4m3fn is not implemented"),
    ("map_other_device", lambda a, r, s: True, lambda a: with_map(a, lambda t: t.to(OTHER)), ValueError,
     r"rois is on (cpu|cuda:0) but (input|grad) is on meta"),
    ("input_no_rows", lambda a, r, s: "input" in a, lambda a: {"input": a["input"][:, :, :0]}, ValueError,
     r"input height and width must be positive, got height=0, width=9"),
    ("input_too_wide", lambda a, r, s: "input" in a,
     lambda a: {"input": a["input"][:, :, :, :1].expand(-1, -1, -1, 2**24 + 1)}, ValueError,
     r"input height and width must be at most 2\^24, got 7 x 16777217"),
    ("rois_a_column_short", lambda a, r, s: True, lambda a: {"rois": a["rois"][:, 1:]}, ValueError,
     r"rois must be \[K, (5|6|17)\] \(rows \(batch_index, .*\)\), got \[2, (4|5|16)\]"),
    ("rois_1d", lambda a, r, s: True, lambda a: {"rois": a["rois"][0]}, ValueError, r"rois must be \[K, (5|6|17)\]"),
    ("rois_int", lambda a, r, s: True, lambda a: {"rois": a["rois"].long()}, ValueError,
     r"rois must be floating point, got torch.int64"),
    ("rois_float32_map_float64", lambda a, r, s: True,
     lambda a: {k: a[k].double() for k in ("input", "grad") if k in a}, ValueError,
     r"rois must be float64 for a float64 (input|grad), got torch.float32"),
    ("rois_other_device", lambda a, r, s: True, lambda a: {"rois": a["rois"].to(OTHER)}, ValueError,
     r"rois is on meta but (input|grad) is on (cpu|cuda:0)"),
    ("batch_size_negative", lambda a, r, s: "batch_size" in a, lambda a: {"batch_size": -1}, ValueError,
     r"batch size and channels must be non-negative, got batch_size=-1, channels="),
    ("channels_negative", lambda a, r, s: "channels" in a, lambda a: {"channels": -1}, ValueError,
     r"batch size and channels must be non-negative, got batch_size=2, channels=-1"),
    ("height_0", lambda a, r, s: "height" in a, lambda a: {"height": 0, **no_winner(a)}, ValueError,
     r"input height and width must be positive, got height=0"),
    ("width_2^24+1", lambda a, r, s: "width" in a, lambda a: {"width": 2**24 + 1}, ValueError,
     r"input height and width must be at most 2\^24, got 7 x 16777217"),
    ("pooled_height_0", lambda a, r, s: "pooled_height" in a, lambda a: {"pooled_height": 0}, ValueError,
     r"output size must be in \[1, 65536\], got pooled_height=0, pooled_width=3$"),
    ("pooled_width_65537", lambda a, r, s: "pooled_width" in a, lambda a: {"pooled_width": 65537}, ValueError,
     r"output size must be in \[1, 65536\], got pooled_height=2, pooled_width=65537"),
    ("no_bins", lambda a, r, s: True, no_bins, ValueError, r"output size must be in \[1, 65536\], got .*pooled_width=0"),
    ("spatial_scale_0", lambda a, r, s: "spatial_scale" in a, lambda a: {"spatial_scale": 0.0}, ValueError,
     r"spatial_scale must be in \[2\^-64, 2\^64\], got 0$"),
    ("spatial_scale_nan", lambda a, r, s: "spatial_scale" in a, lambda a: {"spatial_scale": float("nan")},
     ValueError, r"spatial_scale must be in \[2\^-64, 2\^64\], got nan"),
    ("spatial_scale_1e39", lambda a, r, s: "spatial_scale" in a, lambda a: {"spatial_scale": 1e39}, ValueError,
     r"spatial_scale must be in \[2\^-64, 2\^64\], got 1e\+39"),
    ("spatial_scale_tiny", lambda a, r, s: "spatial_scale" in a, lambda a: {"spatial_scale": 2.0**-65}, ValueError,
     r"spatial_scale must be in \[2\^-64, 2\^64\], got 2.71051e-20"),
    ("sampling_ratio_1025", lambda a, r, s: "sampling_ratio" in a, lambda a: {"sampling_ratio": 1025}, ValueError,
     r"sampling_ratio must be at most 1024 \(<= 0 for adaptive\), got 1025"),
    ("channels_not_a_multiple", lambda a, r, s: s.position_sensitive,
     lambda a: {"channels": a["channels"] + 1} if "channels" in a else {"input": a["input"][:, 1:]}, ValueError,
     r"input channels \(1[79]\) must be a multiple of pooled_height \* pooled_width \(2 \* 3\)"),
    ("num_orientations_0", lambda a, r, s: "num_orientations" in a, lambda a: {"num_orientations": 0}, ValueError,
     r"num_orientations must be in \[1, 65536\], got 0$"),
    ("num_orientations_2^16+1", lambda a, r, s: "num_orientations" in a, lambda a: {"num_orientations": 2**16 + 1},
     ValueError, r"num_orientations must be in \[1, 65536\], got 65537$"),
    ("channels_not_a_multiple_of_orientations", lambda a, r, s: "num_orientations" in a,
     lambda a: {"num_orientations": 2}, ValueError, r"channels \(3\) must be a multiple of num_orientations \(2\)$"),
    ("grad_fewer_boxes", lambda a, r, s: "grad" in a, lambda a: {"grad": a["grad"][:1]}, ValueError,
     r"grad must be \[K, C_out, pooled_height, pooled_width\] = \[2, 3, 2, 3\] \(the forward output's shape\), "
     r"got \[1, 3, 2, 3\]"),
    ("grad_wider", lambda a, r, s: "grad" in a, wider_grad, ValueError,
     r"grad must be \[K, C_out, .* = \[2, [34], 2, 3\] \(the forward output's shape\), got \[2, [34], 2, 3\]"),
    # roi_pool's backward takes its pooled size from grad: argmax no longer matches it.
    ("grad_fewer_bins", lambda a, r, s: "grad" in a, lambda a: {"grad": a["grad"][..., :2]}, ValueError,
     r"grad must be \[K, C_out, .*, got \[2, 3, 2, 2\]|"
     r"argmax must have the shape of grad \[2, 3, 2, 2\], got \[2, 3, 2, 3\]"),
    ("grad_3d", lambda a, r, s: "grad" in a, lambda a: {"grad": a["grad"][0]}, ValueError,
     r"grad must be 4-D \[K, C, pooled_height, pooled_width\], got 3-D|grad must be \[K, C_out, .*, got \[3, 2, 3\]"),
    ("grad_int", lambda a, r, s: "grad" in a, lambda a: {"grad": a["grad"].long()}, ValueError,
     r"grad must be floating point, got torch.int64"),
    ("grad_float64", lambda a, r, s: "grad" in a, lambda a: {"grad": a["grad"].double()}, ValueError,
     r"grad must have the input's dtype torch.float32, got torch.float64|rois must be float64 for a float64 grad"),
    ("grad_other_device", lambda a, r, s: "grad" in a, lambda a: {"grad": a["grad"].to(OTHER)}, ValueError,
     r"grad is on meta but input is on (cpu|cuda:0)|rois is on (cpu|cuda:0) but grad is on meta"),
    ("offset_a_bin_short", lambda a, r, s: "offset" in a, lambda a: {"offset": a["offset"][..., :2]}, ValueError,
     r"offset must be \[K, 2, pooled_height, pooled_width\] = \[2, 2, 2, 3\], got \[2, 2, 2, 2\]"),
    ("offset_int", lambda a, r, s: "offset" in a, lambda a: {"offset": a["offset"].long()}, ValueError,
     r"offset must be floating point, got torch.int64"),
    ("offset_float32_map_float64", lambda a, r, s: "offset" in a,
     lambda a: {**{k: a[k].double() for k in ("input", "grad") if k in a}, "rois": a["rois"].double()}, ValueError,
     r"offset must be float64 for a float64 (input|grad), got torch.float32"),
    ("offset_other_device", lambda a, r, s: "offset" in a, lambda a: {"offset": a["offset"].to(OTHER)}, ValueError,
     r"offset is on meta but (input|grad) is on (cpu|cuda:0)"),
    ("argmax_int64", lambda a, r, s: "argmax" in a, lambda a: {"argmax": a["argmax"].long()}, ValueError,
     r"argmax must be int32, got torch.int64"),
    ("argmax_fewer_bins", lambda a, r, s: "argmax" in a, lambda a: {"argmax": a["argmax"][..., :2]}, ValueError,
     r"argmax must have the shape of grad \[2, 3, 2, 3\], got \[2, 3, 2, 2\]"),
    ("argmax_other_device", lambda a, r, s: "argmax" in a, lambda a: {"argmax": a["argmax"].to(OTHER)},
     ValueError, r"argmax is on meta but grad is on (cpu|cuda:0)"),
]

# What the reference kernels of RoIAlign and RoIPool take beyond the others: an empty map,
# and an int64 argmax in RoIPool's backward (reference/roi_align.py, roi_pool.py; pinned by
# tests/test_reference.py). The other backends refuse these alike.
REFERENCE_TAKES = {*((case, name, role) for name in ("roi_align", "roi_align_max", "roi_pool")
                     for case, role in (("input_no_rows", "forward"), ("height_0", "backward"))),
                   ("argmax_int64", "roi_pool", "backward")}

BAD_CASES = [(name, role, spec, device, case) for name, role, spec in FUNCTIONS for device in devices()
             for case in BAD if case[1](good_args(name, role, spec), role, spec)]
BAD_IDS = [f"{name}_{role}-{device}-{case[0]}" for name, role, _, device, case in BAD_CASES]


@pytest.mark.parametrize("name,role,spec", FUNCTIONS, ids=FUNCTION_IDS)
def test_the_bad_calls_start_from_a_call_every_backend_runs(name, role, spec):
    for device in devices():
        for backend in backends(device):
            if runnable(backend, device):
                args = tuple(good_args(name, role, spec, device).values())
                assert outcome(kernel(backend, name, role), args) is None, (backend, device)


@pytest.mark.parametrize("name,role,spec,device,case", BAD_CASES, ids=BAD_IDS)
def test_every_backend_refuses_a_bad_call_alike(name, role, spec, device, case):
    what, _, change, error, pattern = case
    a = good_args(name, role, spec, device)
    a.update(change(a))
    args = tuple(a.values())
    got = {b: outcome(kernel(b, name, role), args, no_sync=device == "cuda" and b == "triton")
           for b in backends(device)}
    if (what, name, role) in REFERENCE_TAKES:
        assert got.pop("reference") is None
    first = next(iter(got.values()))
    assert first is not None and first[0] == error.__name__, got
    assert re.search(pattern, first[1]), got
    assert all(g == first for g in got.values()), got
    # The same through the registered op (a meta tensor would reach its fake kernel).
    if not any(isinstance(v, torch.Tensor) and v.is_meta for v in args):
        op = getattr(torch.ops.roiops, f"_{name}_{role}" if role != "forward" else name)
        for b in got:
            if runnable(b, device):
                with roiops.use_backend(b):
                    assert outcome(op, args) == first, b


# A value of another type for each argument kind: TypeError on a direct call of a Python
# kernel (the op schema refuses it before any backend runs, and so does the dispatcher
# for a direct call of a C++ kernel).
WRONG_TYPE = {"Tensor": [None, [[0, 1.0, 1.0, 5.0, 5.0]]], "Tensor?": ["rois"], "int": [2.0, True, "2"],
              "float": ["0.5", True, None], "bool": [1, None, torch.tensor(True)]}
TYPE_CASES = [(name, role, spec, arg, value) for name, role, spec in FUNCTIONS for arg, kind in parameters(name, role)
              for value in WRONG_TYPE[kind]]


@pytest.mark.parametrize("name,role,spec,arg,value", TYPE_CASES,
                         ids=[f"{n}_{r}-{arg}-{type(v).__name__}" for n, r, _, arg, v in TYPE_CASES])
def test_python_kernels_refuse_arguments_of_other_types_alike(name, role, spec, arg, value):
    a = good_args(name, role, spec)
    a[arg] = value
    args = tuple(a.values())
    got = {b: outcome(kernel(b, name, role), args) for b in backends("cpu") if b != "cpu"}
    first = got["reference"]
    assert all(g == first for g in got.values()), got
    assert first[0] == "TypeError" and first[1].startswith(f"roiops: {arg} must be"), got


@pytest.mark.parametrize("backend,device", [(b, d) for d in devices() for b in backends(d)])
def test_op_schema_refuses_a_float_sampling_ratio(backend, device):
    if not runnable(backend, device):
        pytest.skip("the Triton kernels are compiled for the GPU")
    a = good_args("roi_align", "forward", spec_of("roi_align"), device)
    a["sampling_ratio"] = 2.5
    with roiops.use_backend(backend), pytest.raises(RuntimeError, match="type 'int' for argument 'sampling_ratio'"):
        torch.ops.roiops.roi_align(*a.values())


@pytest.mark.parametrize("name,role,spec", FUNCTIONS, ids=FUNCTION_IDS)
def test_rois_of_another_floating_dtype_are_used_in_the_opmath_type(name, role, spec):
    """float64 and float16 boxes with a float32 map: the kernels use them in float32 (exact
    for these rows), on every backend; a box gradient comes back in the boxes' dtype."""
    for device in devices():
        for backend in backends(device):
            if not runnable(backend, device):
                continue
            a = good_args(name, role, spec, device)
            fn = kernel(backend, name, role)
            want = fn(*a.values())
            for dtype in (torch.float64, torch.float16):
                got = fn(*{**a, "rois": a["rois"].to(dtype)}.values())
                if role == "rois_backward":
                    assert got.dtype == dtype, backend
                    assert torch.equal(got, want.to(dtype)), backend
                elif isinstance(want, tuple):
                    assert all(torch.equal(g, w) for g, w in zip(got, want)), backend
                else:
                    assert torch.equal(got, want), backend


def test_roi_pool_refuses_a_map_plane_beyond_its_int32_argmax():
    a = good_args("roi_pool", "forward", spec_of("roi_pool"))
    a["input"] = a["input"][:, :, :1, :1].expand(-1, -1, 2**16, 2**16)
    args = tuple(a.values())
    got = {b: outcome(kernel(b, "roi_pool", "forward"), args) for b in backends("cpu")}
    assert all(g == got["cpu"] for g in got.values()), got
    assert got["cpu"] == ("ValueError", "roiops: roi_pool needs H * W < 2^31 (its argmax is the int32 h * W + w), got "
                                        "input height 65536 and width 65536")
