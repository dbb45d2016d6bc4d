"""Chooses the kernel set that runs an op: the best one for the tensor's device, or the
one forced with ``use_backend``."""

from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib
import importlib.metadata
import os
import pkgutil
import re
from collections.abc import Iterable, Iterator
from types import ModuleType

import torch

BACKENDS = ("cpu", "triton", "reference")
_MODULES = {"cpu": "roiops.cpu", "triton": "roiops.triton", "reference": "roiops.reference"}


class _Entry:
    """One active ``use_backend`` block; blocks are removed by identity, so exits in any
    order leave the others in force."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


# Per thread and per asyncio task (each runs in its own context): a block in one thread
# does not change the backend of another.
_forced: contextvars.ContextVar[tuple[_Entry, ...]] = contextvars.ContextVar("roiops_backend", default=())


@contextlib.contextmanager
def use_backend(name: str) -> Iterator[None]:
    """Force the kernels used by every roiops op run inside the block, in the calling
    thread (or asyncio task) only.

    ``"cpu"``: the C++ kernels (CPU tensors only). ``"triton"``: the Triton kernels (CUDA
    tensors; CPU tensors only under ``TRITON_INTERPRET=1``). ``"reference"``: the pure
    PyTorch implementation (any device). The backward pass of an op runs on the backend
    its forward used, whichever thread runs it. Eager calls only: where the dispatcher
    runs an op (torch.compile, torch.export, tensor subclasses and modes), CPU tensors go
    to the C++ kernels registered for them.

    Example::

        with roiops.use_backend("reference"):
            out = roiops.roi_align(x, boxes, 7)
    """
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; expected one of {', '.join(BACKENDS)}")
    entry = _Entry(name)
    _forced.set((*_forced.get(), entry))
    try:
        yield
    finally:
        _forced.set(tuple(e for e in _forced.get() if e is not entry))


def current() -> str | None:
    """The backend forced by the innermost ``use_backend`` of this context, or None."""
    stack = _forced.get()
    return stack[-1].name if stack else None


def _triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


# The oldest Triton whose compiled kernels are checked to keep the CPU kernels' bin edges
# and grid sizes (tests/test_ptx.py runs under it and under the pinned one).
MIN_TRITON = (3, 6)


def triton_too_old() -> str:
    """Why the installed Triton cannot run roiops' kernels; "" when it can (or is absent)."""
    try:
        version = importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:  # none, or one installed under another name
        if not _triton_available():
            return ""
        import triton

        version = triton.__version__
    if tuple(int(v) for v in re.findall(r"\d+", version)[:2]) >= MIN_TRITON:
        return ""
    return (f"roiops' GPU kernels need Triton >= {MIN_TRITON[0]}.{MIN_TRITON[1]} (torch 2.11 and later bring one); "
            f"found Triton {version}. Upgrade torch, or run the pure-PyTorch kernels on the GPU with "
            "roiops.use_backend('reference')")


def select(device: torch.device) -> str:
    name = current()
    if name is None:
        if device.type == "cpu":
            return "cpu"
        if device.type == "cuda" and _triton_available():
            return "triton"
        return "reference"
    if name == "cpu" and device.type != "cpu":
        raise RuntimeError(f"use_backend('cpu') cannot run on {device.type} tensors")
    if name == "triton" and device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("use_backend('triton') on CPU tensors needs TRITON_INTERPRET=1 set before import")
    return name


def collect_kernels(package: str, path: Iterable[str], namespace: dict[str, object]) -> list[str]:
    """Import every op module of a kernel-set package (those not starting with "_") and put
    the kernels each lists in ``__all__`` into the package's namespace: adding an op adds
    a module, and no list of functions changes. Returns the collected names."""
    names: list[str] = []
    for info in sorted(pkgutil.iter_modules(path), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{package}.{info.name}")
        for name in module.__all__:
            if name in namespace:
                raise ImportError(f"{package}: {name} is defined by two op modules")
            namespace[name] = getattr(module, name)
            names.append(name)
    return names


# The oldest torch roiops runs under: its C++ kernels are built for LibTorch's stable ABI
# as of this release (pyproject.toml requires it; setup.py targets it).
MIN_TORCH = (2, 11)


def torch_too_old() -> str:
    """Why the running torch cannot run roiops; "" when it can."""
    if tuple(int(v) for v in re.findall(r"\d+", torch.__version__)[:2]) >= MIN_TORCH:
        return ""
    return (f"roiops needs torch >= {MIN_TORCH[0]}.{MIN_TORCH[1]}, whose stable C++ ABI its CPU kernels are built "
            f"for; found torch {torch.__version__}")


@functools.cache
def cpu_library_error() -> str:
    """Loads the C++ kernels' library, roiops._C, whose static registrations define the ops'
    schemas and register their CPU kernels; returns "" once it is loaded, else why it
    cannot be. The ops' Python declarations call this before defining anything, because
    a schema that Python defined first would make the library's definition fail and
    abort the process as it loads."""
    try:
        importlib.import_module("roiops._C")
    except ImportError as e:
        return (f"roiops: its C++ kernels cannot be loaded ({e}); reinstall roiops, or build them from its sources "
                "with `pip install --no-build-isolation .`")
    return ""


@functools.cache
def _cpu_kernels() -> ModuleType:
    return importlib.import_module("roiops.cpu")


def kernels_of(t: torch.Tensor) -> ModuleType:
    """``kernels(t.device)``; for a CPU or CUDA tensor with no backend forced, without
    building ``t.device``, a Python object that costs more than the rest of the lookup."""
    if not _forced.get():
        if t.is_cpu:
            return _cpu_kernels()
        if t.is_cuda:
            return _cuda_kernels()
    return kernels(t.device)


@functools.cache
def _cuda_kernels() -> ModuleType:
    return kernels(torch.device("cuda"))  # called with no backend forced: select's default


def kernels(device: torch.device) -> ModuleType:
    """The module holding the kernel-contract functions (docs/architecture.md, "Kernel
    contract") for this call."""
    return importlib.import_module(_MODULES[select(device)])
