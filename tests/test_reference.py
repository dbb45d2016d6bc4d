"""Tests of roiops.reference, the pure-PyTorch oracle of the whole suite.

Three independent sources of truth: hand-computed values (derived in the comments from
the definitions in docs/semantics.md), torchvision's kernels, and torch.autograd applied to the forward
functions. The peers' published vectors are in test_conformance.py.
"""

import ctypes
import ctypes.util

import pytest
import torch

from boxes import nasty_coordinates
from cases import F64, tol
from roiops import reference as ref
from roiops._geometry import align_axis, round_half_away

try:
    import torchvision
except ImportError:  # pragma: no cover - torchvision is a test dependency
    torchvision = None

needs_torchvision = pytest.mark.skipif(torchvision is None, reason="torchvision not installed")


def t(values, dtype=F64):
    return torch.tensor(values, dtype=dtype)


def map2x2(dtype=F64):
    # [[1, 2],
    #  [3, 4]]
    return t([[[[1.0, 2.0], [3.0, 4.0]]]], dtype)


def map3x4(dtype=F64):
    # value(y, x) = 4*y + x:
    # [[0, 1,  2,  3],
    #  [4, 5,  6,  7],
    #  [8, 9, 10, 11]]
    return torch.arange(12, dtype=dtype).reshape(1, 1, 3, 4)


def grad_plane(rows):
    return t([[rows]])


# The explicit backward functions, called with the geometry of a forward call.
def align_backward(x, rois, g, scale, ph, pw, sr, aligned):
    n, c, h, w = x.shape
    return ref.roi_align_backward(g, rois, scale, ph, pw, n, c, h, w, sr, aligned, False)


def align_max_backward(x, rois, g, argmax, scale, ph, pw, sr, aligned):
    n, c, h, w = x.shape
    return ref.roi_align_max_backward(g, argmax, rois, scale, ph, pw, n, c, h, w, sr, aligned, False)


def pool_backward(x, rois, g, argmax):
    n, c, h, w = x.shape
    return ref.roi_pool_backward(g, argmax, rois, n, c, h, w, False)


# ======================================================================================
# Hand-computed cases
# ======================================================================================

