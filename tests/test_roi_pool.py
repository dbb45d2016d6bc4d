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
from boxes import nasty_boxes, random_boxes
from cases import C, H, N, SCALE, W, boxes_for, close, feature, num_threads, run


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
    x = feature(dtype, channels_last, seed=3, shape=(2, 40, 180, 160))
    g = torch.Generator().manual_seed(4)
    boxes = torch.cat([random_boxes(2, 12, 320, 360, g), nasty_boxes(2, 320, 360),
                       torch.tensor([[0, 10.0, 2.0, 300.0, 355.0], [1, 40.0, 100.0, 60.0, 350.0]])])
    with num_threads(1):
        _, grad1, _ = run(pool(7), x, boxes)
    with num_threads(2):
        _, grad2, _ = run(pool(7), x, boxes)
    _, ref, _ = run(pool(7), x, boxes, "reference")
    assert torch.equal(grad1, grad2)
    assert grad2.is_contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
    close(grad2, ref, dtype)


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
    # Image 2 of a 3 x 1 x 32768 x 32768 float16 map starts at element 2^31: every offset the
    # box reads overflows int32. torch.empty: only the corner the box reads is ever touched.
    x = torch.empty(3, 1, 32768, 32768, dtype=torch.float16)
    corner = torch.randn(1, 1, 16, 16, generator=torch.Generator().manual_seed(0)).half()
    x[2:, :, :16, :16] = corner
    box = torch.tensor([[2, 1.5, 2.25, 9.0, 12.0]])
    crop_box = torch.tensor([[0, 1.5, 2.25, 9.0, 12.0]])
    assert torch.equal(roiops.roi_pool(x, box, 3), roiops.roi_pool(corner, crop_box, 3))
