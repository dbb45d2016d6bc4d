"""Chooses the kernel set that runs an op: the best one for the tensor's device, or the
one forced with ``use_backend``."""

from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import Iterator
from types import ModuleType

import torch

BACKENDS = ("cpu", "triton", "reference")
_MODULES = {"cpu": "roiops._C", "triton": "roiops.triton", "reference": "roiops.reference"}
_forced: list[str] = []


@contextlib.contextmanager
def use_backend(name: str) -> Iterator[None]:
    """Force the kernels used by every roiops op run inside the block (process-wide).

    ``"cpu"``: the C++ kernels (CPU tensors only). ``"triton"``: the Triton kernels (CUDA
    tensors; CPU tensors only under ``TRITON_INTERPRET=1``). ``"reference"``: the pure
    PyTorch implementation (any device). The backward pass of an op runs on the backend
    its forward used.

    Example::

        with roiops.use_backend("reference"):
            out = roiops.roi_align(x, boxes, 7)
    """
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; expected one of {', '.join(BACKENDS)}")
    _forced.append(name)
    try:
        yield
    finally:
        _forced.pop()


def current() -> str | None:
    """The backend forced by the innermost ``use_backend``, or None."""
    return _forced[-1] if _forced else None


def _triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


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


def kernels(device: torch.device) -> ModuleType:
    """The module holding the six kernel-contract functions for this call."""
    return importlib.import_module(_MODULES[select(device)])
