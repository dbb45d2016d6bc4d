"""The Triton kernels on a real GPU at realistic sizes, against independent CPU oracles.

C = 256 maps of 200x304 (scale 1/4) and 100x150 (scales 1/16 and 1/32), two images, and
the boxes that break quantisation: corners and bin sizes that land exactly on cells after
scaling, larger than the map, outside it, inverted, zero-size, sub-cell. Forward results
of avg RoIAlign and Caffe RoIPool must equal torchvision's CPU kernels bit for bit (bin
edges, grid sizes and sample positions are the CPU's; the per-bin sum runs in the same
order). Backward sums contributions of many boxes in an order that differs on the GPU,
so it is compared within float32 rounding, for the atomic and the deterministic path,
and the deterministic one must repeat bit for bit. Max-mode RoIAlign and the mmdetection
convention are compared with roiops' reference (float32 and float64), half types with
the reference on upcast inputs. The position-sensitive ops (an R-FCN head) must equal the
C++ kernels bit for bit, forward and backward; rotated RoIAlign and Precise RoI Pooling
are compared with the reference.

The interpreter runs the same kernels in tests/test_triton.py; it divides, rounds and
converts with numpy, so only a GPU shows what the compiled kernels do.
"""

from __future__ import annotations

import importlib
import math

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs a CUDA GPU (the compiled Triton kernels; without one, "
                                       "tests/test_triton.py runs them through Triton's interpreter "
                                       "and tests/test_ptx.py checks their compiled code)")

import roiops
import roiops.reference as REF
from cases import config_set, tol
# Skipped, with the reason, where Triton is older than roiops supports (torch < 2.11).
from roiops._backend import triton_too_old

if triton_too_old():
    pytest.skip(triton_too_old(), allow_module_level=True)
import roiops.triton as rt

torchvision = pytest.importorskip("torchvision")

F16, BF16, F32, F64 = torch.float16, torch.bfloat16, torch.float32, torch.float64
N, C = 2, 256
# (scale, H, W): a P2-like level and the two coarsest FPN strides, each at least 100x150.
LEVELS = [(1 / 4, 200, 304), (1 / 16, 100, 150), (1 / 32, 100, 150)]
LEVEL_IDS = ["s4-200x304", "s16-100x150", "s32-100x150"]


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


@pytest.mark.parametrize("cl", [False, True], ids=["nchw", "cl"])
@pytest.mark.parametrize("scale,H,W", LEVELS, ids=LEVEL_IDS)
@pytest.mark.parametrize("dtype", [F32, F64])
def test_align_avg_equals_torchvision_cpu(scale, H, W, cl, dtype):
    x = feature_map(H, W, dtype, cl, seed=1)
    xg = cuda(x)
    for aligned, sr, (ph, pw) in ((True, 0, (7, 7)), (False, 2, (7, 7)), (True, 2, (14, 14)), (False, 0, (5, 3))):
        rois = gpu_boxes(scale, H, W, ph, pw, seed=ph * 10 + sr).to(dtype)
        rg = cuda(rois)
        xr = x.clone().requires_grad_()
        ref = torchvision.ops.roi_align(xr, rois, (ph, pw), scale, sr, aligned)
        out = rt.roi_align_forward(xg, rg, scale, ph, pw, sr, aligned)
        assert out.is_contiguous(memory_format=torch.channels_last if cl else torch.contiguous_format)
        exact(out, ref.detach().contiguous(), f"forward aligned={aligned} sampling={sr} {ph}x{pw}")
        g = random_grad(ref.shape, dtype, seed=2)
        ref.backward(g)
        # Each cell's sum of |terms|: the weights are non-negative, so the backward of |g|.
        xa = x.clone().requires_grad_()
        torchvision.ops.roi_align(xa, rois, (ph, pw), scale, sr, aligned).backward(g.abs())
        fast, det = both_backwards(lambda d: rt.roi_align_backward(cuda(g), rg, scale, ph, pw, N, C, H, W, sr,
                                                                     aligned, cl, deterministic=d))
        close_sums(fast, xr.grad, xa.grad, dtype)
        close_sums(det, xr.grad, xa.grad, dtype)


