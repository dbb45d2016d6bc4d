"""Deformable RoI pooling: mmcv's published values, a brute-force model written per sample
from the definition (forward, input and offset gradients, with autograd of the model as
the offset gradient's oracle), the zero offset as roi_align(aligned=True) bit for bit,
offsets that leave the map or are not finite, and the mmcv drop-ins (Pack layers and
their state_dicts). What every op must do (dtypes, layouts, gradcheck, compile, export,
Module, validation, threads) is in test_generic.py."""

from __future__ import annotations

import math

import pytest
import torch

import roiops
from cases import F32, F64, device_for, tol
from cases import boxes_for as _boxes_for
from cases import feature as _feature
from roiops._boxes import AXIS_ALIGNED

# The option sets the generic tests (tests/cases.py) run the operator with.
OPTIONS = {"deform_roi_pool": (dict(sampling_ratio=2), dict(sampling_ratio=0, gamma=0.5, offset=None))}

N, C, H, W = 2, 3, 9, 11
SCALE = 0.5  # boxes in pixels of a 22 x 18 image
BACKENDS = ["reference", "cpu", "triton"]


def feature(dtype=F64, channels_last=False, seed=0, c=C):
    return _feature(dtype, channels_last, seed, shape=(N, c, H, W))


def boxes(dtype=F64, seed=0, count=6, nasty=True):
    """``count`` random boxes, and with ``nasty`` the nasty ones of tests/boxes.py."""
    return _boxes_for(AXIS_ALIGNED, dtype, seed, count, N, W / SCALE, H / SCALE, nasty)


def offsets(b, size, seed=0, scale=0.5):
    g = torch.Generator().manual_seed(seed)
    h, w = (size, size) if isinstance(size, int) else size
    return (scale * torch.randn(b.shape[0], 2, h, w, generator=g, dtype=F64)).to(b.dtype)


def run(x, b, off, size=(2, 3), sr=2, gamma=0.1, backend=None, seed=1):
    """Output and the gradients of the input and the offset (None without one) for a fixed
    random upstream gradient, on ``backend``'s kernels (on its device)."""
    dev = device_for(backend)
    xg = x.detach().to(dev, copy=True).requires_grad_()
    og = None if off is None else off.detach().to(dev, copy=True).requires_grad_()
    with roiops.use_backend(backend):
        out = roiops.deform_roi_pool(xg, b.to(dev), og, size, SCALE, sr, gamma)
        g = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=F64)
        out.backward(g.to(dev, out.dtype))
    return out.detach().cpu(), xg.grad.cpu(), None if og is None else og.grad.cpu()


# ----------------------------------------------------------------------------- the definition


def _bilinear(plane, y, x):
    """mmcv's sampler (0-d float64 tensors y, x), differentiable in y and x where it moves."""
    h, w = plane.shape
    if not (-1 <= float(y.detach()) <= h and -1 <= float(x.detach()) <= w):
        return plane.new_zeros(())
    y = torch.where(y <= 0, torch.zeros_like(y), y)
    x = torch.where(x <= 0, torch.zeros_like(x), x)
    y0, x0 = int(math.floor(float(y.detach()))), int(math.floor(float(x.detach())))
    if y0 >= h - 1:
        y0 = y1 = h - 1
        y = y.detach() * 0 + (h - 1)
    else:
        y1 = y0 + 1
    if x0 >= w - 1:
        x0 = x1 = w - 1
        x = x.detach() * 0 + (w - 1)
    else:
        x1 = x0 + 1
    ly, lx = y - y0, x - x0
    hy, hx = 1 - ly, 1 - lx
    return hy * hx * plane[y0, x0] + hy * lx * plane[y0, x1] + ly * hx * plane[y1, x0] + ly * lx * plane[y1, x1]


