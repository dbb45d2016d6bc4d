"""Rotated RoIAlign: its geometry against roi_align (angles 0, 90, 180) on every kernel set,
hand-computed samples, angle units and directions, the C++ kernels' channel paths and
checks, the Triton kernels' ordered backward, the drop-ins. What every op must do
(dtypes, layouts, gradcheck, compile, export, Module, validation, threads) is in
test_generic.py; the peers' published vectors run in test_conformance.py."""

from __future__ import annotations

import math

import pytest
import torch

import roiops
from cases import BF16, F16, F32, F64, close, device_for, tol
from cases import boxes_for as _boxes_for
from cases import feature as _feature
from cases import run as _run
from roiops._boxes import ROTATED

# The option sets the generic tests (tests/cases.py) run the operator with.
OPTIONS = {"roi_align_rotated": (dict(sampling_ratio=2),
                                dict(sampling_ratio=0, aligned=False, clockwise=True, angle="radians"))}

N, C, H, W = 2, 3, 9, 11
SCALE = 0.5  # boxes in pixels of a 22 x 18 image
BACKENDS = ["reference", "cpu", "triton"]


def feature(dtype=F64, channels_last=False, seed=0, c=C):
    return _feature(dtype, channels_last, seed, shape=(N, c, H, W))


def boxes(dtype=F64, seed=0, count=6):
    return _boxes_for(ROTATED, dtype, seed, count, N, W / SCALE, H / SCALE)


def run(x, b, size=(2, 3), sr=2, aligned=True, backend=None, seed=1):
    """Output and input gradient for a fixed random upstream gradient, on ``backend``'s
    kernels where they run (cases.device_for)."""
    out, grad, _ = _run(lambda t, c: roiops.roi_align_rotated(t, c, size, SCALE, sr, aligned), x, b, backend, seed)
    return out, grad


def axis_aligned(b):
    """[K, 5] (batch, x1, y1, x2, y2) of rotated boxes at angle 0."""
    i, cx, cy, w, h = b[:, :5].unbind(1)
    return torch.stack([i, cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], 1)


def upright(dtype=F64):
    """Boxes with sides of at least one cell, so that aligned=False's widening never acts."""
    b = boxes(dtype)
    keep = (b[:, 3] * SCALE >= 1) & (b[:, 4] * SCALE >= 1)
    return b[keep]


# ----------------------------------------------------------------------------- the definition


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("sr", [0, 1, 2])
@pytest.mark.parametrize("aligned", [True, False])
def test_angle_0_is_roi_align(backend, sr, aligned):
    """At angle 0 a box is roi_align's (cx - w/2, cy - h/2, cx + w/2, cy + h/2), forward and backward."""
    x = feature()
    b = upright() if not aligned else boxes()
    b[:, 5] = 0
    out, grad = run(x, b, (3, 4), sr, aligned, backend)
    dev = device_for(backend)
    xr = x.to(dev, copy=True).requires_grad_()
    with roiops.use_backend(backend):
        ref = roiops.roi_align(xr, axis_aligned(b).to(dev), (3, 4), SCALE, sr, aligned)
    ref.backward(torch.randn(ref.shape, generator=torch.Generator().manual_seed(1), dtype=F64).to(dev))
    torch.testing.assert_close(out, ref.detach().cpu(), **tol(F64))
    torch.testing.assert_close(grad, xr.grad.cpu(), **tol(F64))


