"""roi_align's gradient with respect to the boxes (box_grad=True, docs/semantics.md "roi_align
box gradient"): gradcheck in float64 and the kernels against the reference (the Triton
kernels' in test_box_grad_triton.py),
closed forms on a linear ramp, the public API's handling of boxes, and a box fitted by
gradient descent."""

from __future__ import annotations

import importlib
import itertools

import pytest
import torch
import torchvision
from torch._dynamo.testing import CompileCounterWithBackend

import roiops
import roiops.compat.torchvision as compat_tv
import cases
from cases import F32, F64, device_for, num_threads, tol

BACKENDS = ("reference", "cpu", "triton")
KERNEL_SETS = {"cpu": "roiops.cpu", "triton": "roiops.triton", "reference": "roiops.reference"}
KERNEL = {"avg": "roi_align_rois_backward", "max": "roi_align_max_rois_backward"}

N, C, H, W = 2, 3, 9, 11
SCALE = 0.9
# Boxes whose samples (output 3 x 2, sampling_ratio 2, scale 0.9, both alignments) all stay
# at least 0.03 cell from an integer coordinate, so from every cell edge and from the
# border rule's limits: the gradient is smooth around them. Row 2 is narrower than a cell
# (widened to one with aligned=False); row 3 lies partly outside the map.
SMOOTH = torch.tensor([[0, 1.29, 2.13, 7.39, 6.25],
                       [1, 0.37, 0.83, 4.47, 3.09],
                       [1, 2.32, 3.18, 2.76, 3.66],
                       [0, -3.36, 5.24, 3.72, 12.54],
                       [1, 6.16, 1.28, 10.96, 9.84]], dtype=F64)


def sample_positions(rois: torch.Tensor, scale: float, ph: int, pw: int, sr: int, aligned: bool):
    """Every sample's (y, x), by docs/semantics.md's formula (an oracle for the test's
    preconditions, independent of the kernels)."""
    o = 0.5 if aligned else 0.0
    out = []
    for _, x1, y1, x2, y2 in rois.tolist():
        roi_w, roi_h = (x2 - x1) * scale, (y2 - y1) * scale
        if not aligned:
            roi_w, roi_h = max(roi_w, 1.0), max(roi_h, 1.0)
        ys = [y1 * scale - o + (i + (a + 0.5) / sr) * roi_h / ph for i in range(ph) for a in range(sr)]
        xs = [x1 * scale - o + (j + (b + 0.5) / sr) * roi_w / pw for j in range(pw) for b in range(sr)]
        out.append((ys, xs, roi_w, roi_h))
    return out


def test_smooth_boxes_keep_off_the_discontinuities():
    for aligned in (False, True):
        for ys, xs, _, _ in sample_positions(SMOOTH, SCALE, 3, 2, 2, aligned):
            assert min(abs(v - round(v)) for v in ys + xs) > 0.03
    raw = (SMOOTH[:, 3:] - SMOOTH[:, 1:3]) * SCALE
    assert ((raw - 1).abs() > 0.1).all()  # away from the 1-cell clamp
    assert (raw < 1).any()  # one box is widened to 1 cell when not aligned


def kernels(backend):
    return importlib.import_module(KERNEL_SETS[backend])


def feature(dtype=F64, channels_last=False, seed=0, shape=(N, C, H, W), device="cpu"):
    return cases.feature(dtype, channels_last, seed, shape=shape).to(device)


# The Triton kernels' gradcheck and comparison with the reference, under the interpreter
# (slow), are in test_box_grad_triton.py.
@pytest.mark.parametrize("backend", ("reference", "cpu"))
@pytest.mark.parametrize("mode, aligned", list(itertools.product(("avg", "max"), (False, True))))
def test_gradcheck_boxes_and_input(backend, mode, aligned):
    dev = device_for(backend)
    x = feature(device=dev).requires_grad_()
    index, coords = SMOOTH[:, :1].to(dev), SMOOTH[:, 1:].to(dev).requires_grad_()

    def fn(x, coords):
        with roiops.use_backend(backend):
            return roiops.roi_align(x, torch.cat([index, coords], 1), (3, 2), SCALE, 2, aligned, mode, box_grad=True)

    # fast_mode: random projections of the Jacobian, which keep it quick on the input too
    assert torch.autograd.gradcheck(fn, (x, coords), eps=1e-6, atol=1e-7, rtol=1e-5, fast_mode=True)
    xcl = feature(channels_last=True, device=dev)
    assert torch.autograd.gradcheck(lambda c: fn(xcl, c), (coords,), eps=1e-6, atol=1e-7, rtol=1e-5)


