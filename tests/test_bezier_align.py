"""Bezier alignment: mmcv's published values, a brute-force model written per sample from
the definition in float64 and in mmcv's float32 arithmetic (the kernels must equal the
latter bit for bit), the degenerate boxes (horizontal and vertical curves, empty grids,
boxes off the map), gradcheck of the input, the ordering of the control points, and the
mmcv drop-ins. What every op must do (dtypes, layouts, compile, export, Module,
validation, threads) is in test_generic.py."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import roiops
from cases import F32, F64, device_for, tol
from cases import boxes_for as _boxes_for
from cases import feature as _feature
from roiops._boxes import BEZIER
from roiops.compat import mmcv

# The option sets the generic tests (tests/cases.py) run the operator with.
OPTIONS = {"bezier_align": (dict(sampling_ratio=1, aligned=True), dict(sampling_ratio=0, aligned=False))}

N, C, H, W = 2, 3, 9, 11
SCALE = 0.5  # boxes in pixels of a 22 x 18 image
BACKENDS = ["reference", "cpu", "triton"]


def feature(dtype=F64, channels_last=False, seed=0, c=C):
    return _feature(dtype, channels_last, seed, shape=(N, c, H, W))


def beziers(dtype=F64, seed=0, count=6, nasty=True):
    """``count`` random text-line beziers, and with ``nasty`` the nasty ones of its box format."""
    return _boxes_for(BEZIER, dtype, seed, count, N, W / SCALE, H / SCALE, nasty)


def run(x, b, size=(3, 4), scale=SCALE, sr=1, aligned=True, backend=None, seed=1):
    """Output and input gradient for a fixed random upstream gradient, on ``backend``."""
    dev = device_for(backend)
    xg = x.detach().to(dev, copy=True).requires_grad_()
    with roiops.use_backend(backend):
        out = roiops.bezier_align(xg, b.to(dev), size, scale, sr, aligned)
        g = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=F64)
        out.backward(g.to(dev, out.dtype))
    return out.detach().cpu(), xg.grad.cpu(), g


# ----------------------------------------------------------------------------- the definition


def _bernstein(p, u, t):
    """The curve through control points p (4 values of type t) at u: mmcv's arithmetic, the
    first three terms in float64 and the last in t, summed in float64, rounded to t."""
    ud = np.float64(u)
    om = np.float64(1.0) - ud
    a = om * om * om * np.float64(p[0])
    b = np.float64(3.0) * ud * om * om * np.float64(p[1])
    c = np.float64(3.0) * ud * ud * om * np.float64(p[2])
    d = np.float64(u * u * u * p[3])
    return t(a + b + c + d)


def _bernstein_plain(p, u, t):
    """The same curve, every operation in t (what mmcv does not do)."""
    om = t(1) - u
    return om * om * om * p[0] + t(3) * u * om * om * p[1] + t(3) * u * u * om * p[2] + u * u * u * p[3]


def _taps(y, x, h, w, t):
    """mmcv's bilinear sampler at (y, x) in t: [(row, column, weight)] in the order w1..w4,
    none outside [-1, h] x [-1, w]."""
    if y < -1 or y > h or x < -1 or x > w:
        return []
    y, x = (t(0) if y <= 0 else y), (t(0) if x <= 0 else x)
    y0, x0 = int(y), int(x)
    if y0 >= h - 1:
        y0 = y1 = h - 1
        y = t(y0)
    else:
        y1 = y0 + 1
    if x0 >= w - 1:
        x0 = x1 = w - 1
        x = t(x0)
    else:
        x1 = x0 + 1
    ly, lx = y - t(y0), x - t(x0)
    hy, hx = t(1) - ly, t(1) - lx
    return [(y0, x0, hy * hx), (y0, x1, hy * lx), (y1, x0, ly * hx), (y1, x1, ly * lx)]


def _samples(row, scale, ph, pw, sr, aligned, h, w, t, curve=_bernstein):
    """Per bin (i, j): its sample points' taps and the count, from one box row (type t), in
    mmcv's order of operations: (taps of each sample iy-outer, ix-inner, count)."""
    p = [t(v) * t(scale) for v in row[1:]]
    top = [(p[2 * n], p[2 * n + 1]) for n in range(4)]
    bottom = [(p[14 - 2 * n], p[15 - 2 * n]) for n in range(4)]  # stored right to left
    roi_w = max(abs(top[0][0] - top[3][0]), abs(bottom[0][0] - bottom[3][0]))
    roi_h = max(abs(top[0][1] - top[3][1]), abs(bottom[0][1] - bottom[3][1]))
    if not aligned:
        roi_w, roi_h = max(roi_w, t(1)), max(roi_h, t(1))
    bin_h, bin_w = roi_h / t(ph), roi_w / t(pw)
    gh = sr if sr > 0 else math.ceil(bin_h)
    gw = sr if sr > 0 else math.ceil(bin_w)
    count = max(gh * gw, 1)
    offset = 0.5 if aligned else 0.0
    bins = {}
    for i in range(ph):
        for j in range(pw):
            u, v = t(j) / t(pw), t(i) / t(ph)
            centre = []
            for a in range(2):
                pt = curve([q[a] for q in top], u, t)
                pb = curve([q[a] for q in bottom], u, t)
                centre.append(t(np.float64(pb * v) + np.float64(pt) * (1.0 - np.float64(v)) - offset))
            xc, yc = centre
            taps = []
            for iy in range(gh):
                y = (yc - t(0.5) * bin_h) + ((t(iy) + t(0.5)) * bin_h) / t(gh)
                for ix in range(gw):
                    x = (xc - t(0.5) * bin_w) + ((t(ix) + t(0.5)) * bin_w) / t(gw)
                    taps.append(_taps(y, x, h, w, t))
            bins[i, j] = taps, count
    return bins