# (map, box, scale, aligned, sampling_ratio, (ph, pw), expected out, expected d(sum out)/dx)
ALIGN_AVG_CASES = {
    # Box [0,1]^2, one sample at its centre (0.5, 0.5): the mean of the four pixels.
    "centre": (map2x2, [0, 0, 0, 1, 1], 1.0, False, 1, (1, 1),
               [[2.5]], [[0.25, 0.25], [0.25, 0.25]]),
    # aligned: x_start = -0.5, roi 2, bin 1, samples at -0.5 + j + 0.5 = j: the pixels.
    "aligned-identity": (map2x2, [0, 0, 0, 2, 2], 1.0, True, 1, (2, 2),
                         [[1, 2], [3, 4]], [[1, 1], [1, 1]]),
    # y = -0.5 lies in (-1, 0): clamped to row 0; x = 0.5 -> (1 + 2) / 2.
    "border-clamp-above": (map2x2, [0, 0, -1, 1, 0], 1.0, False, 1, (1, 1),
                           [[1.5]], [[0.5, 0.5], [0, 0]]),
    # y = -2.5 < -1: the point is 0.
    "border-far-above": (map2x2, [0, 0, -3, 1, -2], 1.0, False, 1, (1, 1),
                         [[0.0]], [[0, 0], [0, 0]]),
    # y = 1.5 in (H-1, H]: snapped to the last row; x = 0.5 -> (3 + 4) / 2.
    "border-last-row": (map2x2, [0, 0, 1, 1, 2], 1.0, False, 1, (1, 1),
                        [[3.5]], [[0, 0], [0.5, 0.5]]),
    # y = 2.7 > H = 2: the point is 0.
    "border-below": (map2x2, [0, 0, 2.2, 1, 3.2], 1.0, False, 1, (1, 1),
                     [[0.0]], [[0, 0], [0, 0]]),
    # Partly outside, 1x2, sampling 1: roi_w = 4, bin_w = 2, x samples 3 and 5, y sample 2.
    # (2, 3) snaps to pixel (2, 3) = 11; x = 5 > W = 4 is 0.
    "partly-outside-sr1": (map3x4, [0, 2, 1, 6, 3], 1.0, False, 1, (1, 2),
                           [[11.0, 0.0]],
                           [[0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 1]]),
    # Same box, sampling 2: bin 0 samples y in {1.5, 2.5}, x in {2.5, 3.5}:
    #   (1.5, 2.5) = (6+7+10+11)/4 = 8.5      (1.5, 3.5) -> x snaps to 3: (7+11)/2 = 9
    #   (2.5, 2.5) -> row 2: (10+11)/2 = 10.5 (2.5, 3.5) -> 11
    # mean 39/4 = 9.75; bin 1 has x in {4.5, 5.5} > W: 0.
    # Gradient (weights / 4): (1,2) 1/16; (1,3) 1/16+1/8; (2,2) 1/16+1/8; (2,3) 1/16+1/8+1/8+1/4.
    "partly-outside-sr2": (map3x4, [0, 2, 1, 6, 3], 1.0, False, 2, (1, 2),
                           [[9.75, 0.0]],
                           [[0, 0, 0, 0], [0, 0, 1 / 16, 3 / 16], [0, 0, 3 / 16, 9 / 16]]),
    # Inverted box, aligned, adaptive: grid = ceil(-2/2) = -1 <= 0: no samples, 0, no grad.
    "inverted-aligned-adaptive": (map3x4, [0, 3, 2, 1, 0], 1.0, True, 0, (2, 2),
                                  [[0, 0], [0, 0]], [[0] * 4] * 3),
    # Inverted in y only: grid_h = ceil(-2/2) = -1, grid_w = ceil(2/2) = 1: still no samples.
    "half-inverted-aligned-adaptive": (map3x4, [0, 1, 2, 3, 0], 1.0, True, 0, (2, 2),
                                       [[0, 0], [0, 0]], [[0] * 4] * 3),
    # Zero-size box, aligned, adaptive: grid = ceil(0) = 0: no samples.
    "empty-aligned-adaptive": (map3x4, [0, 1, 1, 1, 1], 1.0, True, 0, (1, 1),
                               [[0.0]], [[0] * 4] * 3),
    # Zero-size box, aligned, sampling 2: all samples at (0.5, 0.5) -> 4*0.5 + 0.5.
    "empty-aligned-sr2": (map3x4, [0, 1, 1, 1, 1], 1.0, True, 2, (1, 1),
                          [[2.5]], [[0.25, 0.25, 0, 0], [0.25, 0.25, 0, 0], [0, 0, 0, 0]]),
    # Zero-size box, not aligned: roi forced to 1, grid ceil(1/1) = 1, sample (1.5, 1.5).
    "empty-unaligned-adaptive": (map3x4, [0, 1, 1, 1, 1], 1.0, False, 0, (1, 1),
                                 [[7.5]], [[0, 0, 0, 0], [0, 0.25, 0.25, 0], [0, 0.25, 0.25, 0]]),
    # aligned: [1, 3] -> start 0.5, roi 2, sample at 1.5 -> 4*1.5 + 1.5.
    "aligned-shift": (map3x4, [0, 1, 1, 3, 3], 1.0, True, 1, (1, 1),
                      [[7.5]], [[0, 0, 0, 0], [0, 0.25, 0.25, 0], [0, 0.25, 0.25, 0]]),
    # Not aligned: start 1, roi 2, sample at 2 -> snapped to row 2, x = 2: 10.
    "unaligned-shift": (map3x4, [0, 1, 1, 3, 3], 1.0, False, 1, (1, 1),
                        [[10.0]], [[0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 1, 0]]),
    # Scale first, then shift: 2*0.5 - 0.5 = 0.5, 6*0.5 - 0.5 = 2.5 -> sample 1.5: 7.5.
    # (Shift first would give (2-0.5)*0.5 = 0.75 .. 2.75, sample 1.75: 8.75.)
    "scale-then-shift": (map3x4, [0, 2, 2, 6, 6], 0.5, True, 1, (1, 1),
                         [[7.5]], [[0, 0, 0, 0], [0, 0.25, 0.25, 0], [0, 0.25, 0.25, 0]]),
}


@pytest.mark.parametrize("name", list(ALIGN_AVG_CASES))
def test_align_avg_hand(name):
    make, box, scale, aligned, sr, (ph, pw), expected, expected_grad = ALIGN_AVG_CASES[name]
    x, rois = make(), t([box])
    out = ref.roi_align_forward(x, rois, scale, ph, pw, sr, aligned)
    torch.testing.assert_close(out, t([[expected]]), rtol=0, atol=1e-12)
    g = align_backward(x, rois, torch.ones_like(out), scale, ph, pw, sr, aligned)
    torch.testing.assert_close(g, grad_plane(expected_grad), rtol=0, atol=1e-12)


def test_align_max_hand():
    # Box [0,3]x[0,2] of map3x4, 1x1, sampling 2: x in {0.75, 2.25}, y in {0.5, 1.5};
    # value(y, x) = 4y + x inside: 2.75, 4.25, 6.75, 8.25 -> max 8.25 at sample 3.
    x, rois = map3x4(), t([[0, 0, 0, 3, 2]])
    out, argmax = ref.roi_align_max_forward(x, rois, 1.0, 1, 1, 2, False)
    assert out.item() == 8.25 and argmax.item() == 3 and argmax.dtype == torch.int32
    # Winner (1.5, 2.25): ly = 0.5, lx = 0.25; no division by the sample count.
    g = align_max_backward(x, rois, torch.ones_like(out), argmax, 1.0, 1, 1, 2, False)
    torch.testing.assert_close(g, grad_plane([[0, 0, 0, 0], [0, 0, 0.375, 0.125], [0, 0, 0.375, 0.125]]))
    # The avg of the same samples: 22 / 4.
    assert ref.roi_align_forward(x, rois, 1.0, 1, 1, 2, False).item() == 5.5


