"""A whole torchvision Mask R-CNN with roiops plugged in as a user would (its two poolers
replaced by roiops.compat.torchvision.MultiScaleRoIAlign, its mask steps patched with the
drop-ins) gives the stock model's detections, pasted masks and training losses exactly."""

from __future__ import annotations

import copy

import pytest
import torch
import torchvision.models.detection.roi_heads as tv_roi_heads
import torchvision.models.detection.transform as tv_transform
from torchvision.models.detection import maskrcnn_resnet50_fpn

from roiops.compat import torchvision as tv

NUM_CLASSES = 4


@pytest.fixture(scope="module")
def stock():
    with torch.random.fork_rng(devices=[]):  # seeded, leaving the global RNG as it was
        torch.manual_seed(0)
        model = maskrcnn_resnet50_fpn(weights=None, weights_backbone=None, num_classes=NUM_CLASSES, min_size=256,
                                      max_size=320)
    # A random-init model scores every class about equally: keep all its boxes so that
    # masks get pasted.
    model.roi_heads.score_thresh = 0.0
    model.roi_heads.detections_per_img = 20
    return model


def with_roiops(model: torch.nn.Module, monkeypatch: pytest.MonkeyPatch) -> tuple[torch.nn.Module, dict]:
    """A copy of ``model`` with roiops' poolers, and torchvision's mask steps patched to the
    drop-ins for the test; returns the copy and the count of calls to each drop-in."""
    model = copy.deepcopy(model)
    for name in ("box_roi_pool", "mask_roi_pool"):
        theirs = getattr(model.roi_heads, name)
        setattr(model.roi_heads, name, tv.MultiScaleRoIAlign(
            theirs.featmap_names, theirs.output_size, theirs.sampling_ratio,
            canonical_scale=theirs.canonical_scale, canonical_level=theirs.canonical_level))
    calls = {"paste": 0, "project": 0}

    def paste(*args, **kwargs):
        calls["paste"] += 1
        return tv.paste_masks_in_image(*args, **kwargs)

    def project(*args, **kwargs):
        calls["project"] += 1
        return tv.project_masks_on_boxes(*args, **kwargs)

    # GeneralizedRCNNTransform.postprocess pastes with the name transform.py imported from
    # roi_heads, so both modules' names are patched.
    monkeypatch.setattr(tv_roi_heads, "paste_masks_in_image", paste)
    monkeypatch.setattr(tv_transform, "paste_masks_in_image", paste)
    monkeypatch.setattr(tv_roi_heads, "project_masks_on_boxes", project)
    return model, calls


def images() -> list[torch.Tensor]:
    # Two sizes: the batch is padded, and the masks are pasted at each image's own size.
    g = torch.Generator().manual_seed(1)
    return [torch.rand(3, 200, 260, generator=g), torch.rand(3, 180, 240, generator=g)]


def targets(shapes: list[tuple[int, int]]) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(2)
    out = []
    for h, w in shapes:
        boxes = []
        masks = torch.zeros(3, h, w, dtype=torch.uint8)
        for i in range(3):
            x1 = int(torch.randint(0, w // 2, (), generator=g))
            y1 = int(torch.randint(0, h // 2, (), generator=g))
            x2 = x1 + int(torch.randint(30, w // 2, (), generator=g))
            y2 = y1 + int(torch.randint(30, h // 2, (), generator=g))
            boxes.append([x1, y1, x2, y2])
            # An ellipse in its box, so that the targets are not all ones.
            yy, xx = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
            cx, cy, rx, ry = (x1 + x2) / 2, (y1 + y2) / 2, (x2 - x1) / 2, (y2 - y1) / 2
            masks[i] = (((xx - cx) / rx) ** 2 + ((yy - cy) / ry) ** 2 <= 1).to(torch.uint8)
        out.append({"boxes": torch.tensor(boxes, dtype=torch.float32),
                    "labels": torch.randint(1, NUM_CLASSES, (3,), generator=g),
                    "masks": masks})
    return out


def test_eval_detections_and_pasted_masks_equal_torchvision(stock, monkeypatch):
    stock = copy.deepcopy(stock).eval()
    with torch.no_grad():
        expected = stock(images())
    ours, calls = with_roiops(stock, monkeypatch)
    with torch.no_grad():
        got = ours(images())

    assert calls["paste"] == len(expected)
    for e, o, x in zip(expected, got, images()):
        assert len(e["boxes"]) > 0
        assert e["masks"].shape == (len(e["boxes"]), 1, *x.shape[1:])
        assert e["masks"].amax() > 0.1  # masks with something in them were pasted
        for key in ("boxes", "labels", "scores", "masks"):
            assert o[key].dtype == e[key].dtype
            assert torch.equal(o[key], e[key]), key


def test_train_losses_equal_torchvision(stock, monkeypatch):
    batch = images()
    truth = targets([tuple(x.shape[1:]) for x in batch])
    # Train mode updates BatchNorm's running statistics: each run starts from its own copy.
    # The proposal sampler draws at random: both runs from the same seed.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(3)
        expected = copy.deepcopy(stock).train()(batch, truth)
    ours, calls = with_roiops(stock, monkeypatch)  # patched after the stock run: the patch is global
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(3)
        got = ours.train()(batch, truth)

    assert calls["project"] == len(batch)
    assert set(got) == set(expected) == {"loss_classifier", "loss_box_reg", "loss_mask", "loss_objectness",
                                         "loss_rpn_box_reg"}
    for key in expected:
        assert torch.isfinite(expected[key]) and expected[key] > 0, key
        assert torch.equal(got[key], expected[key]), key