def brute_force(x, rois, size, scale, sr, aligned, t=np.float64, curve=_bernstein):
    """The definition, sample by sample in t: out[k, c, i, j] = (sum over the bin's samples
    of w1 v1 + w2 v2 + w3 v3 + w4 v4, in order) / count."""
    ph, pw = size
    n, c, h, w = x.shape
    xs = x.numpy().astype(t)
    out = np.zeros((rois.shape[0], c, ph, pw), dtype=t)
    for k, row in enumerate(rois.numpy().astype(t)):
        b = int(row[0])
        for (i, j), (samples, count) in _samples(row, scale, ph, pw, sr, aligned, h, w, t, curve).items():
            for ch in range(c):
                acc = t(0)
                for taps in samples:
                    val = t(0)
                    for r, s, wt in taps:
                        val = val + wt * xs[b, ch, r, s]
                    acc = acc + val
                out[k, ch, i, j] = acc / t(count)
    return torch.from_numpy(out)


def brute_force_grad(grad, rois, size, scale, sr, aligned, shape):
    """The input gradient by the definition, in float64: each sample adds (grad * w) / count
    to its taps."""
    ph, pw = size
    n, c, h, w = shape
    gi = np.zeros(shape)
    g = grad.double().numpy()
    for k, row in enumerate(rois.double().numpy()):
        b = int(row[0])
        for (i, j), (samples, count) in _samples(row, scale, ph, pw, sr, aligned, h, w, np.float64).items():
            for taps in samples:
                for r, s, wt in taps:
                    gi[b, :, r, s] += g[k, :, i, j] * wt / count
    return torch.from_numpy(gi)


# ----------------------------------------------------------------------------- mmcv's values

MMCV_INPUT = torch.tensor([[1.0, 2, 5, 6], [3, 4, 7, 8], [9, 10, 13, 14], [11, 12, 15, 16]])[None, None]
MMCV_BEZIERS = torch.tensor([[0.0, 0, 0, 1, 0, 2, 0, 3, 0, 3, 3, 2, 3, 1, 3, 0, 3]])
MMCV_OUTPUT = torch.tensor([[1, 1.75, 3.5, 5.25], [2.5, 3.25, 5, 6.75], [6, 6.75, 8.5, 10.25],
                            [9.5, 10.25, 12, 13.75]])[None, None]
MMCV_GRAD = torch.tensor([[1.5625, 1.5625, 1.5625, 0.3125]] * 3 + [[0.3125, 0.3125, 0.3125, 0.0625]])[None, None]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [F32, F64, torch.float16, torch.bfloat16])
def test_mmcv_published_values(backend, dtype):
    """mmcv's unit test (aligned=False, sampling_ratio=1, 4 x 4 bins): output and input
    gradient, exactly (every value is exact in each dtype)."""
    dev = device_for(backend)
    x = MMCV_INPUT.to(dev, dtype, copy=True).requires_grad_()
    with roiops.use_backend(backend):
        out = roiops.bezier_align(x, MMCV_BEZIERS.to(dev, dtype), (4, 4), 1.0, 1, False)
        out.backward(torch.ones_like(out))
    assert torch.equal(out.cpu().double(), MMCV_OUTPUT.double())
    assert torch.equal(x.grad.cpu().double(), MMCV_GRAD.double())