@pytest.mark.parametrize("backend", BACKENDS)
def test_quarter_and_half_turns(backend):
    """A half turn flips the output in both axes; a quarter turn (counter-clockwise) of a
    square box is roi_align's output transposed with its columns reversed."""
    dev = device_for(backend)
    x, b = feature().to(dev), boxes().to(dev)
    b[:, 5] = 0
    square = b.clone()
    square[:, 4] = square[:, 3]
    with roiops.use_backend(backend):
        at0 = roiops.roi_align_rotated(x, b, (3, 4), SCALE, 2)
        sq0 = roiops.roi_align(x, axis_aligned(square), (3, 3), SCALE, 2, aligned=True)
        b[:, 5], square[:, 5] = 180, 90
        at180 = roiops.roi_align_rotated(x, b, (3, 4), SCALE, 2)
        sq90 = roiops.roi_align_rotated(x, square, (3, 3), SCALE, 2)
        square[:, 5] = -270
        sq_270 = roiops.roi_align_rotated(x, square, (3, 3), SCALE, 2)
    # cos and sin of 90 degrees are not exactly 0 and 1 in float64: within rounding.
    torch.testing.assert_close(at180, at0.flip(-2, -1), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(sq90, sq0.transpose(-2, -1).flip(-1), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(sq_270, sq90, rtol=1e-12, atol=1e-12)


def test_hand_computed():
    """One bin, one sample at the centre of a box turned by 90 degrees: the bilinear value there."""
    x = torch.arange(20.0, dtype=F64).reshape(1, 1, 4, 5)  # value 5y + x
    box = torch.tensor([[0, 2.25, 1.75, 3.0, 1.0, 90.0]], dtype=F64)
    out = roiops.roi_align_rotated(x, box, 1, 1.0, 1, aligned=False)
    assert out.item() == pytest.approx(5 * 1.75 + 2.25)
    # 2 x 1 bins along the box's height, which a quarter turn lays along the map's x axis
    # (y = cy - xx, x = cx + yy): bin 0 (the top edge before rotation) samples x = cx - 0.5.
    box = torch.tensor([[0, 2.0, 2.0, 1.0, 2.0, 90.0]], dtype=F64)
    out = roiops.roi_align_rotated(x, box, (2, 1), 1.0, 1, aligned=False)
    assert out.flatten().tolist() == pytest.approx([5 * 2 + 1.5, 5 * 2 + 2.5])


def test_units_and_direction():
    x, b = feature(), boxes()
    radians = b.clone()
    radians[:, 5] = b[:, 5] * math.pi / 180
    mirrored = b.clone()
    mirrored[:, 5] = -b[:, 5]
    deg = roiops.roi_align_rotated(x, b, 3, SCALE, 2)
    assert torch.equal(deg, roiops.roi_align_rotated(x, radians, 3, SCALE, 2, angle="radians"))
    assert torch.equal(deg, roiops.roi_align_rotated(x, mirrored, 3, SCALE, 2, clockwise=True))
    before = b.clone()  # float64 rows: their angles are converted on a copy, not in place
    roiops.roi_align_rotated(x, b, 3, SCALE, 2, clockwise=True)
    assert torch.equal(b, before)


@pytest.mark.parametrize("backend", BACKENDS)
def test_degenerate_boxes_give_zero(backend):
    """Zero and negative sizes with adaptive sampling: no samples, zeros and no gradient."""
    b = torch.tensor([[0, 8.0, 6.0, 0.0, 0.0, 30.0], [1, 8.0, 6.0, -4.0, 6.0, 0.0]], dtype=F64)
    out, grad = run(feature(), b, 3, 0, True, backend)
    assert torch.equal(out, torch.zeros_like(out)) and torch.equal(grad, torch.zeros_like(grad))


def test_huge_boxes_cost_what_they_cover():
    """A box 2^23 cells long with adaptive sampling: only samples near the map are visited
    (millions of samples per bin otherwise)."""
    x = feature()
    b = torch.tensor([[0, 10.0, 9.0, 2.0**24, 2.0**24, 33.0], [1, 2.0**23, 9.0, 2.0**24, 6.0, 0.5]], dtype=F64)
    for backend in ("reference", "cpu"):
        out, grad = run(x, b, 2, 0, True, backend)
        assert out.abs().sum() > 0 and grad.abs().sum() > 0


# ----------------------------------------------------------------------------- kernel sets


@pytest.mark.parametrize("c, dtype", [(1, F64), (8, F64), (19, F64), (32, F64), (70, F64), (19, F32), (19, F16),
                                      (19, BF16)])
@pytest.mark.parametrize("channels_last", [False, True])
def test_cpu_channel_counts(c, dtype, channels_last):
    # The CPU kernels sum 8, 16 or 32 channels in registers, more in a buffer sample by
    # sample, and the rest one by one: counts that reach each path (19: a vector of lanes
    # and a tail, in each dtype). One channels_last channel: its gradient is contiguous in
    # both layouts.
    x, b = feature(dtype, channels_last, c=c), boxes(F64)
    out, grad = run(x, b, (2, 3), 0, True, "cpu")
    ref_out, ref_grad = run(x, b, (2, 3), 0, True, "reference")
    close(out, ref_out, dtype)
    close(grad, ref_grad, dtype)


# ----------------------------------------------------------------------------- API


# The rotated rows' own messages (what every op refuses: test_generic.py).
@pytest.mark.parametrize("bad, match", [
    (torch.zeros(2, 5), r"boxes must have shape \[K, 6\] \(rows \(batch_index, cx, cy, w, h, angle\)\)"),
    ([torch.zeros(1, 4), torch.zeros(1, 5)], r"boxes\[0\] must have shape \[K, 5\] \(rows \(cx, cy, w, h, angle\)\)"),
    (torch.tensor([[0.0, 1, 1, 2, 2, 0], [0, 1, 1, 2, 2, float("inf")]]), "row 1 .*angle must be finite"),
    (torch.tensor([[0.0, 1, 1, 2**26, 2, 0]]), "2\\^24"),
    ("boxes", "Tensor\\[K, 6\\] or a list of Tensor\\[L, 5\\]"),
])
def test_bad_boxes(bad, match):
    with pytest.raises((ValueError, TypeError), match=match):
        roiops.roi_align_rotated(feature(), bad, 2)


@pytest.mark.parametrize("backend", BACKENDS)
def test_direct_op_call_rejects_bad_rows(backend):
    x = feature(F32)
    if backend == "triton":
        pytest.skip("the Triton kernels mask bad rows instead (no host sync); test_triton covers that")
    for bad in ([2.0, 0, 0, 4, 4, 0], [-1.0, 0, 0, 4, 4, 0], [0.0, float("nan"), 0, 4, 4, 0],
                [0.0, 0, 0, 4, 4, float("inf")]):
        rois = torch.tensor([bad])
        with roiops.use_backend(backend):
            with pytest.raises(ValueError, match="row 0"):
                torch.ops.roiops.roi_align_rotated(x, rois, 1.0, 2, 2, 2, False)
            with pytest.raises(ValueError, match="row 0"):
                torch.ops.roiops._roi_align_rotated_backward(torch.ones(1, C, 2, 2), rois, 1.0, 2, 2, N, C, H, W, 2,
                                                              False, False)
    with roiops.use_backend(backend), pytest.raises(ValueError, match=r"\[K, 6\]"):
        torch.ops.roiops.roi_align_rotated(x, torch.zeros(1, 5), 1.0, 2, 2, 2, False)


@pytest.mark.parametrize("channels_last", [False, True])
def test_triton_deterministic_backward(channels_last):
    """The ordered Triton backward gives the reference's gradient, the same bits on every run."""
    from roiops._requirements import triton_too_old

    if triton_too_old():
        pytest.skip(triton_too_old())
    import roiops.triton as rt

    b = boxes(F32, count=3)
    b[:, 5] = torch.deg2rad(b[:, 5])
    g = torch.randn(len(b), C, 2, 2, generator=torch.Generator().manual_seed(2))
    sizes = (SCALE, 2, 2, N, C, H, W, 0, True, channels_last)
    dev = device_for("triton")
    # Twice on a GPU, where programs run concurrently; the interpreter runs them in order.
    runs = [rt.roi_align_rotated_backward(g.to(dev), b.to(dev), *sizes, deterministic=True).cpu()
            for _ in range(2 if dev == "cuda" else 1)]
    ref = roiops.reference.roi_align_rotated_backward(g, b, *sizes)
    assert torch.equal(runs[0], runs[-1])
    torch.testing.assert_close(runs[0], ref, **tol(F32))


# ----------------------------------------------------------------------------- drop-ins


def test_detectron2_drop_in():
    from roiops.compat.detectron2 import ROIAlignRotated

    m = ROIAlignRotated((3, 4), SCALE, 0)
    assert repr(m) == "ROIAlignRotated(output_size=(3, 4), spatial_scale=0.5, sampling_ratio=0)"
    x, b = feature(F32), boxes(F32)
    assert torch.equal(m(x, b), roiops.roi_align_rotated(x, b, (3, 4), SCALE, 0, aligned=True))
    with pytest.raises(ValueError, match=r"Tensor\[K, 6\]"):
        m(x, b[:, :5])


def test_mmcv_drop_in():
    from roiops.compat.mmcv import RoIAlignRotated, roi_align_rotated

    m = RoIAlignRotated(3, SCALE, 2, aligned=False, clockwise=True)
    assert repr(m) == "RoIAlignRotated(output_size=(3, 3), spatial_scale=0.5, sampling_ratio=2, aligned=False, " \
                      "clockwise=True)"
    x, b = feature(F32), boxes(F32)
    b[:, 5] = torch.deg2rad(b[:, 5])
    expected = roiops.roi_align_rotated(x, b, 3, SCALE, 2, False, True, "radians")
    assert torch.equal(m(x, b), expected)
    assert torch.equal(roi_align_rotated(x, b, 3, SCALE, 2, False, True), expected)
    # Defaults: spatial_scale 1, adaptive sampling, aligned, counter-clockwise.
    assert torch.equal(roi_align_rotated(x, b, 2), roiops.roi_align_rotated(x, b, 2, 1.0, 0, angle="radians"))


# ----------------------------------------------------------------------------- on a GPU
# The compiled Triton kernels at realistic sizes (moved from tests/test_gpu.py; the helpers
# are tests/gpu_cases.py). Skipped without a CUDA GPU.

import gpu_cases as gpu  # noqa: E402


def gpu_rotated_rois(scale: float, H: int, W: int, seed: int) -> torch.Tensor:
    """[K, 6] (batch, cx, cy, w, h, degrees): gpu_cases.gpu_boxes' boxes (their awkward
    sizes and places), turned by quarter, half and whole turns (whose cosines and sines
    round near 0 and 1) and by other angles."""
    b = gpu.gpu_boxes(scale, H, W, 7, 7, seed, k_random=24).double()
    angles = torch.tensor([0.0, 90.0, 180.0, -90.0, 45.0, -30.5, 12.25, 270.0, 360.0, 135.0, -179.75])
    angle = angles[torch.arange(b.shape[0]) % len(angles)].double()
    return torch.stack([b[:, 0], (b[:, 1] + b[:, 3]) / 2, (b[:, 2] + b[:, 4]) / 2, b[:, 3] - b[:, 1],
                        b[:, 4] - b[:, 2], angle], dim=1)


@gpu.on_gpu
@pytest.mark.parametrize("cl", [False, True], ids=["nchw", "cl"])
@pytest.mark.parametrize("dtype", [gpu.F32, gpu.F64])
@pytest.mark.parametrize("sr,aligned", [(2, True), (0, False)])
def test_rotated_on_cuda_against_reference(sr, aligned, dtype, cl):
    """Rotated RoIAlign on C = 256 maps: forward, atomic and deterministic backward against
    the reference; the deterministic one repeats bit for bit."""
    from roiops import reference as REF

    rt = gpu.triton_kernels()
    N, C, cuda, close = gpu.N, gpu.C, gpu.cuda, gpu.close
    scale, H, W = gpu.LEVELS[1]
    x = gpu.feature_map(H, W, dtype, cl, seed=23)
    deg = gpu_rotated_rois(scale, H, W, seed=24).to(dtype)
    rad = torch.cat([deg[:, :5], torch.deg2rad(deg[:, 5:].double()).to(dtype)], dim=1)
    out = rt.roi_align_rotated_forward(cuda(x), cuda(rad), scale, 7, 7, sr, aligned)
    assert out.is_contiguous(memory_format=torch.channels_last if cl else torch.contiguous_format)
    close(out.cpu(), REF.roi_align_rotated_forward(x, rad, scale, 7, 7, sr, aligned), dtype)
    g = gpu.random_grad(out.shape, dtype, seed=25)
    ref_gi = REF.roi_align_rotated_backward(g, rad, scale, 7, 7, N, C, H, W, sr, aligned, cl)
    for gi in gpu.both_backwards(lambda d: rt.roi_align_rotated_backward(cuda(g), cuda(rad), scale, 7, 7, N, C, H,
                                                                         W, sr, aligned, cl, deterministic=d)):
        close(gi, ref_gi, dtype)
    # The public function in degrees, against the C++ kernels.
    fn = lambda t, b: roiops.roi_align_rotated(t, b, 7, scale, sr, aligned)  # noqa: E731
    cpu_out, cpu_gi = gpu.api_forward_backward(fn, x, deg, g)
    gpu_out, gpu_gi = gpu.api_forward_backward(fn, cuda(x), cuda(deg), g)
    close(gpu_out, cpu_out, dtype)
    close(gpu_gi, cpu_gi, dtype)


@gpu.on_gpu
def test_rotated_on_cuda_at_angle_zero_is_roi_align():
    """Angle 0 pools the axis-aligned box as roi_align(aligned=True) does. The two compute
    the sample positions in different orders, so in float64, where that rounding is far
    below the tolerance (coordinates up to 10^3 cells)."""
    cuda = gpu.cuda
    scale, H, W = gpu.LEVELS[0]
    x = cuda(gpu.feature_map(H, W, gpu.F64, True, seed=26))
    rois = gpu_rotated_rois(scale, H, W, seed=27)
    rois[:, 5] = 0
    rois = rois[(rois[:, 3] > 0) & (rois[:, 4] > 0)]  # roi_align pools inverted boxes as 1-cell ones
    axis = torch.stack([rois[:, 0], rois[:, 1] - rois[:, 3] / 2, rois[:, 2] - rois[:, 4] / 2,
                        rois[:, 1] + rois[:, 3] / 2, rois[:, 2] + rois[:, 4] / 2], dim=1)
    torch.testing.assert_close(roiops.roi_align_rotated(x, cuda(rois), 7, scale, 2).cpu(),
                               roiops.roi_align(x, cuda(axis), 7, scale, 2, True).cpu(), rtol=1e-10, atol=1e-10)