def test_align_max_outside_points_count_as_zero():
    # Negative map, box x in [1, 3], y in [0, 1], sampling 2: x in {1.5, 2.5}, y in {.25, .75}.
    # x = 1.5 snaps to column 1: -2.5 and -3.5; x = 2.5 > W is 0. Samples row-major:
    # [-2.5, 0, -3.5, 0] -> max 0, first at 1; an outside winner gets no gradient.
    x, rois = -map2x2(), t([[0, 1, 0, 3, 1]])
    out, argmax = ref.roi_align_max_forward(x, rois, 1.0, 1, 1, 2, False)
    assert out.item() == 0.0 and argmax.item() == 1
    g = align_max_backward(x, rois, torch.ones_like(out), argmax, 1.0, 1, 1, 2, False)
    assert torch.equal(g, torch.zeros_like(x))
    # A bin with no sample point at all (aligned, adaptive, zero size): 0 and argmax -1.
    out, argmax = ref.roi_align_max_forward(map3x4(), t([[0, 1, 1, 1, 1]]), 1.0, 2, 2, 0, True)
    assert torch.equal(out, torch.zeros(1, 1, 2, 2, dtype=F64))
    assert torch.equal(argmax, torch.full((1, 1, 2, 2), -1, dtype=torch.int32))
    g = align_max_backward(map3x4(), t([[0, 1, 1, 1, 1]]), torch.ones_like(out), argmax, 1.0, 2, 2, 0, True)
    assert torch.equal(g, torch.zeros(1, 1, 3, 4, dtype=F64))
    # Inverted in y only (grid_h = -1, grid_w = 1): no sample points either.
    out, argmax = ref.roi_align_max_forward(map3x4(), t([[0, 1, 2, 3, 0]]), 1.0, 2, 2, 0, True)
    assert not out.any() and (argmax == -1).all()


def test_align_max_ties_and_nan():
    # Constant map: every sample ties, the first one wins; its 4 neighbours share the grad.
    x, rois = torch.ones(1, 1, 3, 4, dtype=F64), t([[0, 0, 0, 2, 2]])
    out, argmax = ref.roi_align_max_forward(x, rois, 1.0, 1, 1, 2, False)
    assert out.item() == 1.0 and argmax.item() == 0
    g = align_max_backward(x, rois, torch.ones_like(out), argmax, 1.0, 1, 1, 2, False)
    torch.testing.assert_close(g, grad_plane([[0.25, 0.25, 0, 0], [0.25, 0.25, 0, 0], [0, 0, 0, 0]]))
    # NaN at (1, 3): samples 1 (0.5, 2.25) and 3 (1.5, 2.25) touch it; the first NaN wins.
    x, rois = map3x4(), t([[0, 0, 0, 3, 2]])
    x[0, 0, 1, 3] = float("nan")
    out, argmax = ref.roi_align_max_forward(x, rois, 1.0, 1, 1, 2, False)
    assert torch.isnan(out).all() and argmax.item() == 1
    g = align_max_backward(x, rois, torch.ones_like(out), argmax, 1.0, 1, 1, 2, False)
    # Winner (0.5, 2.25): ly = 0.5, lx = 0.25.
    torch.testing.assert_close(g, grad_plane([[0, 0, 0.375, 0.125], [0, 0, 0.375, 0.125], [0, 0, 0, 0]]))