def rois_grad(backend, mode, x, rois, grad, size, sr, aligned, scale=SCALE):
    dev = device_for(backend)
    out = getattr(kernels(backend), KERNEL[mode])(grad.to(dev), x.to(dev), rois.to(dev), scale, size[0], size[1], sr,
                                                 aligned)
    assert out.dtype == rois.dtype and out.shape == rois.shape
    return out.cpu()


def boxes_for(dtype):
    return torch.cat([cases.boxes_for(dtype=dtype, seed=5, count=8, n=N, width=W / SCALE, height=H / SCALE),
                      SMOOTH.to(dtype)])


@pytest.mark.parametrize("backend", ("cpu",))
@pytest.mark.parametrize("mode", ("avg", "max"))
@pytest.mark.parametrize("dtype, channels_last, aligned, sr, size", [
    (F64, False, False, 2, (3, 2)), (F64, True, True, 2, (3, 2)), (F64, False, True, 1, (2, 4)),
    (F64, True, False, 3, (1, 1)), (F32, False, True, 2, (3, 2)), (F32, True, False, 2, (2, 3)),
    (F64, True, True, 0, (2, 2)), (F32, False, False, -1, (3, 3)),  # adaptive: the grid frozen at the box's size
])
def test_kernels_match_reference(backend, mode, dtype, channels_last, aligned, sr, size):
    rois = boxes_for(dtype)
    x = feature(dtype, channels_last, seed=2)
    grad = torch.randn(len(rois), C, *size, generator=torch.Generator().manual_seed(3), dtype=F64).to(dtype)
    ref = rois_grad("reference", mode, x, rois, grad, size, sr, aligned)
    got = rois_grad(backend, mode, x, rois, grad, size, sr, aligned)
    assert ref[:, 0].eq(0).all() and got[:, 0].eq(0).all()
    # Sums of terms of both signs: compare against the terms' scale, not the result's.
    scale = float(ref.abs().max())
    t = tol(dtype)["atol"]
    torch.testing.assert_close(got, ref, rtol=t, atol=t * scale)


@pytest.mark.parametrize("backend", ("cpu", "triton"))
@pytest.mark.parametrize("mode", ("avg", "max"))
def test_kernels_empty_and_outside(backend, mode):
    x = feature()
    none = torch.zeros(0, 5, dtype=F64)
    assert rois_grad(backend, mode, x, none, torch.zeros(0, C, 2, 2, dtype=F64), (2, 2), 2, True).shape == (0, 5)
    # Entirely outside the map: every sample is 0 whatever the box does nearby.
    out = torch.tensor([[0, 30.0, 40.0, 45.0, 50.0], [1, -30.0, -20.0, -5.0, -8.0]], dtype=F64)
    grad = torch.ones(2, C, 2, 2, dtype=F64)
    assert rois_grad(backend, mode, x, out, grad, (2, 2), 2, False).eq(0).all()


@pytest.mark.parametrize("backend", ("reference", "cpu"))
@pytest.mark.parametrize("mode", ("avg", "max"))
def test_kernels_refuse_bad_rows(backend, mode):
    x, grad = feature(), torch.ones(1, C, 2, 2, dtype=F64)
    with pytest.raises(ValueError, match="batch index"):
        rois_grad(backend, mode, x, torch.tensor([[2, 1.0, 1, 4, 4]], dtype=F64), grad, (2, 2), 2, True)
    with pytest.raises(ValueError, match="finite"):
        rois_grad(backend, mode, x, torch.tensor([[0, 1.0, float("nan"), 4, 4]], dtype=F64), grad, (2, 2), 2, True)


# ---- closed forms on a linear ramp F[h, w] = a*w + b*h

A, B = 0.7, -1.3


def ramp(n=1, c=2, h=12, w=14, dtype=F64):
    hh, ww = torch.meshgrid(torch.arange(h, dtype=dtype), torch.arange(w, dtype=dtype), indexing="ij")
    return (A * ww + B * hh).expand(n, c, h, w).contiguous()