def brute_force(x, rois, off, size, scale, sr, gamma):
    """The definition, sample by sample in float64: out[k, c, i, j] = mean of the bin's
    bilinear samples, bin (i, j) moved by gamma * box side * offset."""
    ph, pw = size
    out = []
    for k, roi in enumerate(rois.tolist()):
        b = int(roi[0])
        sw, sh = roi[1] * scale - 0.5, roi[2] * scale - 0.5
        rw, rh = roi[3] * scale - 0.5 - sw, roi[4] * scale - 0.5 - sh
        bh, bw = rh / ph, rw / pw
        gh = sr if sr > 0 else math.ceil(bh)
        gw = sr if sr > 0 else math.ceil(bw)
        bins = []
        for i in range(ph):
            for j in range(pw):
                sy = sh + (0 if off is None else gamma * rh * off[k, 1, i, j])
                sx = sw + (0 if off is None else gamma * rw * off[k, 0, i, j])
                total = x.new_zeros(x.shape[1])
                for iy in range(max(gh, 0)):
                    for ix in range(max(gw, 0)):
                        y = torch.as_tensor(sy + i * bh + (iy + 0.5) * bh / gh, dtype=F64)
                        xx = torch.as_tensor(sx + j * bw + (ix + 0.5) * bw / gw, dtype=F64)
                        total = total + torch.stack([_bilinear(x[b, c], y, xx) for c in range(x.shape[1])])
                bins.append(total / max(gh * gw, 1))
        out.append(torch.stack(bins, 1).view(x.shape[1], ph, pw))
    return torch.stack(out)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("sr, gamma", [(2, 0.1), (0, 0.3), (3, 1.0)])
def test_matches_the_definition(backend, sr, gamma):
    """Forward, input gradient and offset gradient against the brute-force model (autograd of
    the model gives the offset's: the derivative of the forward, zero along an axis where
    the border rule holds a sample)."""
    x, b = feature(), boxes(count=4)
    off = offsets(b, (2, 3), scale=1.0)
    out, gx, goff = run(x, b, off, (2, 3), sr, gamma, backend)
    xm, om = x.clone().requires_grad_(), off.clone().requires_grad_()
    want = brute_force(xm, b, om, (2, 3), SCALE, sr, gamma)
    want.backward(torch.randn(want.shape, generator=torch.Generator().manual_seed(1), dtype=F64))
    torch.testing.assert_close(out, want.detach(), **tol(F64))
    torch.testing.assert_close(gx, xm.grad, **tol(F64))
    torch.testing.assert_close(goff, om.grad, **tol(F64))


@pytest.mark.parametrize("backend", BACKENDS)
def test_mmcv_published_values(backend):
    """mmcv's own test vectors (sampling_ratio 2, output 2 x 2, no offset): outputs and the
    input gradient of a sum, exact in float32 and float64."""
    cases = [
        ([[[1.0, 2.0], [3.0, 4.0]]], [[0, 0.0, 0.0, 1.0, 1.0]], [[[1.0, 1.25], [1.5, 1.75]]],
         [[[3.0625, 0.4375], [0.4375, 0.0625]]]),
        ([[[1.0, 2.0], [3.0, 4.0]], [[4.0, 3.0], [2.0, 1.0]]], [[0, 0.0, 0.0, 1.0, 1.0]],
         [[[1.0, 1.25], [1.5, 1.75]], [[4.0, 3.75], [3.5, 3.25]]],
         [[[3.0625, 0.4375], [0.4375, 0.0625]], [[3.0625, 0.4375], [0.4375, 0.0625]]]),
        ([[[1.0, 2.0, 5.0, 6.0], [3.0, 4.0, 7.0, 8.0], [9.0, 10.0, 13.0, 14.0], [11.0, 12.0, 15.0, 16.0]]],
         [[0, 0.0, 0.0, 3.0, 3.0]], [[[1.9375, 4.75], [7.5625, 10.375]]],
         [[[0.47265625, 0.4296875, 0.4296875, 0.04296875], [0.4296875, 0.390625, 0.390625, 0.0390625],
           [0.4296875, 0.390625, 0.390625, 0.0390625], [0.04296875, 0.0390625, 0.0390625, 0.00390625]]]),
    ]
    dev = device_for(backend)
    for dtype in (F32, F64):
        for value, rois, expected, grad in cases:
            x = torch.tensor([value], dtype=dtype, device=dev, requires_grad=True)
            with roiops.use_backend(backend):
                out = roiops.deform_roi_pool(x, torch.tensor(rois, dtype=dtype, device=dev), None, 2, 1.0, 2)
                out.sum().backward()
            assert torch.equal(out.detach().cpu(), torch.tensor([expected], dtype=dtype))
            assert torch.equal(x.grad.cpu(), torch.tensor([grad], dtype=dtype))


