"""Rotation-invariant RoIAlign: mmcv's own test vectors, an independent per-sample
brute force of mmcv's definition (forward, and the backward as its adjoint), the
orientation rule for any finite angle, its equality with roi_align_rotated(aligned=False)
for one orientation, and the drop-ins' signatures and checks. What every op must do
(dtypes, layouts, gradcheck, compile, export, Module, validation, threads) is in
test_generic.py; the shared conformance vectors run in test_conformance.py."""

from __future__ import annotations

import inspect
import math
import sys
import time

import pytest
import torch

import roiops
from cases import F16, F32, F64, close, device_for, sample_taps, tol
from cases import boxes_for as _boxes_for
from cases import feature as _feature
from cases import run as _run
from roiops._boxes import ROTATED
from roiops.compat import mmcv

# The option sets the generic tests (tests/cases.py) run the operator with.
OPTIONS = {"riroi_align_rotated": (dict(sampling_ratio=2, num_orientations=8, clockwise=False),
                                  dict(sampling_ratio=0, num_orientations=2, clockwise=True))}

N, H, W = 2, 9, 11
SCALE = 0.5  # boxes in pixels of a 22 x 18 image
BACKENDS = ["reference", "cpu", "triton"]


def feature(c=8, dtype=F64, channels_last=False, seed=0):
    return _feature(dtype, channels_last, seed, shape=(N, c, H, W))


def boxes(dtype=F64, seed=0, count=6):
    """Random rotated boxes, angles in radians (boxes_for draws degrees), and angles beyond
    a turn either way."""
    b = _boxes_for(ROTATED, dtype, seed, count, N, W / SCALE, H / SCALE)
    b[:, 5] = b[:, 5] * (math.pi / 180)
    b[::3, 5] += 4 * math.pi
    b[1::3, 5] -= 3 * math.pi
    return b


# ----------------------------------------------------------------------------- mmcv's definition, per sample


def _bilinear(plane: list, y: float, x: float) -> float:
    """mmcv's bilinear_interpolate on a list-of-lists plane."""
    return sum(w * plane[a][b] for a, b, w in sample_taps(y, x, len(plane), len(plane[0])))


def brute_force(x: torch.Tensor, rois: torch.Tensor, ph: int, pw: int, scale: float, num_samples: int,
                orientations: int, clockwise: bool) -> torch.Tensor:
    """mmcv's riroi_align_rotated in float64, sample by sample: each sample blends the two
    orientations it reads (r * v0 + l * v1), the bin is their mean. The orientation comes
    from the box's angle as given; clockwise turns only the sampling."""
    maps = x.double().tolist()
    out = torch.zeros(len(rois), x.shape[1], ph, pw, dtype=F64)
    for k, (b, cx, cy, w, h, theta) in enumerate(rois.double().tolist()):
        planes = maps[int(b)]
        cx, cy = cx * scale, cy * scale
        w, h = max(w * scale, 1.0), max(h * scale, 1.0)
        f = theta * orientations / (2 * math.pi)
        f = max(min(f, sys.float_info.max), -sys.float_info.max)  # made finite, as the kernels do
        whole = math.floor(f)
        l = f - whole
        r = 1 - l
        ind = whole % orientations
        gh = num_samples if num_samples > 0 else math.ceil(h / ph)
        gw = num_samples if num_samples > 0 else math.ceil(w / pw)
        t = -theta if clockwise else theta
        cs, sn = math.cos(t), math.sin(t)
        for c in range(x.shape[1]):
            field, o = divmod(c, orientations)
            i0 = (o - ind) % orientations
            i1 = (i0 + 1) % orientations
            p0, p1 = planes[field * orientations + i0], planes[field * orientations + i1]
            for i in range(ph):
                for j in range(pw):
                    acc = 0.0
                    for iy in range(gh):
                        yy = -h / 2 + i * h / ph + (iy + 0.5) * (h / ph) / gh
                        for ix in range(gw):
                            xx = -w / 2 + j * w / pw + (ix + 0.5) * (w / pw) / gw
                            y, xs = yy * cs - xx * sn + cy, yy * sn + xx * cs + cx
                            acc += r * _bilinear(p0, y, xs) + l * _bilinear(p1, y, xs)
                    out[k, c, i, j] = acc / max(gh * gw, 1)
    return out


