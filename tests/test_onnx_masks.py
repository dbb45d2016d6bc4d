"""ONNX export of the mask steps (mask pasting by both rules, mask targets), checked in
onnxruntime against roiops' kernels bit for bit: nasty boxes, masks holding NaN,
infinities, ties and huge values, no boxes and one, float32, float64 and float16 (bool and
uint8 masks for the targets), through the public functions and the drop-ins; and the
fused multiply-add that the paste graphs build from separately rounded operations, against
the exact value on products that land next to rounding ties.

Exports are slow (seconds each, most of it fixed costs and torch.onnx's optimiser): three
models, each exported once. The main public functions are exported as users get them
(optimised); the other dtypes and flags without the optimiser, which computes the same and
takes a few seconds less.
"""

from __future__ import annotations

import inspect
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
import torch
from torch.export import Dim

import roiops
from onnx_runs import boxes_for_tests, export
from roiops.compat import detectron2 as d2
from roiops.compat import torchvision as tv

pytest.importorskip("onnx")
_masks = pytest.importorskip("roiops.onnx._masks")

pytestmark = pytest.mark.filterwarnings("ignore:# The axis name")  # inputs share the Dims K and P, as intended

H, W = 40, 56  # the image the masks are pasted into
paste = torch.ops.roiops.paste_masks
paste_tv = torch.ops.roiops.paste_masks_torchvision
_FMA = ("fa", "fb", "fc", "da", "db", "dc")  # the fused multiply-add's inputs: float32 (f) and float64 (d)


# ---- inputs --------------------------------------------------------------------------------

# Boxes (x1, y1, x2, y2) in the 40 x 56 image: ordinary, of zero width, height or both (a
# 0/0 grid coordinate at the pixel centre on the box), inverted along one axis and both,
# larger than the image, wholly outside on each side, sub-pixel, at the 2^24 limit.
_NASTY = [[3.0, 4.0, 20.0, 30.0], [10.3, 5.5, 10.3, 20.0], [5.0, 12.5, 30.0, 12.5], [10.5, 10.5, 10.5, 10.5],
          [30.0, 30.0, 10.0, 5.0], [30.0, 5.0, 10.0, 35.0], [-20.0, -10.0, 60.0, 45.0], [-100.0, 2.0, -50.0, 8.0],
          [2.0, 50.0, 20.0, 80.0], [60.0, 2.0, 80.0, 30.0], [1.5, 2.25, 55.9, 39.9], [-1e6, -1e6, 1e6, 1e6],
          [7.25, 3.75, 7.5, 4.0], [0.1, 0.1, 0.101, 30.0], [16777215.0, 0.0, 16777216.0, 10.0],
          [-16777216.0, -16777216.0, 16777216.0, 16777216.0], [0.0, 0.0, 56.0, 40.0], [-0.7, 38.6, 12.2, 40.4],
          [-35.0, -30.0, 95.0, 75.0], [10.0, 8.0, 38.0, 36.0]]

# Whole-pixel boxes for torchvision's rule: of one pixel, inverted, resizing the padded
# mask (7 + 2 * padding cells) to its own size (a copy), above and below ATen's switch
# from one pass to two (height + width > 128).
_WHOLE = [[5, 5, 5, 5], [20, 10, 8, 30], [3, 4, 3 + 10, 4 + 10], [-2, -3, -2 + 8, -3 + 8], [10, -20, 70, 60],
          [-10, -10, 60, 55], [0, 0, 66, 61], [1, 2, 9, 8]]

# Small boxes only, some at the image's edges: each plane is computed in a crop smaller
# than the image, placed where the box is (a crop at the right or bottom edge starts before
# the box). Whole-pixel ones likewise, a copy among them.
_SMALL = [[50.0, 30.0, 56.0, 40.0], [-3.0, -2.0, 5.0, 6.0], [45.5, 1.0, 55.9, 9.0], [20.0, 20.0, 20.0, 25.0],
          [30.0, 10.0, 25.0, 14.0], [10.0, 10.0, 22.0, 18.0], [1.0, 33.5, 9.25, 39.75], [52.2, 36.1, 53.9, 38.8]]
_SMALL_WHOLE = [[50, 30, 58, 40], [-3, -2, 5, 6], [46, 31, 46 + 8, 31 + 8], [20, 20, 20, 25], [30, 10, 25, 14],
                [10, 10, 22, 18], [1, 33, 9, 39], [52, 36, 53, 38]]