# (box, scale, continuous, (ph, pw), expected out, expected argmax) on map3x4.
POOL_CASES = {
    # round: x 0.4 -> 0, y 0.5 -> 1 (half away from zero), x 2.5 -> 3, y 1.49 -> 1.
    # roi 4 x 1, bins of 2 columns in row 1: max(4, 5) = 5, max(6, 7) = 7.
    "caffe-rounding": ([0, 0.4, 0.5, 2.5, 1.49], 1.0, False, (1, 2), [[5, 7]], [[5, 7]]),
    # x2 = 0.5 rounds to 1 (torch.round would give 0): columns [0, 2) of row 0.
    "caffe-half-up": ([0, 0, 0, 0.5, 0], 1.0, False, (1, 1), [[1]], [[1]]),
    # x1 = -0.5 rounds to -1 (torch.round: -0): roi_w 2, bin 0 = [-1, 0) clips empty.
    "caffe-half-down": ([0, -0.5, 0, 0.4, 0], 1.0, False, (1, 2), [[0, 0]], [[-1, 0]]),
    # Partly outside: columns [2, 4) and [4, 6) -> the second clips to [4, 4): empty.
    "caffe-empty-bin": ([0, 2, 0, 5, 0], 1.0, False, (1, 2), [[3, 0]], [[3, -1]]),
    # Entirely outside: every bin empty.
    "caffe-outside": ([0, 10, 10, 12, 12], 1.0, False, (2, 2), [[0, 0], [0, 0]], [[-1, -1], [-1, -1]]),
    # Inverted box is forced to 1x1 at (x1r, y1r) = (3, 2): pixel 11.
    "caffe-inverted": ([0, 3, 2, 1, 0], 1.0, False, (1, 1), [[11]], [[11]]),
    # Bins of a 4x3 box (rows [0, 2) and [1, 3), columns [0, 2) and [2, 4)) overlap.
    "caffe-overlap": ([0, 0, 0, 3, 2], 1.0, False, (2, 2), [[5, 7], [9, 11]], [[5, 7], [9, 11]]),
    # scale 0.5: 1*0.5 = 0.5 -> 1, 5*0.5 = 2.5 -> 3; rows 0 -> 0, 2*0.5 -> 1.
    "caffe-scale": ([0, 1, 0, 5, 2], 0.5, False, (1, 1), [[7]], [[7]]),
    # Continuous: box [0, 1.2)^2 -> bin [floor 0, ceil 1.2) = rows/cols 0..1: max 5.
    "continuous-subpixel": ([0, 0, 0, 0.2, 0.2], 1.0, True, (1, 1), [[5]], [[5]]),
    "caffe-subpixel": ([0, 0, 0, 0.2, 0.2], 1.0, False, (1, 1), [[0]], [[0]]),
    # Continuous, 1x2: x from 0.5 to 2.5, bins [0, 2) and [1, 3); y [0, 2): 5 and 6.
    "continuous-bins": ([0, 0.5, 0, 1.5, 1], 1.0, True, (1, 2), [[5, 6]], [[5, 6]]),
    # Continuous, width (0.5 + 1) - 2 < 0: the whole box is 0 (Caffe would give pixel 6).
    "continuous-inverted": ([0, 2, 0, 0.5, 1], 1.0, True, (1, 2), [[0, 0]], [[-1, -1]]),
    "caffe-inverted-2": ([0, 2, 0, 0.5, 1], 1.0, False, (1, 1), [[6]], [[6]]),
    # Continuous, width exactly 0.
    "continuous-zero-width": ([0, 1, 0, 0, 1], 1.0, True, (1, 1), [[0]], [[-1]]),
}


@pytest.mark.parametrize("name", list(POOL_CASES))
def test_pool_hand(name):
    box, scale, continuous, (ph, pw), expected, expected_argmax = POOL_CASES[name]
    x, rois = map3x4(), t([box])
    out, argmax = ref.roi_pool_forward(x, rois, scale, ph, pw, continuous)
    assert torch.equal(out, t([[expected]]))
    assert torch.equal(argmax, torch.tensor([[expected_argmax]], dtype=torch.int32))
    # The gradient of sum(out) counts how often each element is a bin's argmax.
    expected_grad = torch.zeros(12, dtype=F64)
    for a in torch.tensor(expected_argmax).flatten().tolist():
        if a >= 0:
            expected_grad[a] += 1
    g = pool_backward(x, rois, torch.ones_like(out), argmax)
    assert torch.equal(g, expected_grad.view(1, 1, 3, 4))


@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_round_half_away_is_c_round(dtype):
    # Oracle: the C library's round()/roundf(), bit for bit (NaN, infinities, the sign of
    # zero, halves, 0.49999997, values beyond the last fraction).
    libm = ctypes.CDLL(ctypes.util.find_library("m"))
    c_round = libm.round if dtype == F64 else libm.roundf
    ctype = ctypes.c_double if dtype == F64 else ctypes.c_float
    c_round.restype, c_round.argtypes = ctype, [ctype]
    v = nasty_coordinates(dtype)
    expected = torch.tensor([c_round(x) for x in v.tolist()], dtype=dtype)
    got = round_half_away(v)
    bits = torch.int64 if dtype == F64 else torch.int32
    nan = torch.isnan(expected)
    assert torch.equal(torch.isnan(got), nan)
    assert torch.equal(got[~nan].view(bits), expected[~nan].view(bits))


