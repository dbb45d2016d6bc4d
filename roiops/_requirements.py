"""What roiops needs of the installed torch and Triton, and why a release is refused."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re

import torch

# The oldest torch roiops runs under: its C++ kernels are built for LibTorch's stable ABI
# as of this release (pyproject.toml requires it; setup.py targets it).
MIN_TORCH = (2, 11)

# The oldest Triton whose compiled kernels are checked to keep the CPU kernels' bin edges
# and grid sizes (tests/test_ptx.py runs under it and under the pinned one).
MIN_TRITON = (3, 6)


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(v) for v in re.findall(r"\d+", version)[:2])


def torch_too_old() -> str:
    """Why the running torch cannot run roiops; "" when it can."""
    if _release(torch.__version__) >= MIN_TORCH:
        return ""
    return (f"roiops needs torch >= {MIN_TORCH[0]}.{MIN_TORCH[1]}, whose stable C++ ABI its CPU kernels are built "
            f"for; found torch {torch.__version__}")


def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def triton_too_old() -> str:
    """Why the installed Triton cannot run roiops' kernels; "" when it can (or is absent)."""
    try:
        version = importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:  # none, or one installed under another name
        if not triton_available():
            return ""
        import triton

        version = triton.__version__
    if _release(version) >= MIN_TRITON:
        return ""
    return (f"roiops' GPU kernels need Triton >= {MIN_TRITON[0]}.{MIN_TRITON[1]} (torch 2.11 and later bring one); "
            f"found Triton {version}. Upgrade torch, or run the pure-PyTorch kernels on the GPU with "
            "roiops.use_backend('reference')")
