"""Every kernel set implements the kernel contract (docs/architecture.md) of every op
registered under torch.ops.roiops: op ``<name>`` calls ``<name>_forward`` and op
``_<name>_backward`` calls ``<name>_backward``, each taking the op schema's arguments in
the schema's order. The multi-level pair is optional: checked where a kernel set has it."""

from __future__ import annotations

import importlib
import inspect
import re
import types

import pytest

from cases import OPTIONAL_OPS, VARIANTS, contract_ops, kernel_name, registered_ops, schema

KERNEL_SETS = {"cpu": "roiops._C", "triton": "roiops.triton", "reference": "roiops.reference"}

POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)

# How pybind11 writes the argument types of the schema's types in a signature (its
# SupportsInt/SupportsFloat forms come from pybind11 3; older releases write int, float).
PYBIND_TYPES = {"Tensor": r"torch\.Tensor", "int": r"(typing\.)?SupportsInt\b.*|int",
                "float": r"(typing\.)?SupportsFloat\b.*|float", "bool": r"bool"}


def pybind_type_matches(schema_type: str, text: str) -> bool:
    if schema_type.endswith("[]"):
        inner = re.match(r"(list|collections\.abc\.Sequence|typing\.Sequence)\[(.*)\]$", text)
        return inner is not None and pybind_type_matches(schema_type[:-2], inner.group(2))
    return re.fullmatch(PYBIND_TYPES[schema_type], text) is not None


def split_top_level(text: str) -> list[str]:
    """``text`` split at the commas outside brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    last = text[start:].strip()
    return parts + [last] if last else parts


def pybind_problems(name: str, fn, want: list[tuple[str, str]]) -> list[str]:
    """A pybind11 function has no Python signature: its docstring's first line holds it,
    ``name(arg0: type, ...) -> type``, names argN unless the binding gives them."""
    first = (fn.__doc__ or "").partition("\n")[0]
    m = re.fullmatch(r"(\w+)\((.*)\) -> .*", first)
    if m is None:
        return [f"no pybind11 signature in its docstring: {first!r}"]
    if m.group(1) != name:
        return [f"is bound as {m.group(1)}"]
    args = [re.fullmatch(r"(\w+): ([^=]*?)(?: = .*)?", a) for a in split_top_level(m.group(2))]
    if None in args or len(args) != len(want):
        return [f"takes {len(args)} arguments ({m.group(2)}), the schema {len(want)}"]
    problems = []
    for i, (arg, (want_name, want_type)) in enumerate(zip(args, want)):
        got_name, got_type = arg.groups()
        if got_name != f"arg{i}" and got_name != want_name:
            problems.append(f"argument {i} is {got_name}, the schema's is {want_name}")
        if not pybind_type_matches(want_type, got_type):
            problems.append(f"argument {i} ({want_name}) has type {got_type}, the schema's is {want_type}")
    return problems


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
        found = pybind_problems(name, fn, want) if inspect.isbuiltin(fn) else python_problems(fn, want)
        problems += [f"{name}: {p}" for p in found]
    return problems


@pytest.mark.parametrize("backend", list(KERNEL_SETS))
def test_kernel_set_implements_every_registered_op(backend):
    module = importlib.import_module(KERNEL_SETS[backend])
    assert contract_problems(module, registered_ops()) == []


def test_tables_match_the_registered_ops():
    """The optional ops exist, and the shared case tables cover every contract op."""
    assert set(OPTIONAL_OPS) <= set(registered_ops())
    assert contract_ops() and sorted(VARIANTS) == contract_ops()


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


def test_checker_reads_pybind_signatures():
    cpu = pytest.importorskip("roiops._C")
    assert contract_problems(kernel_set(roi_pool_forward=cpu.roi_pool_forward), registered_ops()) == []
    # A bound function under another name, with other arguments.
    problems = contract_problems(kernel_set(roi_align_forward=cpu.roi_pool_forward), registered_ops())
    assert problems == ["roi_align_forward: is bound as roi_pool_forward"]
    want = [(a.name, str(a.type)) for a in schema("roi_pool").arguments]
    doc = "roi_pool_forward(arg0: torch.Tensor, arg1: torch.Tensor, arg2: typing.SupportsFloat | " \
          "typing.SupportsIndex, arg3: typing.SupportsInt | typing.SupportsIndex, arg4: typing.SupportsInt | " \
          "typing.SupportsIndex, arg5: bool) -> tuple[torch.Tensor, torch.Tensor]"
    fake = types.SimpleNamespace(__doc__=doc)
    assert pybind_problems("roi_pool_forward", fake, want) == []
    assert len(pybind_problems("roi_pool_forward", types.SimpleNamespace(
        __doc__=doc.replace(", arg5: bool", "")), want)) == 1
    swapped = doc.replace("arg2: typing.SupportsFloat", "arg2: typing.SupportsInt").replace(
        "arg3: typing.SupportsInt", "arg3: typing.SupportsFloat")
    assert len(pybind_problems("roi_pool_forward", types.SimpleNamespace(__doc__=swapped), want)) == 2
    named = doc.replace("arg0", "input").replace("arg1", "boxes")
    assert pybind_problems("roi_pool_forward", types.SimpleNamespace(__doc__=named), want) == [
        "argument 1 is boxes, the schema's is rois"]