def run(x, b, size=(2, 3), sr=2, orientations=4, clockwise=False, backend=None, seed=1):
    out, grad, _ = _run(lambda t, c: roiops.riroi_align_rotated(t, c, size, SCALE, sr, orientations, clockwise), x, b,
                        backend, seed)
    return out, grad


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("sr,orientations,clockwise", [(2, 4, False), (0, 4, True), (1, 2, True), (3, 8, False)])
def test_brute_force(backend, sr, orientations, clockwise):
    """float64 output against mmcv's per-sample definition; the gradient as its adjoint
    (the op is linear in the map): <out, g> = <x, grad>."""
    x, b = feature(), boxes()
    out, grad = run(x, b, (2, 3), sr, orientations, clockwise, backend)
    expected = brute_force(x, b, 2, 3, SCALE, sr, orientations, clockwise)
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=F64)
    torch.testing.assert_close((grad * x).sum(), (expected * g).sum(), rtol=1e-12, atol=1e-12)


# mmcv's tests/test_ops/test_riroi_align_rotated.py: one 8-channel map, two boxes, 2 x 2
# bins, 2 x 2 samples, 8 orientations, counter-clockwise; atol 1e-3 as there.
MMCV_INPUT = [[[[1, 2], [3, 4]], [[1, 2], [4, 3]], [[4, 3], [2, 1]], [[1, 2], [5, 6]], [[3, 4], [7, 8]],
               [[9, 10], [13, 14]], [[11, 12], [15, 16]], [[1, 1], [2, 2]]]]
MMCV_ROIS = [[0.0, 0.5, 0.5, 1.0, 1.0, math.pi / 3], [0.0, 1.0, 1.0, 3.0, 3.0, math.pi / 2]]
MMCV_OUTPUT = [[[[1.8425, 1.3516], [2.3151, 1.8241]], [[2.4779, 1.7416], [3.2173, 2.5632]],
                [[2.7149, 2.2638], [2.6540, 2.3673]], [[2.9461, 2.8638], [2.8028, 2.7205]],
                [[4.1943, 2.7214], [5.6119, 4.1391]], [[7.5276, 6.0547], [8.9453, 7.4724]],
                [[12.1943, 10.7214], [13.6119, 12.1391]], [[9.5489, 8.4237], [10.5763, 9.4511]]],
               [[[7.6562, 12.5625], [4.0000, 6.6250]], [[1.0000, 1.3125], [0.5000, 0.6562]],
                [[1.6562, 1.9375], [1.0000, 1.3125]], [[1.8438, 2.0547], [0.7500, 1.1562]],
                [[0.8438, 3.0625], [0.2500, 1.1875]], [[2.6562, 2.5625], [1.5000, 1.6250]],
                [[3.6562, 4.5625], [2.0000, 2.6250]], [[6.6562, 10.5625], [3.5000, 5.6250]]]]
MMCV_GRAD = [[[1.4727, 1.5586], [1.5586, 1.6602]]] * 8


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("channels_last", [False, True])
def test_mmcv_vectors(backend, dtype, channels_last):
    """The drop-in module on mmcv's test case: its published output and input gradient."""
    dev = device_for(backend)
    x = torch.tensor(MMCV_INPUT, dtype=dtype)
    x = x.contiguous(memory_format=torch.channels_last) if channels_last else x
    x = x.to(dev).requires_grad_()
    layer = mmcv.RiRoIAlignRotated((2, 2), 1.0, 2, 8, False)
    with roiops.use_backend(backend):
        out = layer(x, torch.tensor(MMCV_ROIS, dtype=dtype, device=dev))
        out.backward(torch.ones_like(out))
    torch.testing.assert_close(out.cpu(), torch.tensor(MMCV_OUTPUT, dtype=dtype), rtol=0, atol=1e-3)
    torch.testing.assert_close(x.grad.cpu(), torch.tensor([MMCV_GRAD], dtype=dtype), rtol=0, atol=1e-3)
    # Box 1 (a quarter turn, samples on dyadic points) to the float32 rounding of its
    # weights, rather than mmcv's 4 printed decimals; and the brute force, to float64's.
    torch.testing.assert_close(out[1, 0].detach().cpu(), torch.tensor([[7.65625, 12.5625], [4.0, 6.625]],
                                                                      dtype=dtype), rtol=0, atol=1e-5)
    if dtype == F64:
        expected = brute_force(torch.tensor(MMCV_INPUT, dtype=F64), torch.tensor(MMCV_ROIS, dtype=F64), 2, 2, 1.0, 2, 8,
                                 False)
        torch.testing.assert_close(out.detach().cpu(), expected, rtol=1e-12, atol=1e-12)


