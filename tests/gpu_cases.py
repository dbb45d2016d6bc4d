"""What the tests that run compiled Triton kernels on a CUDA GPU share (tests/test_gpu.py,
and the GPU sections of the per-op test files): realistic feature maps, the boxes that
break quantisation, and comparisons that say where they fail.

C = 256 maps of 200x304 (scale 1/4) and 100x150 (scales 1/16 and 1/32), two images.
Importable without a GPU; ``on_gpu`` marks (and skips elsewhere) a test that needs one.
"""

from __future__ import annotations

import math
from types import ModuleType

import pytest
import torch

from cases import tol
from roiops._requirements import triton_too_old

F16, BF16, F32, F64 = torch.float16, torch.bfloat16, torch.float32, torch.float64
N, C = 2, 256
# (scale, H, W): a P2-like level and the two coarsest FPN strides, each at least 100x150.
LEVELS = [(1 / 4, 200, 304), (1 / 16, 100, 150), (1 / 32, 100, 150)]
LEVEL_IDS = ["s4-200x304", "s16-100x150", "s32-100x150"]

# A test of the compiled Triton kernels: skipped without a CUDA GPU (tests/test_triton.py
# runs the kernels through Triton's interpreter, tests/test_ptx.py checks their compiled
# code), and where Triton is older than roiops supports (torch < 2.11).
on_gpu = pytest.mark.skipif(not torch.cuda.is_available() or bool(triton_too_old()),
                            reason=triton_too_old() or "needs a CUDA GPU (the compiled Triton kernels)")


def triton_kernels() -> ModuleType:
    """roiops.triton, imported by a test that runs on a GPU."""
    import roiops.triton

    return roiops.triton


def gpu_boxes(scale: float, H: int, W: int, ph: int, pw: int, seed: int, k_random: int = 40) -> torch.Tensor:
    """[K, 5] float32 boxes in image pixels (1 cell = 1/scale pixels) for a H x W map."""
    g = torch.Generator().manual_seed(seed)
    cell = 1.0 / scale
    rows = []
    # Random boxes, sides log-uniform from a tenth of a cell to the map's size.
    for _ in range(k_random):
        b = int(torch.randint(0, N, (1,), generator=g))
        sw, sh = (math.exp(float(torch.empty(1).uniform_(math.log(0.1), math.log(m), generator=g)))
                  for m in (W, H))
        cx = float(torch.empty(1).uniform_(-0.1 * W, 1.1 * W, generator=g))
        cy = float(torch.empty(1).uniform_(-0.1 * H, 1.1 * H, generator=g))
        rows.append([b, (cx - sw / 2) * cell, (cy - sh / 2) * cell, (cx + sw / 2) * cell, (cy + sh / 2) * cell])
    # Corners on cell edges with sizes a multiple of the output size: integer bin sizes
    # (1, 2, 3 and 5 cells) after scaling, and the same shifted by half a cell, which
    # aligned=True moves back onto cell edges.
    for m, (a, b0) in zip((1, 2, 3, 5), ((0, 0), (3, 7), (11, 2), (20, 30))):
        for half in (0.0, 0.5):
            x1, y1 = a + half, b0 + half
            rows.append([m % N, x1 * cell, y1 * cell, (x1 + m * pw) * cell, (y1 + m * ph) * cell])
    rows += [
        [0, 0.0, 0.0, (W - 1) * cell, (H - 1) * cell],                  # exactly the map
        [1, 0.0, 0.0, W * cell, H * cell],                              # the map plus a cell
        [0, -W * cell, -H * cell, 2 * W * cell, 2 * H * cell],          # three times the map
        [1, -0.5 * W * cell, 0.25 * H * cell, 1.5 * W * cell, 0.75 * H * cell],  # wider than the map
        [0, (W + 3) * cell, (H + 2) * cell, (W + 9) * cell, (H + 8) * cell],     # outside, after the map
        [1, -9 * cell, -7 * cell, -2 * cell, -1.5 * cell],              # outside, before the map
        [0, 12 * cell, 9 * cell, 4 * cell, 3 * cell],                   # inverted
        [1, 5 * cell, 6 * cell, 5 * cell, 6 * cell],                    # zero size
        [0, 7.25 * cell, 3.5 * cell, 7.5 * cell, 3.75 * cell],          # a quarter of a cell
        [1, (W - 1.5) * cell, (H - 1.5) * cell, (W + 0.5) * cell, (H + 0.5) * cell],  # over the last cells
        [0, -1.25 * cell, -0.75 * cell, 2.0 * cell, 1.0 * cell],        # over the first cells
    ]
    return torch.tensor(rows, dtype=torch.float64).to(F32)


def feature_map(H: int, W: int, dtype: torch.dtype, cl: bool, seed: int, channels: int = C) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N, channels, H, W, generator=g).to(dtype)
    return x.contiguous(memory_format=torch.channels_last) if cl else x


def cuda(t: torch.Tensor) -> torch.Tensor:
    return t.to("cuda", memory_format=torch.preserve_format)


def random_grad(shape, dtype: torch.dtype, seed: int) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def both_backwards(fn):
    """(atomic result, deterministic result), checking that the deterministic path repeats
    bit for bit."""
    fast = fn(False).cpu()
    det = fn(True).cpu()
    assert torch.equal(det, fn(True).cpu()), "deterministic backward differs between two runs"
    return fast, det


def close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    torch.testing.assert_close(actual, expected, **tol(dtype), equal_nan=True)


def close_sums(actual: torch.Tensor, expected: torch.Tensor, magnitude: torch.Tensor, dtype: torch.dtype) -> None:
    """Sums the GPU adds in another order than the CPU: within the dtype's tolerance of
    each cell's sum of |terms| (``magnitude``), since terms that cancel leave the sum's
    rounding, not its value, as the scale of the difference."""
    t = tol(dtype)["atol"]
    bad = (actual - expected).abs() > t + t * magnitude
    assert not bool(bad.any()), (f"{int(bad.sum())} of {bad.numel()} cells beyond {t:g} x (1 + sum of |terms|); "
                                 f"max |diff| {float((actual - expected).abs().max()):.3g}")


def exact(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    actual = actual.cpu()
    if not torch.equal(actual, expected):
        diff = (actual.double() - expected.double()).abs()
        bad = int((diff > 0).sum())
        raise AssertionError(f"{what}: {bad} of {diff.numel()} elements differ, max {float(diff.max()):.3g}")


def api_forward_backward(fn, x: torch.Tensor, rois, g: torch.Tensor):
    """(forward, input gradient) of a public function with autograd, on x's device."""
    xr = x.clone().requires_grad_()
    out = fn(xr, rois)
    out.backward(g.to(out.device, memory_format=torch.preserve_format))
    return out.detach().cpu(), xr.grad.cpu()


def in_format(form, b):
    """Axis-aligned boxes (a tensor of rows or a per-image list) as boxes of ``form``, built
    on the device (no sync)."""
    if isinstance(b, list):
        return [form.from_axis_aligned(torch.cat([r[:, :1] * 0, r], dim=1))[:, 1:] for r in b]
    return form.from_axis_aligned(b)