# RoIAlign's box-to-grid rule, by hand (semantics.md "roi_align avg"): box side (lo, hi),
# scale, pooled, sampling_ratio, aligned -> start, size, bin, grid, stretched.
ALIGN_AXIS_CASES = {
    # 10 cells in 2 bins of 5; adaptive grid ceil(5) = 5
    "plain": ((0.0, 10.0, 1.0, 2, 0, False), (0.0, 10.0, 5.0, 5, False)),
    # scaled by 1/2, shifted by -0.5: from 0.5 - 0.5 = 0 to 2.25 - 0.5 = 1.75; bins of 0.4375
    "aligned": ((1.0, 4.5, 0.5, 4, 0, True), (0.0, 1.75, 0.4375, 1, False)),
    # a quarter cell, widened to 1 cell without aligned: bins of 1/2, grid ceil(0.5) = 1
    "stretched": ((3.0, 3.25, 1.0, 2, -1, False), (3.0, 1.0, 0.5, 1, True)),
    # aligned keeps the reversed size -2: bins of -1, grid ceil(-1) = -1, no samples
    "reversed": ((4.0, 2.0, 1.0, 2, 0, True), (3.5, -2.0, -1.0, -1, False)),
    # a fixed ratio whatever the size; 0.75 cells stretched to 1 in 4 bins of 1/4
    "fixed": ((0.25, 1.0, 1.0, 4, 3, False), (0.25, 1.0, 0.25, 3, True)),
}


@pytest.mark.parametrize("dtype", [torch.float32, F64])
@pytest.mark.parametrize("name", ALIGN_AXIS_CASES)
def test_align_axis_hand(name, dtype):
    (lo, hi, scale, pooled, ratio, aligned), expected = ALIGN_AXIS_CASES[name]
    start, size, bin_size, grid, stretched = align_axis(t([lo], dtype), t([hi], dtype), scale, pooled, ratio, aligned)
    assert (start.item(), size.item(), bin_size.item(), int(grid), bool(stretched)) == expected
    assert start.dtype == size.dtype == bin_size.dtype == dtype


def test_pool_ties_nan_inf():
    # Constant map, Caffe box 4x3 in 2x2 bins (rows [0,2), [1,3); cols [0,2), [2,4)):
    # each bin's first element wins.
    x = torch.ones(1, 1, 3, 4, dtype=F64)
    for continuous in (False, True):
        _, argmax = ref.roi_pool_forward(x, t([[0, 0, 0, 3, 2]]), 1.0, 2, 2, continuous)
        assert argmax.flatten().tolist() == [0, 2, 4, 6]
    # NaN propagates and the first NaN (row-major) wins.
    x = map3x4()
    x[0, 0, 1, 1] = float("nan")
    x[0, 0, 0, 3] = float("nan")
    out, argmax = ref.roi_pool_forward(x, t([[0, 0, 0, 3, 2]]), 1.0, 1, 1, False)
    assert torch.isnan(out).all() and argmax.item() == 3
    # All -inf: the max starts at the first element.
    x = torch.full((1, 1, 3, 4), float("-inf"), dtype=F64)
    out, argmax = ref.roi_pool_forward(x, t([[0, 1, 1, 3, 2]]), 1.0, 1, 1, False)
    assert out.item() == float("-inf") and argmax.item() == 5


def test_pool_backward_accumulates():
    # A zero-size box: all 4 bins pick pixel (0, 0); their grads add up.
    x, rois = map3x4(), t([[0, 0, 0, 0, 0]])
    out, argmax = ref.roi_pool_forward(x, rois, 1.0, 2, 2, False)
    assert argmax.flatten().tolist() == [0, 0, 0, 0]
    g = pool_backward(x, rois, t([[[[1, 2], [3, 4]]]]), argmax)
    assert g[0, 0, 0, 0].item() == 10 and g.sum().item() == 10


# ======================================================================================
# Against torchvision
# ======================================================================================

NASTY_BOXES = [
    [0, 1.3, 2.2, 7.9, 8.1],  # ordinary
    [1, -3.0, -2.0, 4.0, 5.0],  # negative coordinates, partly outside
    [0, 5.0, 5.0, 30.0, 25.0],  # larger than the map
    [1, 2.5, 2.5, 2.5, 2.5],  # zero size
    [0, 3.4, 1.2, 3.6, 1.7],  # sub-pixel
    [1, -20.0, -20.0, -5.0, -5.0],  # entirely outside (above left)
    [0, 23.0, 1.0, 29.0, 3.0],  # entirely outside (right)
    [0, 0.5, 1.5, 10.5, 9.5],  # half-integer corners: rounding ties in roi_pool
    [1, -1.0, -3.0, 5.0, 7.0],  # negative half-integers at scale 0.5
    [0, -60.0, -40.0, 80.0, 60.0],  # covers far more than the map
    [1, 8.0, 6.0, 3.0, 2.0],  # inverted
]


def _inverted(box):
    return box[3] < box[1] or box[4] < box[2]


