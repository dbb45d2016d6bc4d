"""Drop-in namespaces roiops.compat.{torchvision, detectron2, mmcv}: peers' signatures,
defaults and reprs, and their numbers (torchvision itself, including a whole Faster R-CNN;
detectron2's and mmcv's published test vectors; mmcv's RoIPool kernel formula)."""

from __future__ import annotations

import inspect
import json
import math
from collections import OrderedDict
from pathlib import Path

import pytest
import torch
import torchvision
from torchvision.ops import poolers as tv_poolers

import roiops
from roiops._boxes import AXIS_ALIGNED
from roiops.compat import detectron2 as d2
from roiops.compat import mmcv
from roiops.compat import torchvision as tv

PEER_PATH = Path(__file__).resolve().parents[2] / "shared" / "conformance" / "peer_vectors.json"


def _params(fn) -> list[tuple[str, object, object]]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


def _equal(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a, b, rtol=0, atol=0)


# ---- torchvision -----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["roi_align", "roi_pool", "RoIAlign", "RoIPool", "MultiScaleRoIAlign"])
def test_torchvision_signatures(name):
    ours, theirs = getattr(tv, name), getattr(torchvision.ops, name)
    if inspect.isclass(ours):
        ours, theirs = ours.__init__, theirs.__init__
    assert _params(ours) == _params(theirs)


def test_torchvision_reprs():
    assert repr(tv.RoIAlign((7, 7), 1 / 16, 2)) == repr(torchvision.ops.RoIAlign((7, 7), 1 / 16, 2))
    assert repr(tv.RoIAlign(5, 0.25, 0, True)) == repr(torchvision.ops.RoIAlign(5, 0.25, 0, True))
    assert repr(tv.RoIPool(7, 0.5)) == repr(torchvision.ops.RoIPool(7, 0.5))
    assert repr(tv.MultiScaleRoIAlign(["0", "1"], 7, 2)) == repr(torchvision.ops.MultiScaleRoIAlign(["0", "1"], 7, 2))


@pytest.mark.parametrize("aligned", [False, True])
@pytest.mark.parametrize("sampling_ratio", [-1, 0, 2])
def test_torchvision_roi_align_forward_backward(aligned, sampling_ratio):
    g = torch.Generator().manual_seed(sampling_ratio + 5 * aligned)
    x = torch.randn(2, 4, 12, 15, generator=g)
    boxes = AXIS_ALIGNED.random(2, 17, 60, 48, g)
    boxes[:3, 1:] -= 6  # partly outside the map
    for b in (boxes, [boxes[boxes[:, 0] == i, 1:] for i in range(2)]):
        xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
        ours = tv.roi_align(xa, b, (3, 4), 0.25, sampling_ratio, aligned)
        theirs = torchvision.ops.roi_align(xb, b, (3, 4), 0.25, sampling_ratio, aligned)
        _equal(ours, theirs)
        grad = torch.randn(ours.shape, generator=g)
        ours.backward(grad)
        theirs.backward(grad)
        _equal(xa.grad, xb.grad)
    module = tv.RoIAlign((3, 4), 0.25, sampling_ratio, aligned)
    _equal(module(x, boxes), torchvision.ops.RoIAlign((3, 4), 0.25, sampling_ratio, aligned)(x, boxes))


def test_torchvision_roi_pool_forward_backward_and_short_box_list():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(3, 4, 12, 15, generator=g)
    boxes = AXIS_ALIGNED.random(2, 17, 60, 48, g)
    per_image = [boxes[boxes[:, 0] == i, 1:] for i in range(2)]  # 2 lists for 3 images: allowed
    for b in (boxes, per_image):
        xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
        ours, theirs = tv.roi_pool(xa, b, 3, 0.25), torchvision.ops.roi_pool(xb, b, 3, 0.25)
        _equal(ours, theirs)
        ours.sum().backward()
        theirs.sum().backward()
        _equal(xa.grad, xb.grad)
    _equal(tv.roi_align(x, per_image, 2, 0.25), torchvision.ops.roi_align(x, per_image, 2, 0.25))
    _equal(tv.RoIPool(3, 0.25)(x, boxes), torchvision.ops.RoIPool(3, 0.25)(x, boxes))