@pytest.mark.parametrize("backend", ["cpu", "triton"])
@pytest.mark.parametrize("channels_last", [False, True])
def test_zero_offset_is_roi_align_aligned(backend, channels_last):
    """No offset, or a zero one, pools as roi_align(aligned=True) with the same sampling, bit
    for bit (the same arithmetic); its offset gradient is then the derivative at 0."""
    x, b = feature(F32, channels_last), boxes(F32, count=8)
    dev = device_for(backend)
    for sr in (2, 0):
        with roiops.use_backend(backend):
            want = roiops.roi_align(x.to(dev), b.to(dev), (2, 3), SCALE, sr, aligned=True).cpu()
        for off in (None, torch.zeros(len(b), 2, 2, 3)):
            out, _, _ = run(x, b, off, (2, 3), sr, 0.1, backend)
            assert torch.equal(out, want)


@pytest.mark.parametrize("backend", BACKENDS)
def test_offsets_that_leave_the_map_or_are_not_finite(backend):
    """A bin moved off the map, or by a non-finite offset, has no sample on it: 0, and no
    gradient; the other bins are unchanged. Huge offsets cost nothing more."""
    x, b = feature(), boxes(count=3, nasty=False)
    off = offsets(b, (2, 2))
    out, gx, goff = run(x, b, off, (2, 2), 0, 0.1, backend)
    moved = off.clone()
    moved[0, 0, 0, 0] = 1e30
    moved[1, 1, 1, 0] = float("nan")
    moved[2, 0, 0, 1] = float("-inf")
    got, gx2, goff2 = run(x, b, moved, (2, 2), 0, 0.1, backend)
    hit = torch.zeros(3, 2, 2, dtype=torch.bool)
    hit[0, 0, 0] = hit[1, 1, 0] = hit[2, 0, 1] = True
    assert torch.equal(got.permute(1, 0, 2, 3)[:, hit], torch.zeros(C, 3, dtype=F64))
    torch.testing.assert_close(got.permute(1, 0, 2, 3)[:, ~hit], out.permute(1, 0, 2, 3)[:, ~hit], **tol(F64))
    assert torch.isfinite(gx2).all() and torch.isfinite(goff2).all()
    assert torch.equal(goff2.permute(1, 0, 2, 3)[:, hit], torch.zeros(2, 3, dtype=F64))


@pytest.mark.parametrize("backend", BACKENDS)
def test_degenerate_boxes_give_zero(backend):
    """An empty or inverted box with adaptive sampling has no samples: zeros, no gradient."""
    b = torch.tensor([[0, 8.0, 6.0, 8.0, 6.0], [1, 8.0, 6.0, 4.0, 12.0]], dtype=F64)
    out, gx, goff = run(feature(), b, offsets(b, 3), 3, 0, 0.1, backend)
    for t in (out, gx, goff):
        assert torch.equal(t, torch.zeros_like(t))


def test_offset_checks():
    x, b = feature(F32), boxes(F32, count=2, nasty=False)
    with pytest.raises(ValueError, match=r"offset must be \[K, 2, h, w\] = \[2, 2, 3, 3\]"):
        roiops.deform_roi_pool(x, b, torch.zeros(2, 2, 3), 3, SCALE)
    with pytest.raises(ValueError, match="offset must be floating point"):
        roiops.deform_roi_pool(x, b, torch.zeros(2, 2, 3, 3, dtype=torch.int64), 3, SCALE)
    with pytest.raises(TypeError, match="offset must be a Tensor or None"):
        roiops.deform_roi_pool(x, b, [[0.0]], 3, SCALE)
    with pytest.raises(ValueError, match="offset is on meta"):
        roiops.deform_roi_pool(x, b, torch.zeros(2, 2, 3, 3, device="meta"), 3, SCALE)
    with pytest.raises(ValueError, match="gamma must be a finite number"):
        roiops.deform_roi_pool(x, b, None, 3, SCALE, gamma=float("inf"))
    # An offset of another floating dtype is used as the coordinates' type; its gradient
    # comes back in its own.
    off = offsets(b, 3).to(torch.bfloat16).requires_grad_()
    roiops.deform_roi_pool(x, b, off, 3, SCALE).sum().backward()
    assert off.grad.dtype == torch.bfloat16 and off.grad.shape == off.shape