@needs_torchvision
@pytest.mark.parametrize("aligned", [False, True])
@pytest.mark.parametrize("sampling_ratio", [-1, 0, 1, 2, 3])
@pytest.mark.parametrize("output_size", [(1, 1), (2, 3), (7, 7), (4, 1)])
def test_align_vs_torchvision(aligned, sampling_ratio, output_size):
    boxes = NASTY_BOXES
    if aligned and sampling_ratio <= 0:
        # torchvision mishandles a negative adaptive grid (roi < 0 with aligned=True).
        boxes = [b for b in boxes if not _inverted(b)]
    ph, pw = output_size
    gen = torch.Generator().manual_seed(1)
    for dtype, scales in ((torch.float32, (1.0, 0.5)), (F64, (0.5,))):
        x = torch.randn(2, 3, 10, 12, generator=gen, dtype=dtype)
        rois = t(boxes, dtype)
        for scale in scales:
            xg = x.clone().requires_grad_()
            expected = torchvision.ops.roi_align(xg, rois, output_size, scale, sampling_ratio, aligned)
            out = ref.roi_align_forward(x, rois, scale, ph, pw, sampling_ratio, aligned)
            torch.testing.assert_close(out, expected.detach(), **tol(dtype))
            g = torch.randn(expected.shape, generator=gen, dtype=dtype)
            (expected_grad,) = torch.autograd.grad(expected, xg, g)
            grad = align_backward(x, rois, g, scale, ph, pw, sampling_ratio, aligned)
            torch.testing.assert_close(grad, expected_grad, **tol(dtype))


@needs_torchvision
@pytest.mark.parametrize("dtype", [torch.float32, F64])
@pytest.mark.parametrize("output_size", [(1, 1), (2, 3), (7, 7), (3, 2)])
def test_pool_vs_torchvision_bit_exact(dtype, output_size):
    ph, pw = output_size
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(2, 3, 10, 12, generator=gen, dtype=dtype)
    rois = t(NASTY_BOXES, dtype)
    for scale in (1.0, 0.5, 0.25, 1 / 3):
        expected, expected_argmax = torch.ops.torchvision.roi_pool(x, rois, scale, ph, pw)
        out, argmax = ref.roi_pool_forward(x, rois, scale, ph, pw, False)
        assert torch.equal(out, expected)
        assert torch.equal(argmax, expected_argmax)
        xg = x.clone().requires_grad_()
        g = torch.randn(expected.shape, generator=gen, dtype=dtype)
        (expected_grad,) = torch.autograd.grad(torchvision.ops.roi_pool(xg, rois, output_size, scale), xg, g)
        assert torch.equal(pool_backward(x, rois, g, argmax), expected_grad)


# ======================================================================================
# Explicit backward == torch.autograd of the forward
# ======================================================================================


def _autograd(forward, x, g):
    xg = x.clone().requires_grad_()
    out = forward(xg)
    out = out[0] if isinstance(out, tuple) else out
    (grad,) = torch.autograd.grad(out, xg, g)
    return grad


@pytest.mark.parametrize("aligned", [False, True])
@pytest.mark.parametrize("sampling_ratio", [0, 2])
def test_backward_matches_autograd(aligned, sampling_ratio):
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(2, 3, 9, 11, generator=gen, dtype=F64)
    rois = t(NASTY_BOXES)  # inverted boxes included: the reference handles them
    n, c, h, w = x.shape
    for ph, pw in ((1, 1), (3, 2)):
        g = torch.randn(len(NASTY_BOXES), c, ph, pw, generator=gen, dtype=F64)
        for channels_last in (False, True):
            # avg
            expected = _autograd(lambda a: ref.roi_align_forward(a, rois, 0.5, ph, pw, sampling_ratio, aligned), x, g)
            got = ref.roi_align_backward(g, rois, 0.5, ph, pw, n, c, h, w, sampling_ratio, aligned, channels_last)
            torch.testing.assert_close(got, expected, **tol(F64))
            assert got.is_contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
            # max
            _, argmax = ref.roi_align_max_forward(x, rois, 0.5, ph, pw, sampling_ratio, aligned)
            expected = _autograd(lambda a: ref.roi_align_max_forward(a, rois, 0.5, ph, pw, sampling_ratio, aligned), x, g)
            got = ref.roi_align_max_backward(g, argmax, rois, 0.5, ph, pw, n, c, h, w, sampling_ratio, aligned,
                                             channels_last)
            torch.testing.assert_close(got, expected, **tol(F64))
        # pool, both conventions (exact: each gradient element is a sum of grads)
        for continuous in (False, True):
            _, argmax = ref.roi_pool_forward(x, rois, 0.5, ph, pw, continuous)
            expected = _autograd(lambda a: ref.roi_pool_forward(a, rois, 0.5, ph, pw, continuous), x, g)
            got = ref.roi_pool_backward(g, argmax, rois, n, c, h, w, False)
            torch.testing.assert_close(got, expected, **tol(F64))


# ======================================================================================
# Contract: validation, dtypes, layouts (gradcheck and K = 0 of every op on the reference:
# test_generic.py)
# ======================================================================================