@pytest.mark.parametrize("cl", [False, True], ids=["nchw", "cl"])
@pytest.mark.parametrize("scale,H,W", LEVELS, ids=LEVEL_IDS)
def test_pool_caffe_equals_torchvision_cpu(scale, H, W, cl):
    x = feature_map(H, W, F32, cl, seed=3)
    for ph, pw in ((7, 7), (6, 4)):
        rois = gpu_boxes(scale, H, W, ph, pw, seed=ph)
        xr = x.clone().requires_grad_()
        ref = torchvision.ops.roi_pool(xr, rois, (ph, pw), scale)
        out, am = rt.roi_pool_forward(cuda(x), cuda(rois), scale, ph, pw, False)
        exact(out, ref.detach().contiguous(), f"roi_pool {ph}x{pw}")
        _, ref_am = REF.roi_pool_forward(x, rois, scale, ph, pw, False)
        exact(am, ref_am, "roi_pool argmax")
        g = random_grad(ref.shape, F32, seed=4)
        ref.backward(g)
        fast, det = both_backwards(lambda d: rt.roi_pool_backward(cuda(g), am, cuda(rois), N, C, H, W, cl,
                                                                    deterministic=d))
        close(fast, xr.grad, F32)
        close(det, xr.grad, F32)


@pytest.mark.parametrize("cl", [False, True], ids=["nchw", "cl"])
@pytest.mark.parametrize("scale,H,W", LEVELS[:2], ids=LEVEL_IDS[:2])
@pytest.mark.parametrize("dtype", [F32, F64])
def test_pool_mmdet_and_align_max_equal_reference(scale, H, W, cl, dtype):
    """Maxima are input values: forward and argmax equal the reference exactly."""
    x = feature_map(H, W, dtype, cl, seed=5)
    rois = gpu_boxes(scale, H, W, 7, 7, seed=6, k_random=24).to(dtype)
    out, am = rt.roi_pool_forward(cuda(x), cuda(rois), scale, 7, 7, True)
    ref, ref_am = REF.roi_pool_forward(x, rois, scale, 7, 7, True)
    exact(out, ref, "mmdet roi_pool")
    exact(am, ref_am, "mmdet roi_pool argmax")
    g = random_grad(ref.shape, dtype, seed=7)
    ref_gi = REF.roi_pool_backward(g, ref_am, rois, N, C, H, W, cl)
    for gi in both_backwards(lambda d: rt.roi_pool_backward(cuda(g), am, cuda(rois), N, C, H, W, cl,
                                                            deterministic=d)):
        close(gi, ref_gi, dtype)

    for aligned, sr in ((True, 2), (False, 0)):
        out, am = rt.roi_align_max_forward(cuda(x), cuda(rois), scale, 7, 7, sr, aligned)
        ref, ref_am = REF.roi_align_max_forward(x, rois, scale, 7, 7, sr, aligned)
        exact(am, ref_am, f"max-mode argmax aligned={aligned} sampling={sr}")
        close(out.cpu(), ref, dtype)
        ref_gi = REF.roi_align_max_backward(g, ref_am, rois, scale, 7, 7, N, C, H, W, sr, aligned, cl)
        for gi in both_backwards(lambda d: rt.roi_align_max_backward(cuda(g), am, cuda(rois), scale, 7, 7, N, C, H,
                                                                     W, sr, aligned, cl, deterministic=d)):
            close(gi, ref_gi, dtype)


@pytest.mark.parametrize("cl", [False, True], ids=["nchw", "cl"])
@pytest.mark.parametrize("dtype", [F16, BF16])
def test_half_types_against_upcast_reference(dtype, cl):
    scale, H, W = LEVELS[1]
    x = feature_map(H, W, dtype, cl, seed=8)
    rois = gpu_boxes(scale, H, W, 7, 7, seed=9, k_random=24)
    g = random_grad((rois.shape[0], C, 7, 7), dtype, seed=10)
    xf, gf = x.float(), g.float()
    out = rt.roi_align_forward(cuda(x), cuda(rois), scale, 7, 7, 0, True)
    assert out.dtype == dtype
    close(out.cpu(), REF.roi_align_forward(xf, rois, scale, 7, 7, 0, True).to(dtype), dtype)
    ref_gi = REF.roi_align_backward(gf, rois, scale, 7, 7, N, C, H, W, 0, True, cl)
    for gi in both_backwards(lambda d: rt.roi_align_backward(cuda(g), cuda(rois), scale, 7, 7, N, C, H, W, 0, True,
                                                             cl, deterministic=d)):
        assert gi.dtype == dtype
        close(gi.float(), ref_gi, dtype)

    out, am = rt.roi_align_max_forward(cuda(x), cuda(rois), scale, 7, 7, 2, False)
    ref, ref_am = REF.roi_align_max_forward(xf, rois, scale, 7, 7, 2, False)
    close(out.cpu(), ref.to(dtype), dtype)
    for gi in both_backwards(lambda d: rt.roi_align_max_backward(cuda(g), am, cuda(rois), scale, 7, 7, N, C, H, W, 2,
                                                                 False, cl, deterministic=d)):
        close(gi.float(), REF.roi_align_max_backward(gf, am.cpu(), rois, scale, 7, 7, N, C, H, W, 2, False, cl),
              dtype)

    for continuous in (False, True):
        out, am = rt.roi_pool_forward(cuda(x), cuda(rois), scale, 7, 7, continuous)
        ref, ref_am = REF.roi_pool_forward(x, rois, scale, 7, 7, continuous)
        exact(out, ref, "half roi_pool")
        exact(am, ref_am, "half roi_pool argmax")
        for gi in both_backwards(lambda d: rt.roi_pool_backward(cuda(g), am, cuda(rois), N, C, H, W, cl,
                                                                deterministic=d)):
            close(gi.float(), REF.roi_pool_backward(gf, ref_am, rois, N, C, H, W, cl), dtype)


