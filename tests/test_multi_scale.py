"""Multi-level (FPN) RoIAlign: roiops.multi_scale_roi_align and its registered op, against
single-level roi_align on the level each box's size selects (the definition), on every
kernel set."""

import contextlib
import importlib
import math

import pytest
import torch

import roiops
from cases import RecordOps, tol

from roiops._requirements import triton_too_old

rt = None if triton_too_old() else importlib.import_module("roiops.triton")
needs_triton = pytest.mark.skipif(rt is None, reason=triton_too_old())

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SCALES = [1 / 4, 1 / 8, 1 / 16, 1 / 32]
IMG_H, IMG_W = 96, 128


def maps(dtype=torch.float32, channels_last=False, c=3, seed=0, device="cpu", img=(IMG_H, IMG_W)):
    g = torch.Generator().manual_seed(seed)
    out = [torch.randn(2, c, int(img[0] * s), int(img[1] * s), generator=g, dtype=torch.float64).to(dtype)
           for s in SCALES]
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    return [x.contiguous(memory_format=fmt).to(device) for x in out]


def boxes(seed=1, count=24):
    """[K, 5] boxes of every level, plus ones exactly on level boundaries (sqrt(area) =
    224 * 2^k), inverted (negative area: no level) and zero-size."""
    g = torch.Generator().manual_seed(seed)
    side = torch.exp(torch.rand(count, 2, generator=g) * math.log(1000.0)) + 1
    xy = torch.rand(count, 2, generator=g) * torch.tensor([IMG_W, IMG_H])
    rows = torch.cat([xy, xy + side], 1)
    rows = torch.cat([rows, torch.tensor([[0.0, 0.0, 112.0, 112.0], [5.0, 3.0, 61.0, 59.0], [0.0, 0.0, 448.0, 448.0],
                                          [50.0, 40.0, 20.0, 60.0], [7.0, 7.0, 7.0, 7.0]])])
    index = torch.arange(rows.shape[0]) % 2
    return torch.cat([index[:, None].float(), rows], 1)


def by_definition(features, rois, levels, output_size, sampling_ratio, aligned):
    """Each box on its own level with the single-level op; 0 where it has none."""
    out = torch.zeros(rois.shape[0], features[0].shape[1], *output_size, dtype=features[0].dtype)
    for k in range(rois.shape[0]):
        level = int(levels[k])
        if 0 <= level < len(features):
            out[k] = roiops.roi_align(features[level], rois[k:k + 1], output_size, SCALES[level], sampling_ratio,
                                      aligned)[0]
    return out


@pytest.mark.parametrize("rule", ["torchvision", "detectron2"])
def test_levels_follow_the_peers_formulas(rule):
    side = torch.tensor([1.0, 13.9, 111.99, 112.0, 112.01, 224.0, 447.9, 448.0, 3000.0, 0.0, -3.0])
    rois = torch.stack([torch.zeros_like(side), torch.zeros_like(side), torch.zeros_like(side), side, side.abs()], 1)
    levels = roiops.fpn_levels(rois, 2, 5, rule=rule)
    area = side * side.abs()
    for k in range(len(side)):
        if area[k] < 0:
            assert levels[k] == -1
            continue
        size = math.sqrt(float(area[k]))
        if rule == "torchvision":
            lvl = math.floor(4 + math.log2(size / 224) + 1e-6) if size > 0 else 2
        else:
            lvl = math.floor(4 + math.log2(size / 224 + 1e-8))
        assert levels[k] == min(max(lvl, 2), 5) - 2, (side[k], levels[k])


@pytest.mark.parametrize("rule", ["torchvision", "detectron2"])
@pytest.mark.parametrize("channels_last", [False, True])
def test_cpu_equals_single_level_ops(rule, channels_last):
    feats = maps(channels_last=channels_last)
    rois = boxes()
    out = roiops.multi_scale_roi_align(feats, rois, (3, 2), SCALES, 2, True, level_rule=rule)
    levels = roiops.fpn_levels(rois, 2, 5, rule=rule)
    assert levels.unique().tolist() == [-1, 0, 1, 2, 3]  # every level and "none"
    assert torch.equal(out, by_definition(feats, rois, levels, (3, 2), 2, True))
    assert out.is_contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)


def test_gradients_gradcheck_and_per_level():
    small = [f.requires_grad_() for f in maps(torch.float64, c=1, img=(32, 32))]
    rois = boxes(count=6).double() * torch.tensor([1.0, 0.25, 0.25, 0.25, 0.25], dtype=torch.float64)
    torch.autograd.gradcheck(lambda *f: roiops.multi_scale_roi_align(list(f), rois, 2, SCALES, 2, False), small)

    feats = maps(c=2)
    rois = boxes(count=6)

    feats = [f.requires_grad_() for f in feats]
    out = roiops.multi_scale_roi_align(feats, rois, 2, SCALES, 0, False)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(3))
    out.backward(g)
    levels = roiops.fpn_levels(rois, 2, 5)
    for level, f in enumerate(feats):
        chosen = (levels == level).nonzero().squeeze(1)
        ref = torch.ops.roiops._roi_align_backward(g[chosen], rois[chosen].float(), SCALES[level], 2, 2, *f.shape,
                                                   0, False, False)
        assert torch.equal(f.grad, ref)