FORWARDS = {
    "align": lambda x, r: ref.roi_align_forward(x, r, 1.0, 2, 2, 0, True),
    "align_max": lambda x, r: ref.roi_align_max_forward(x, r, 1.0, 2, 2, 0, True),
    "pool": lambda x, r: ref.roi_pool_forward(x, r, 1.0, 2, 2, False),
    "pool_continuous": lambda x, r: ref.roi_pool_forward(x, r, 1.0, 2, 2, True),
}


def _backwards(x, rois):
    n, c, h, w = x.shape
    k = rois.shape[0]
    g = torch.ones(k, c, 2, 2, dtype=x.dtype)
    am = torch.zeros(k, c, 2, 2, dtype=torch.int32)
    return {
        "align": lambda: ref.roi_align_backward(g, rois, 1.0, 2, 2, n, c, h, w, 0, True, False),
        "align_max": lambda: ref.roi_align_max_backward(g, am, rois, 1.0, 2, 2, n, c, h, w, 2, True, False),
        "pool": lambda: ref.roi_pool_backward(g, am, rois, n, c, h, w, False),
    }


@pytest.mark.parametrize("bad", [
    [0.5, 0, 0, 1, 1],  # not an integer
    [-1, 0, 0, 1, 1],  # negative
    [2, 0, 0, 1, 1],  # >= N
    [float("nan"), 0, 0, 1, 1],
    [0, 0, float("inf"), 1, 1],  # non-finite coordinate
    [0, 0, 0, float("nan"), 1],
])
def test_bad_rows_raise(bad):
    x = torch.randn(2, 2, 4, 5, dtype=F64)
    rois = t([[0, 0, 0, 1, 1], [1, 0, 0, 2, 2], bad])
    for fn in FORWARDS.values():
        with pytest.raises(ValueError, match="row 2"):
            fn(x, rois)
    for fn in _backwards(x, rois).values():
        with pytest.raises(ValueError, match="row 2"):
            fn()


def test_overflow_after_scale_raises():
    # 3e38 is a finite float32, 3e38 * 4 is not.
    x, rois = torch.randn(1, 1, 3, 4), t([[0, 0, 0, 3e38, 1]], torch.float32)
    calls = [
        lambda: ref.roi_align_forward(x, rois, 4.0, 2, 2, 0, True),
        lambda: ref.roi_align_max_forward(x, rois, 4.0, 2, 2, 2, False),
        lambda: ref.roi_pool_forward(x, rois, 4.0, 2, 2, False),
        lambda: ref.roi_pool_forward(x, rois, 4.0, 2, 2, True),
    ]
    for call in calls:
        with pytest.raises(ValueError, match="row 0"):
            call()


def test_huge_but_finite_boxes_do_not_crash():
    x = torch.randn(1, 2, 3, 4)
    rois = t([[0, -1e30, -1e30, 1e30, 1e30], [0, 1e30, 2.0, 3e30, 3.0]], torch.float32)
    for continuous in (False, True):
        out, argmax = ref.roi_pool_forward(x, rois, 1.0, 2, 2, continuous)
        assert torch.isfinite(out).all() and ((argmax >= -1) & (argmax < 12)).all()
    out = ref.roi_align_forward(x, rois, 1.0, 2, 2, 2, False)
    assert torch.isfinite(out).all()


def test_bad_argmax_raises():
    rois = t([[0, 0, 0, 2, 2]])
    g = torch.ones(1, 1, 1, 1, dtype=F64)
    with pytest.raises(ValueError, match="argmax"):
        ref.roi_pool_backward(g, torch.full((1, 1, 1, 1), 12, dtype=torch.int32), rois, 1, 1, 3, 4, False)
    with pytest.raises(ValueError, match="argmax"):
        ref.roi_align_max_backward(g, torch.full((1, 1, 1, 1), 4, dtype=torch.int32), rois, 1.0, 1, 1, 1, 1,
                                   3, 4, 2, False, False)


def test_empty_map_does_not_index():
    x = torch.randn(1, 2, 0, 4, dtype=F64)
    rois = t([[0, 0, 0, 3, 3]])
    assert not ref.roi_align_forward(x, rois, 1.0, 2, 2, 2, False).any()
    out, argmax = ref.roi_align_max_forward(x, rois, 1.0, 2, 2, 2, False)
    assert not out.any()
    out, argmax = ref.roi_pool_forward(x, rois, 1.0, 2, 2, False)
    assert not out.any() and (argmax == -1).all()
    g = torch.ones(1, 2, 2, 2, dtype=F64)
    assert ref.roi_align_backward(g, rois, 1.0, 2, 2, 1, 2, 0, 4, 2, False, False).shape == (1, 2, 0, 4)
    _, argmax = ref.roi_align_max_forward(x, rois, 1.0, 2, 2, 2, False)
    assert ref.roi_align_max_backward(g, argmax, rois, 1.0, 2, 2, 1, 2, 0, 4, 2, False, False).shape == (1, 2, 0, 4)
    assert ref.roi_pool_backward(g, torch.full((1, 2, 2, 2), -1), rois, 1, 2, 0, 4, False).shape == (1, 2, 0, 4)


