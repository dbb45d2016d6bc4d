"""roiops.compat against the original projects' formulas, re-derived here as small loops.

Each oracle below is written from the original kernel's arithmetic (not from roiops), in
float64 unless the point is to reproduce the original's float32 bin arithmetic.
"""

import math

import numpy as np
import pytest
import torch

from roiops.compat import faster_rcnn_pytorch as frp
from roiops.compat import maskrcnn_benchmark as mrb
from roiops.compat import mmdet
from roiops.compat import simple_faster_rcnn as sfr
from cases import sample_taps, tol


# ----------------------------------------------------------------------------- oracles

def _apply_taps(x, rois, ph, pw, taps):
    """Forward and a backward function for an op that is linear in x.

    ``taps(roi_row, i, j)`` lists ``(y, x, weight)`` read by output bin ``(i, j)``.
    """
    x = x.double()
    k_, c_ = len(rois), x.shape[1]
    table = {(k, i, j): taps(r, i, j)
             for k, r in enumerate(rois.tolist()) for i in range(ph) for j in range(pw)}
    out = torch.zeros(k_, c_, ph, pw, dtype=torch.float64)
    batch = [int(r[0]) for r in rois.tolist()]
    for (k, i, j), tp in table.items():
        for yy, xx, w in tp:
            out[k, :, i, j] += w * x[batch[k], :, yy, xx]

    def backward(grad):
        g = torch.zeros_like(x)
        for (k, i, j), tp in table.items():
            for yy, xx, w in tp:
                g[batch[k], :, yy, xx] += w * grad[k, :, i, j].double()
        return g

    return out, backward


def legacy_roi_align(x, rois, ph, pw, scale, sampling_ratio):
    """maskrcnn-benchmark ROIAlign (aligned=False)."""
    h, w = x.shape[-2:]

    def taps(r, i, j):
        xs, ys = r[1] * scale, r[2] * scale
        rw = max(r[3] * scale - xs, 1.0)
        rh = max(r[4] * scale - ys, 1.0)
        bw, bh = rw / pw, rh / ph
        gw = sampling_ratio if sampling_ratio > 0 else math.ceil(rw / pw)
        gh = sampling_ratio if sampling_ratio > 0 else math.ceil(rh / ph)
        out = []
        for iy in range(gh):
            for ix in range(gw):
                yy = ys + i * bh + (iy + 0.5) * bh / gh
                xx = xs + j * bw + (ix + 0.5) * bw / gw
                out += [(a, b, wt / (gh * gw)) for a, b, wt in sample_taps(yy, xx, h, w)]
        return out

    return _apply_taps(x, rois, ph, pw, taps)


def corner_roi_align(x, rois, ph, pw, scale):
    """faster-rcnn.pytorch RoIAlign, from its CUDA kernel."""
    h, w = x.shape[-2:]

    def taps(r, i, j):
        xs, ys, xe, ye = (v * scale for v in r[1:])
        bw = max(xe - xs + 1, 0.0) / (pw - 1)
        bh = max(ye - ys + 1, 0.0) / (ph - 1)
        yy, xx = i * bh + ys, j * bw + xs
        if yy < 0 or yy >= h or xx < 0 or xx >= w:
            return []
        y0, x0 = min(math.floor(yy), h - 2), min(math.floor(xx), w - 2)
        ly, lx = yy - y0, xx - x0
        return [(y0, x0, (1 - ly) * (1 - lx)), (y0, x0 + 1, (1 - ly) * lx),
                (y0 + 1, x0, ly * (1 - lx)), (y0 + 1, x0 + 1, ly * lx)]

    return _apply_taps(x, rois, ph, pw, taps)


def _c_round(v):
    return math.floor(abs(v) + 0.5) * (1 if v >= 0 else -1)


