"""Host-side helpers shared by the Triton launchers: backward path choice, layouts, block sizes.

Nothing here looks at tensor *values*: launchers may only use shapes, strides, dtypes and
devices, so that they never synchronise with the GPU and can later be wrapped with
``torch.library.wrap_triton``.
"""

from __future__ import annotations

import inspect
import struct

import torch
import triton


def use_deterministic(explicit: bool | None) -> bool:
    """Backward path: ``explicit``, else ``roiops.config.deterministic_backward``, else
    ``torch.are_deterministic_algorithms_enabled()``."""
    from .. import config

    if explicit is not None:
        return bool(explicit)
    if config.deterministic_backward is not None:
        return bool(config.deterministic_backward)
    return torch.are_deterministic_algorithms_enabled()


def check_device(t: torch.Tensor, kernel) -> None:
    # A compiled kernel handed CPU pointers fails deep inside Triton's launcher; say why.
    # (Whether kernels are interpreted is fixed when triton.jit decorates them.)
    if t.device.type == "cpu" and isinstance(kernel, triton.runtime.jit.JITFunction):
        raise RuntimeError(
            "roiops.triton got CPU tensors but its kernels are compiled for the GPU: set "
            "TRITON_INTERPRET=1 before roiops.triton is first imported to run them on the CPU "
            "through Triton's interpreter")


def is_channels_last(t: torch.Tensor) -> bool:
    # Same rule as the C++ kernels: ambiguous strides (C == 1, 1x1 maps) count as NCHW.
    return t.is_contiguous(memory_format=torch.channels_last) and not t.is_contiguous()


def memory_format(channels_last: bool) -> torch.memory_format:
    return torch.channels_last if channels_last else torch.contiguous_format


def opmath(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def f64_bits(x: float) -> int:
    """spatial_scale as its IEEE-754 bits.

    Triton types a Python float argument as fp32, which would round the scale before a
    float64 kernel sees it; an int64 travels exactly and the kernel bitcasts it back.
    """
    return struct.unpack("<q", struct.pack("<d", float(x)))[0]


def next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


# Elements per program tile. On the interpreter every tile op is one numpy call, so a
# program covers as much as possible. On the GPU a gather tile holds a 64-bit address per
# element and tap, so ~8 elements per thread (1024 with 4 warps; half that for float64 and
# for per-element sample coordinates) keep ptxas under 255 registers without spills.
GPU_TILE = 1024
INTERP_TILE = 1 << 14


def tile_blocks(P: int, C: int, lanes_over_channels: bool, on_cpu: bool, budget: int = GPU_TILE) -> tuple[int, int]:
    """(BLOCK_P, BLOCK_C) of a [bins x channels] tile for the per-box kernels."""
    if on_cpu:
        budget = INTERP_TILE
    if lanes_over_channels:
        # channels_last: a bin's channels are contiguous; take as many as fit (up to 256)
        # so a box's sampling coordinates are computed once for all of them.
        block_c = min(next_pow2(C), budget if on_cpu else 256)
        block_p = max(1, min(next_pow2(P), budget // block_c))
    else:
        # NCHW: lanes along the bins of a box (consecutive output columns, contiguous
        # stores); warps over a few channels.
        block_p = min(next_pow2(P), budget if on_cpu else 64)
        block_c = max(1, min(next_pow2(C), budget // block_p))
    return block_p, block_c


def gather_blocks(H: int, W: int, C: int, lanes_over_channels: bool, on_cpu: bool,
                  wide: bool = False) -> tuple[int, int, int]:
    """(TILE_H, TILE_W, BLOCK_C) of the deterministic backward's [pixels x channels] tile
    (`wide`: 8-byte accumulators, half the channels)."""
    if on_cpu:
        tile_h = min(next_pow2(H), 16)
        tile_w = min(next_pow2(W), 16)
        return tile_h, tile_w, max(1, min(next_pow2(C), INTERP_TILE // (tile_h * tile_w)))
    tile_h, tile_w = 8, 8
    block_c = min(next_pow2(C), (64 if lanes_over_channels else 32) // (2 if wide else 1))
    return tile_h, tile_w, block_c


# Integer arguments that must stay run-time values: Triton would otherwise turn an
# argument equal to 1 into a compile-time constant (one more compiled variant per value
# pattern, and no `.to()` on it). Strides are left specializable: stride 1 tells the
# compiler which dimension is contiguous.
_RUNTIME_INTS = {"scale_bits", "K", "N", "C", "H", "W", "ph", "pw", "sampling_ratio", "n_pblocks", "n_tw",
                 "n_tiles"}


def kernel(fn):
    """triton.jit with the run-time integer arguments kept unspecialized."""
    names = [p for p in inspect.signature(fn).parameters if p in _RUNTIME_INTS]
    return triton.jit(fn, do_not_specialize=names)


# Compile options for every launch. fp fusion is off so that a*b+c rounds as on the CPU:
# the floor/ceil/round of box coordinates are discontinuous, and an FMA could move a bin
# edge or an adaptive grid size by one relative to the C++ and reference kernels.
LAUNCH_OPTS = dict(num_warps=4, enable_fp_fusion=False)