# ----------------------------------------------------------------------------- the definition


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("sr, aligned", [(1, True), (2, True), (0, True), (0, False), (3, False)])
def test_brute_force_float64(backend, sr, aligned):
    """Forward and input gradient against the per-sample definition in float64, over the
    random and the nasty beziers (horizontal, vertical, a point, off the map, ...)."""
    x, b = feature(), beziers()
    out, gx, g = run(x, b, (3, 4), SCALE, sr, aligned, backend)
    torch.testing.assert_close(out, brute_force(x, b, (3, 4), SCALE, sr, aligned), **tol(F64))
    torch.testing.assert_close(gx, brute_force_grad(g, b, (3, 4), SCALE, sr, aligned, x.shape), **tol(F64))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("sr, aligned", [(1, True), (2, False), (0, True)])
def test_float32_is_mmcv_arithmetic_bit_for_bit(backend, sr, aligned):
    """In float32 the kernels place every sample and sum it as mmcv's CPU kernel does (the
    Bernstein terms partly in float64): equal to the float32 model, bit for bit (the
    reference places the samples alike but sums a bin's samples in torch's order). The
    same model with the curves evaluated in float32 alone differs (so this test would see
    it)."""
    x, b = feature(F32), beziers(F32, count=12)
    out, _, _ = run(x, b, (3, 8), SCALE, sr, aligned, backend)
    want = brute_force(x, b, (3, 8), SCALE, sr, aligned, np.float32)
    if backend == "reference":
        torch.testing.assert_close(out, want, **tol(F32))
    else:
        assert torch.equal(out, want)
    if backend == "cpu":
        plain = brute_force(x, b, (3, 8), SCALE, sr, aligned, np.float32, _bernstein_plain)
        assert not torch.equal(out, plain)


def test_horizontal_curves_have_bins_of_height_zero():
    """A horizontal text line: both curves' end points at one height, so the bins (sized
    from those spans) have height 0. With aligned=True and one sample per bin the bins
    sample the curves' points themselves; adaptive sampling has no sample row (zeros)."""
    x = feature()
    line = torch.tensor([[0.0, 2, 4, 6, 4, 10, 4, 14, 4, 14, 10, 10, 10, 6, 10, 2, 10]])  # y 4 (top), 10 (bottom)
    out = roiops.bezier_align(x, line, (3, 4), SCALE, 1, True)
    # Bin (i, j): x = 1 + 1.5 j (the curves), y = 2 + i (a third of the way each row), minus half a cell.
    for i in range(3):
        for j in range(4):
            yc, xc = 2.0 + i - 0.5, 1.0 + 1.5 * j - 0.5
            y0, x0 = int(yc), int(xc)
            ly, lx = yc - y0, xc - x0
            v = ((1 - ly) * (1 - lx) * x[0, :, y0, x0] + (1 - ly) * lx * x[0, :, y0, x0 + 1]
                 + ly * (1 - lx) * x[0, :, y0 + 1, x0] + ly * lx * x[0, :, y0 + 1, x0 + 1])
            torch.testing.assert_close(out[0, :, i, j], v, **tol(F64))
    assert torch.equal(roiops.bezier_align(x, line, (3, 4), SCALE, 0, True), torch.zeros(1, C, 3, 4, dtype=F64))
    # aligned=False: bins at least one cell high, two samples per axis.
    torch.testing.assert_close(roiops.bezier_align(x, line, (3, 4), SCALE, 0, False),
                               brute_force(x, line, (3, 4), SCALE, 0, False), **tol(F64))


