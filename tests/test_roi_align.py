"""RoIAlign (modes "avg" and "max") on the C++ kernels: every sampling ratio, alignment and
output size against the reference, torchvision bit for bit, hand-computed bins, the
kernels' work split and their checks. What every op must do is in test_generic.py, the
box gradient in test_box_grad.py, the Triton kernels in test_triton.py."""

from __future__ import annotations

import itertools

import pytest
import torch
import torchvision

import roiops
from cases import C, H, N, SCALE, W, backward_in_bands, beyond_int32_offsets, boxes_for, close, feature, run

# The option sets the generic tests (tests/cases.py) run the operator with.
OPTIONS = {"roi_align": (dict(sampling_ratio=2, aligned=True), dict(sampling_ratio=-1, aligned=False),
                        dict(sampling_ratio=2, aligned=False, mode="max"), dict(sampling_ratio=0, aligned=True, mode="max"))}


def align(size, sr, aligned, mode="avg"):
    return lambda x, b: roiops.roi_align(x, b, size, SCALE, sr, aligned, mode)


def ordinary_boxes(dtype):
    """torchvision crashes or differs on inverted boxes with aligned=True and adaptive sampling."""
    b = boxes_for(dtype=dtype)
    return b[(b[:, 3] >= b[:, 1]) & (b[:, 4] >= b[:, 2])]


