"""Host-side helpers shared by the Triton launchers: backward path choice, layouts, block
sizes, grids, outputs and gradient buffers. The launchers' argument checks are the kernel
contract's, roiops._kernel_checks.

Nothing here looks at tensor *values*: launchers may only use shapes, strides, dtypes and
devices, so that they never synchronise with the GPU and can later be wrapped with
``torch.library.wrap_triton``.
"""

from __future__ import annotations

import inspect
import operator
import struct
from typing import NamedTuple

import torch
import triton
from triton.runtime.jit import JITFunction

from .._geometry import MAX_LEVELS, dense, is_channels_last, memory_format
from ._jit import FLAT


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
    if t.is_cpu and isinstance(kernel, triton.runtime.jit.JITFunction):
        raise RuntimeError(
            "roiops.triton got CPU tensors but its kernels are compiled for the GPU: set "
            "TRITON_INTERPRET=1 before roiops.triton is first imported to run them on the CPU "
            "through Triton's interpreter")


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
# element and tap, so the tile sets the registers a thread needs: 2 elements per thread
# (256 with 4 warps; less for float64 and for per-element sample coordinates) keep
# RoIAlign's forward within tests/test_ptx.py's MAX_PER_BOX_REGISTERS, where larger tiles
# exceed it and cut the programs an SM runs at once.
GPU_TILE = 256
INTERP_TILE = 1 << 14