def _paste_boxes() -> torch.Tensor:
    """The nasty boxes and random ones (float64, with more digits than float32 keeps)."""
    g = torch.Generator().manual_seed(3)
    xy = torch.rand(12, 2, generator=g, dtype=torch.float64) * torch.tensor([W + 30.0, H + 30.0]) - 20
    wh = torch.rand(12, 2, generator=g, dtype=torch.float64) * 50 + 0.2
    return torch.cat([torch.tensor(_NASTY, dtype=torch.float64), torch.cat([xy, xy + wh], 1)])


def _probabilities(k: int, mh: int, mw: int, seed: int) -> torch.Tensor:
    """A mask head's output (float64): sigmoids of logits, with cells at exactly 0, 1 and 0.5."""
    g = torch.Generator().manual_seed(seed)
    m = torch.sigmoid(torch.randn(k, mh, mw, generator=g, dtype=torch.float64) * 4)
    m[:, 0, :3], m[:, -1, -2:], m[:, 2, 2] = 0, 1, 0.5
    return m


def _odd(m: torch.Tensor) -> torch.Tensor:
    """Masks of any values: negative, huge, infinite and NaN cells next to ordinary ones."""
    m = m * 3 - 1
    m[1, 1, 1], m[2, 0, 0], m[3, -1, -1] = float("nan"), float("inf"), -float("inf")
    m[4] *= 1e30
    m[6, 2:4, 2:4] = float("nan")
    return m


def _inputs(boxes: str, values: str) -> dict[str, torch.Tensor]:
    """Every model's inputs by name: masks and boxes to paste (K of them), masks, boxes and
    mask indices of the targets (P proposals). ``boxes``: "nasty" (all), "small", "none" or
    "one"."""
    pick = {"nasty": slice(None), "small": slice(None), "none": slice(0), "one": slice(-2, -1)}[boxes]
    b = _paste_boxes()
    whole = torch.cat([torch.tensor(_WHOLE), tv._expanded(b.float(), 9 / 7)])[:len(b)]
    if boxes == "small":
        b, whole = torch.tensor(_SMALL, dtype=torch.float64), torch.tensor(_SMALL_WHOLE)
    b, whole = b[pick], whole[pick]
    m, square = _probabilities(len(_NASTY) + 12, 6, 9, 0), _probabilities(len(_NASTY) + 12, 7, 7, 1)
    rows = boxes_for_tests()  # (mask index, x1, y1, x2, y2) over 18 x 22 masks
    rows = rows[{"none": slice(0), "one": slice(-3, -2)}.get(boxes, slice(None))]
    targets = _probabilities(2, 18, 22, 4)
    any_targets = targets
    if values == "odd":
        m, square, targets = _odd(m), _odd(square), targets * 3 - 1
        targets[0, 3, 4] = 1e4
        # Non-finite cells, one in a top-left corner: for the decomposition only, as ONNX
        # RoiAlign computes a sample outside the mask as 0 * mask[0, 0].
        any_targets = targets.clone()
        any_targets[0, 5, 6], any_targets[1, 10, 3], any_targets[1, 0, 0] = float("nan"), float("inf"), -float("inf")
    m, square = m[:len(b)], square[:len(b)]
    return {"m32": m.float(), "b32": b.float(), "m64": m, "b64": b, "m16": m.half(), "square": square.float(),
            "whole": whole, "t_bool": targets > 0.5, "t_u8": (targets > 0.5).to(torch.uint8), "t16": targets.half(),
            "t32": targets.float(), "t64": targets, "any32": any_targets.float(), "any64": any_targets,
            "t_empty": torch.zeros(2, 0, 22), "proposals": rows[:, 1:].contiguous(), "idx": rows[:, 0].long()}


def _names(model: torch.nn.Module) -> list[str]:
    return list(inspect.signature(model.forward).parameters)


def _export(model: torch.nn.Module, fma_cases: dict[str, np.ndarray] | None = None, **kwargs: Any):
    k, p, f32, f64 = Dim("K"), Dim("P"), Dim("F32"), Dim("F64")
    example = {**_inputs("nasty", "probabilities"), **{n: torch.from_numpy(a) for n, a in (fma_cases or {}).items()}}
    shapes = {"proposals": {0: p}, "idx": {0: p}, **{n: {0: k} for n in ("m32", "b32", "m64", "b64", "m16",
                                                                         "square", "whole")},
              **{n: {0: f32 if n[0] == "f" else f64} for n in _FMA}}
    names = _names(model)
    short = {n: example[n][:4] if n in shapes and n not in _FMA else example[n] for n in names}
    return export(model, tuple(short.values()), {n: shapes.get(n) for n in names}, **kwargs)