def test_no_channels():
    x, rois = torch.randn(1, 0, 3, 4, dtype=F64), t([[0, 0, 0, 2, 2]])
    g = torch.zeros(1, 0, 2, 2, dtype=F64)
    assert ref.roi_align_forward(x, rois, 1.0, 2, 2, 0, False).shape == (1, 0, 2, 2)
    assert ref.roi_align_max_forward(x, rois, 1.0, 2, 2, 0, False)[1].shape == (1, 0, 2, 2)
    out, argmax = ref.roi_pool_forward(x, rois, 1.0, 2, 2, False)
    assert out.shape == argmax.shape == (1, 0, 2, 2)
    assert ref.roi_align_backward(g, rois, 1.0, 2, 2, 1, 0, 3, 4, 0, False, False).shape == x.shape
    assert ref.roi_align_max_backward(g, argmax, rois, 1.0, 2, 2, 1, 0, 3, 4, 0, False, False).shape == x.shape
    assert ref.roi_pool_backward(g, argmax, rois, 1, 0, 3, 4, False).shape == x.shape


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_types_compute_in_float32(dtype):
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(1, 3, 6, 7, generator=gen).to(dtype)
    rois = t([[0, 0.3, 0.6, 5.2, 4.9], [0, -1.0, 2.0, 3.5, 8.0]], torch.float32)
    x32 = x.float()
    out = ref.roi_align_forward(x, rois, 1.0, 2, 3, 0, False)
    assert out.dtype == dtype and torch.equal(out, ref.roi_align_forward(x32, rois, 1.0, 2, 3, 0, False).to(dtype))
    out, argmax = ref.roi_align_max_forward(x, rois, 1.0, 2, 3, 2, True)
    out32, argmax32 = ref.roi_align_max_forward(x32, rois, 1.0, 2, 3, 2, True)
    assert out.dtype == dtype and torch.equal(out, out32.to(dtype)) and torch.equal(argmax, argmax32)
    out, argmax = ref.roi_pool_forward(x, rois, 1.0, 2, 3, False)
    assert out.dtype == dtype and torch.equal(out.float(), ref.roi_pool_forward(x32, rois, 1.0, 2, 3, False)[0])
    g = torch.randn(2, 3, 2, 3, generator=gen).to(dtype)
    grad = ref.roi_align_backward(g, rois, 1.0, 2, 3, 1, 3, 6, 7, 0, False, False)
    expected = ref.roi_align_backward(g.float(), rois, 1.0, 2, 3, 1, 3, 6, 7, 0, False, False)
    assert grad.dtype == dtype and torch.equal(grad, expected.to(dtype))


def test_channels_last():
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(2, 3, 6, 7, generator=gen, dtype=F64)
    xcl = x.contiguous(memory_format=torch.channels_last)
    rois = t([[0, 0.3, 0.6, 5.2, 4.9], [1, -1.0, 2.0, 3.5, 8.0]])
    cl = torch.channels_last
    out, out_cl = ref.roi_align_forward(x, rois, 1.0, 2, 3, 2, True), ref.roi_align_forward(xcl, rois, 1.0, 2, 3, 2, True)
    assert out_cl.is_contiguous(memory_format=cl) and out.is_contiguous() and torch.equal(out, out_cl)
    for fn in (lambda a: ref.roi_align_max_forward(a, rois, 1.0, 2, 3, 2, True),
               lambda a: ref.roi_pool_forward(a, rois, 1.0, 2, 3, False)):
        (o, a), (o_cl, a_cl) = fn(x), fn(xcl)
        assert o_cl.is_contiguous(memory_format=cl) and a_cl.is_contiguous(memory_format=cl)
        assert torch.equal(o, o_cl) and torch.equal(a, a_cl)
    g = torch.randn(2, 3, 2, 3, generator=gen, dtype=F64).contiguous(memory_format=cl)
    grad = ref.roi_align_backward(g, rois, 1.0, 2, 3, 2, 3, 6, 7, 2, True, True)
    assert grad.is_contiguous(memory_format=cl)
    assert torch.equal(grad, ref.roi_align_backward(g.contiguous(), rois, 1.0, 2, 3, 2, 3, 6, 7, 2, True, False))


def test_rois_dtype_is_opmath():
    # float64 boxes with a float32 input are used in float32, like float32 boxes.
    x = torch.randn(1, 2, 5, 6)
    rois64 = t([[0, 0.1, 0.2, 4.3, 3.9]])
    for fn in (lambda r: ref.roi_align_forward(x, r, 1.0, 2, 2, 0, False),
               lambda r: ref.roi_pool_forward(x, r, 1.0, 2, 2, True)[0]):
        assert torch.equal(fn(rois64), fn(rois64.float()))