def tile_blocks(P: int, C: int, lanes_over_channels: bool, on_cpu: bool, budget: int = GPU_TILE,
                flat: bool = False) -> tuple[int, int, int, int, bool | int]:
    """(BLOCK_P, BLOCK_C, bin blocks, channel blocks, CF) of the per-box kernels' tiles
    (bin_tile in _jit.py): a box's programs are its bin blocks x channel blocks, and CF
    the tile layout the kernel takes. `flat`: flat tiles for NCHW input (CF = FLAT)."""
    if on_cpu:
        budget = INTERP_TILE
    if lanes_over_channels:
        # channels_last: a bin's channels are contiguous; take as many as fit (up to 256)
        # so a box's sampling coordinates are computed once for all of them.
        block_c = min(next_pow2(C), budget if on_cpu else 256)
        block_p = max(1, min(next_pow2(P), budget // block_c))
    elif flat:
        # NCHW, flat: consecutive outputs of a box, channel after channel: no lane idles
        # when P is not a power of two (bins of 64 leave 15 of 64 lanes idle at 7x7), but
        # each lane computes its own bin's geometry. Only the kernels measured faster with
        # them take them (RoIAlign's and rotated RoIAlign's forwards); the
        # others keep [channels x bins] tiles, which compute a bin's geometry once for all
        # of its channels.
        block = min(next_pow2(C * P), budget)
        return block, 1, cdiv(C * P, block), 1, FLAT.value
    else:
        # NCHW: lanes along the bins of a box (consecutive output columns, contiguous
        # stores); warps over a few channels.
        block_p = min(next_pow2(P), budget if on_cpu else 64)
        block_c = max(1, min(next_pow2(C), budget // block_p))
    return block_p, block_c, cdiv(P, block_p), cdiv(C, block_c), lanes_over_channels


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


def gather_grid(grad: torch.Tensor, H: int, W: int, C: int, channels_last: bool) -> tuple[int, int, int, int, int]:
    """(TILE_H, TILE_W, BLOCK_C, tile columns, tiles) of a deterministic backward's programs
    on an H x W map (gather_blocks for grad's dtype)."""
    tile_h, tile_w, block_c = gather_blocks(H, W, C, channels_last, grad.is_cpu, grad.dtype == torch.float64)
    n_tw = cdiv(W, tile_w)
    return tile_h, tile_w, block_c, n_tw, cdiv(H, tile_h) * n_tw


def tile_mask(tiles: int, K: int, device: torch.device) -> torch.Tensor:
    """A zeroed [tiles, ceil(K / 32)] int32 mask: bit k of row t for box k reaching gather
    tile t (set by a deterministic backward's prepass)."""
    return torch.zeros((tiles, cdiv(K, 32)), dtype=torch.int32, device=device)


def tile_budget(dtype: torch.dtype, share: int = 1) -> int:
    """GPU_TILE elements for a tile whose elements each carry `share` values, halved for
    float64 (its values take two registers)."""
    return GPU_TILE // share // (2 if dtype == torch.float64 else 1)


class BoxGrid(NamedTuple):
    """The grid of a per-box kernel: one program per (box, block of bins, block of
    channels), the tiles of tile_blocks (box_program in _jit.py decodes it)."""
    boxes: int
    block_p: int
    block_c: int
    n_pb: int
    n_cb: int
    cf: bool | int

    def launch(self, kernel, head: tuple, strides: tuple, **constexprs) -> None:
        """kernel(*head, n_pblocks, *strides) with the tile's BLOCK_P, BLOCK_C and CF, the
        kernel's other constexprs and LAUNCH_OPTS."""
        kernel[(self.boxes * self.n_pb, self.n_cb)](*head, self.n_pb, *strides, BLOCK_P=self.block_p,
                                                     BLOCK_C=self.block_c, CF=self.cf, **constexprs, **LAUNCH_OPTS)


def box_grid(K: int, ph: int, pw: int, C: int, lanes_over_channels: bool, on_cpu: bool, budget: int = GPU_TILE,
             flat: bool = False) -> BoxGrid:
    """The BoxGrid of K boxes of ph x pw bins and C channels (tile_blocks' arguments)."""
    return BoxGrid(K, *tile_blocks(ph * pw, C, lanes_over_channels, on_cpu, budget, flat))


def forward_output(input: torch.Tensor, rois: torch.Tensor, channels: int, ph: int, pw: int,
                   dtype: torch.dtype | None = None) -> torch.Tensor:
    """An uninitialised [K, channels, ph, pw] forward output in the input's memory format and
    dtype (or `dtype`). The kernels store bin p at p * soW: soH == pw * soW."""
    out = torch.empty((rois.shape[0], channels, ph, pw), dtype=dtype or input.dtype, device=input.device,
                      memory_format=memory_format(is_channels_last(input)))
    assert ph == 1 or out.stride(2) == pw * out.stride(3)
    return out


class BoxForward(NamedTuple):
    """A per-box forward's launch: rois in opmath, dense; its uninitialised output and int32
    argmax (box_forward's argmax; else the output, which a kernel with an unused argmax
    pointer takes in its place); the kernel's sizes (N, C, H, W, ph, pw), C the output's
    channels; the grid."""
    rois: torch.Tensor
    out: torch.Tensor
    argmax: torch.Tensor
    sizes: tuple[int, int, int, int, int, int]
    grid: BoxGrid


def box_forward(input: torch.Tensor, rois: torch.Tensor, pooled_height: int, pooled_width: int,
                budget: int = GPU_TILE, flat: bool = False, argmax: bool = False,
                position_sensitive: bool = False) -> BoxForward:
    """The BoxForward of a forward of `input`: [K, C, ph, pw] outputs (C / (ph * pw) channels
    if position_sensitive), tiles from the input's layout (tile_blocks' budget and flat)."""
    N, C, H, W = input.shape
    ph, pw = int(pooled_height), int(pooled_width)
    c_out = C // (ph * pw) if position_sensitive else C
    rois = dense(rois, opmath(input.dtype))
    out = forward_output(input, rois, c_out, ph, pw)
    grid = box_grid(rois.shape[0], ph, pw, c_out, input.stride(1) < input.stride(3), input.is_cpu, budget, flat)
    return BoxForward(rois, out, forward_output(input, rois, c_out, ph, pw, torch.int32) if argmax else out,
                      (N, c_out, H, W, ph, pw), grid)


def grad_input(grad: torch.Tensor, N: int, C: int, H: int, W: int, channels_last: bool,
               atomic: bool = False) -> torch.Tensor:
    """An uninitialised [N, C, H, W] input gradient in grad's dtype; or (atomic) a zeroed
    one for atomic adds, in float32 for half types as the CPU kernels accumulate
    (from_atomic casts it back)."""
    fmt = memory_format(channels_last)
    if not atomic:
        return torch.empty((N, C, H, W), dtype=grad.dtype, device=grad.device, memory_format=fmt)
    dtype = grad.dtype if grad.dtype in (torch.float32, torch.float64) else torch.float32
    return torch.empty((N, C, H, W), dtype=dtype, device=grad.device, memory_format=fmt).zero_()


def from_atomic(gi: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """An atomic grad_input in `dtype`."""
    return gi if gi.dtype == dtype else gi.to(dtype)


def level_args(tensors: list, scales: list[float], heights: list[int], widths: list[int]) -> tuple[list, ...]:
    """A multi-level kernel's per-level arguments (pointers, scale bits, heights, widths),
    padded to MAX_LEVELS with level 0's (padding is never selected: boxes of other levels
    are masked)."""
    L = len(tensors)
    if not 1 <= L <= MAX_LEVELS:
        raise ValueError(f"roiops: multi-level RoIAlign takes 1 to {MAX_LEVELS} levels, got {L}")
    pad = MAX_LEVELS - L
    return ([*tensors, *[tensors[0]] * pad], [f64_bits(s) for s in [*scales, *[scales[0]] * pad]],
            [*heights, *[heights[0]] * pad], [*widths, *[widths[0]] * pad])


def level_starts(programs: list[int]) -> list[int]:
    """First program of levels 1 to 4 in a grid of per-level program counts, the missing
    levels' past any grid."""
    return [sum(programs[:i]) for i in range(1, len(programs))] + [2 ** 31 - 1] * (MAX_LEVELS - len(programs))


# Integer arguments that must stay run-time values: Triton would otherwise turn an
# argument equal to 1 into a compile-time constant (one more compiled variant per value
# pattern, and no `.to()` on it). Strides are left specializable: stride 1 tells the
# compiler which dimension is contiguous.
_RUNTIME_INTS = {"scale_bits", "gamma_bits", "K", "N", "C", "H", "W", "ph", "pw", "sampling_ratio", "n_pblocks", "n_tw",
                 "n_tiles", "TILE", "n_words", "n_levels", "num_orientations", "pool_size", "n_kblocks", "n_cblocks",
                 "ox", "oy", "oz", "max_points", "S",
                 *(f"{name}{level}" for name in ("sb", "H", "W", "p") for level in range(5))}  # per-level arguments


def box_trig(boxes: torch.Tensor) -> torch.Tensor:
    """``[..., 2]`` (cos, sin) of -yaw of ``[..., 7]`` LiDAR boxes: computed in float64 on the
    boxes' device and rounded to their dtype (no host read; tl.cos would fuse and round
    differently)."""
    yaw = -boxes[..., 6].to(torch.float64)
    return torch.stack((torch.cos(yaw), torch.sin(yaw)), -1).to(boxes.dtype)


def kernel(fn):
    """triton.jit with the run-time integer arguments kept unspecialized; compiled (not
    interpreted), a :class:`_Kernel`, whose repeated launches skip Triton's binder."""
    names = [p for p in inspect.signature(fn).parameters if p in _RUNTIME_INTS]
    return triton.jit(fn, do_not_specialize=names) if triton.knobs.runtime.interpret else \
        _Kernel(fn, do_not_specialize=names)


def _picker(positions: list[int]):
    """values -> the tuple of values at these positions."""
    if len(positions) > 1:
        return operator.itemgetter(*positions)
    return (lambda values: (values[positions[0]],)) if positions else (lambda values: ())


def _hooked(*hooks) -> bool:
    # A launch hook is None or a chain of calls, depending on Triton's version.
    return any(getattr(h, "calls", h) for h in hooks)


_INTS = frozenset([int])
_TENSORS = frozenset([torch.Tensor, torch.nn.Parameter])
_I32 = range(-(2**31), 2**31)
_MAX_KEYS = 4096


class _Kernel(JITFunction):
    """A JITFunction whose repeated launches call the compiled kernel directly.

    JITFunction.run binds and specializes every argument in Python and checks its options
    and globals on each launch, several times the host time of the compiled kernel's own
    launcher. Here a launch is keyed by the device, each tensor argument's dtype and
    16-byte alignment, the values of the integer arguments Triton specializes (the
    strides, on being 1 or a multiple of 16), whether each of the others fits in int32,
    the constexpr values and the compile options. A key's first launch goes through
    JITFunction.run, which compiles if needed and launches, and the kernel it returns
    serves the key's later launches. The key separates at least what Triton's does, so it
    names one compiled kernel. Which parameters are tensors and which integers is learnt
    from the first launch; a launch that differs in that, has an integer of 2^63 or more,
    or leaves a parameter to its default, and any launch while launch hooks (profilers) or
    pre-run hooks are set, takes Triton's path."""

    def __init__(self, fn, **kwargs):
        super().__init__(fn, **kwargs)
        self._param_names = frozenset(self.arg_names)
        self._plan = None
        self._compiled: dict = {}

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self._launch(grid, args, kwargs)

    def _make_plan(self, values):
        kinds = ["const" if p.is_constexpr else "tensor" if isinstance(v, torch.Tensor) else
                 ("runtime" if p.do_not_specialize else "int") if type(v) is int else "other"
                 for p, v in zip(self.params, values)]
        if "other" in kinds:
            return False
        return tuple(_picker([i for i, k in enumerate(kinds) if k == kind])
                     for kind in ("tensor", "int", "runtime", "const"))

    def _launch(self, grid, args, kwargs):
        try:
            values = args + tuple([kwargs[n] for n in self.arg_names[len(args):]])
        except KeyError:
            values = None
        hooks = triton.knobs.runtime
        if values is None or self.pre_run_hooks or _hooked(hooks.launch_enter_hook, hooks.launch_exit_hook):
            self.run(*args, grid=grid, warmup=False, **kwargs)
            return
        if self._plan is None:
            self._plan = self._make_plan(values)
        key = None
        if self._plan:
            tensors, ints, runtime, consts = self._plan
            tensors, ints, runtime = tensors(values), ints(values), runtime(values)
            if _INTS.issuperset(map(type, ints + runtime)) and _TENSORS.issuperset(map(type, tensors)) and \
                    max(runtime, default=0) < 2**63:
                driver = triton.runtime.driver.active
                device = driver.get_current_device()
                key = (device, *[(t.dtype, not t.data_ptr() & 15) for t in tensors], ints,
                       tuple(map(_I32.__contains__, runtime)), consts(values),
                       *[item for item in kwargs.items() if item[0] not in self._param_names])
                compiled = self._compiled.get(key)
                if compiled is not None:
                    compiled.run(grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1,
                                 driver.get_current_stream(device), compiled.function, compiled.packed_metadata,
                                 None, None, None, *values)
                    return
        compiled = self.run(*args, grid=grid, warmup=False, **kwargs)
        if key is not None and compiled is not None and not hasattr(compiled, "result"):  # not a pending compile
            if len(self._compiled) >= _MAX_KEYS:  # many map sizes: start again rather than grow
                self._compiled.clear()
            self._compiled[key] = compiled


# Compile options for every launch. fp fusion is off so that a*b+c rounds as on the CPU:
# the floor/ceil/round of box coordinates are discontinuous, and an FMA could move a bin
# edge or an adaptive grid size by one relative to the C++ and reference kernels.
# reflect_ftz is off because with it Triton compiles float32 floor/ceil to conversions that
# flush subnormals to zero: ceil of a subnormal bin size (a tiny spatial_scale) would be 0
# where the CPU and the interpreter give 1 (tests/test_ptx.py).
LAUNCH_OPTS = dict(num_warps=4, enable_fp_fusion=False, enable_reflect_ftz=False)