def _equal(actual: np.ndarray, expected: torch.Tensor, what: str) -> None:
    """Bit for bit: the same dtype, shape and values, NaN where NaN, the same signed zeros."""
    e = expected.numpy()
    assert actual.dtype == e.dtype and actual.shape == e.shape, what
    if actual.dtype.kind == "f":
        bits = {2: np.uint16, 4: np.uint32, 8: np.uint64}[actual.itemsize]
        nan = np.isnan(actual)
        assert np.array_equal(nan, np.isnan(e)), f"{what}: NaN elsewhere"
        actual, e = np.where(nan, 0, actual).view(bits), np.where(nan, 0, e).view(bits)
    mismatch = np.argwhere(actual != e)
    assert not len(mismatch), f"{what}: {len(mismatch)} values differ, first at {mismatch[0].tolist()}"


def _check(exported, model: torch.nn.Module, boxes: str, values: str) -> None:
    """Every output of the exported model equals the kernels' (the eager model's)."""
    proto, session = exported
    assert {n.domain for n in proto.graph.node} == {""}  # standard ONNX operators only
    fma_inputs = {n: torch.zeros(1, dtype=torch.float32 if n[0] == "f" else torch.float64) for n in _FMA}
    inputs = fma_inputs | _inputs(boxes, values)
    args = [inputs[n] for n in _names(model)]
    got = session.run(None, {n: a.numpy() for n, a in zip(_names(model), args)})
    for i, (a, e, what) in enumerate(zip(got, model(*args), model.OUTPUTS, strict=True)):
        if what.startswith("fma"):
            continue  # test_fma_is_rounded_once
        if what == "detectron2" and boxes == "none":
            # detectron2 returns uint8 for no masks; a graph's output has one dtype (bool here).
            assert e.dtype == torch.uint8 and a.dtype == np.bool_ and a.shape == (0, H, W)
            continue
        _equal(a, e, f"output {i} ({what}), {boxes} boxes, {values} values")


# ---- the fused multiply-add --------------------------------------------------------------