def _caffe_geometry(r, ph, pw, scale):
    """Rounded box and float32 bin sizes, as the Caffe/chainer CUDA kernels compute them."""
    xs, ys, xe, ye = (_c_round(v * scale) for v in r[1:])
    bw = np.float32(max(xe - xs + 1, 1)) / np.float32(pw)
    bh = np.float32(max(ye - ys + 1, 1)) / np.float32(ph)
    return xs, ys, xe, ye, bw, bh


def caffe_roi_pool(x, rois, ph, pw, scale):
    """Fast R-CNN RoIPool forward: output and argmax (h * W + w, or -1)."""
    n_, c_, h, w = x.shape
    out = torch.zeros(len(rois), c_, ph, pw, dtype=x.dtype)
    arg = torch.full((len(rois), c_, ph, pw), -1, dtype=torch.long)
    for k, r in enumerate(rois.tolist()):
        xs, ys, _, _, bw, bh = _caffe_geometry(r, ph, pw, scale)
        for i in range(ph):
            h0 = min(max(math.floor(np.float32(i) * bh) + ys, 0), h)
            h1 = min(max(math.ceil(np.float32(i + 1) * bh) + ys, 0), h)
            for j in range(pw):
                w0 = min(max(math.floor(np.float32(j) * bw) + xs, 0), w)
                w1 = min(max(math.ceil(np.float32(j + 1) * bw) + xs, 0), w)
                for c in range(c_):
                    best, where = -math.inf, -1
                    for yy in range(h0, h1):
                        for xx in range(w0, w1):
                            v = x[int(r[0]), c, yy, xx].item()
                            if v > best:
                                best, where = v, yy * w + xx
                    if where >= 0:
                        out[k, c, i, j], arg[k, c, i, j] = best, where
    return out, arg


def caffe_roi_pool_backward(grad, arg, rois, shape, scale):
    """The original (Caffe, chainer, simple-faster-rcnn) backward, pixel by pixel.

    For each input pixel it finds the bins whose window may contain it and adds their
    gradient where the argmax is this pixel; pixels outside the rounded box are skipped.
    """
    n_, c_, h, w = shape
    _, _, ph, pw = grad.shape
    g = torch.zeros(shape, dtype=grad.dtype)
    for k, r in enumerate(rois.tolist()):
        xs, ys, xe, ye, bw, bh = _caffe_geometry(r, ph, pw, scale)
        for yy in range(max(ys, 0), min(ye + 1, h)):
            p0 = min(max(math.floor(np.float32(yy - ys) / bh), 0), ph)
            p1 = min(max(math.ceil(np.float32(yy - ys + 1) / bh), 0), ph)
            for xx in range(max(xs, 0), min(xe + 1, w)):
                q0 = min(max(math.floor(np.float32(xx - xs) / bw), 0), pw)
                q1 = min(max(math.ceil(np.float32(xx - xs + 1) / bw), 0), pw)
                for i in range(p0, p1):
                    for j in range(q0, q1):
                        hit = arg[k, :, i, j] == yy * w + xx
                        g[int(r[0]), hit, yy, xx] += grad[k, hit, i, j]
    return g


def mmdet_roi_pool(x, rois, ph, pw, scale):
    """mmdetection RoIPool: output and argmax (h * W + w, or -1)."""
    n_, c_, h, w = x.shape
    out = torch.zeros(len(rois), c_, ph, pw, dtype=torch.float64)
    arg = torch.full((len(rois), c_, ph, pw), -1, dtype=torch.long)
    for k, r in enumerate(rois.tolist()):
        x1, y1 = r[1] * scale, r[2] * scale
        rw, rh = (r[3] + 1) * scale - x1, (r[4] + 1) * scale - y1
        if rw <= 0 or rh <= 0:
            continue
        bw, bh = rw / pw, rh / ph
        for i in range(ph):
            h0 = min(max(math.floor(i * bh + y1), 0), h)
            h1 = min(max(math.ceil((i + 1) * bh + y1), 0), h)
            for j in range(pw):
                w0 = min(max(math.floor(j * bw + x1), 0), w)
                w1 = min(max(math.ceil((j + 1) * bw + x1), 0), w)
                for c in range(c_):
                    cells = [(x[int(r[0]), c, a, b].item(), a * w + b)
                             for a in range(h0, h1) for b in range(w0, w1)]
                    if cells:
                        best = max(v for v, _ in cells)
                        out[k, c, i, j] = best
                        arg[k, c, i, j] = next(p for v, p in cells if v == best)
    return out, arg