def ramp_expected(box, g, s, sr, aligned, mode):
    """Away from the border rule's clamps a bilinear sample of the ramp is a*x + b*y, so
    each output is linear in the sample positions: avg takes their mean, the bin centre;
    max (a > 0 > b) the sample of the last column and the first row. Position
    ``c1*s - o + t*(c2 - c1)*s`` gives d/dc1 = s*(1 - t), d/dc2 = s*t, or s and 0 for an
    axis widened to 1 cell."""
    _, x1, y1, x2, y2 = box
    c, ph, pw = g.shape
    grads = torch.zeros(5, dtype=F64)
    for axis, (lo, hi, pooled, slope) in enumerate(((x1, x2, pw, A), (y1, y2, ph, B))):
        clamped = not aligned and (hi - lo) * s < 1
        for p in range(pooled):
            if mode == "avg":
                t = (p + 0.5) / pooled
            else:
                last = sr - 1 if slope > 0 else 0
                t = (p + (last + 0.5) / sr) / pooled
            gsum = float(g.sum(dim=(0, 1))[p] if axis == 0 else g.sum(dim=(0, 2))[p])
            grads[1 + axis] += gsum * slope * (s if clamped else s * (1 - t))
            grads[3 + axis] += 0.0 if clamped else gsum * slope * s * t
    return grads


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", ("avg", "max"))
@pytest.mark.parametrize("aligned", (False, True))
def test_linear_ramp_closed_form(backend, mode, aligned):
    dev = device_for(backend)
    s, sr, size = 0.5, 2, (3, 4)
    # Inside [0, H - 1) x [0, W - 1) with a margin, so no clamp of the border rule; the
    # last box is 1.4 pixels = 0.7 cell wide and 0.9 cell tall (widened when not aligned).
    boxes = torch.tensor([[0, 3.1, 2.7, 20.3, 17.9], [0, 6.0, 5.0, 7.4, 6.8]], dtype=F64)
    g = torch.randn(2, 2, *size, generator=torch.Generator().manual_seed(0), dtype=F64)
    coords = boxes[:, 1:].clone().to(dev).requires_grad_()
    with roiops.use_backend(backend):
        out = roiops.roi_align(ramp().to(dev), torch.cat([boxes[:, :1].to(dev), coords], 1), size, s, sr, aligned,
                               mode, box_grad=True)
    out.backward(g.to(dev))
    for k in range(2):
        want = ramp_expected(boxes[k].tolist(), g[k], s, sr, aligned, mode)
        torch.testing.assert_close(coords.grad[k].cpu(), want[1:], rtol=1e-12, atol=1e-12)


# ---- the public API


@pytest.mark.parametrize("mode", ("avg", "max"))
def test_gradient_reaches_a_list_of_boxes(mode):
    x = feature()
    per_image = [SMOOTH[SMOOTH[:, 0] == i, 1:].clone().requires_grad_() for i in range(N)]
    roiops.roi_align(x, per_image, (3, 2), SCALE, 2, True, mode, box_grad=True).square().sum().backward()
    rows = torch.cat([SMOOTH[SMOOTH[:, 0] == i] for i in range(N)]).requires_grad_()
    roiops.roi_align(x, rows, (3, 2), SCALE, 2, True, mode, box_grad=True).square().sum().backward()
    assert rows.grad[:, 0].eq(0).all() and rows.grad[:, 1:].abs().sum() > 0
    torch.testing.assert_close(torch.cat([b.grad for b in per_image]), rows.grad[:, 1:], rtol=0, atol=0)


def test_module_box_grad():
    pool = roiops.RoIAlign((3, 2), SCALE, 2, aligned=True, box_grad=True)
    assert "box_grad=True" in repr(pool)
    coords = SMOOTH[:, 1:].clone().requires_grad_()
    pool(feature(), torch.cat([SMOOTH[:, :1], coords], 1)).sum().backward()
    assert coords.grad is not None and coords.grad.abs().sum() > 0


@pytest.mark.parametrize("mode", ("avg", "max"))
def test_without_box_grad_boxes_get_no_gradient(mode):
    x = feature().requires_grad_()
    boxes = SMOOTH.clone().requires_grad_()
    out = roiops.roi_align(x, boxes, (3, 2), SCALE, 2, True, mode)
    out.sum().backward()
    assert boxes.grad is None and x.grad is not None
    per_image = [SMOOTH[SMOOTH[:, 0] == i, 1:].clone().requires_grad_() for i in range(N)]
    roiops.RoIAlign((3, 2), SCALE, 2, mode=mode)(x, per_image).sum().backward()
    assert all(b.grad is None for b in per_image)


def test_compat_torchvision_gives_boxes_no_gradient_like_torchvision():
    x = feature(F32).requires_grad_()
    ours, theirs = SMOOTH.float().requires_grad_(), SMOOTH.float().requires_grad_()
    compat_tv.roi_align(x, ours, 2, SCALE, 2, True).sum().backward()
    torchvision.ops.roi_align(x, theirs, 2, SCALE, 2, True).sum().backward()
    assert ours.grad is None and theirs.grad is None