def test_public_api_on_cuda_equals_cpu():
    """The public functions with autograd on CUDA tensors against the same calls on CPU
    (the C++ kernels, bit-exact with torchvision)."""
    scale, H, W = LEVELS[0]
    x = feature_map(H, W, F32, True, seed=11)
    rois = gpu_boxes(scale, H, W, 7, 7, seed=12)
    for fn in (lambda t, b: roiops.roi_align(t, b, 7, scale, 2, True),
               lambda t, b: roiops.roi_align(t, b, 7, scale, 0, False, mode="max"),
               lambda t, b: roiops.roi_pool(t, b, 7, scale),
               lambda t, b: roiops.roi_pool(t, b, 7, scale, convention="mmdet")):
        xc = x.clone().requires_grad_()
        xg = cuda(x).requires_grad_()
        ref = fn(xc, rois)
        out = fn(xg, cuda(rois))
        exact(out.detach(), ref.detach(), "public API forward")
        g = random_grad(ref.shape, F32, seed=13)
        ref.backward(g)
        out.backward(cuda(g))
        assert xg.grad.device.type == "cuda"
        close(xg.grad.cpu(), xc.grad, F32)


# R-FCN's head on the stride-16 map of a 600x800 image: 7x7 bins of 21 classes.
R_FCN = (1 / 16, 38, 50)
R_FCN_C = 21 * 49


def api_forward_backward(fn, x: torch.Tensor, rois, g: torch.Tensor):
    """(forward, input gradient) of a public function with autograd, on x's device."""
    xr = x.clone().requires_grad_()
    out = fn(xr, rois)
    out.backward(g.to(out.device, memory_format=torch.preserve_format))
    return out.detach().cpu(), xr.grad.cpu()


PS = {"align-adaptive": lambda t, b, s: roiops.ps_roi_align(t, b, 7, s, 0),
      "align-2": lambda t, b, s: roiops.ps_roi_align(t, b, 7, s, 2),
      "pool": lambda t, b, s: roiops.ps_roi_pool(t, b, 7, s)}


