"""Mask pasting and mask targets: the C++ kernels against the reference (grid_sample and
F.interpolate, the peers' own primitives) and the drop-ins against torchvision's functions
and detectron2's documented definition; errors; compile and export."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import torchvision
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torchvision.models.detection import roi_heads

import roiops
import roiops.reference as reference
from roiops.compat import detectron2 as d2
from roiops.compat import torchvision as tv
from roiops.ops.paste_masks import paste, paste_torchvision


def boxes_in(k: int, height: int, width: int, largest: float, seed: int = 0) -> torch.Tensor:
    """Boxes of 0.3 to ``largest`` pixels, some partly or wholly outside the image, plus a
    zero-width, an inverted and a sub-pixel box."""
    g = torch.Generator().manual_seed(seed)
    xy = torch.rand(k, 2, generator=g) * torch.tensor([width + 40.0, height + 40.0]) - 30
    wh = torch.rand(k, 2, generator=g) * largest + 0.3
    boxes = torch.cat([xy, xy + wh], dim=1)
    boxes[0] = torch.tensor([5.0, 5.0, 5.0, 30.0])
    boxes[1] = torch.tensor([50.0, 40.0, 20.0, 60.0])
    boxes[2] = torch.tensor([10.2, 11.7, 10.4, 11.9])
    return boxes


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("threshold", [None, 0.5, 0.25])
@pytest.mark.parametrize("box_window", [False, True])
def test_paste_continuous_equals_reference(dtype: torch.dtype, threshold: float | None, box_window: bool) -> None:
    masks = torch.rand(24, 28, 20, dtype=dtype, generator=torch.Generator().manual_seed(1))
    boxes = boxes_in(24, 70, 90, 80.0).to(dtype)
    got = paste(masks, boxes, 70, 90, threshold, box_window)
    expected = reference.paste_masks_forward(masks, boxes, 70, 90, 0.0 if threshold is None else threshold,
                                             threshold is not None, box_window)
    assert got.dtype == (torch.bool if threshold is not None else dtype)
    assert torch.equal(got, expected)


def test_paste_masks_public() -> None:
    masks = torch.rand(6, 1, 14, 14)
    boxes = boxes_in(6, 40, 50, 30.0).double()  # any floating dtype: converted to float32
    out = roiops.paste_masks(masks, boxes, (40, 50))
    assert out.shape == (6, 40, 50) and out.dtype == torch.bool
    assert torch.equal(out, reference.paste_masks_forward(masks[:, 0], boxes.float(), 40, 50, 0.5, True, False))
    assert not out[0].any() and not out[1].any()  # zero-width and inverted boxes paste nothing
    soft = roiops.paste_masks(masks, boxes, (40, 50), threshold=None)
    assert soft.dtype == torch.float32 and torch.equal(soft >= 0.5, out)
    with roiops.use_backend("reference"):
        assert torch.equal(roiops.paste_masks(masks, boxes, (40, 50)), out)


def detectron2_paste(masks: torch.Tensor, boxes: torch.Tensor, shape: tuple[int, int], threshold: float) -> torch.Tensor:
    """detectron2's paste_masks_in_image on the CPU by its definition: per mask, the window
    [floor(x1) - 1, ceil(x2) + 1) of pixel centres mapped to [-1, 1] over the box and
    sampled by grid_sample; bool ``>= threshold``, or uint8 ``value * 255``."""
    h, w = shape
    out = torch.zeros(len(masks), h, w, dtype=torch.bool if threshold >= 0 else torch.uint8)
    for i in range(len(masks)):
        x1, y1, x2, y2 = boxes[i]
        c0, r0 = max(int(x1.floor()) - 1, 0), max(int(y1.floor()) - 1, 0)
        c1, r1 = min(int(x2.ceil()) + 1, w), min(int(y2.ceil()) + 1, h)
        if c1 <= c0 or r1 <= r0:
            continue
        gx = (torch.arange(c0, c1, dtype=torch.float32) + 0.5 - x1) / (x2 - x1) * 2 - 1
        gy = (torch.arange(r0, r1, dtype=torch.float32) + 0.5 - y1) / (y2 - y1) * 2 - 1
        grid = torch.stack([gx[None, :].expand(len(gy), -1), gy[:, None].expand(-1, len(gx))], dim=2)
        v = F.grid_sample(masks[i][None, None], grid[None], align_corners=False)[0, 0]
        out[i, r0:r1, c0:c1] = v >= threshold if threshold >= 0 else (v * 255).to(torch.uint8)
    return out


@pytest.mark.parametrize("threshold", [0.5, 0.3, -1.0])
def test_detectron2_paste_masks_in_image(threshold: float) -> None:
    masks = torch.rand(40, 28, 28, generator=torch.Generator().manual_seed(2))
    boxes = boxes_in(40, 120, 160, 120.0, seed=3)
    boxes[0, 2] += 1.0  # detectron2 divides by the width: keep its boxes non-degenerate
    got = d2.paste_masks_in_image(masks, boxes, (120, 160), threshold)
    assert torch.equal(got, detectron2_paste(masks, boxes, (120, 160), threshold))
    assert d2.paste_masks_in_image(masks[:0], boxes[:0], (5, 6)).shape == (0, 5, 6)


def test_torchvision_paste_masks_in_image() -> None:
    masks = torch.rand(80, 1, 28, 28, generator=torch.Generator().manual_seed(4))
    g = torch.Generator().manual_seed(5)
    xy = torch.rand(80, 2, generator=g) * torch.tensor([200.0, 150.0])
    # box sides 1 to 250 pixels: ATen resizes outputs of height + width up to 128 in one
    # pass and larger ones in two, with other roundings; both are reproduced
    boxes = torch.cat([xy, xy + torch.rand(80, 2, generator=g) * 250 + 1], dim=1)
    for m, b in ((masks, boxes), (masks.double(), boxes.double())):
        expected = roi_heads.paste_masks_in_image(m, b, (150, 200))
        got = tv.paste_masks_in_image(m, b, (150, 200))
        assert got.dtype == expected.dtype and torch.equal(got, expected)
    assert tv.paste_masks_in_image(masks[:0], boxes[:0], (7, 8)).shape == (0, 1, 7, 8)


def test_paste_torchvision_equals_reference() -> None:
    masks = torch.rand(10, 14, 14, generator=torch.Generator().manual_seed(6))
    boxes = torch.tensor([[0, 0, 9, 9], [-5, -3, 20, 40], [30, 30, 29, 29], [40, 2, 90, 5], [3, 3, 3, 3],
                          [-20, -20, -2, -2], [10, 50, 12, 200], [0, 0, 63, 63], [5, 5, 100, 6], [60, 1, 61, 70]])
    got = paste_torchvision(masks, boxes, 64, 80, 1, True)
    expected = reference.paste_masks_torchvision_forward(masks, boxes, 64, 80, 1, True)
    assert torch.equal(got, expected)
    assert not got[5].any()  # wholly outside (torchvision itself raises there): zeros


@pytest.mark.parametrize("dtype", [torch.bool, torch.uint8, torch.float32, torch.float64])
@pytest.mark.parametrize("aligned,sampling_ratio", [(False, -1), (True, 0), (True, 2)])
def test_mask_targets_equal_roi_align(dtype: torch.dtype, aligned: bool, sampling_ratio: int) -> None:
    g = torch.Generator().manual_seed(7)
    masks = (torch.rand(5, 60, 80, generator=g) > 0.5).to(dtype)
    indices = torch.randint(0, 5, (40,), generator=g)
    boxes = boxes_in(40, 60, 80, 50.0, seed=8)
    inverted = boxes[1].clone()
    boxes[1] = torch.tensor([20.0, 40.0, 50.0, 60.0])  # torchvision fails on it (aligned, adaptive): below
    coords = torch.float64 if dtype == torch.float64 else torch.float32
    rois = torch.cat([indices[:, None].to(coords), boxes.to(coords)], dim=1)
    expected = torchvision.ops.roi_align(masks[:, None].to(coords), rois, (14, 14), 1.0, sampling_ratio, aligned)[:, 0]
    got = roiops.mask_targets(masks, boxes, indices, 14, aligned=aligned, sampling_ratio=sampling_ratio)
    assert got.dtype == (dtype if dtype.is_floating_point else torch.float32)
    assert torch.equal(got, expected.to(got.dtype))
    assert torch.equal(roiops.mask_targets(masks, boxes, indices, 14, aligned=aligned, sampling_ratio=sampling_ratio,
                                           threshold=0.5), expected >= 0.5)
    if aligned and sampling_ratio <= 0:  # an empty adaptive grid: 0 (docs/semantics.md)
        assert not roiops.mask_targets(masks, inverted[None], indices[:1], 14, aligned=aligned,
                                       sampling_ratio=sampling_ratio).any()
    with roiops.use_backend("reference"):  # the reference sums in its own order
        torch.testing.assert_close(roiops.mask_targets(masks, boxes, indices, 14, aligned=aligned,
                                                       sampling_ratio=sampling_ratio), got, atol=1e-6, rtol=1e-6)


def test_project_masks_on_boxes_and_bitmasks() -> None:
    g = torch.Generator().manual_seed(9)
    gt = torch.rand(6, 90, 120, generator=g) > 0.4
    boxes = boxes_in(50, 90, 120, 70.0, seed=10)
    idx = torch.randint(0, 6, (50,), generator=g)
    for masks in (gt, gt.to(torch.uint8), gt.float()):
        assert torch.equal(tv.project_masks_on_boxes(masks, boxes, idx, 28),
                           roi_heads.project_masks_on_boxes(masks, boxes, idx, 28))
    boxes[1] = torch.tensor([20.0, 40.0, 50.0, 60.0])  # torchvision fails on an inverted box (aligned)
    rois = torch.cat([torch.arange(6.0)[:, None], boxes[:6]], dim=1)
    expected = torchvision.ops.roi_align(gt[:, None].float(), rois, (28, 28), 1.0, 0, True)[:, 0] >= 0.5
    assert torch.equal(d2.bitmasks_crop_and_resize(gt, boxes[:6], 28), expected)


def test_errors() -> None:
    masks = torch.zeros(3, 10, 10, dtype=torch.bool)
    boxes = torch.zeros(4, 4)
    with pytest.raises(ValueError, match=r"indices\[1\] = 3 is not a mask index in \[0, 3\)"):
        roiops.mask_targets(masks, boxes, torch.tensor([0, 3, 1, 2]), 7)
    with pytest.raises(ValueError, match="indices must be \\[P\\]"):
        roiops.mask_targets(masks, boxes, torch.tensor([0, 1]), 7)
    with pytest.raises(ValueError, match="indices must be integers"):
        roiops.mask_targets(masks, boxes, torch.zeros(4), 7)
    with pytest.raises(ValueError, match="masks must be bool, uint8 or floating point"):
        roiops.mask_targets(masks.int(), boxes, torch.zeros(4, dtype=torch.int64), 7)
    with pytest.raises(ValueError, match="boxes row 2"):
        roiops.mask_targets(masks, torch.tensor([[0, 0, 1, 1.0]] * 2 + [[0, float("nan"), 1, 1]]),
                            torch.zeros(3, dtype=torch.int64), 7)
    soft = torch.rand(3, 8, 8)
    with pytest.raises(ValueError, match="boxes must be \\[K, 4\\]"):
        roiops.paste_masks(soft, boxes, (10, 10))
    with pytest.raises(ValueError, match="image_size must be"):
        roiops.paste_masks(soft, boxes[:3], (10, -1))
    with pytest.raises(ValueError, match="masks must be floating point"):
        roiops.paste_masks(soft.bool(), boxes[:3], (10, 10))
    with pytest.raises(ValueError, match="threshold must be a finite"):
        roiops.paste_masks(soft, boxes[:3], (10, 10), threshold=float("nan"))
    with pytest.raises(ValueError, match="boxes row 0"):
        roiops.paste_masks(soft, torch.tensor([[0, 0, float("inf"), 1]] * 3), (10, 10))


@pytest.mark.parametrize("backend", ["cpu", "reference"])
def test_kernel_checks_agree(backend: str) -> None:
    """A direct op call with bad arguments: the same ValueError from every backend."""
    masks, rois = torch.rand(2, 8, 8), torch.zeros(3, 5)
    calls = [
        (lambda: torch.ops.roiops.mask_targets(masks, rois[:, :4], 4, 4, 0, True, 0.5, False), "rois must be \\[K, 5\\]"),
        (lambda: torch.ops.roiops.mask_targets(masks.int(), rois, 4, 4, 0, True, 0.5, False), "masks must be bool"),
        (lambda: torch.ops.roiops.mask_targets(masks, rois, 0, 4, 0, True, 0.5, False), "output size must be"),
        (lambda: torch.ops.roiops.paste_masks(masks, rois[:2, :4].double(), 5, 5, 0.5, True, False), "boxes must be float32"),
        (lambda: torch.ops.roiops.paste_masks(masks, rois[:, :4], 5, 5, 0.5, True, False), "boxes must be \\[K, 4\\]"),
        (lambda: torch.ops.roiops.paste_masks_torchvision(masks, rois[:2, :4], 5, 5, 1, True), "boxes must be int64"),
    ]
    with roiops.use_backend(backend):
        for call, message in calls:
            with pytest.raises(ValueError, match="roiops: " + message):
                call()


def test_compile_and_export() -> None:
    class Head(torch.nn.Module):
        def forward(self, masks: torch.Tensor, boxes: torch.Tensor, gt: torch.Tensor, idx: torch.Tensor) -> tuple:
            return roiops.paste_masks(masks, boxes, (32, 48)), roiops.mask_targets(gt, boxes, idx, 7, threshold=0.5)

    args = (torch.rand(5, 14, 14), boxes_in(5, 32, 48, 20.0), torch.rand(2, 32, 48) > 0.5, torch.tensor([0, 1, 1, 0, 1]))
    expected = Head()(*args)
    compiled = torch.compile(Head(), fullgraph=True, backend="eager")(*args)
    exported = torch.export.export(Head(), args).module()(*args)
    for got in (compiled, exported):
        assert all(torch.equal(a, b) for a, b in zip(got, expected))


@pytest.fixture
def fused_interpreter(monkeypatch):
    """On a CPU, the Triton kernels run in Triton's interpreter, which evaluates ``tl.fma`` as
    a multiply and an add (two roundings); compiled, it is fma.rn (one rounding, as the
    CPU kernels' std::fma: tests/test_ptx.py). The interpreter gets a fused one here:
    float32 through float64 (the product is exact there), float64 exactly."""
    if torch.cuda.is_available():
        return
    from triton.runtime import interpreter

    def fma64(a: float, b: float, c: float) -> float:
        finite = np.isfinite(a) and np.isfinite(b) and np.isfinite(c)
        return float(Fraction(a) * Fraction(b) + Fraction(c)) if finite else a * b + c

    exact = np.vectorize(fma64, otypes=[np.float64])

    def fused64(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
        # in long double (64-bit significand: off by at most one unit there), exactly where
        # that lies too near a float64 rounding tie to tell
        a, b, c = np.broadcast_arrays(a, b, c)
        wide = a.astype(np.longdouble) * b + c
        r = wide.astype(np.float64)
        with np.errstate(invalid="ignore"):
            off = np.abs(wide - r)
            tie = (off != 0) & (np.abs(off - np.spacing(r) / 2) <= np.abs(wide) * np.longdouble(2.0 ** -62))
        if tie.any():
            r[tie] = exact(a[tie], b[tie], c[tie])
        return r
    def create_fma(self, x, y, z):
        a, b, c = x.data, y.data, z.data
        if np.result_type(a, b, c) == np.float64:
            r = fused64(a, b, c)
        else:
            r = (a.astype(np.float64) * b.astype(np.float64) + c.astype(np.float64)).astype(np.float32)
        return interpreter.TensorHandle(r, z.dtype.scalar)

    monkeypatch.setattr(interpreter.InterpreterBuilder, "create_fma", create_fma)


def _device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
@pytest.mark.parametrize("threshold,box_window", [(None, False), (0.5, False), (0.5, True), (None, True), (0.0, True),
                                                 (-1.0, False)])
def test_triton_paste_equals_cpu(fused_interpreter, dtype: torch.dtype, threshold: float | None,
                                 box_window: bool) -> None:
    masks = torch.rand(8, 14, 10, generator=torch.Generator().manual_seed(11)).to(dtype)
    boxes = boxes_in(8, 40, 60, 50.0, seed=12).to(torch.float64 if dtype == torch.float64 else torch.float32)
    expected = paste(masks, boxes, 40, 60, threshold, box_window)
    with roiops.use_backend("triton"):
        got = paste(masks.to(_device()), boxes.to(_device()), 40, 60, threshold, box_window)
    assert torch.equal(got.cpu(), expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("fused", [True, False])
def test_triton_paste_torchvision_equals_cpu(fused_interpreter, dtype: torch.dtype, fused: bool) -> None:
    masks = torch.rand(12, 14, 14, dtype=dtype, generator=torch.Generator().manual_seed(13))
    # one-pass and two-pass sizes, outside, inverted, wider than the image
    boxes = torch.tensor([[0, 0, 9, 9], [-5, -3, 20, 40], [30, 30, 29, 29], [40, 2, 90, 5], [3, 3, 3, 3],
                          [-20, -20, -2, -2], [10, 50, 12, 200], [0, 0, 63, 63], [5, 5, 100, 6], [60, 1, 61, 70],
                          [2, 2, 150, 100], [0, 0, 1, 1]])
    expected = paste_torchvision(masks, boxes, 64, 80, 1, fused)
    with roiops.use_backend("triton"):
        got = paste_torchvision(masks.to(_device()), boxes.to(_device()), 64, 80, 1, fused)
    assert torch.equal(got.cpu(), expected)


@pytest.mark.parametrize("dtype", [torch.bool, torch.uint8, torch.float16])
def test_triton_mask_targets_equal_cpu(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(14)
    masks = (torch.rand(3, 40, 50, generator=g) > 0.5).to(dtype)
    indices = torch.randint(0, 3, (12,), generator=g)
    boxes = boxes_in(12, 40, 50, 16.0, seed=15)
    for kwargs in (dict(aligned=False, sampling_ratio=-1), dict(aligned=True, threshold=0.5),
                   dict(aligned=True, sampling_ratio=2)):
        expected = roiops.mask_targets(masks, boxes, indices, 7, **kwargs)
        with roiops.use_backend("triton"):
            got = roiops.mask_targets(masks.to(_device()), boxes.to(_device()), indices.to(_device()), 7, **kwargs)
        assert got.dtype == expected.dtype and torch.equal(got.cpu(), expected), kwargs


def coco_polygons(seed: int, instances: int) -> list[list[np.ndarray]]:
    """COCO-like instances: 1 to 3 polygons of 3 to 12 vertices each (convex and
    self-intersecting), some on whole or tenth pixels, some partly off any box."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(instances):
        centre = rng.uniform(0, 200, 2)
        polys = []
        for _ in range(int(rng.integers(1, 4))):
            n = int(rng.integers(3, 13))
            pts = centre + rng.normal(0, rng.uniform(3, 60), (n, 2))
            if rng.random() < 0.3:
                pts = np.round(pts * rng.choice([1, 10])) / rng.choice([1, 10])
            polys.append(pts.reshape(-1).astype(np.float64))
        out.append(polys)
    return out


def detectron2_polygon_targets(polygons: list[list[np.ndarray]], boxes: torch.Tensor, size: int) -> torch.Tensor:
    """detectron2's PolygonMasks.crop_and_resize by its definition (rasterize_polygons_within_box):
    shift to the box corner, scale by size / max(side, 0.1), pycocotools' frPyObjects, merge,
    decode."""
    mask_util = pytest.importorskip("pycocotools.mask", reason="pycocotools rasterises detectron2's polygons")
    out = []
    for polys, box in zip(polygons, boxes.numpy()):
        w, h = box[2] - box[0], box[3] - box[1]
        shifted = []
        for p in polys:
            p = p.copy()
            p[0::2] = p[0::2] - box[0]
            p[1::2] = p[1::2] - box[1]
            shifted.append(p)
        ratio_h, ratio_w = size / max(h, 0.1), size / max(w, 0.1)
        for p in shifted:
            if ratio_h == ratio_w:
                p *= ratio_h
            else:
                p[0::2] *= ratio_w
                p[1::2] *= ratio_h
        rle = mask_util.merge(mask_util.frPyObjects(shifted, size, size))
        out.append(torch.from_numpy(mask_util.decode(rle).astype(bool)))
    return torch.stack(out)


def test_polygon_targets_equal_pycocotools() -> None:
    polygons = coco_polygons(16, 60)
    g = torch.Generator().manual_seed(17)
    centres = torch.from_numpy(np.array([p[0][:2] for p in polygons], dtype=np.float32))
    wh = torch.rand(60, 2, generator=g) * 80 + 0.05  # some sides under 0.1 (clamped)
    boxes = torch.cat([centres - wh / 2, centres + wh / 2], dim=1)
    expected = detectron2_polygon_targets(polygons, boxes, 28)
    assert torch.equal(d2.polygons_crop_and_resize(polygons, boxes, 28), expected)
    # a proposal per instance index, several per instance, through the native API
    indices = torch.arange(60).flip(0)
    got = roiops.mask_targets(polygons, boxes[indices], indices, 28)
    assert torch.equal(got, expected.flip(0))
    with roiops.use_backend("reference"):
        assert torch.equal(roiops.mask_targets(polygons[:8], boxes[:8], torch.arange(8), 28), expected[:8])


def test_polygon_targets_errors() -> None:
    square = [[[0.0, 0.0, 4.0, 0.0, 4.0, 4.0]]]
    boxes = torch.tensor([[0.0, 0.0, 4.0, 4.0]])
    with pytest.raises(ValueError, match=r"indices\[0\] = 1 is not an instance in \[0, 1\)"):
        roiops.mask_targets(square, boxes, torch.tensor([1]), 4)
    with pytest.raises(ValueError, match="must hold \\(x, y\\) pairs"):
        roiops.mask_targets([[[0.0, 1.0, 2.0]]], boxes, torch.tensor([0]), 4)
    with pytest.raises(ValueError, match="square"):
        roiops.mask_targets(square, boxes, torch.tensor([0]), (4, 5))
    with pytest.raises(ValueError, match="do not apply to polygons"):
        roiops.mask_targets(square, boxes, torch.tensor([0]), 4, threshold=0.5)
    with pytest.raises(ValueError, match="boxes row 0"):
        roiops.mask_targets(square, torch.tensor([[0.0, float("nan"), 4.0, 4.0]]), torch.tensor([0]), 4)
    assert roiops.mask_targets(square, boxes[:0], torch.zeros(0, dtype=torch.int64), 4).shape == (0, 4, 4)
    assert not roiops.mask_targets([[]], boxes, torch.tensor([0]), 4).any()  # an instance without polygons


# ---- fuzz: the C++ kernels against the reference on drawn boxes, sizes and values

_FUZZ = dict(derandomize=True, database=None, deadline=None, max_examples=60,
             suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
_COORD = st.one_of(st.floats(-40, 120, width=32), st.sampled_from([0.0, 0.5, -0.5, 1e-7, 63.5, 2.0**24, -(2.0**24)]))


@settings(**_FUZZ)
@given(k=st.integers(0, 4), mh=st.integers(1, 9), mw=st.integers(1, 9), h=st.integers(0, 40), w=st.integers(0, 50),
       coords=st.lists(_COORD, min_size=16, max_size=16), threshold=st.sampled_from([None, 0.5, -1.0, 0.0]),
       window=st.booleans(), double=st.booleans())
def test_fuzz_paste(k, mh, mw, h, w, coords, threshold, window, double) -> None:
    dtype = torch.float64 if double else torch.float32
    masks = torch.rand(k, mh, mw, generator=torch.Generator().manual_seed(k * 100 + mh), dtype=dtype)
    boxes = torch.tensor(coords[:4 * k], dtype=dtype).reshape(k, 4)
    expected = reference.paste_masks_forward(masks, boxes, h, w, 0.0 if threshold is None else threshold,
                                             threshold is not None, window)
    assert torch.equal(paste(masks, boxes, h, w, threshold, window), expected)


@settings(**_FUZZ)
@given(k=st.integers(0, 4), m=st.integers(1, 9), h=st.integers(0, 40), w=st.integers(0, 50), padding=st.integers(0, 3),
       coords=st.lists(st.integers(-60, 120), min_size=16, max_size=16), double=st.booleans())
def test_fuzz_paste_torchvision(k, m, h, w, padding, coords, double) -> None:
    masks = torch.rand(k, m, m, generator=torch.Generator().manual_seed(k * 10 + m),
                       dtype=torch.float64 if double else torch.float32)
    boxes = torch.tensor(coords[:4 * k], dtype=torch.int64).reshape(k, 4)
    expected = reference.paste_masks_torchvision_forward(masks, boxes, h, w, padding, True)
    assert torch.equal(paste_torchvision(masks, boxes, h, w, padding, True), expected)


@settings(**_FUZZ)
@given(p=st.integers(0, 6), g=st.integers(1, 3), h=st.integers(0, 30), w=st.integers(0, 30),
       coords=st.lists(_COORD, min_size=24, max_size=24), size=st.integers(1, 9), aligned=st.booleans(),
       ratio=st.sampled_from([-1, 0, 1, 2]), dtype=st.sampled_from([torch.bool, torch.uint8, torch.float32]))
def test_fuzz_mask_targets(p, g, h, w, coords, size, aligned, ratio, dtype) -> None:
    masks = (torch.rand(g, h, w, generator=torch.Generator().manual_seed(p * 7 + g)) > 0.5).to(dtype)
    rois = torch.cat([torch.arange(p).remainder(g)[:, None].float(), torch.tensor(coords[:4 * p]).reshape(p, 4)], 1)
    expected = reference.mask_targets_forward(masks, rois, size, size, ratio, aligned, 0.0, False)
    got = torch.ops.roiops.mask_targets(masks, rois, size, size, ratio, aligned, 0.0, False)
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-6)  # the reference sums in its own order


@pytest.mark.parametrize("fn, args", [
    (roiops.paste_masks, ((20, 30),)), (tv.paste_masks_in_image, ((20, 30),)), (d2.paste_masks_in_image, ((20, 30),)),
    (d2.bitmasks_crop_and_resize, (7,))])
def test_mask_steps_are_one_fx_node(fn, args) -> None:
    """torch.fx records each mask step whole, as the RoI functions (a leaf)."""
    class Call(torch.nn.Module):
        def forward(self, masks: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
            return fn(masks, boxes, *args)

    traced = torch.fx.symbolic_trace(Call())
    assert [n.target for n in traced.graph.nodes if n.op == "call_function"] == [fn]
    masks = torch.rand(3, 1, 14, 14) if fn is tv.paste_masks_in_image else torch.rand(3, 14, 14)
    boxes = torch.tensor([[1.0, 2.0, 9.0, 12.0], [0.0, 0.0, 5.0, 5.0], [3.0, 1.0, 13.0, 8.0]])
    assert torch.equal(traced(masks, boxes), Call()(masks, boxes))
