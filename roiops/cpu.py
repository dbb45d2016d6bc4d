"""The C++ CPU kernels (roiops/csrc) as a kernel set: for every declared op, the functions
the kernel contract names (docs/architecture.md), each calling the op's C++ kernel at the
dispatcher's CPU key directly, past the autograd and Python layers above it. The library
(roiops._C) registers those kernels, and the ops' schemas, as it loads.

Also ``output_cache_bytes()``: the bytes of freed outputs the kernels keep for reuse.
"""

from __future__ import annotations

from . import _library, _registry
from ._library import output_cache_bytes

_WHY = _library.error()
if _WHY:
    raise ImportError(_WHY)

__all__ = ["output_cache_bytes"]
for _spec in _registry.specs():
    for _k in _spec.kernels:
        for _role, _op in _k.ops().items():
            globals()[f"{_k.name}_{_role}"] = _library.cpu_kernel(_op)
            __all__.append(f"{_k.name}_{_role}")
for _kernel, _op in _registry.plain_kernels().items():
    globals()[_kernel] = _library.cpu_kernel(_op)
    __all__.append(_kernel)
