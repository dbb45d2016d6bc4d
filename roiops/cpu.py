"""The C++ CPU kernels (roiops/csrc) as a kernel set: for every registered op, the functions
the kernel contract names (docs/architecture.md), each calling the op's C++ kernel at the
dispatcher's CPU key directly, past the autograd and Python layers above it. The library
(roiops._C) registers those kernels, and the ops' schemas, as it loads.

Also the kernels' own check of box rows, for the validation layer, and for tests the bytes
of freed outputs the kernels keep for reuse.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from ._backend import cpu_library_error
from .ops import SPECS

_WHY = cpu_library_error()
if _WHY:
    raise ImportError(_WHY)

_CPU = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)


def _kernel(op: str) -> Callable[..., Any]:
    return functools.partial(getattr(torch.ops.roiops, op).default.redispatch, _CPU)


__all__ = ["first_invalid", "output_cache_bytes"]
for _spec in SPECS:
    for _k in _spec.kernels:
        for _role, _op in _k.ops().items():
            globals()[f"{_k.name}_{_role}"] = _kernel(_op)
            __all__.append(f"{_k.name}_{_role}")


def first_invalid(rois: torch.Tensor, batch_size: int, spatial_scale: float) -> tuple[int, int]:
    """``(row, column)`` of the first invalid value of CPU boxes ``[K, 5]`` or ``[K, 6]``,
    ``(-1, -1)`` if none: the rule of the validation layer's ``_first_invalid``."""
    row, column = torch.ops.roiops._first_invalid.default.redispatch(_CPU, rois, batch_size, spatial_scale)
    return row, column


def output_cache_bytes() -> int:
    """Bytes of freed outputs and gradients the kernels keep for the next ones."""
    return int(torch.ops.roiops._output_cache_bytes.default())