# ----------------------------------------------------------------------------- properties


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("sr", [0, 2])
@pytest.mark.parametrize("clockwise", [False, True])
def test_one_orientation_is_roi_align_rotated_unaligned(backend, sr, clockwise):
    """num_orientations=1 leaves the channels as they are: roi_align_rotated without the
    half-cell offset and with sides of at least one cell, forward and backward."""
    x, b = feature(c=3), boxes()
    out, grad = run(x, b, (3, 2), sr, 1, clockwise, backend)
    ref, ref_grad, _ = _run(lambda t, c: roiops.roi_align_rotated(t, c, (3, 2), SCALE, sr, False, clockwise,
                                                                  "radians"), x, b, backend)
    torch.testing.assert_close(out, ref, **tol(F64))
    torch.testing.assert_close(grad, ref_grad, **tol(F64))


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_turn_of_one_orientation_step_shifts_the_fields(backend):
    """Two boxes whose angles differ by exactly 2 pi / O (here pi / 2, O = 4) but that
    sample the same points (a square box turned a quarter turn, with 1 x 1 bins, samples
    the same 2 x 2 points in another order: their mean is the same): the output's
    orientations shift by one."""
    dev = device_for(backend)
    x = feature(c=8).to(dev)
    b = torch.tensor([[0, 10.0, 8.0, 6.0, 6.0, 0.25], [0, 10.0, 8.0, 6.0, 6.0, 0.25 + math.pi / 2]],
                     dtype=F64, device=dev)
    with roiops.use_backend(backend):
        out = roiops.riroi_align_rotated(x, b, 1, SCALE, 2, 4).cpu()
    turned = out[1].view(2, 4)
    torch.testing.assert_close(torch.roll(out[0].view(2, 4), 1, dims=1), turned, **tol(F64))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [F32, F64])
def test_any_finite_angle_picks_a_bin(backend, dtype):
    """Huge angles (the orientation factor f = angle * O / 2 pi beyond float64's range
    saturates) give finite results equal to the definition's, on every backend."""
    dev = device_for(backend)
    x = feature(c=6, dtype=dtype).to(dev)
    big = 3e38 if dtype == F32 else 1.7e308
    angles = [1e30, -1e30, big, -big, 2.5e7, -7.0]
    b = torch.tensor([[k % N, 10.0, 8.0, 5.0, 4.0, a] for k, a in enumerate(angles)], dtype=dtype, device=dev)
    with roiops.use_backend(backend):
        out = roiops.riroi_align_rotated(x, b, 2, SCALE, 2, 3, True).cpu()
    assert torch.isfinite(out).all()
    expected = brute_force(x.cpu(), b.cpu(), 2, 2, SCALE, 2, 3, True)
    torch.testing.assert_close(out.double(), expected, **tol(dtype))


@pytest.mark.parametrize("backend", ["cpu", "triton"])
def test_cost_follows_the_map_not_the_box(backend):
    """A box of 10^4 x 10^4 cells with adaptive sampling (about 10^8 samples, nearly all off
    the 9 x 11 map) costs what its samples near the map cost, forward and backward, and
    agrees with the reference, which visits only those too."""
    x = feature(c=8)
    b = torch.tensor([[0, 10.0, 8.0, 2e4, 2e4, 0.3], [1, 10.0, 8.0, 4.0, 6.0, -1.0]], dtype=F64)
    start = time.perf_counter()
    out, grad = run(x, b, (7, 7), 0, 8, True, backend)
    assert time.perf_counter() - start < 60
    expected = run(x, b, (7, 7), 0, 8, True, "reference")
    torch.testing.assert_close(out, expected[0], **tol(F64))
    torch.testing.assert_close(grad, expected[1], **tol(F64))


