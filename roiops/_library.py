"""The C++ kernels' library, roiops._C, and what Python needs of it besides the ops it
registers: its own check of box rows and the bytes of freed outputs it keeps.

Loading the library runs its static registrations, which define the ops' schemas and
register their CPU kernels. The ops' declarations (roiops.ops) load it before defining
anything, because a schema that Python defined first would make the library's definition
fail and abort the process as it loads.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import Any

import torch

_CPU = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)


@functools.cache
def error() -> str:
    """Loads the library; "" once it is loaded, else why it cannot be."""
    try:
        importlib.import_module("roiops._C")
    except ImportError as e:
        return (f"roiops: its C++ kernels cannot be loaded ({e}); reinstall roiops, or build them from its sources "
                "with `pip install --no-build-isolation .`")
    return ""


def first_invalid(rois: torch.Tensor, batch_size: int, spatial_scale: float) -> tuple[int, int]:
    """``(row, column)`` of the first invalid value of CPU boxes ``[K, 5]``, ``[K, 6]`` or
    ``[K, 17]``, ``(-1, -1)`` if none: the rule of the validation layer's ``_first_invalid``,
    in one pass over the rows."""
    row, column = torch.ops.roiops._first_invalid.default.redispatch(_CPU, rois, batch_size, spatial_scale)
    return row, column


def output_cache_bytes() -> int:
    """Bytes of freed outputs and gradients the kernels keep for the next ones."""
    return int(torch.ops.roiops._output_cache_bytes.default())


def cpu_kernel(op: str) -> Callable[..., Any]:
    """Registered op ``roiops::<op>`` at the dispatcher's CPU key: the C++ kernel itself,
    past the autograd and Python layers above it."""
    return functools.partial(getattr(torch.ops.roiops, op).default.redispatch, _CPU)