def argmax_backward(grad, arg, rois, shape):
    g = torch.zeros(shape, dtype=torch.float64)
    flat = g.view(shape[0], shape[1], -1)
    for k, r in enumerate(rois.tolist()):
        for c in range(shape[1]):
            for a, gv in zip(arg[k, c].flatten().tolist(), grad[k, c].flatten().tolist()):
                if a >= 0:
                    flat[int(r[0]), c, a] += gv
    return g


# ----------------------------------------------------------------------------- fixtures

def _features(*shape, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=dtype)


def _grad_of(fn, x, grad):
    x = x.detach().clone().requires_grad_(True)
    fn(x).backward(grad)
    return x.grad


# (batch, x1, y1, x2, y2) in image pixels for an 8x10 map at scale 1/4: inside, touching
# the borders, partly outside, tiny, inverted, and one on the second image.
ROIS = torch.tensor([
    [0, 3.7, 5.2, 29.4, 22.9],
    [1, 0.0, 0.0, 39.0, 31.0],
    [0, -6.3, 10.1, 12.8, 40.5],
    [1, 17.2, 9.6, 18.1, 10.4],
    [0, 30.5, 20.2, 11.4, 7.7],
    [1, 2.0, 2.5, 44.0, 35.0],
], dtype=torch.float64)


# ----------------------------------------------------------------------------- maskrcnn-benchmark

@pytest.mark.parametrize("sampling_ratio", [2, 0, -1])
def test_maskrcnn_roi_align_matches_legacy_formula(sampling_ratio):
    x = _features(2, 3, 8, 10)
    layer = mrb.ROIAlign((4, 5), 0.25, sampling_ratio)
    want, want_backward = legacy_roi_align(x, ROIS, 4, 5, 0.25, sampling_ratio)
    torch.testing.assert_close(layer(x, ROIS), want)
    grad = _features(len(ROIS), 3, 4, 5, seed=1)
    torch.testing.assert_close(_grad_of(lambda t: layer(t, ROIS), x, grad), want_backward(grad))
    torch.testing.assert_close(mrb.roi_align(x, ROIS, (4, 5), 0.25, sampling_ratio), want)


def test_maskrcnn_roi_align_half_runs_natively():
    x = _features(2, 3, 8, 10, dtype=torch.float16)
    layer = mrb.ROIAlign((4, 5), 0.25, 2)
    out = layer(x, ROIS.float())
    assert out.dtype == torch.float16
    want, _ = legacy_roi_align(x.double(), ROIS, 4, 5, 0.25, 2)
    torch.testing.assert_close(out.double(), want, **tol(torch.float16))
    xg = x.clone().requires_grad_(True)
    layer(xg, ROIS.half()).sum().backward()
    assert xg.grad.dtype == torch.float16 and torch.isfinite(xg.grad).all()


def test_maskrcnn_roi_pool_matches_caffe_formula():
    x = _features(2, 3, 8, 10)
    layer = mrb.ROIPool((3, 4), 0.25)
    want, arg = caffe_roi_pool(x, ROIS, 3, 4, 0.25)
    torch.testing.assert_close(layer(x, ROIS), want)
    grad = _features(len(ROIS), 3, 3, 4, seed=1)
    torch.testing.assert_close(_grad_of(lambda t: layer(t, ROIS), x, grad),
                               argmax_backward(grad, arg, ROIS, x.shape))
    torch.testing.assert_close(mrb.roi_pool(x, ROIS, (3, 4), 0.25), want)