@pytest.mark.parametrize("cl", [False, True], ids=["nchw", "cl"])
@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("op", list(PS))
def test_position_sensitive_equal_cpu_kernels(op, dtype, cl, monkeypatch):
    """The R-FCN head: forward and the deterministic backward equal the C++ kernels bit for
    bit (the same arithmetic in the same order; tests/test_ps_roi.py holds those to
    torchvision), the atomic backward within rounding; and the PSRoIAlign forward with a
    fixed grid equals torchvision's CPU kernel itself."""
    scale, H, W = R_FCN
    g = torch.Generator().manual_seed(20)
    x = torch.randn(N, R_FCN_C, H, W, generator=g).to(dtype)
    x = x.contiguous(memory_format=torch.channels_last) if cl else x
    rois = gpu_boxes(scale, H, W, 7, 7, seed=21).to(dtype)
    grad = random_grad((rois.shape[0], R_FCN_C // 49, 7, 7), dtype, seed=22)
    fn = lambda t, b: PS[op](t, b, scale)
    ref_out, ref_grad = api_forward_backward(fn, x, rois, grad)
    for deterministic in (False, True):
        monkeypatch.setattr(roiops.config, "deterministic_backward", deterministic)
        out, gi = api_forward_backward(fn, cuda(x), cuda(rois), grad)
        exact(out, ref_out, f"ps {op} forward")
        if deterministic:
            exact(gi, ref_grad, f"ps {op} deterministic backward")
        else:
            close(gi, ref_grad, dtype)
    if op == "align-2":
        exact(out, torchvision.ops.ps_roi_align(x, rois, 7, scale, 2).contiguous(), "ps align vs torchvision")


def rotated_rois(scale: float, H: int, W: int, seed: int) -> torch.Tensor:
    """[K, 6] (batch, cx, cy, w, h, degrees): gpu_boxes' boxes (their awkward sizes and
    places), turned by quarter, half and whole turns (whose cosines and sines round near
    0 and 1) and by other angles."""
    b = gpu_boxes(scale, H, W, 7, 7, seed, k_random=24).double()
    angles = torch.tensor([0.0, 90.0, 180.0, -90.0, 45.0, -30.5, 12.25, 270.0, 360.0, 135.0, -179.75])
    angle = angles[torch.arange(b.shape[0]) % len(angles)].double()
    return torch.stack([b[:, 0], (b[:, 1] + b[:, 3]) / 2, (b[:, 2] + b[:, 4]) / 2, b[:, 3] - b[:, 1],
                        b[:, 4] - b[:, 2], angle], dim=1)


@pytest.mark.parametrize("cl", [False, True], ids=["nchw", "cl"])
@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("sr,aligned", [(2, True), (0, False)])
def test_rotated_against_reference(sr, aligned, dtype, cl):
    """Rotated RoIAlign on C = 256 maps: forward, atomic and deterministic backward against
    the reference; the deterministic one repeats bit for bit."""
    scale, H, W = LEVELS[1]
    x = feature_map(H, W, dtype, cl, seed=23)
    deg = rotated_rois(scale, H, W, seed=24).to(dtype)
    rad = torch.cat([deg[:, :5], torch.deg2rad(deg[:, 5:].double()).to(dtype)], dim=1)
    out = rt.roi_align_rotated_forward(cuda(x), cuda(rad), scale, 7, 7, sr, aligned)
    assert out.is_contiguous(memory_format=torch.channels_last if cl else torch.contiguous_format)
    close(out.cpu(), REF.roi_align_rotated_forward(x, rad, scale, 7, 7, sr, aligned), dtype)
    g = random_grad(out.shape, dtype, seed=25)
    ref_gi = REF.roi_align_rotated_backward(g, rad, scale, 7, 7, N, C, H, W, sr, aligned, cl)
    for gi in both_backwards(lambda d: rt.roi_align_rotated_backward(cuda(g), cuda(rad), scale, 7, 7, N, C, H, W,
                                                                     sr, aligned, cl, deterministic=d)):
        close(gi, ref_gi, dtype)
    # The public function in degrees, against the C++ kernels.
    fn = lambda t, b: roiops.roi_align_rotated(t, b, 7, scale, sr, aligned)
    cpu_out, cpu_gi = api_forward_backward(fn, x, deg, g)
    gpu_out, gpu_gi = api_forward_backward(fn, cuda(x), cuda(deg), g)
    close(gpu_out, cpu_out, dtype)
    close(gpu_gi, cpu_gi, dtype)


def test_rotated_at_angle_zero_is_roi_align():
    """Angle 0 pools the axis-aligned box as roi_align(aligned=True) does. The two compute
    the sample positions in different orders, so in float64, where that rounding is far
    below the tolerance (coordinates up to 10^3 cells)."""
    scale, H, W = LEVELS[0]
    x = cuda(feature_map(H, W, F64, True, seed=26))
    rois = rotated_rois(scale, H, W, seed=27)
    rois[:, 5] = 0
    rois = rois[(rois[:, 3] > 0) & (rois[:, 4] > 0)]  # roi_align pools inverted boxes as 1-cell ones
    axis = torch.stack([rois[:, 0], rois[:, 1] - rois[:, 3] / 2, rois[:, 2] - rois[:, 4] / 2,
                        rois[:, 1] + rois[:, 3] / 2, rois[:, 2] + rois[:, 4] / 2], dim=1)
    torch.testing.assert_close(roiops.roi_align_rotated(x, cuda(rois), 7, scale, 2).cpu(),
                               roiops.roi_align(x, cuda(axis), 7, scale, 2, True).cpu(), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("cl", [False, True], ids=["nchw", "cl"])
@pytest.mark.parametrize("dtype", [F32, F64])
def test_prroi_pool_against_cpu_kernels_and_reference(dtype, cl):
    """Precise RoI Pooling on C = 256 maps: forward, both input-gradient paths and the box
    gradient. float64 against the reference; float32 against the C++ kernels, which
    compute the windows' weights with the same arithmetic (the float32 reference takes
    differences of the hat's antiderivative, which lose digits on short windows far from
    the origin: docs/semantics.md)."""
    scale, H, W = LEVELS[1]
    x = feature_map(H, W, dtype, cl, seed=28)
    rois = gpu_boxes(scale, H, W, 7, 7, seed=29, k_random=24).to(dtype)
    g = random_grad((rois.shape[0], C, 7, 7), dtype, seed=30)
    if dtype == F64:
        want = (REF.prroi_pool_forward(x, rois, scale, 7, 7),
                REF.prroi_pool_backward(g, rois, scale, 7, 7, N, C, H, W, cl),
                REF.prroi_pool_rois_backward(g, x, rois, scale, 7, 7))
    else:
        import roiops._C as cpp

        want = (cpp.prroi_pool_forward(x, rois, scale, 7, 7),
                cpp.prroi_pool_backward(g, rois, scale, 7, 7, N, C, H, W, cl),
                cpp.prroi_pool_rois_backward(g, x, rois, scale, 7, 7))
    out = rt.prroi_pool_forward(cuda(x), cuda(rois), scale, 7, 7)
    close(out.cpu(), want[0], dtype)
    for gi in both_backwards(lambda d: rt.prroi_pool_backward(cuda(g), cuda(rois), scale, 7, 7, N, C, H, W, cl,
                                                              deterministic=d)):
        close(gi, want[1], dtype)
    gr = rt.prroi_pool_rois_backward(cuda(g), cuda(x), cuda(rois), scale, 7, 7).cpu()
    # A box's four derivatives each sum C x 49 terms, in another order on each side.
    scale_row = want[2].abs().amax(dim=1, keepdim=True)
    torch.testing.assert_close(gr / scale_row.clamp(min=1e-30), want[2] / scale_row.clamp(min=1e-30), **tol(dtype))


def as_rotated(b):
    """Axis-aligned boxes as rotated rows at angle 0, built on the device (no sync)."""
    if isinstance(b, list):
        return [torch.cat([(r[:, :2] + r[:, 2:]) / 2, r[:, 2:] - r[:, :2], r[:, :1] * 0], dim=1) for r in b]
    return torch.cat([b[:, :1], (b[:, 1:3] + b[:, 3:]) / 2, b[:, 3:] - b[:, 1:3], b[:, :1] * 0], dim=1)


OPS = {
    "align": lambda t, b, s: roiops.roi_align(t, b, 7, s, 2, True),
    "align-max": lambda t, b, s: roiops.roi_align(t, b, 7, s, 0, False, mode="max"),
    "pool": lambda t, b, s: roiops.roi_pool(t, b, 7, s),
    "pool-mmdet": lambda t, b, s: roiops.roi_pool(t, b, 7, s, convention="mmdet"),
    "multi-level": lambda t, b, s: roiops.multi_scale_roi_align([t, t[:, :, ::2, ::2]], b, 7, [s, s / 2], 2),
    "ps-align": lambda t, b, s: roiops.ps_roi_align(t, b, 4, s, 2),   # 256 = 16 channels x 4 x 4 bins
    "ps-pool": lambda t, b, s: roiops.ps_roi_pool(t, b, 4, s),
    "rotated": lambda t, b, s: roiops.roi_align_rotated(t, as_rotated(b), 7, s, 2),
    "prroi": lambda t, b, s: roiops.prroi_pool(t, b, 7, s),
}


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("op", list(OPS))
def test_no_host_sync_by_default(op, deterministic):
    """Forward and backward never wait for the GPU by default: the box value check is
    skipped on CUDA tensors (invalid rows give 0 and no gradient)."""
    scale, H, W = LEVELS[1]
    x = cuda(feature_map(H, W, F32, True, seed=14)).requires_grad_()
    cpu_rois = gpu_boxes(scale, H, W, 7, 7, seed=15, k_random=8)
    rois = cuda(cpu_rois)
    boxes = [cuda(cpu_rois[cpu_rois[:, 0] == i, 1:]) for i in range(N)]  # the list form too
    g = torch.ones(1, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with config_set(deterministic_backward=deterministic):
            for b in (rois, boxes):
                out = OPS[op](x, b, scale)
                out.backward(g.expand_as(out))
    finally:
        torch.cuda.set_sync_debug_mode(0)


def test_invalid_rows_on_cuda_give_zeros_or_raise_in_strict_mode():
    scale, H, W = LEVELS[1]
    x = cuda(feature_map(H, W, F32, False, seed=16))
    rois = cuda(torch.tensor([[0, 8.0, 8.0, 200.0, 160.0], [5, 8.0, 8.0, 200.0, 160.0],
                              [1, float("nan"), 8.0, 200.0, 160.0]]))
    out = roiops.roi_align(x, rois, 7, scale, 2, True)
    assert out[0].abs().sum() > 0 and not out[1:].any()
    with config_set(check_box_values=True), pytest.raises(ValueError, match="boxes row 1"):
        roiops.roi_align(x, rois, 7, scale, 2, True)


def test_repeated_launches_run_the_kernel_of_their_own_specialization(monkeypatch):
    """A launch whose arguments key it as an earlier one's calls that launch's compiled
    kernel directly (_common._Kernel). Launches that Triton specializes differently, one
    after another and then again in reverse: maps and boxes 4 or 8 bytes past 16-byte
    alignment, rows of W + 1 cells, channels_last, float32 and float64. Each must equal
    torchvision's CPU kernel bit for bit, and the second round must take no other path."""
    scale, H, W = LEVELS[1]
    cases = []
    for dtype in (F32, F64):
        wide = cuda(feature_map(H, W + 1, dtype, False, seed=21))
        rows = cuda(torch.cat([torch.zeros(1, 5), gpu_boxes(scale, H, W, 7, 7, seed=22)]).to(dtype))
        for x, rois in ((wide[..., :W], rows[1:].clone()),         # aligned map, rows of W + 1 cells
                        (wide[..., 1:], rows[1:]),                 # both misaligned
                        (cuda(feature_map(H, W, dtype, True, seed=23)), rows[1:].clone())):
            expected = torchvision.ops.roi_align(x.cpu(), rois.cpu(), 7, scale, 2, True)
            cases.append((x, rois, expected))
    assert cases[1][0].data_ptr() % 16 and cases[1][1].data_ptr() % 16
    for x, rois, expected in cases:
        exact(rt.roi_align_forward(x, rois, scale, 7, 7, 2, True), expected, f"first round {x.dtype} {x.stride()}")
    slow = []
    kernel = importlib.import_module("roiops.triton.roi_align")._align_fwd_kernel
    full_path = kernel.run
    monkeypatch.setattr(kernel, "run", lambda *a, **k: slow.append(1) or full_path(*a, **k))
    for x, rois, expected in reversed(cases):
        exact(rt.roi_align_forward(x, rois, scale, 7, 7, 2, True), expected, f"second round {x.dtype} {x.stride()}")
    assert not slow, "a repeated launch went through JITFunction.run"


@pytest.mark.parametrize("op", ["roi_align", "ps_roi_pool"])
def test_cuda_graph_capture_and_replay(op):
    """A step captured in a CUDA graph and replayed after new values were copied into its
    inputs (the pattern of docs/ecosystem.md) gives what an eager call gives on them."""
    scale, H, W = LEVELS[0]
    c, c_out = (C, C) if op == "roi_align" else (4 * 49, 4)

    def call(x, rois):
        return roiops.roi_align(x, rois, 7, scale, 2, True) if op == "roi_align" else \
            roiops.ps_roi_pool(x, rois, 7, scale)

    static_x = cuda(feature_map(H, W, F32, True, seed=17, channels=c)).requires_grad_()
    static_rois = cuda(gpu_boxes(scale, H, W, 7, 7, seed=18))
    static_g = torch.randn(static_rois.shape[0], c_out, 7, 7, device="cuda")

    def step():
        static_x.grad = None
        out = call(static_x, static_rois)
        out.backward(static_g)
        return out

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = step()
    new_x = cuda(feature_map(H, W, F32, True, seed=19, channels=c))
    with torch.no_grad():
        static_x.copy_(new_x)
        static_rois[:, 1:] *= 0.5
    graph.replay()
    xe = new_x.clone().requires_grad_()
    expected = call(xe, static_rois.clone())
    expected.backward(static_g)
    exact(static_out, expected.detach().cpu(), "replayed forward")
    close(static_x.grad.cpu(), xe.grad.cpu(), F32)