def test_vertical_curves_have_bins_of_width_zero():
    """A vertical line: bins of width 0; adaptive sampling has no sample column."""
    x = feature()
    line = torch.tensor([[0.0, 4, 2, 4, 6, 4, 10, 4, 14, 8, 14, 8, 10, 8, 6, 8, 2]])
    assert torch.equal(roiops.bezier_align(x, line, (3, 4), SCALE, 0, True), torch.zeros(1, C, 3, 4, dtype=F64))
    out = roiops.bezier_align(x, line, (3, 4), SCALE, 2, True)
    torch.testing.assert_close(out, brute_force(x, line, (3, 4), SCALE, 2, True), **tol(F64))
    assert out.abs().sum() > 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_beziers_off_the_map_give_zeros_and_no_gradient(backend):
    x = feature()
    off = beziers(count=3, nasty=False)
    off[:, 1:] += 1000.0
    out, gx, _ = run(x, off, (3, 4), SCALE, 2, True, backend)
    assert torch.equal(out, torch.zeros_like(out))
    assert torch.equal(gx, torch.zeros_like(gx))


def test_bin_rows_and_columns_follow_the_curves():
    """Row 0 lies on the top curve and column 0 at its first end point, whatever the bottom
    curve's order: the bottom curve is read right to left (its last point pairs with the
    top curve's first), so reversing its storage moves the bins."""
    x = feature()
    b = beziers(count=4, nasty=False)
    flipped = b.clone()
    flipped[:, 9:] = b[:, 9:].reshape(-1, 4, 2).flip(1).reshape(-1, 8)
    a, c = (roiops.bezier_align(x, t, (4, 5), SCALE, 1, False) for t in (b, flipped))
    torch.testing.assert_close(a[:, :, 0], c[:, :, 0], **tol(F64))  # row 0 is on the top curve either way
    assert not torch.allclose(a[:, :, 1:], c[:, :, 1:])


def test_gradcheck_of_the_input():
    """The input's gradient in float64; the control points get none (as in mmcv)."""
    x = feature(c=2).requires_grad_()
    b = beziers(count=3).requires_grad_()
    for sr, aligned in ((1, True), (0, False)):
        assert torch.autograd.gradcheck(lambda t: roiops.bezier_align(t, b.detach(), (2, 3), SCALE, sr, aligned),
                                        (x,))
    out = roiops.bezier_align(x, b, (2, 3), SCALE)
    assert not out.grad_fn.next_functions or b.grad is None
    out.sum().backward()
    assert b.grad is None


def test_list_of_beziers_per_image():
    x, b = feature(), beziers(count=4, nasty=False)
    rows = [b[b[:, 0] == i, 1:] for i in range(N)]
    ordered = torch.cat([b[b[:, 0] == i] for i in range(N)])
    assert torch.equal(roiops.bezier_align(x, rows, (3, 4), SCALE, 1),
                       roiops.bezier_align(x, ordered, (3, 4), SCALE, 1))


def test_errors_name_the_beziers():
    x = feature()
    with pytest.raises(ValueError, match=r"beziers must have shape \[K, 17\] \(rows \(batch_index, x0, y0"):
        roiops.bezier_align(x, torch.zeros(1, 5, dtype=F64), 2)
    with pytest.raises(ValueError, match=r"beziers\[0\] must have shape \[K, 16\]"):
        roiops.bezier_align(x, [torch.zeros(1, 17, dtype=F64), torch.zeros(0, 16, dtype=F64)], 2)
    bad = beziers(count=1, nasty=False)
    bad[0, 12] = float("nan")
    with pytest.raises(ValueError, match=r"beziers row 0 .*coordinates must be finite"):
        roiops.bezier_align(x, bad, 2)
    with pytest.raises(ValueError, match=r"roiops: rois row 0 has coordinate nan"):
        torch.ops.roiops.bezier_align(x, bad, 1.0, 2, 2, 1, True)


# ----------------------------------------------------------------------------- mmcv drop-ins


def test_mmcv_drop_ins():
    """mmcv's signatures: the module's spatial_scale and sampling_ratio have no defaults and
    are cast (MMOCR passes sampling_ratio=1.0); malformed beziers assert."""
    x, b = feature(), beziers(count=4)
    want = roiops.bezier_align(x, b, (3, 4), SCALE, 1, True)
    layer = mmcv.BezierAlign((3, 4), SCALE, 1.0)
    assert torch.equal(layer(x, b), want)
    assert torch.equal(mmcv.bezier_align(x, b, (3, 4), SCALE, 1), want)
    assert torch.equal(mmcv.BezierAlign(3, 1, 0, False)(x, b), roiops.bezier_align(x, b, 3, 1.0, 0, False))
    with pytest.raises(TypeError):
        mmcv.BezierAlign((3, 4))  # type: ignore[call-arg]
    with pytest.raises(AssertionError):
        mmcv.bezier_align(x, b[:, :16], 3)