def test_maskrcnn_reprs_are_the_originals():
    assert repr(mrb.ROIAlign((7, 7), 1 / 16, 2)) == \
        "ROIAlign(output_size=(7, 7), spatial_scale=0.0625, sampling_ratio=2)"
    assert repr(mrb.ROIPool((7, 7), 0.0625)) == "ROIPool(output_size=(7, 7), spatial_scale=0.0625)"


def test_maskrcnn_bad_arguments_raise():
    x = _features(2, 3, 8, 10)
    with pytest.raises((ValueError, TypeError)):
        mrb.ROIAlign((7, 0), 0.25, 2)(x, ROIS)
    with pytest.raises(ValueError):
        mrb.ROIPool((7, 7), 0.25)(x, torch.tensor([[2.0, 0, 0, 4, 4]], dtype=torch.float64))


# ----------------------------------------------------------------------------- faster-rcnn.pytorch

def test_faster_rcnn_roi_align_matches_cuda_kernel_formula():
    x = _features(2, 3, 8, 10)
    layer = frp.RoIAlign(4, 5, 0.25)
    want, want_backward = corner_roi_align(x, ROIS, 4, 5, 0.25)
    torch.testing.assert_close(layer(x, ROIS), want)
    grad = _features(len(ROIS), 3, 4, 5, seed=1)
    torch.testing.assert_close(_grad_of(lambda t: layer(t, ROIS), x, grad), want_backward(grad))


def test_faster_rcnn_roi_align_extrapolates_in_last_column():
    # corners at x = 0, 1.5, 3 (the last column of a 4-wide map): W-2 and W-1 blend with
    # weights -0.5 and 1.5 at x = 3; x = 4.5 would be outside (0)
    x = torch.arange(4, dtype=torch.float64).view(1, 1, 1, 4).expand(1, 1, 2, 4).contiguous() ** 2
    out = frp.RoIAlign(2, 3, 1.0)(x, torch.tensor([[0, 0.0, 0, 2.0, 0.0]], dtype=torch.float64))
    torch.testing.assert_close(out[0, 0, 0], torch.tensor([0.0, 2.5, 9.0], dtype=torch.float64))
    wide = frp.RoIAlign(2, 2, 1.0)(x, torch.tensor([[0, 0.0, 0, 3.0, 0.0]], dtype=torch.float64))
    assert wide[0, 0, 0, 1] == 0  # x = 4 >= W


def test_faster_rcnn_roi_align_gradcheck():
    x = _features(2, 2, 5, 6).requires_grad_(True)
    rois = ROIS[:4] * torch.tensor([1, 0.5, 0.5, 0.5, 0.5], dtype=torch.float64)
    for layer in (frp.RoIAlign(3, 4, 0.3), frp.RoIAlignAvg(2, 3, 0.3), frp.RoIAlignMax(2, 3, 0.3)):
        assert torch.autograd.gradcheck(lambda t: layer(t, rois), (x,))


def test_faster_rcnn_avg_and_max_pool_the_larger_grid():
    x = _features(2, 3, 8, 10)
    big, big_backward = corner_roi_align(x, ROIS, 4, 5, 0.25)  # aligned at (3+1, 4+1)
    avg = (big[..., :-1, :-1] + big[..., :-1, 1:] + big[..., 1:, :-1] + big[..., 1:, 1:]) / 4
    torch.testing.assert_close(frp.RoIAlignAvg(3, 4, 0.25)(x, ROIS), avg)
    mx = torch.zeros_like(avg)
    grad = _features(len(ROIS), 3, 3, 4, seed=1)
    grad_big = torch.zeros_like(big)
    for k in range(len(ROIS)):
        for c in range(3):
            for i in range(3):
                for j in range(4):
                    window = [(big[k, c, i + a, j + b].item(), i + a, j + b)
                              for a in (0, 1) for b in (0, 1)]
                    best = max(v for v, _, _ in window)
                    _, a, b = next(w for w in window if w[0] == best)
                    mx[k, c, i, j] = best
                    grad_big[k, c, a, b] += grad[k, c, i, j]
    layer = frp.RoIAlignMax(3, 4, 0.25)
    torch.testing.assert_close(layer(x, ROIS), mx)
    torch.testing.assert_close(_grad_of(lambda t: layer(t, ROIS), x, grad), big_backward(grad_big))