@pytest.mark.parametrize("mode", ["avg", "max"])
@pytest.mark.parametrize("aligned", [False, True])
@pytest.mark.parametrize("sr", [-1, 0, 1, 2, 3])
@pytest.mark.parametrize("size", [1, (2, 3), (7, 7)])
def test_matches_reference(mode, aligned, sr, size):
    for dtype, channels_last in itertools.product([torch.float32, torch.float64], [False, True]):
        x, boxes = feature(dtype, channels_last, channels=5), boxes_for(dtype=dtype)
        out, grad, _ = run(align(size, sr, aligned, mode), x, boxes)
        ref_out, ref_grad, _ = run(align(size, sr, aligned, mode), x, boxes, "reference")
        close(out, ref_out, dtype)
        close(grad, ref_grad, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("aligned", [False, True])
@pytest.mark.parametrize("sr", [-1, 0, 2, 3])
@pytest.mark.parametrize("channels_last", [False, True])
def test_matches_torchvision(dtype, aligned, sr, channels_last):
    x, boxes = feature(dtype, channels_last, channels=5), ordinary_boxes(dtype)
    ours = run(align((3, 5), sr, aligned), x, boxes)
    theirs = run(lambda t, b: torchvision.ops.roi_align(t, b, (3, 5), SCALE, sr, aligned), x, boxes)
    assert torch.equal(ours[0], theirs[0]) and torch.equal(ours[1], theirs[1])  # same arithmetic, same order


@pytest.mark.parametrize("channels_last", [False, True])
def test_adaptive_backward_divisions_bit_exact_with_torchvision(channels_last):
    """Adaptive sampling divides every term by a count that is rarely a power of two; the
    C++ kernel replaces that division by an FMA sequence where it is exact. Sample counts
    from 1 to several hundred and gradients over the whole float32 range (subnormals, zeros,
    infinities and NaN included) must still give torchvision's bits."""
    g = torch.Generator().manual_seed(3)
    x = torch.zeros(1, 19, 80, 80, dtype=torch.float32)  # 19 channels: vector and tail lanes
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    lo = torch.rand(60, 2, generator=g) * 20
    size = torch.rand(60, 2, generator=g) * 59 + 0.5
    boxes = torch.cat([torch.zeros(60, 1), lo, lo + size], dim=1)
    grad = torch.randn(60, 19, 2, 3, generator=g) * torch.exp2(torch.randint(-150, 128, (60, 19, 2, 3), generator=g))
    grad[grad.abs() < 2.0**-149] = 0.0
    grad[5, :4] = float("inf")
    grad[7, 2] = float("nan")
    grads = []
    for fn in (roiops.roi_align, torchvision.ops.roi_align):
        xi = x.detach().requires_grad_()
        fn(xi, boxes, (2, 3), 1.0, 0, True).backward(grad)
        grads.append(xi.grad)
    subnormal = (grads[0] != 0) & (grads[0].abs() < 2.0**-126)
    assert grads[0].isinf().any() and grads[0].isnan().any() and subnormal.any()
    torch.testing.assert_close(grads[0], grads[1], rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("sr", [2, 0])
@pytest.mark.parametrize("channels_last", [False, True])
def test_non_finite_values_bit_exact_with_torchvision(sr, channels_last):
    """NaN, inf and -inf inside the map and on its last row and column, where a sample
    clamped to the border puts weight 0 on a tap (0 * inf is NaN in the per-sample formula):
    torchvision's bits (the reference: test_generic.py)."""
    x = feature(channels=5)
    x[0, 0, 3, 4], x[0, 1, H - 1, 5], x[1, 2, 6, W - 1] = float("inf"), float("inf"), float("-inf")
    x[0, 3, 2:5, 7:9], x[1, 4, 5, 2] = float("-inf"), float("nan")
    x = x.contiguous(memory_format=torch.channels_last) if channels_last else x
    boxes = boxes_for()
    out = roiops.roi_align(x, boxes, (3, 4), SCALE, sr, False)
    assert out.isnan().any() and out.isinf().any()
    torch.testing.assert_close(out, torchvision.ops.roi_align(x, boxes, (3, 4), SCALE, sr, False), rtol=0, atol=0,
                               equal_nan=True)


def test_inverted_box_aligned_adaptive_gives_zero():
    x = feature().requires_grad_()
    box = torch.tensor([[0, 10.0, 12.0, 4.0, 6.0]])
    for mode in ("avg", "max"):
        out = roiops.roi_align(x, box, 3, SCALE, 0, aligned=True, mode=mode)
        assert torch.equal(out, torch.zeros_like(out))
        out.sum().backward()
        assert torch.equal(x.grad, torch.zeros_like(x))


def test_hand_computed():
    # One 2x2 bin over a 3x3 ramp: sample (0.5, 0.5) of a bilinear ramp is its mean.
    x = torch.arange(9.0).reshape(1, 1, 3, 3)
    out = roiops.roi_align(x, torch.tensor([[0, 0.0, 0.0, 1.0, 1.0]]), 1, 1.0, 1, aligned=False)
    assert out.item() == pytest.approx(2.0)  # value at (y, x) = (0.5, 0.5): 3*0.5 + 0.5
    out = roiops.roi_align(x, torch.tensor([[0, 0.0, 0.0, 2.0, 2.0]]), 1, 1.0, 2, aligned=True, mode="max")
    # aligned: samples at -0.5+{0.5,1.5} -> (0,0),(0,1),(1,0),(1,1) -> max is 4.
    assert out.item() == pytest.approx(4.0)


@pytest.mark.parametrize("mode, sr", [("avg", 2), ("avg", 0), ("max", 2), ("max", 0)])
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_backward_split_into_bands_and_channel_blocks(mode, sr, channels_last, dtype):
    """A map large enough that backward splits it into several bands of rows and blocks of
    channels (one of 8 channels, not a multiple of 16), with tall boxes crossing bands; 2
    threads against 1 (other splits, the same sums) and against the reference."""
    backward_in_bands(align(7, sr, True, mode), dtype, channels_last)


def test_direct_op_call_rejects_bad_rows():
    x = feature(channels=C)
    for bad in ([2.0, 0, 0, 4, 4], [-1.0, 0, 0, 4, 4], [0.5, 0, 0, 4, 4], [0.0, float("nan"), 0, 4, 4],
                [0.0, 0, 0, float("inf"), 4]):
        rois = torch.tensor([bad])
        with pytest.raises(ValueError, match="row 0"):
            torch.ops.roiops.roi_align(x, rois, 1.0, 2, 2, 2, False)
        with pytest.raises(ValueError, match="row 0"):
            torch.ops.roiops.roi_align_max(x, rois, 1.0, 2, 2, 2, False)
        with pytest.raises(ValueError, match="row 0"):
            torch.ops.roiops._roi_align_backward(torch.ones(1, C, 2, 2), rois, 1.0, 2, 2, N, C, H, W, 2, False, False)


def test_more_than_2_31_elements():
    beyond_int32_offsets(lambda t, b: roiops.roi_align(t, b, 3, 1.0, 2, True))
    beyond_int32_offsets(lambda t, b: roiops.roi_align(t, b, 3, 1.0, 2, False, mode="max"))