def test_eager_call_equals_the_registered_op():
    """A plain eager call runs the kernels without the dispatcher; under a dispatch mode it
    calls the registered op: same bits, forward and each map's gradient."""
    rois = boxes(count=12)
    results = []
    for recorded in (False, True):
        feats = [f.requires_grad_() for f in maps(torch.float64, c=2)]
        recorder = RecordOps()
        with recorder if recorded else contextlib.nullcontext():
            assert roiops.ops._declare.direct(rois, *feats) is not recorded
            out = roiops.multi_scale_roi_align(feats, rois.double(), 3, SCALES, 2, True)
            out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(3), dtype=out.dtype))
        if recorded:
            assert "roiops.multi_scale_roi_align.default" in recorder.ops
            assert "roiops._multi_scale_roi_align_backward.default" in recorder.ops
        results.append((out, [f.grad for f in feats]))
    (out, grads), (out_op, grads_op) = results
    assert torch.equal(out, out_op)
    assert all(torch.equal(a, b) for a, b in zip(grads, grads_op))
    assert sum(int(g.ne(0).any()) for g in grads) >= 3  # the boxes reach several levels


def test_opcheck():
    feats = maps(c=2)
    rois = boxes(count=5)
    levels = roiops.fpn_levels(rois, 2, 5)
    torch.library.opcheck(torch.ops.roiops.multi_scale_roi_align.default,
                          (feats, rois, levels, SCALES, 2, 2, 2, True))


@needs_triton
@pytest.mark.parametrize("dtype,channels_last", [(torch.float32, False), (torch.bfloat16, True)])
def test_triton_one_launch_equals_single_level_kernels(dtype, channels_last):
    """The fused Triton kernels (forward, atomic and deterministic backward) against the
    single-level Triton kernels per level; bad levels give 0 and no gradient."""
    feats = maps(dtype, channels_last, device=DEVICE, img=(64, 64))
    rois = boxes(count=8).to(torch.float64 if dtype == torch.float64 else torch.float32).to(DEVICE)
    levels = roiops.fpn_levels(rois, 2, 5).to(DEVICE)
    levels[0], levels[1] = -1, 7
    out = rt.multi_scale_roi_align_forward(feats, rois, levels, SCALES, 3, 2, 0, True)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(4)).to(dtype).to(DEVICE)
    N, C = feats[0].shape[:2]
    heights, widths = [f.shape[2] for f in feats], [f.shape[3] for f in feats]
    grads = {det: rt.multi_scale_roi_align_backward(g, rois, levels, SCALES, 3, 2, N, C, heights, widths, 0, True,
                                                    channels_last, deterministic=det) for det in (False, True)}
    assert not out[:2].cpu().any()
    for level, f in enumerate(feats):
        chosen = (levels == level).nonzero().squeeze(1)
        ref = rt.roi_align_forward(f, rois[chosen], SCALES[level], 3, 2, 0, True)
        assert torch.equal(out[chosen].cpu(), ref.cpu())
        for det, gl in grads.items():
            ref = rt.roi_align_backward(g[chosen], rois[chosen], SCALES[level], 3, 2, N, C, *f.shape[2:], 0, True,
                                        channels_last, deterministic=det)
            assert gl[level].dtype == dtype and gl[level].shape == f.shape
            fmt = torch.channels_last if channels_last else torch.contiguous_format
            assert gl[level].is_contiguous(memory_format=fmt)
            torch.testing.assert_close(gl[level].cpu(), ref.cpu(), **tol(dtype))


@needs_triton
def test_public_api_through_triton_backward():
    feats = [f.requires_grad_() for f in maps(device=DEVICE)]
    rois = boxes().to(DEVICE)
    with roiops.use_backend("triton"):
        out = roiops.multi_scale_roi_align(feats, rois, 2, SCALES, 2, False)
        out.backward(torch.ones_like(out))
    ref_feats = [f.detach().cpu().requires_grad_() for f in feats]
    ref = roiops.multi_scale_roi_align(ref_feats, rois.cpu(), 2, SCALES, 2, False)
    ref.backward(torch.ones_like(ref))
    torch.testing.assert_close(out.detach().cpu(), ref.detach(), **tol(torch.float32))
    for f, r in zip(feats, ref_feats):
        torch.testing.assert_close(f.grad.cpu(), r.grad, **tol(torch.float32))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="host-device synchronisation exists only with a GPU")
def test_no_host_sync_on_cuda():
    feats = [f.requires_grad_() for f in maps(device="cuda")]
    rois = boxes().cuda()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = roiops.multi_scale_roi_align(feats, rois, 7, SCALES, 2, False)
        out.backward(torch.ones_like(out))
    finally:
        torch.cuda.set_sync_debug_mode(0)


def test_validation_names_the_argument():
    feats = maps()
    rois = boxes(count=3)
    with pytest.raises(ValueError, match="consecutive powers of two"):
        roiops.multi_scale_roi_align(feats, rois, 2, [1 / 4, 1 / 8, 1 / 32, 1 / 64])
    with pytest.raises(ValueError, match="one scale per feature map"):
        roiops.multi_scale_roi_align(feats, rois, 2, SCALES[:3])
    with pytest.raises(ValueError, match=r"features\[2\]"):
        roiops.multi_scale_roi_align([feats[0], feats[1], feats[2][:, :2]], rois, 2, SCALES[:3])
    with pytest.raises(ValueError, match="1 to 5 feature maps"):
        roiops.multi_scale_roi_align(feats + feats, rois, 2, SCALES + SCALES)
    with pytest.raises(ValueError, match="level_rule"):
        roiops.multi_scale_roi_align(feats, rois, 2, SCALES, level_rule="mmdet")
