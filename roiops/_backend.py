"""Chooses the kernel set that runs an op: the best one for the tensor's device, or the
one forced with ``use_backend``."""

from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib
import os
from collections.abc import Iterator
from types import ModuleType

import torch

from ._requirements import triton_available

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
    thread (or asyncio task) only; other threads keep their own choice.

    Without it, CPU tensors run the C++ kernels, CUDA tensors the Triton kernels, and
    tensors on any other device the reference. The backward pass of an op runs on the
    backend its forward used, whichever thread runs it. Eager calls only: where the
    dispatcher runs an op (torch.compile, torch.export, tensor subclasses and modes), CPU
    tensors go to the C++ kernels registered for them. Blocks nest; the innermost wins.
    An op given tensors that the forced backend cannot run raises ``RuntimeError``.

    Args:
        name: ``"cpu"``: the C++ kernels (CPU tensors only). ``"triton"``: the Triton
            kernels (CUDA tensors; CPU tensors only under ``TRITON_INTERPRET=1``).
            ``"reference"``: the pure-PyTorch implementation (any device).

    Raises:
        ValueError: an unknown backend name.

    Examples:
        >>> x = torch.randn(1, 4, 16, 16)
        >>> boxes = torch.tensor([[0, 1.0, 1.0, 12.0, 9.0]])
        >>> with roiops.use_backend("reference"):
        ...     expected = roiops.roi_align(x, boxes, 7, 1.0, 2, True)
        >>> torch.allclose(roiops.roi_align(x, boxes, 7, 1.0, 2, True), expected)
        True
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


def select(device: torch.device) -> str:
    name = current()
    if name is None:
        if device.type == "cpu":
            return "cpu"
        if device.type == "cuda" and triton_available():
            return "triton"
        return "reference"
    if name == "cpu" and device.type != "cpu":
        raise RuntimeError(f"use_backend('cpu') cannot run on {device.type} tensors")
    if name == "triton" and device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("use_backend('triton') on CPU tensors needs TRITON_INTERPRET=1 set before import")
    return name


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