def _fpn(image_sizes: list[tuple[int, int]], channels: int = 4, seed: int = 0):
    """Features of a padded batch (multiple of 32) at strides 4..32, plus the 'pool' level."""
    g = torch.Generator().manual_seed(seed)
    h = max(s[0] for s in image_sizes)
    w = max(s[1] for s in image_sizes)
    h, w = math.ceil(h / 32) * 32, math.ceil(w / 32) * 32
    feats = OrderedDict((str(i), torch.randn(len(image_sizes), channels, h // 2 ** (i + 2), w // 2 ** (i + 2),
                                             generator=g)) for i in range(4))
    feats["pool"] = torch.randn(len(image_sizes), channels, h // 64, w // 64, generator=g)
    return feats


def _proposals(image_sizes: list[tuple[int, int]], seed: int = 0) -> list[torch.Tensor]:
    """Boxes from a few pixels to the whole image, so every level is used."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for h, w in image_sizes:
        size = torch.exp(torch.rand(40, 2, generator=g) * math.log(300)) + 1
        xy = torch.rand(40, 2, generator=g) * torch.tensor([w, h])
        boxes = torch.cat([xy, xy + size], dim=1)
        # exactly on level boundaries (sqrt(area) = 224 * 2^k), tiny, inverted
        boxes = torch.cat([boxes, torch.tensor([[0.0, 0.0, 112.0, 112.0], [3.0, 4.0, 59.0, 60.0],
                                                [10.0, 10.0, 10.5, 10.25], [50.0, 40.0, 20.0, 30.0]])])
        out.append(boxes)
    return out


@pytest.mark.parametrize("names,output_size,sampling_ratio", [
    (["0", "1", "2", "3"], 7, 2), (["0", "1", "2", "3"], (5, 3), 0), (["1", "3"], 4, -1), (["2"], 7, 2),
    (["0", "1", "2", "3", "pool"], 7, 2)])
def test_multiscale_roi_align_matches_torchvision(names, output_size, sampling_ratio):
    sizes = [(200, 256), (160, 224), (189, 240)]
    feats, boxes = _fpn(sizes), _proposals(sizes)
    ours = tv.MultiScaleRoIAlign(names, output_size, sampling_ratio)
    theirs = torchvision.ops.MultiScaleRoIAlign(names, output_size, sampling_ratio)
    _equal(ours(feats, boxes, sizes), theirs(feats, boxes, sizes))
    assert ours.scales == theirs.scales
    assert (ours.map_levels.k_min, ours.map_levels.k_max) == (theirs.map_levels.k_min, theirs.map_levels.k_max)
    # the scales are fixed at the first call, as torchvision's
    smaller = [(s[0] // 2, s[1] // 2) for s in sizes]
    _equal(ours(feats, boxes, smaller), theirs(feats, boxes, smaller))


def test_level_mapper_matches_torchvision():
    side = torch.tensor([1.0, 13.9, 55.99, 56.0, 111.99, 112.0, 112.01, 224.0, 447.9, 448.0, 1000.0, 3000.0])
    boxes = [torch.stack([torch.zeros_like(side), torch.zeros_like(side), side, side], 1),
             torch.tensor([[5.0, 5.0, 5.0, 9.0], [4.0, 4.0, 2.0, 9.0]])]  # zero and negative area
    for k_min, k_max in ((2, 5), (3, 4), (2, 6)):
        for dtype in (torch.float32, torch.float64):
            b = [t.to(dtype) for t in boxes]
            ours, theirs = tv.LevelMapper(k_min, k_max)(b), tv_poolers.LevelMapper(k_min, k_max)(b)
            _equal(ours[:-1], theirs[:-1])
            # Negative area: torchvision casts a NaN level to an arbitrary int64, roiops
            # gives -1; neither matches a level, so the box pools to 0 in both.
            assert ours[-1] == -1 and not 0 <= theirs[-1] <= k_max - k_min


def test_fasterrcnn_with_our_pooler_gives_the_same_detections():
    from torchvision.models.detection import fasterrcnn_resnet50_fpn

    torch.manual_seed(0)
    model = fasterrcnn_resnet50_fpn(weights=None, weights_backbone=None, min_size=128, max_size=160,
                                    box_score_thresh=0.0).eval()
    g = torch.Generator().manual_seed(1)
    images = [torch.rand(3, 120, 150, generator=g), torch.rand(3, 96, 140, generator=g)]

    def run():
        pooled = []
        hook = model.roi_heads.box_roi_pool.register_forward_hook(lambda m, i, o: pooled.append(o))
        with torch.no_grad():
            detections = model(images)
        hook.remove()
        return detections, pooled[0]

    expected, expected_pooled = run()
    theirs = model.roi_heads.box_roi_pool
    model.roi_heads.box_roi_pool = tv.MultiScaleRoIAlign(theirs.featmap_names, theirs.output_size,
                                                         theirs.sampling_ratio)
    got, got_pooled = run()
    assert isinstance(model.roi_heads.box_roi_pool, tv.MultiScaleRoIAlign)
    assert expected_pooled.shape[0] > 0
    _equal(got_pooled, expected_pooled)
    assert sum(len(d["boxes"]) for d in expected) > 0
    for e, o in zip(expected, got):
        torch.testing.assert_close(o["boxes"], e["boxes"], rtol=0, atol=1e-5)
        torch.testing.assert_close(o["scores"], e["scores"], rtol=0, atol=1e-5)
        assert torch.equal(o["labels"], e["labels"])


# ---- detectron2 ------------------------------------------------------------------------


def test_detectron2_signature_default_and_repr():
    assert _params(d2.ROIAlign.__init__) == _params(lambda self, output_size, spatial_scale, sampling_ratio,
                                                   aligned=True: None)
    assert repr(d2.ROIAlign((7, 7), 0.0625, 0)) == \
        "ROIAlign(output_size=(7, 7), spatial_scale=0.0625, sampling_ratio=0, aligned=True)"
    assert d2.roi_align is tv.roi_align  # detectron2.layers.roi_align is torchvision's


def test_detectron2_matches_torchvision_aligned_and_empty_boxes_give_zeros():
    g = torch.Generator().manual_seed(4)
    x = torch.randn(2, 4, 12, 15, generator=g)
    boxes = AXIS_ALIGNED.random(2, 17, 60, 48, g)
    for ratio in (0, 2):
        _equal(d2.ROIAlign((3, 3), 0.25, ratio)(x, boxes), torchvision.ops.roi_align(x, boxes, 3, 0.25, ratio, True))
    # detectron2's test_empty_box: a zero-height box pools to zeros with a zero gradient
    xg = x.clone().requires_grad_()
    out = d2.ROIAlign(7, 1.0, 0)(xg, torch.tensor([[0.0, 1.0, 1.0, 3.0, 1.0]]))
    out.sum().backward()
    assert not out.any() and not xg.grad.any()
    with pytest.raises(ValueError, match=r"Tensor\[K, 5\]"):
        d2.ROIAlign(7, 1.0, 0)(x, boxes[:, 1:])


def test_detectron2_casts_boxes_to_the_input_dtype():
    x = torch.randn(1, 2, 40, 40).half()
    rois = torch.tensor([[0, 1.3, 2.7, 30.1, 25.03]])
    assert torch.equal(d2.ROIAlign(3, 0.5, 2)(x, rois), roiops.roi_align(x, rois.half(), 3, 0.5, 2, True))


# ---- mmcv -------------------------------------------------------------------------------


def test_mmcv_signatures_defaults_and_reprs():
    assert _params(mmcv.roi_align) == _params(lambda input, rois, output_size, spatial_scale=1.0, sampling_ratio=0,
                                              pool_mode="avg", aligned=True: None)
    assert _params(mmcv.roi_pool) == _params(lambda input, rois, output_size, spatial_scale=1.0: None)
    assert _params(mmcv.RoIAlign.__init__) == _params(
        lambda self, output_size, spatial_scale=1.0, sampling_ratio=0, pool_mode="avg", aligned=True,
        use_torchvision=False: None)
    assert _params(mmcv.RoIPool.__init__) == _params(lambda self, output_size, spatial_scale=1.0: None)
    assert repr(mmcv.RoIAlign(7, 1 / 16)) == ("RoIAlign(output_size=(7, 7), spatial_scale=0.0625, sampling_ratio=0, "
                                              "pool_mode=avg, aligned=True, use_torchvision=False)")
    assert repr(mmcv.RoIPool((7, 6), 0.25)) == "RoIPool(output_size=(7, 6), spatial_scale=0.25)"
    assert mmcv.RoIAlign(7, sampling_ratio=2.0).sampling_ratio == 2  # a config's 2.0 is fine
    with pytest.raises(ValueError):
        mmcv.RoIAlign(7, sampling_ratio=2.5)  # mmcv would silently truncate
    with pytest.raises(ValueError, match="pool_mode"):
        mmcv.roi_align(torch.zeros(1, 1, 4, 4), torch.zeros(1, 5), 2, pool_mode="sum")


@pytest.mark.parametrize("layer", [mmcv.RoIAlign, mmcv.RoIAlignRotated])
def test_mmcv_deprecated_keywords(layer):
    with pytest.warns(DeprecationWarning) as caught:
        old = layer(out_size=(3, 4), spatial_scale=0.5, sample_num=2)
    assert [str(w.message) for w in caught] == [
        f'"{old}" is deprecated in `{layer.__name__}`, please use "{new}" instead'
        for old, new in (("out_size", "output_size"), ("sample_num", "sampling_ratio"))]
    assert repr(old) == repr(layer(output_size=(3, 4), spatial_scale=0.5, sampling_ratio=2))
    assert (old.output_size, old.sampling_ratio) == ((3, 4), 2)
    with pytest.raises(TypeError, match="'sample_num' and 'sampling_ratio'"):
        layer(7, sample_num=2, sampling_ratio=2)
    with pytest.raises(ValueError, match="sampling_ratio"), pytest.warns(DeprecationWarning):
        layer(7, sample_num=2.5)


def test_mmcv_roi_align_modes():
    g = torch.Generator().manual_seed(6)
    x = torch.randn(2, 4, 12, 15, generator=g)
    boxes = AXIS_ALIGNED.random(2, 17, 60, 48, g)
    for mode in ("avg", "max"):
        expected = roiops.roi_align(x, boxes, 7, 0.25, 0, True, mode=mode)
        _equal(mmcv.roi_align(x, boxes, 7, 0.25, pool_mode=mode), expected)
        _equal(mmcv.RoIAlign(7, 0.25, pool_mode=mode)(x, boxes), expected)
        # use_torchvision=True runs torchvision's roi_align in mmcv: always an average
        _equal(mmcv.RoIAlign(7, 0.25, 2, pool_mode=mode, use_torchvision=True)(x, boxes),
               torchvision.ops.roi_align(x, boxes, 7, 0.25, 2, True))


def _mmcv_roi_pool_kernel(x: torch.Tensor, rois: torch.Tensor, ph: int, pw: int, scale: float) -> torch.Tensor:
    """mmcv's CUDA RoIPool written out per bin: continuous coordinates, x2 + 1, no rounding."""
    out = torch.zeros(len(rois), x.shape[1], ph, pw)
    f32 = torch.float32
    s = torch.tensor(scale, dtype=f32)
    for k, r in enumerate(rois.to(f32)):
        x1, y1 = r[1] * s, r[2] * s
        roi_w, roi_h = (r[3] + 1) * s - x1, (r[4] + 1) * s - y1
        if roi_w <= 0 or roi_h <= 0:
            continue
        bw, bh = roi_w / pw, roi_h / ph
        for i in range(ph):
            h0 = min(max(int(torch.floor(i * bh + y1)), 0), x.shape[2])
            h1 = min(max(int(torch.ceil((i + 1) * bh + y1)), 0), x.shape[2])
            for j in range(pw):
                w0 = min(max(int(torch.floor(j * bw + x1)), 0), x.shape[3])
                w1 = min(max(int(torch.ceil((j + 1) * bw + x1)), 0), x.shape[3])
                if h1 > h0 and w1 > w0:
                    out[k, :, i, j] = x[int(r[0]), :, h0:h1, w0:w1].amax(dim=(1, 2))
    return out


def test_mmcv_roi_pool_is_the_continuous_convention():
    g = torch.Generator().manual_seed(8)
    x = torch.randn(2, 3, 10, 12, generator=g)
    boxes = torch.cat([AXIS_ALIGNED.random(2, 12, 48, 40, g),
                       torch.tensor([[0, 0.4, 0.4, 2.6, 2.6], [1, 5.5, 3.5, 6.5, 9.5], [0, 9.0, 9.0, 3.0, 20.0],
                                     [1, -8.0, -6.0, 50.0, 44.0]])])
    expected = _mmcv_roi_pool_kernel(x, boxes, 3, 2, 0.25)
    _equal(mmcv.roi_pool(x, boxes, (3, 2), 0.25), expected)
    _equal(mmcv.RoIPool((3, 2), 0.25)(x, boxes), expected)
    assert not torch.equal(expected, roiops.roi_pool(x, boxes, (3, 2), 0.25))  # not Caffe's


def _peer_entries(source: str) -> list:
    if not PEER_PATH.exists():
        return [pytest.param(None, id="peer-vectors-missing")]
    entries = json.loads(PEER_PATH.read_text())
    return [pytest.param(e, id=f"{e['op']}-{e['case_index']}") for e in entries
            if e["source"].startswith(source) and e["op"] in ("roi_align", "roi_pool")
            and isinstance(e["input"], list) and isinstance(e.get("expected_output"), list)]


def _run_peer(entry, layer) -> None:
    if entry is None:
        pytest.skip(f"{PEER_PATH} not found")
    x = torch.tensor(entry["input"], dtype=torch.float64, requires_grad=True)
    rois = torch.tensor(entry["rois"], dtype=torch.float64)
    out = layer(x, rois)
    torch.testing.assert_close(out, torch.tensor(entry["expected_output"], dtype=torch.float64),
                               rtol=0, atol=1e-3, check_dtype=False)
    if isinstance(entry.get("expected_grad"), list):
        out.sum().backward()
        torch.testing.assert_close(x.grad, torch.tensor(entry["expected_grad"], dtype=torch.float64),
                                   rtol=0, atol=1e-3)


@pytest.mark.parametrize("entry", _peer_entries("open-mmlab/mmcv"))
def test_mmcv_published_vectors(entry):
    if entry is not None and entry["op"] == "roi_pool":
        p = entry["params"]
        _run_peer(entry, mmcv.RoIPool(tuple(p["output_size"]), p["spatial_scale"]))
    elif entry is not None:
        p = entry["params"]
        _run_peer(entry, mmcv.RoIAlign(tuple(p["output_size"]), p["spatial_scale"], p["sampling_ratio"],
                                       p["pool_mode"], p["aligned"]))
    else:
        _run_peer(entry, None)


@pytest.mark.parametrize("entry", _peer_entries("facebookresearch/detectron2"))
def test_detectron2_published_vectors(entry):
    if entry is None:
        _run_peer(entry, None)
        return
    p = entry["params"]
    _run_peer(entry, d2.ROIAlign(tuple(p["output_size"]), p["spatial_scale"], p["sampling_ratio"], p["aligned"]))