@pytest.mark.parametrize("sr", (0, -1))
def test_box_grad_refuses_adaptive_sampling(sr):
    x = feature()
    with pytest.raises(ValueError, match="box_grad.*sampling_ratio"):
        roiops.roi_align(x, SMOOTH, 2, SCALE, sr, box_grad=True)
    with pytest.raises(ValueError, match="box_grad.*sampling_ratio"):
        roiops.RoIAlign(2, SCALE, sr, box_grad=True)


def test_box_grad_must_be_a_bool():
    with pytest.raises(ValueError, match="box_grad must be a bool"):
        roiops.roi_align(feature(), SMOOTH, 2, SCALE, 2, box_grad="yes")
    with pytest.raises(ValueError, match="box_grad must be a bool"):
        roiops.RoIAlign(2, SCALE, 2, box_grad=1)


def test_compiles_in_both_modes_and_matches_eager(fresh_dynamo):
    """box_grad=True in both modes: the boxes' gradient (roiops::_roi_align_rois_backward and
    its max twin, through their fake kernels) in one graph, forward and backward."""

    def fn(x, coords):
        boxes = torch.cat([torch.zeros_like(coords[:, :1]), coords], dim=1)
        return (roiops.roi_align(x, boxes, 2, 0.5, 2, True, box_grad=True)
                + roiops.roi_align(x, boxes, 2, 0.5, 2, False, mode="max", box_grad=True))

    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(fn, backend=counter, fullgraph=True)
    x = feature(F32, shape=(1, 3, 8, 8))
    coords = SMOOTH[:, 1:].float()
    results = []
    for f in (compiled, fn):
        xi, c = x.clone().requires_grad_(), coords.clone().requires_grad_()
        out = f(xi, c)
        (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
        results.append((out.detach(), xi.grad, c.grad))
    (out, grad_x, grad_c), (ref_out, ref_grad_x, ref_grad_c) = results
    torch.testing.assert_close(out, ref_out, rtol=0, atol=0)
    torch.testing.assert_close(grad_x, ref_grad_x)
    assert ref_grad_c.abs().sum() > 0
    torch.testing.assert_close(grad_c, ref_grad_c)
    assert counter.frame_count == 1


def test_double_backward_is_refused():
    coords = SMOOTH[:, 1:].clone().requires_grad_()
    out = roiops.roi_align(feature(), torch.cat([SMOOTH[:, :1], coords], 1), 2, SCALE, 2, box_grad=True)
    (g,) = torch.autograd.grad(out.sum(), coords, create_graph=True)
    with pytest.raises(RuntimeError, match="no double backward"):
        g.sum().backward()


# ---- fitting a box by gradient descent (the example of docs/api.md)


def blobs(h=32, w=40):
    """A smooth map: a few Gaussian bumps, so that a crop's error varies smoothly with the box."""
    yy, xx = torch.meshgrid(torch.arange(h, dtype=F32), torch.arange(w, dtype=F32), indexing="ij")
    centres = [(8.0, 10.0, 4.0), (20.0, 28.0, 6.0), (25.0, 9.0, 5.0)]
    m = sum(torch.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / (2 * r * r)) for cy, cx, r in centres)
    return torch.stack([m, m.square(), yy / h]).unsqueeze(0)


def test_gradient_descent_finds_the_target_box():
    features = blobs()
    target = torch.tensor([[0, 6.0, 4.0, 22.0, 16.0]])
    crop = roiops.roi_align(features, target, 7, 1.0, 2, aligned=True)
    box = torch.tensor([[9.0, 7.0, 25.0, 20.0]], requires_grad=True)  # (x1, y1, x2, y2), 3-4 cells off
    opt = torch.optim.Adam([box], lr=0.1)
    for _ in range(200):
        opt.zero_grad()
        out = roiops.roi_align(features, [box], 7, 1.0, 2, aligned=True, box_grad=True)
        loss = (out - crop).square().mean()
        loss.backward()
        opt.step()
    assert (box.detach() - target[:, 1:]).abs().max() < 0.1, box


@pytest.mark.parametrize("mode", ("avg", "max"))
@pytest.mark.parametrize("channels_last", (False, True))
def test_cpu_kernels_deterministic_across_threads(mode, channels_last):
    """Each box's sums are its own (NCHW: blocks of channels added in block order), so the
    bits do not depend on the thread count."""
    x = feature(F32, channels_last, seed=4, shape=(2, 40, 12, 14))
    rois = boxes_for(F32)
    grad = torch.randn(len(rois), 40, 3, 3, generator=torch.Generator().manual_seed(6))
    results = []
    for n in (1, 2, 3):
        with num_threads(n):
            results.append(rois_grad("cpu", mode, x, rois, grad, (3, 3), 2, True))
    assert results[0].abs().sum() > 0
    assert all(torch.equal(r, results[0]) for r in results[1:])