@pytest.mark.parametrize("dtype", [F16, F32])
def test_backends_agree(dtype):
    """The C++ and Triton kernels against the reference, NCHW and channels_last (the
    orientation weights are the same bits everywhere; sums differ in order only)."""
    x, b = feature(c=16, dtype=dtype, seed=4), boxes(seed=4, count=9)
    expected = run(x, b, (3, 3), 0, 8, True, "reference")
    for backend in ("cpu", "triton"):
        for cl in (False, True):
            xs = x.contiguous(memory_format=torch.channels_last) if cl else x
            out, grad = run(xs, b, (3, 3), 0, 8, True, backend)
            assert out.is_contiguous(memory_format=torch.channels_last) == cl
            close(out, expected[0], dtype)
            close(grad, expected[1], dtype)


# ----------------------------------------------------------------------------- checks and drop-ins


def test_channels_must_be_fields_of_the_orientations():
    x, b = feature(c=6), boxes()
    with pytest.raises(ValueError, match=r"input has 6 channels, not a multiple of num_orientations = 4"):
        roiops.riroi_align_rotated(x, b, 2, SCALE, num_orientations=4)
    for bad in (0, -1, 2**16 + 1, 2.5, True):
        with pytest.raises(ValueError, match=r"num_orientations must be an int in \[1, 65536\]"):
            roiops.riroi_align_rotated(x, b, 2, SCALE, num_orientations=bad)
    with pytest.raises(ValueError, match=r"num_orientations must be an int"):
        roiops.RiRoIAlignRotated(2, SCALE, num_orientations=0)
    with pytest.raises(ValueError, match=r"channels \(6\) must be a multiple of num_orientations \(4\)"):
        torch.ops.roiops.riroi_align_rotated(x, b, SCALE, 2, 2, 2, 4, False)


def test_mmcv_signatures_and_attributes():
    """mmcv's names, order and defaults; the module keeps out_size as given (MMRotate reads
    it), casts the others as mmcv does, and refuses what mmcv refuses."""
    params = inspect.signature(mmcv.riroi_align_rotated).parameters
    assert [(p.name, p.default) for p in params.values()] == [
        ("features", inspect.Parameter.empty), ("rois", inspect.Parameter.empty), ("out_size", inspect.Parameter.empty),
        ("spatial_scale", inspect.Parameter.empty), ("num_samples", 0), ("num_orientations", 8), ("clockwise", False)]
    init = list(inspect.signature(mmcv.RiRoIAlignRotated).parameters.values())
    assert [(p.name, p.default) for p in init] == [
        ("out_size", inspect.Parameter.empty), ("spatial_scale", inspect.Parameter.empty), ("num_samples", 0),
        ("num_orientations", 8), ("clockwise", False)]
    layer = mmcv.RiRoIAlignRotated(7, 1 / 4, 2.0, 8.0, True)
    assert layer.out_size == 7 and isinstance(layer.out_size, int)
    assert (layer.spatial_scale, layer.num_samples, layer.num_orientations, layer.clockwise) == (0.25, 2, 8, True)
    assert mmcv.RiRoIAlignRotated((7, 5), 1).out_size == (7, 5)
    with pytest.raises(TypeError, match="out_size"):
        mmcv.RiRoIAlignRotated([7, 7], 1 / 4)
    x, b = feature(c=8), boxes()
    with pytest.raises(TypeError, match="out_size"):
        mmcv.riroi_align_rotated(x, b, [2, 2], SCALE)
    out = mmcv.riroi_align_rotated(x, b, (2, 3), SCALE, 2, 4, True)
    torch.testing.assert_close(out, roiops.riroi_align_rotated(x, b, (2, 3), SCALE, 2, 4, True), rtol=0, atol=0)