@torch.library.custom_op("roiops_onnx_masks_test::fma", mutates_args=())
def _fma_op(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(a)  # only exported


@_fma_op.register_fake
def _(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(a)


def _fma_translation(a: Any, b: Any, c: Any) -> Any:
    return _masks._fma(a, b, c, _masks._Constants(a.dtype))


def _rounded(x: Fraction, dtype: type) -> Any:
    """``x`` rounded to the nearest ``dtype`` (ties to even), by exact distance."""
    r = dtype(float(x))
    candidates = [np.nextafter(r, dtype(-np.inf)), r, np.nextafter(r, dtype(np.inf))]
    bits = np.uint32 if dtype == np.float32 else np.uint64
    return min(candidates, key=lambda c: (abs(Fraction(float(c)) - x), int(np.array(c).view(bits)) & 1))


def _fma_cases(dtype: type) -> tuple[np.ndarray, ...]:
    """``(a, b, c, fma(a, b, c))``: products within ``2^-2k`` of half the spacing of ``c``
    (where rounding the sum twice, or the product first, goes wrong), random values of
    mixed scales and signs, zeros, infinities and NaN."""
    rng = np.random.default_rng(0)
    ks = range(12, 24) if dtype == np.float32 else range(27, 52, 2)
    rows = []
    for c in (rng.random(24) + 0.5) * np.exp2(rng.integers(-20, 20, 24)) * rng.choice([-1, 1], 24):
        c = dtype(c)
        half = dtype(np.spacing(np.abs(c)) / 2)
        rows += [(half * (1 + sa * dtype(2.0**-k)), dtype(1 + sb * 2.0**-k), c) for k in ks for sa in (1, -1)
                 for sb in (1, -1)]
    mixed = rng.random((600, 3)) * np.exp2(rng.integers(-40, 5, (600, 3))) * rng.choice([-1, 1], (600, 3))
    a, b, c = np.concatenate([np.array(rows, dtype), mixed.astype(dtype)]).T
    expected = [_rounded(Fraction(float(x)) * Fraction(float(y)) + Fraction(float(z)), dtype) for x, y, z in
                zip(a, b, c)]
    special = np.array([[0.0, -0.0, 1.0], [np.inf, 0.0, 1.0], [np.inf, 2.0, -np.inf], [np.nan, 1.0, 1.0],
                        [1.0, 1.0, np.inf], [-0.0, 5.0, 0.0]], dtype).T
    with np.errstate(invalid="ignore"):
        expected += list(special[0] * special[1] + special[2])
    return (*(np.concatenate([x, s]) for x, s in zip((a, b, c), special)), np.array(expected, dtype))


@pytest.fixture(scope="module")
def fma_cases() -> dict[str, np.ndarray]:
    f32, f64 = _fma_cases(np.float32), _fma_cases(np.float64)
    return {"fa": f32[0], "fb": f32[1], "fc": f32[2], "f": f32[3], "da": f64[0], "db": f64[1], "dc": f64[2],
            "d": f64[3]}


def test_fma_is_rounded_once(users, fma_cases):
    """The graph's fused multiply-add (optimised as exports are) on products next to rounding
    ties, where a float64 sum rounded to float32, or an unfused float64 sum, is one unit in
    the last place off."""
    proto, session = users
    feed = {**{n: t.numpy() for n, t in _inputs("none", "probabilities").items()}, **fma_cases}
    got = session.run(None, {i.name: feed[i.name] for i in session.get_inputs()})[-2:]
    for a, name, dtype in zip(got, "fd", ("float32", "float64")):
        _equal(a, torch.from_numpy(fma_cases[name]), f"fma in {dtype}")


# ---- what users call, exported as they get it -------------------------------------------


class _Users(torch.nn.Module):
    """roiops.paste_masks (rectangular masks, the whole plane), torchvision's drop-in (square
    masks, fused as ATen on this machine), roiops.mask_targets and the target drop-ins."""

    OUTPUTS = ["paste_masks", "torchvision", "mask_targets", "project_masks_on_boxes", "bitmasks_crop_and_resize",
               "fma float32", "fma float64"]

    def forward(self, m32: torch.Tensor, b32: torch.Tensor, square: torch.Tensor, t_bool: torch.Tensor,
                t_u8: torch.Tensor, proposals: torch.Tensor, idx: torch.Tensor, fa: torch.Tensor, fb: torch.Tensor,
                fc: torch.Tensor, da: torch.Tensor, db: torch.Tensor, dc: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (roiops.paste_masks(m32, b32, (H, W)), tv.paste_masks_in_image(square[:, None], b32, (H, W)),
                roiops.mask_targets(t_bool, proposals, idx, 7),
                tv.project_masks_on_boxes(t_u8, proposals, idx, 6),
                d2.bitmasks_crop_and_resize(t_bool[idx], proposals, 5),
                _fma_op(fa, fb, fc), _fma_op(da, db, dc))  # the fused multiply-add alone, for its own test


class _Variants(torch.nn.Module):
    """detectron2's paste drop-in (square masks, its CPU window, uint8 for a negative
    threshold), and the other dtypes and flags: pasting in float64 and float16, soft values
    in detectron2's window, thresholds <= 0 (the zeros pass) with and without it;
    torchvision's rule with and without fused multiply-adds, paddings 0 to 2; targets of
    float16, float32, float64 and uint8 masks, aligned or not, fixed grids; an image of no
    rows and one of no columns, masks of no rows."""

    OUTPUTS = ["detectron2", "paste float64", "paste float16", "soft window", "threshold 0 window", "threshold < 0",
               "threshold float64 window", "detectron2 uint8", "torchvision float64 fused",
               "torchvision unfused padding 0", "torchvision float16", "targets float16", "targets float16 binary",
               "targets float32", "targets float64 binary", "targets uint8 binary", "empty image",
               "torchvision empty image", "targets of empty masks"]

    def forward(self, m32: torch.Tensor, b32: torch.Tensor, m64: torch.Tensor, b64: torch.Tensor, m16: torch.Tensor,
                square: torch.Tensor, whole: torch.Tensor, t_u8: torch.Tensor, t16: torch.Tensor, t32: torch.Tensor,
                t64: torch.Tensor, proposals: torch.Tensor, idx: torch.Tensor, t_empty: torch.Tensor
                ) -> tuple[torch.Tensor, ...]:
        return (d2.paste_masks_in_image(square, b32, (H, W)),
                roiops.paste_masks(m64, b64, (H, W), threshold=None), roiops.paste_masks(m16, b32, (H, W), None),
                paste(m32, b32, H, W, 0.0, False, True), paste(square, b32, H, W, 0.0, True, True),
                paste(m64, b64, H, W, -0.25, True, False), paste(m64, b64, H, W, 0.3, True, True),
                d2.paste_masks_in_image(square[:, 1:, 1:], b32, (H, W), -1.0),
                paste_tv(m64, whole, H, W, 2, True), paste_tv(m32, whole, H, W, 0, False),
                paste_tv(m16, whole, H, W, 1, True),
                roiops.mask_targets(t16, proposals, idx, 7),
                roiops.mask_targets(t16, proposals, idx, 7, threshold=0.25),
                roiops.mask_targets(t32, proposals, idx, (6, 4), aligned=False, sampling_ratio=-1),
                roiops.mask_targets(t64, proposals, idx, 4, sampling_ratio=3, threshold=0.5),
                roiops.mask_targets(t_u8, proposals, idx, (5, 6), aligned=False, sampling_ratio=2, threshold=0.5),
                roiops.paste_masks(m32, b32, (0, W)), paste_tv(m16, whole, H, 0, 1, False),
                roiops.mask_targets(t_empty, proposals, idx, 3))


class _Decomposed(torch.nn.Module):
    """mask_targets through roi_align's decomposition: exact on masks of any values."""

    OUTPUTS = ["bool", "float16 binary", "float32 unaligned", "float64"]

    def forward(self, t_bool: torch.Tensor, t16: torch.Tensor, any32: torch.Tensor, any64: torch.Tensor,
                proposals: torch.Tensor, idx: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (roiops.mask_targets(t_bool, proposals, idx, 7),
                roiops.mask_targets(t16, proposals, idx, 5, threshold=0.5),
                roiops.mask_targets(any32, proposals, idx, (6, 4), aligned=False, sampling_ratio=-1),
                roiops.mask_targets(any64, proposals, idx, 4, sampling_ratio=2))


@pytest.fixture(scope="module")
def users(fma_cases):
    table = {torch.ops.roiops_onnx_masks_test.fma.default: _fma_translation}
    return _export(_Users(), fma_cases, custom_translation_table=table)


@pytest.fixture(scope="module")
def variants():
    return _export(_Variants(), optimize=False)


@pytest.fixture(scope="module")
def decomposed():
    proto, session = _export(_Decomposed(), optimize=False, align_avg="decompose")
    assert "RoiAlign" not in {n.op_type for n in proto.graph.node}
    return proto, session


_SETS = [(boxes, values) for values in ("probabilities", "odd") for boxes in ("nasty", "small", "none", "one")]


@pytest.mark.parametrize("boxes,values", _SETS)
def test_what_users_call_equals_the_kernels_bit_for_bit(users, boxes, values):
    proto, _ = users
    assert "RoiAlign" in {n.op_type for n in proto.graph.node}
    _check(users, _Users(), boxes, values)


@pytest.mark.parametrize("boxes,values", _SETS)
def test_other_dtypes_and_flags_equal_the_kernels_bit_for_bit(variants, boxes, values):
    _check(variants, _Variants(), boxes, values)


@pytest.mark.parametrize("boxes,values", _SETS)
def test_decomposed_targets_equal_the_kernels_bit_for_bit(decomposed, boxes, values):
    _check(decomposed, _Decomposed(), boxes, values)


def test_torchvision_drop_in_with_float64_boxes():
    """The boxes are expanded in float64, as in eager: the scale is a float64 constant of the
    graph (torch.onnx would store a Python float in float32, and the box (0, 0, M, M) would
    then expand one pixel less)."""

    class Paste(torch.nn.Module):
        def forward(self, masks: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
            return tv.paste_masks_in_image(masks, boxes, (H, W))

    g = torch.Generator().manual_seed(3)
    masks = torch.rand(64, 1, 28, 28, generator=g)
    boxes = torch.rand(64, 4, generator=g, dtype=torch.float64) * torch.tensor([W, H, W, H]) * 0.6
    boxes[:, 2:] += boxes[:, :2]
    boxes[0] = torch.tensor([0.0, 0.0, 28.0, 28.0])
    k = Dim("K")
    _, session = export(Paste(), (masks[:3], boxes[:3]), {"masks": {0: k}, "boxes": {0: k}}, optimize=False)
    (got,) = session.run(None, {"masks": masks.numpy(), "boxes": boxes.numpy()})
    _equal(got, Paste()(masks, boxes), "float64 boxes")
