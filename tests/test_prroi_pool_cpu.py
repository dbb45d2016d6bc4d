"""Precise RoI Pooling's C++ CPU kernels: against the float64 reference (output, input
gradient and box gradient, every dtype, both layouts), against exact quadrature of the
interpolated map, gradcheck through the registered op, thread-count independence and
the kernels' own argument checks."""

from __future__ import annotations

import math

import pytest
import torch

import roiops
from boxes import nasty_boxes, random_boxes
from cases import tol

N, C, H, W = 2, 5, 9, 11
SCALE = 0.5  # boxes are in image pixels of a 22 x 18 image


def feature(dtype=torch.float32, channels_last=False, seed=0, channels=C):
    x = torch.randn(N, channels, H, W, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(dtype)
    return x.contiguous(memory_format=torch.channels_last) if channels_last else x


def boxes_for(dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.cat([random_boxes(N, 10, W / SCALE, H / SCALE, g, dtype), nasty_boxes(N, W / SCALE, H / SCALE, dtype)])


def run(x, boxes, size, backend, seed=1):
    """Output, input gradient and box gradient for a fixed random upstream gradient."""
    x = x.detach().clone().requires_grad_()
    boxes = boxes.detach().clone().requires_grad_()
    with roiops.use_backend(backend):
        out = roiops.prroi_pool(x, boxes, size, SCALE)
        g = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(out.dtype)
        out.backward(g)
    return out.detach(), x.grad, boxes.grad


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("size", [(2, 3), 7])
def test_matches_reference(dtype, channels_last, size):
    x = feature(dtype, channels_last)
    rois_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    boxes = boxes_for(rois_dtype)
    out, gx, gb = run(x, boxes, size, "cpu")
    ref_out, ref_gx, ref_gb = run(x, boxes, size, "reference")
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    assert out.dtype == dtype and out.is_contiguous(memory_format=fmt)
    assert gx.dtype == dtype and gx.is_contiguous(memory_format=fmt)
    assert gb.dtype == rois_dtype
    torch.testing.assert_close(out.double(), ref_out.double(), **tol(dtype))
    torch.testing.assert_close(gx.double(), ref_gx.double(), **tol(dtype))
    if dtype in (torch.float64, torch.float32):
        # The box gradient sums channels and bins of differences of averages: scale the
        # tolerance by the size of its terms.
        scale = float(ref_gb.abs().max()) + 1
        torch.testing.assert_close(gb.double(), ref_gb.double(), rtol=tol(dtype)["rtol"],
                                   atol=tol(dtype)["atol"] * scale)
    assert torch.all(gb[:, 0] == 0)


def test_empty_and_outside_boxes():
    x = feature(torch.float64)
    boxes = nasty_boxes(N, W / SCALE, H / SCALE, torch.float64)
    out, gx, gb = run(x, boxes, 3, "cpu")
    # Entirely outside the map, zero size and inverted boxes: all zero, no gradient.
    for k in (1, 2, 4, 7):
        assert torch.all(out[k] == 0) and torch.all(gb[k] == 0)
    assert out[0].abs().sum() > 0 and out[5].abs().sum() > 0  # corner straddler, sub-pixel box
    x0, g0, b0 = run(x, boxes[:0], 3, "cpu")
    assert x0.shape == (0, C, 3, 3) and torch.all(g0 == 0) and b0.shape == (0, 5)


# ---- an independent oracle: exact quadrature of the interpolated map -------------------

def interpolated(f, x, y):
    """The hat-function interpolation of planes f [C, H, W] at (x, y), zero outside."""
    v = torch.zeros(f.shape[0], dtype=f.dtype)
    for h in range(max(0, math.floor(y)), min(f.shape[1], math.floor(y) + 2)):
        for w in range(max(0, math.floor(x)), min(f.shape[2], math.floor(x) + 2)):
            v += f[:, h, w] * max(0.0, 1 - abs(x - w)) * max(0.0, 1 - abs(y - h))
    return v


def pieces(a, b):
    """[a, b] split at integers: the interpolation is bilinear on each piece's cells."""
    cuts = [a] + list(range(math.floor(a) + 1, math.ceil(b))) + [b]
    return [(cuts[i], cuts[i + 1]) for i in range(len(cuts) - 1)]


def quadrature(f, box, scale, ph, pw):
    """[C, ph, pw] bin averages by 2 x 2 Gauss points per bilinear piece (exact)."""
    _, x1, y1, x2, y2 = box
    dw, dh = max(x2 - x1, 0) * scale / pw, max(y2 - y1, 0) * scale / ph
    nodes = (0.5 - 0.5 / math.sqrt(3), 0.5 + 0.5 / math.sqrt(3))
    out = torch.zeros(f.shape[0], ph, pw, dtype=torch.float64)
    for i in range(ph):
        for j in range(pw):
            ys, xs = y1 * scale + i * dh, x1 * scale + j * dw
            for ya, yb in pieces(ys, ys + dh):
                for xa, xb in pieces(xs, xs + dw):
                    for u in nodes:
                        for t in nodes:
                            v = interpolated(f, xa + t * (xb - xa), ya + u * (yb - ya))
                            out[:, i, j] += v * (xb - xa) * (yb - ya) / 4
            out[:, i, j] /= dw * dh
    return out


@pytest.mark.parametrize("channels_last", [False, True])
def test_matches_quadrature(channels_last):
    x = feature(torch.float64, channels_last, channels=3)
    boxes = torch.tensor([[0, 2.6, 1.4, 12.2, 10.4], [1, -6.0, -4.0, 5.0, 3.0], [0, 15.0, 11.0, 24.0, 18.0],
                          [1, 4.5, 4.5, 4.7, 4.6]], dtype=torch.float64)
    out = roiops._C.prroi_pool_forward(x, boxes, SCALE, 3, 2)
    for k, box in enumerate(boxes.tolist()):
        torch.testing.assert_close(out[k], quadrature(x[int(box[0])], box, SCALE, 3, 2), rtol=1e-12, atol=1e-12)


# ---- gradients, determinism, argument checks ----------------------------------------

@pytest.mark.parametrize("channels_last", [False, True])
def test_gradcheck(channels_last):
    x = torch.randn(N, 2, 6, 7, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    x = x.contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
    x.requires_grad_()
    # Away from x2 == x1 (where a bin's average jumps from 0); partly outside the map too.
    # The batch indices are not differentiable: gradcheck perturbs the coordinates only.
    idx = torch.tensor([[0.0], [1.0], [0.0]], dtype=torch.float64)
    coords = torch.tensor([[2.6, 1.4, 10.2, 9.4], [-3.3, -2.2, 5.1, 3.7], [9.3, 7.1, 15.9, 13.5]],
                          dtype=torch.float64, requires_grad=True)
    with roiops.use_backend("cpu"):
        assert torch.autograd.gradcheck(
            lambda a, b: torch.ops.roiops.prroi_pool(a, torch.cat([idx, b], 1), SCALE, 2, 3), (x, coords))


@pytest.mark.parametrize("channels_last", [False, True])
def test_threads_do_not_change_results(channels_last):
    x = feature(torch.float32, channels_last, channels=40)
    boxes = boxes_for()
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = run(x, boxes, 4, "cpu")
        torch.set_num_threads(3)
        many = run(x, boxes, 4, "cpu")
    finally:
        torch.set_num_threads(threads)
    for a, b in zip(one, many):
        assert torch.equal(a, b)


def test_strided_input():
    x = feature(torch.float64, channels=2 * C)[:, ::2]
    boxes = boxes_for(torch.float64)
    torch.testing.assert_close(roiops._C.prroi_pool_forward(x, boxes, SCALE, 3, 3),
                               roiops._C.prroi_pool_forward(x.contiguous(), boxes, SCALE, 3, 3), rtol=0, atol=0)


@pytest.mark.parametrize("column,value,match", [(0, 2.0, "batch index"), (0, 0.5, "batch index"),
                                                (1, float("nan"), "coordinate"), (4, float("inf"), "coordinate")])
def test_bad_rois_raise(column, value, match):
    x = feature()
    boxes = boxes_for()
    boxes[3, column] = value
    grad = torch.ones(boxes.shape[0], C, 2, 2)
    with pytest.raises(ValueError, match=match):
        roiops._C.prroi_pool_forward(x, boxes, SCALE, 2, 2)
    with pytest.raises(ValueError, match=match):
        roiops._C.prroi_pool_backward(grad, boxes, SCALE, 2, 2, N, C, H, W, False)
    with pytest.raises(ValueError, match=match):
        roiops._C.prroi_pool_rois_backward(grad, x, boxes, SCALE, 2, 2)


def test_bad_shapes_raise():
    x, boxes = feature(), boxes_for()
    with pytest.raises(ValueError, match="grad must be"):
        roiops._C.prroi_pool_backward(torch.ones(boxes.shape[0], C, 2, 3), boxes, SCALE, 2, 2, N, C, H, W, False)
    with pytest.raises(ValueError, match="grad must be"):
        roiops._C.prroi_pool_rois_backward(torch.ones(boxes.shape[0], C + 1, 2, 2), x, boxes, SCALE, 2, 2)
    with pytest.raises(ValueError, match="rois must be float64"):
        roiops._C.prroi_pool_forward(x.double(), boxes, SCALE, 2, 2)