# ----------------------------------------------------------------------------- drop-ins


def test_mmcv_drop_in():
    from roiops.compat.mmcv import DeformRoIPool, deform_roi_pool

    x, b = feature(F32), boxes(F32)
    off = offsets(b, 3).float()
    expected = roiops.deform_roi_pool(x, b, off, 3, SCALE, 2, 0.2)
    assert torch.equal(deform_roi_pool(x, b, off, 3, SCALE, 2, 0.2), expected)
    m = DeformRoIPool(3, SCALE, 2, 0.2)
    assert (m.output_size, m.spatial_scale, m.sampling_ratio, m.gamma) == ((3, 3), SCALE, 2, 0.2)
    assert torch.equal(m(x, b, off), expected)
    assert torch.equal(m(x, b), roiops.roi_align(x, b, 3, SCALE, 2, aligned=True))
    with pytest.raises(AssertionError):
        deform_roi_pool(x, b[:, 1:], None, 3)


def _mmcv_state_dict(ph, pw, c, d, modulated, seed=0):
    """A state_dict named and shaped as mmcv's Pack layers save theirs."""
    g = torch.Generator().manual_seed(seed)
    f = ph * pw * c
    shapes = {"offset_fc.0.weight": (d, f), "offset_fc.0.bias": (d,), "offset_fc.2.weight": (d, d),
              "offset_fc.2.bias": (d,), "offset_fc.4.weight": (ph * pw * 2, d), "offset_fc.4.bias": (ph * pw * 2,)}
    if modulated:
        shapes |= {"mask_fc.0.weight": (d, f), "mask_fc.0.bias": (d,), "mask_fc.2.weight": (ph * pw, d),
                   "mask_fc.2.bias": (ph * pw,)}
    return {k: 0.05 * torch.randn(s, generator=g) for k, s in shapes.items()}


@pytest.mark.parametrize("modulated", [False, True])
def test_mmcv_pack_layers(modulated):
    """Pack layers: zero-initialised last layers make the first output plain pooling (times
    the initial mask 0.5); a state_dict saved the mmcv way loads, after which the layer pools
    with the offset (and mask) its heads predict, and trains them."""
    from roiops.compat.mmcv import DeformRoIPoolPack, ModulatedDeformRoIPoolPack

    cls = ModulatedDeformRoIPoolPack if modulated else DeformRoIPoolPack
    x, b = feature(F32, c=4), boxes(F32)
    layer = cls((2, 3), 4, 16, spatial_scale=SCALE, sampling_ratio=2)
    plain = roiops.deform_roi_pool(x, b, None, (2, 3), SCALE, 2)
    assert torch.equal(layer(x, b), plain * 0.5 if modulated else plain)
    state = _mmcv_state_dict(2, 3, 4, 16, modulated)
    layer.load_state_dict(state)
    flat = plain.reshape(len(b), -1)
    fc = lambda w, t: t @ state[w + ".weight"].T + state[w + ".bias"]  # noqa: E731
    offset = fc("offset_fc.4", fc("offset_fc.2", fc("offset_fc.0", flat).relu()).relu()).view(len(b), 2, 2, 3)
    want = roiops.deform_roi_pool(x, b, offset, (2, 3), SCALE, 2)
    if modulated:
        want = want * torch.sigmoid(fc("mask_fc.2", fc("mask_fc.0", flat).relu())).view(len(b), 1, 2, 3)
    torch.testing.assert_close(layer(x, b), want, **tol(F32))
    layer(x, b).square().sum().backward()
    assert layer.offset_fc[4].weight.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="output_channels=4"):
        layer(feature(F32, c=3), b)
