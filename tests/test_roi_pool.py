"""RoIPool (conventions "caffe" and "mmdet") on the C++ kernels: every output size against
the reference bit for bit, torchvision bit for bit, hand-computed conventions, the
kernels' work split and their checks. What every op must do is in test_generic.py, the
Triton kernels in test_triton.py."""

from __future__ import annotations

import itertools

import pytest
import torch
import torchvision

import roiops
from cases import C, H, N, SCALE, W, backward_in_bands, beyond_int32_offsets, boxes_for, feature, run

# The option sets the generic tests (tests/cases.py) run the operator with.
OPTIONS = {"roi_pool": (dict(), dict(convention="mmdet"))}


def pool(size, convention="caffe"):
    return lambda x, b: roiops.roi_pool(x, b, size, SCALE, convention)


@pytest.mark.parametrize("convention", ["caffe", "mmdet"])
@pytest.mark.parametrize("size", [1, (2, 3), (7, 7)])
def test_matches_reference_bit_for_bit(convention, size):
    for dtype, channels_last in itertools.product([torch.float32, torch.float64], [False, True]):
        x, boxes = feature(dtype, channels_last, channels=5), boxes_for(dtype=dtype)
        out, grad, _ = run(pool(size, convention), x, boxes)
        ref_out, ref_grad, _ = run(pool(size, convention), x, boxes, "reference")
        assert torch.equal(out, ref_out) and torch.equal(grad, ref_grad)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("size", [1, (2, 3), (7, 7)])
@pytest.mark.parametrize("channels_last", [False, True])
def test_bit_exact_with_torchvision(dtype, size, channels_last):
    x, boxes = feature(dtype, channels_last, channels=5), boxes_for(dtype=dtype)
    ours = run(pool(size), x, boxes)
    theirs = run(lambda t, b: torchvision.ops.roi_pool(t, b, size, SCALE), x, boxes)
    assert torch.equal(ours[0], theirs[0]) and torch.equal(ours[1], theirs[1])


def test_hand_computed_conventions():
    x = torch.arange(16.0).reshape(1, 1, 4, 4)
    box = torch.tensor([[0, 0.4, 0.4, 1.6, 1.6]])
    # Caffe: rounds to cells 0..2 (inclusive), one bin -> max of x[0:3, 0:3] = 10.
    assert roiops.roi_pool(x, box, 1).item() == 10.0
    # mmdet: [0.4, 2.6) -> floor/ceil to cells 0..2 as well -> 10; with scale 0.5: [0.2, 1.3) -> cells 0..1 -> 5.
    assert roiops.roi_pool(x, box, 1, convention="mmdet").item() == 10.0
    assert roiops.roi_pool(x, box, 1, 0.5, convention="mmdet").item() == 5.0
    # mmdet: a box whose width (x2 + 1 - x1) * s <= 0 gives 0.
    assert roiops.roi_pool(x, torch.tensor([[0, 3.0, 0.0, 1.0, 2.0]]), 1, convention="mmdet").item() == 0.0


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_backward_split_into_bands_and_channel_blocks(channels_last, dtype):
    """A map large enough that backward splits it into several bands of rows and blocks of
    channels (one of 8 channels, not a multiple of 16), with tall boxes crossing bands; 2
    threads against 1 (other splits, the same sums) and against the reference."""
    backward_in_bands(pool(7), dtype, channels_last)


def test_direct_op_call_rejects_bad_rows():
    x = feature(channels=C)
    for bad in ([2.0, 0, 0, 4, 4], [-1.0, 0, 0, 4, 4], [0.5, 0, 0, 4, 4], [0.0, float("nan"), 0, 4, 4],
                [0.0, 0, 0, float("inf"), 4]):
        with pytest.raises(ValueError, match="row 0"):
            torch.ops.roiops.roi_pool(x, torch.tensor([bad]), 1.0, 2, 2, False)
    with pytest.raises(ValueError, match="argmax"):
        torch.ops.roiops._roi_pool_backward(torch.ones(1, C, 2, 2), torch.full((1, C, 2, 2), H * W, dtype=torch.int32),
                                            torch.tensor([[0.0, 0, 0, 4, 4]]), N, C, H, W, False)


def test_more_than_2_31_elements():
    beyond_int32_offsets(lambda t, b: roiops.roi_pool(t, b, 3))