def test_faster_rcnn_roi_align_dtypes_and_box_forms():
    x = _features(2, 3, 8, 10)
    layer = frp.RoIAlign(4, 5, 0.25)
    want, _ = corner_roi_align(x, ROIS, 4, 5, 0.25)
    out32 = layer(x.float(), ROIS.float())
    assert out32.dtype == torch.float32
    torch.testing.assert_close(out32.double(), want, **tol(torch.float32))
    out16 = layer(x.half(), ROIS.float())
    assert out16.dtype == torch.float16
    torch.testing.assert_close(out16.double(), want, **tol(torch.float16, "rounded input"))
    per_image = [ROIS[ROIS[:, 0] == i, 1:] for i in range(2)]
    order = torch.cat([torch.nonzero(ROIS[:, 0] == i)[:, 0] for i in range(2)])
    torch.testing.assert_close(layer(x, per_image), want[order])
    empty = layer(x, ROIS[:0])
    assert empty.shape == (0, 3, 4, 5)


def test_faster_rcnn_roi_align_argument_errors():
    with pytest.raises(ValueError, match="aligned_width"):
        frp.RoIAlign(7, 1, 1 / 16)
    with pytest.raises(ValueError, match="aligned_height"):
        frp.RoIAlign(1, 7, 1 / 16)
    frp.RoIAlignAvg(1, 1, 1 / 16)  # samples 2x2, so 1 is fine there
    with pytest.raises(ValueError):
        frp.RoIAlignMax(0, 1, 1 / 16)
    with pytest.raises(TypeError):
        frp.RoIAlign("7", 7, 1 / 16)
    with pytest.raises(ValueError):
        frp.RoIAlign(6.5, 7, 1 / 16)
    assert frp.RoIAlign(7.0, 7, 1 / 16).aligned_height == 7
    layer = frp.RoIAlign(3, 3, 1.0)
    rois = torch.tensor([[0, 0.0, 0, 1, 1]])
    with pytest.raises(ValueError, match="at least 2x2"):
        layer(torch.zeros(1, 1, 1, 5), rois)
    with pytest.raises(ValueError, match="at least 2x2"):
        layer(torch.zeros(1, 1, 5, 1), rois)
    with pytest.raises(ValueError, match="row 0"):
        layer(torch.zeros(1, 1, 5, 5), torch.tensor([[1, 0.0, 0, 1, 1]]))
    with pytest.raises(ValueError, match="row 1"):
        layer(torch.zeros(2, 1, 5, 5), torch.tensor([[1, 0.0, 0, 1, 1], [0, 0, float("nan"), 1, 1]]))
    with pytest.raises(ValueError):
        layer(torch.zeros(1, 1, 5, 5), torch.zeros(3, 4))
    with pytest.raises(TypeError):
        layer(torch.zeros(1, 1, 5, 5), [[0, 0.0, 0, 1, 1]])


def test_faster_rcnn_roi_pool_is_caffe():
    x = _features(2, 3, 8, 10)
    layer = frp.RoIPool(3, 4, 0.25)
    assert frp._RoIPooling is frp.RoIPool
    want, arg = caffe_roi_pool(x, ROIS, 3, 4, 0.25)
    torch.testing.assert_close(layer(x, ROIS), want)
    grad = _features(len(ROIS), 3, 3, 4, seed=1)
    torch.testing.assert_close(_grad_of(lambda t: layer(t, ROIS), x, grad),
                               argmax_backward(grad, arg, ROIS, x.shape))


