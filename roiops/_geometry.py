"""Geometry primitives of the ops in PyTorch, defined once for the Python side: the limits,
the layout rule, C's rounding, sample positions and the bilinear border rule (docs/
semantics.md). The validation layer, the registered ops, the reference, the Triton
launchers and the demo use these; the C++ kernels have their own in csrc/geometry.h, the
Triton kernels in triton/_jit.py, and the ONNX translations build the same formulas as
graph nodes (roiops/onnx.py).

Each is a primitive, not a plan: an op that samples along rotated or non-separable
grids reuses them as they are.
"""

from __future__ import annotations

import torch
from torch import Tensor

# ---- limits (docs/semantics.md, "Limits"); the C++ and Triton kernels refuse the same values

MAX_COORDINATE = 2.0**24  # |x * spatial_scale| in feature-map cells: float32 places samples exactly up to here
MAX_MAP_SIDE = 2**24  # H and W: no box can reach cells beyond the coordinate range
MAX_OUTPUT_SIZE = 2**16  # per side: bin indices exact in float32, <= 2^32 bins per box and channel
MAX_SAMPLING_RATIO = 1024  # a fixed ratio costs ratio^2 samples per bin, whatever the box
MAX_ARGMAX_GRID = 2**31 - 1  # samples per bin in mode "max": its argmax is int32 iy * grid_w + ix
MIN_SCALE, MAX_SCALE = 2.0**-64, 2.0**64  # the kernels use spatial_scale as a float32


# ---- layout

def is_channels_last(t: Tensor) -> bool:
    """The kernels' layout rule: channels_last strides, unless they are also NCHW-contiguous
    (C == 1, or a 1 x 1 map), which counts as NCHW."""
    return t.is_contiguous(memory_format=torch.channels_last) and not t.is_contiguous()


def memory_format(channels_last: bool) -> torch.memory_format:
    return torch.channels_last if channels_last else torch.contiguous_format


# ---- arithmetic

def round_half_away(v: Tensor) -> Tensor:
    """C's round(): halves away from zero (torch.round rounds them to even). v - trunc(v) is
    exact, unlike floor(|v| + 0.5), which rounds 0.49999997 up."""
    t = torch.trunc(v)
    return torch.where((v - t).abs() >= 0.5, t + torch.sign(v), t)


def sample_position(start: Tensor, bin_size: Tensor, grid: int | Tensor, b: Tensor, s: Tensor) -> Tensor:
    """Position of sample s of bin b along one axis, start + b*bin + (s + 0.5) * bin / grid,
    evaluated left to right as torchvision does (so float32 results agree to the bit); b and
    s are integer tensors, converted to start's dtype first."""
    t = start.dtype
    return start + b.to(t) * bin_size + (s.to(t) + 0.5) * bin_size / grid


def bilinear_taps(coord: Tensor, size: int) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Border rule of one axis: (low, high, l, h = 1 - l, inside). A point outside [-1, size]
    has value 0 (inside is False); otherwise it is clamped at 0 and, from the last cell on,
    snapped to it. low and high lie in [0, size - 1] even for outside points, so indexing
    with them is always safe."""
    inside = (coord >= -1) & (coord <= size) & (size > 0)
    last = max(size - 1, 0)
    c = coord.clamp(min=0)
    low = torch.floor(c)
    at_edge = low >= last
    low = torch.where(at_edge, torch.full_like(low, last), low)
    c = torch.where(at_edge, low, c)
    high = torch.where(at_edge, low, low + 1)
    l = c - low
    return low.long(), high.long(), l, 1 - l, inside