def test_faster_rcnn_reprs():
    assert repr(frp.RoIAlign(7, 7, 1 / 16)) == \
        "RoIAlign(aligned_height=7, aligned_width=7, spatial_scale=0.0625)"
    assert repr(frp.RoIAlignMax(7, 7, 1 / 16)).startswith("RoIAlignMax(aligned_height=7")
    assert repr(frp.RoIPool(7, 7, 1 / 16)) == \
        "RoIPool(pooled_height=7, pooled_width=7, spatial_scale=0.0625)"


# ----------------------------------------------------------------------------- simple-faster-rcnn

def _original_test_data(seed):
    """The data of simple-faster-rcnn's own test_roi_module, with x1 <= x2 and y1 <= y2."""
    g = torch.Generator().manual_seed(seed)
    b, n, c, h, w = 2, 8, 4, 32, 32
    x = torch.randn(b, c, h, w, generator=g)
    rois = torch.zeros(n, 5)
    rois[n // 2:, 0] = 1
    corners = torch.rand(n, 4, generator=g) * 100
    rois[:, [1, 3]] = corners[:, [0, 2]].sort(1).values
    rois[:, [2, 4]] = corners[:, [1, 3]].sort(1).values
    return x, rois


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_simple_faster_rcnn_passes_its_own_chainer_test(seed):
    x, rois = _original_test_data(seed)
    module = sfr.RoIPooling2D(7, 7, 1.0 / 16)
    xg = x.clone().requires_grad_(True)
    out = module(xg, rois)
    out.sum().backward()
    want, arg = caffe_roi_pool(x, rois, 7, 7, 1.0 / 16)
    assert torch.equal(out, want), "forward"
    want_grad = caffe_roi_pool_backward(torch.ones_like(want), arg, rois, x.shape, 1.0 / 16)
    assert torch.equal(xg.grad, want_grad), "backward"


def test_simple_faster_rcnn_yx_boxes_with_indices():
    x, rois = _original_test_data(3)
    module = sfr.RoIPooling2D(7, 7, 1.0 / 16)
    yx = rois[:, [2, 1, 4, 3]]
    want = module(x, rois)
    assert torch.equal(module(x, yx, rois[:, 0]), want)
    assert torch.equal(module(x, yx.numpy(), rois[:, 0].numpy().astype(np.int32)), want)
    with pytest.raises(ValueError, match="y_min"):
        module(x, rois, rois[:, 0])
    with pytest.raises(ValueError, match="roi_indices"):
        module(x, yx, rois[:3, 0])


def test_simple_faster_rcnn_inverted_box():
    # x2 < x1 and y2 < y1: both pool the single cell at the rounded (x1, y1) = (5, 4);
    # the original backward (its in-box test) drops that gradient, roiops delivers it
    x = _features(1, 2, 8, 8, dtype=torch.float32)
    rois = torch.tensor([[0, 80.0, 64.0, 40.0, 16.0]])
    module = sfr.RoIPooling2D(2, 2, 1.0 / 16)
    xg = x.clone().requires_grad_(True)
    out = module(xg, rois)
    want, arg = caffe_roi_pool(x, rois, 2, 2, 1.0 / 16)
    assert torch.equal(out, want)
    assert torch.equal(out, x[0, :, 4, 5].view(1, 2, 1, 1).expand(1, 2, 2, 2))
    out.sum().backward()
    original = caffe_roi_pool_backward(torch.ones_like(want), arg, rois, x.shape, 1.0 / 16)
    assert original.abs().sum() == 0
    assert torch.equal(xg.grad, argmax_backward(torch.ones_like(want), arg, rois, x.shape).float())
    assert xg.grad[0, :, 4, 5].tolist() == [4.0, 4.0]


def test_simple_faster_rcnn_repr_and_arguments():
    assert repr(sfr.RoIPooling2D(7, 7, 1 / 16)) == \
        "RoIPooling2D(outh=7, outw=7, spatial_scale=0.0625)"
    with pytest.raises(ValueError):
        sfr.RoIPooling2D(0, 7, 1 / 16)
    with pytest.raises(ValueError):
        sfr.RoIPooling2D(7, 7, 0)


# ----------------------------------------------------------------------------- mmdetection

def test_mmdet_roi_pool_matches_continuous_formula():
    x = _features(2, 3, 8, 10)
    layer = mmdet.RoIPool((3, 4), 0.25)
    want, arg = mmdet_roi_pool(x, ROIS, 3, 4, 0.25)
    out = layer(x, ROIS)
    torch.testing.assert_close(out, want)
    assert (out[4] == 0).all()  # the inverted box
    grad = _features(len(ROIS), 3, 3, 4, seed=1)
    got = _grad_of(lambda t: layer(t, ROIS), x, grad)
    torch.testing.assert_close(got, argmax_backward(grad, arg, ROIS, x.shape))
    torch.testing.assert_close(mmdet.roi_pool(x, ROIS, (3, 4), 0.25), want)
    square, _ = mmdet_roi_pool(x, ROIS, 3, 3, 0.25)
    torch.testing.assert_close(mmdet.RoIPool(3, 0.25)(x, ROIS), square)


def test_mmdet_degenerate_box_gets_no_gradient():
    x = _features(1, 2, 6, 6)
    rois = torch.tensor([[0, 12.0, 8.0, 6.0, 20.0]], dtype=torch.float64)  # x2 + 1 <= x1
    got = _grad_of(lambda t: mmdet.RoIPool(2, 0.25)(t, rois), x, torch.ones(1, 2, 2, 2))
    assert (got == 0).all()


def test_mmdet_use_torchvision_is_caffe():
    x = _features(2, 3, 8, 10)
    want, _ = caffe_roi_pool(x, ROIS, 3, 3, 0.25)
    torch.testing.assert_close(mmdet.RoIPool(3, 0.25, use_torchvision=True)(x, ROIS), want)


@pytest.mark.parametrize("bad", [[7, 7], 7.0, (7,), (7, 7, 7), (7, 7.0), True, "7", None])
def test_mmdet_out_size_type_errors(bad):
    with pytest.raises(TypeError, match="out_size"):
        mmdet.RoIPool(bad, 1 / 16)
    with pytest.raises(TypeError, match="out_size"):
        mmdet.roi_pool(_features(1, 1, 4, 4), torch.zeros(1, 5, dtype=torch.float64), bad, 1.0)


def test_mmdet_out_size_values_and_repr():
    with pytest.raises(ValueError, match="out_size"):
        mmdet.RoIPool((7, 0), 1 / 16)
    assert repr(mmdet.RoIPool(7, 1 / 16)) == \
        "RoIPool(out_size=7, spatial_scale=0.0625, use_torchvision=False)"
    assert repr(mmdet.RoIPool((7, 5), 0.25, True)) == \
        "RoIPool(out_size=(7, 5), spatial_scale=0.25, use_torchvision=True)"


def test_faster_rcnn_roi_align_unchecked_bad_rows_give_zeros(monkeypatch):
    # with the value checks switched off, a bad row must still not read out of bounds
    import roiops

    monkeypatch.setattr(roiops.config, "check_box_values", False)
    x = _features(2, 3, 8, 10).requires_grad_(True)
    rois = torch.tensor([[5, 0, 0, 20, 20], [0.5, 0, 0, 20, 20], [0, float("nan"), 0, 20, 20],
                         [1, 0, float("inf"), 20, 20], [0, 3.7, 5.2, 29.4, 22.9]],
                        dtype=torch.float64)
    out = frp.RoIAlign(3, 3, 0.25)(x, rois)
    assert (out[:2] == 0).all() and torch.isfinite(out).all()
    want, _ = corner_roi_align(x.detach(), rois[4:], 3, 3, 0.25)
    torch.testing.assert_close(out[4:], want)
    out.sum().backward()
    assert torch.isfinite(x.grad).all()
