"""Every public Module and every ``roiops.compat`` class, learned ones included, through the
battery the functions go through (tests/test_generic.py): against the oracle each documents
(the public roiops function it calls, with the converted arguments, also on the reference
kernels; faster-rcnn.pytorch's corner RoIAlign against tests/test_compat.py's loop) in every
dtype and in NCHW and channels_last, forward and backward; no boxes; no channels; an empty
batch; strided maps; ``torch.save``/``torch.load`` of the module and of its state_dict;
state_dict names and shapes equal to the peer's; ``torch.compile``; meta tensors; and for the
classes that claim TorchScript (the torchvision drop-ins) ``torch.jit.script`` followed by
``torch.jit.save``/``torch.jit.load``, as scripted detectors are deployed.

The classes are discovered (roiops.ops.SPECS, and the nn.Module classes of every module of
roiops.compat); SUBJECTS holds each one's arguments and oracle, and a class without an
entry fails test_every_class_has_an_entry."""

from __future__ import annotations

import contextlib
import copy
import importlib
import io
import math
import pkgutil
import warnings
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch
import torch.nn.functional as TF
import torchvision
from torch import Tensor, nn

import roiops
import roiops.compat
from cases import (DTYPES, F16, F32, F64, OPTIONS, SCALE, C, Case, H, N, W, boxes_for, close, feature, per_bin_values,
                   per_image, tol)
from roiops._boxes import AXIS_ALIGNED, BEZIER, PER_IMAGE, ROTATED, BoxFormat
from roiops.compat import detectron2 as d2
from roiops.compat import faster_rcnn_pytorch as frp
from roiops.compat import maskrcnn_benchmark as mrb
from roiops.compat import mmcv, mmdet
from roiops.compat import simple_faster_rcnn as sfr
from roiops.compat import torchvision as tv
from roiops.ops import SPECS
from test_compat import corner_roi_align

# torch.jit.script and torch.jit.load warn of TorchScript's deprecation on each call.
pytestmark = pytest.mark.filterwarnings("ignore:.*TorchScript.*:FutureWarning", "ignore:.*torch.jit.*:FutureWarning",
                                        "ignore::DeprecationWarning")

SIZE = (2, 3)
GAMMA = 0.1
IMAGE = (64, 80)  # the image (height, width) of the FPN maps, strides 4 and 8
CL = torch.channels_last


# ----------------------------------------------------------------------------- discovery


def _compat_modules() -> list[Any]:
    """Every module of roiops.compat (a new one is found without a list)."""
    return [importlib.import_module(f"roiops.compat.{m.name}") for m in pkgutil.iter_modules(roiops.compat.__path__)
            if not m.name.startswith("_")]


def _classes(module: Any) -> list[type]:
    """The public nn.Module classes of a module: those its __all__ names and those it defines."""
    names = list(getattr(module, "__all__", ())) + [n for n in vars(module) if not n.startswith("_")]
    found = [getattr(module, n) for n in names if hasattr(module, n)]
    return [c for c in found if isinstance(c, type) and issubclass(c, nn.Module)
            and (c.__module__ == module.__name__ or c.__name__ in getattr(module, "__all__", ()))]


# The point-cloud Modules take points and LiDAR boxes, not a map: tests/test_points3d.py
# runs them.
POINT_CLOUDS = {roiops.PointsInBoxes, roiops.RoIAwarePool3d, roiops.RoIPointPool3d, mmcv.RoIAwarePool3d,
                mmcv.RoIPointPool3d}


def discovered() -> list[type]:
    """Every public Module of roiops (one per spec, and any other nn.Module roiops exports) and
    every nn.Module class of roiops.compat, but the point-cloud ones."""
    public = [spec.module for spec in SPECS]
    public += [getattr(roiops, n) for n in roiops.__all__ if isinstance(getattr(roiops, n), type)
               and issubclass(getattr(roiops, n), nn.Module)]
    found = dict.fromkeys(public + [c for m in _compat_modules() for c in _classes(m)])
    return [c for c in found if c not in POINT_CLOUDS]


# ----------------------------------------------------------------------------- the table


@dataclass(frozen=True, eq=False)
class Subject:
    """One class under test. ``make(seed)``: an instance with the battery's small arguments (a
    learned class's weights drawn from ``seed``); ``oracle(module, x, boxes)``: what the class
    documents it computes, from roiops' public functions, or an independent formula;
    ``boxes``: the box format it takes (roiops._boxes; ``PER_IMAGE`` in cells), or
    ``"levels"``: a dict of FPN maps and a list of each image's boxes; ``channels``: the maps' channels (a
    multiple of what the op needs); ``call(module, x, boxes)``: how a user calls it;
    ``fixed_channels``: built for ``channels`` (its learned layers' sizes); ``state``: the
    peer's state_dict names and shapes, for the module; ``peer``: the peer's class built with
    the same arguments, where the peer is installed (its state_dict is then the one to equal);
    ``script``: the class claims TorchScript."""

    cls: type
    make: Callable[[int], nn.Module]
    oracle: Callable[[nn.Module, Any, Any], Tensor]
    boxes: BoxFormat | str = AXIS_ALIGNED
    channels: int = C
    call: Callable[[nn.Module, Any, Any], Tensor] = lambda m, x, b: m(x, b)
    fixed_channels: bool = False
    state: Callable[[nn.Module], dict[str, tuple[int, ...]]] = lambda m: {}
    peer: Callable[[], nn.Module] | None = None
    script: bool = False

    @property
    def id(self) -> str:
        short = "roiops" if not self.cls.__module__.startswith("roiops.compat") else self.cls.__module__[7:]
        return f"{short}.{self.cls.__name__}"


def _offset(x: Any, boxes: Tensor) -> Tensor:
    """A deformable offset [K, 2, h, w] for these boxes (the generic tests' values)."""
    return per_bin_values(boxes, SIZE, 2, x)


def _public(spec: Any) -> Subject:
    """A public Module with its spec's first option set; its oracle is the public function."""
    case = Case(spec.name, spec, OPTIONS[spec.name][0])
    if spec.boxes is PER_IMAGE:
        return Subject(spec.module, lambda seed: spec.module(**case.keywords),
                       lambda m, x, b: spec.function(x, b, **case.keywords), PER_IMAGE, 4 * C)
    return Subject(spec.module, lambda seed: case.module(SIZE, SCALE),
                   lambda m, x, b: case(x, b, SIZE, SCALE), spec.boxes, case.channels(C, SIZE),
                   call=lambda m, x, b: m(x, b, *case.tensors(x, b, SIZE).values()))


def _corners(pool: str = "") -> Callable[..., Tensor]:
    """faster-rcnn.pytorch's RoIAlign by tests/test_compat.py's loop over its CUDA kernel's
    taps (differentiable: float64 sums of the map's values); RoIAlignAvg/Max sample one
    more row and column and take the mean or the maximum of each 2 x 2 window."""
    def oracle(m: nn.Module, x: Tensor, b: Tensor) -> Tensor:
        out = corner_roi_align(x, b.double(), SIZE[0] + bool(pool), SIZE[1] + bool(pool), SCALE)[0]
        if pool:
            windows = torch.stack([out[..., :-1, :-1], out[..., :-1, 1:], out[..., 1:, :-1], out[..., 1:, 1:]])
            out = windows.mean(0) if pool == "avg" else windows.amax(0)
        return (out + 0 * x.double().sum()).to(x.dtype)  # attached to x also without boxes

    return oracle


def _seeded(module: nn.Module, seed: int) -> nn.Module:
    """The module's parameters drawn anew from ``seed`` (small, as trained heads are; a
    learned class starts with zero last layers, which would hide them)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(0.05 * torch.randn(p.shape, generator=g, dtype=F64))
    return module


def _pack_state(m: nn.Module, modulated: bool) -> dict[str, tuple[int, ...]]:
    """mmcv's Pack layers' state_dict (mmcv/ops/deform_roi_pool.py): offset_fc (Linear, ReLU,
    Linear, ReLU, Linear) and, modulated, mask_fc (Linear, ReLU, Linear, Sigmoid)."""
    (h, w), c, d = m.output_size, m.output_channels, m.deform_fc_channels
    state = {"offset_fc.0.weight": (d, h * w * c), "offset_fc.0.bias": (d,), "offset_fc.2.weight": (d, d),
             "offset_fc.2.bias": (d,), "offset_fc.4.weight": (h * w * 2, d), "offset_fc.4.bias": (h * w * 2,)}
    if modulated:
        state |= {"mask_fc.0.weight": (d, h * w * c), "mask_fc.0.bias": (d,), "mask_fc.2.weight": (h * w, d),
                  "mask_fc.2.bias": (h * w,)}
    return state


def _pack_oracle(modulated: bool) -> Callable[..., Tensor]:
    """mmcv's Pack forward written out with the parameters by mmcv's names: pool without
    offset, the offset (and mask) from the flattened result, pool with the offset."""
    def oracle(m: nn.Module, x: Tensor, b: Tensor) -> Tensor:
        p = dict(m.named_parameters())

        def fc(name: str, t: Tensor) -> Tensor:
            return TF.linear(t, p[f"{name}.weight"], p[f"{name}.bias"])

        plain = roiops.deform_roi_pool(x, b, None, SIZE, SCALE, 2, GAMMA)
        flat = plain.flatten(1)
        offset = fc("offset_fc.4", fc("offset_fc.2", fc("offset_fc.0", flat).relu()).relu()).view(len(b), 2, *SIZE)
        out = roiops.deform_roi_pool(x, b, offset, SIZE, SCALE, 2, GAMMA)
        if modulated:
            out = out * torch.sigmoid(fc("mask_fc.2", fc("mask_fc.0", flat).relu())).view(len(b), 1, *SIZE)
        return out

    return oracle


def _pyramid_scales(x: dict[str, Tensor], names: list[str]) -> list[float]:
    """Each named map's scale, the power of two nearest its height over the image's."""
    return [2.0 ** round(math.log2(x[n].shape[-2] / IMAGE[0])) for n in names]


def _tv(cls: type, *args: Any, **kwargs: Any) -> dict[str, Any]:
    """A torchvision drop-in's entry: the peer (torchvision.ops' class of its name) with the
    same arguments, and TorchScript."""
    return dict(peer=lambda: getattr(torchvision.ops, cls.__name__)(*args, **kwargs), script=True)


def _entries() -> list[Subject]:
    ps = C * SIZE[0] * SIZE[1]
    names = ["0", "1"]
    table = [_public(spec) for spec in SPECS]
    table += [
        # torchvision: roiops' functions with torchvision's arguments.
        Subject(tv.RoIAlign, lambda s: tv.RoIAlign(SIZE, SCALE, 2, True),
                lambda m, x, b: roiops.roi_align(x, b, SIZE, SCALE, 2, True), **_tv(tv.RoIAlign, SIZE, SCALE, 2, True)),
        Subject(tv.RoIPool, lambda s: tv.RoIPool(SIZE, SCALE),
                lambda m, x, b: roiops.roi_pool(x, b, SIZE, SCALE, "caffe"), **_tv(tv.RoIPool, SIZE, SCALE)),
        Subject(tv.PSRoIAlign, lambda s: tv.PSRoIAlign(SIZE, SCALE, 2),
                lambda m, x, b: roiops.ps_roi_align(x, b, SIZE, SCALE, 2), channels=ps,
                **_tv(tv.PSRoIAlign, SIZE, SCALE, 2)),
        Subject(tv.PSRoIPool, lambda s: tv.PSRoIPool(SIZE, SCALE),
                lambda m, x, b: roiops.ps_roi_pool(x, b, SIZE, SCALE), channels=ps, **_tv(tv.PSRoIPool, SIZE, SCALE)),
        Subject(tv.MultiScaleRoIAlign, lambda s: tv.MultiScaleRoIAlign(names, SIZE, 2, canonical_scale=56),
                lambda m, x, b: roiops.multi_scale_roi_align([x[n] for n in names], b, SIZE,
                                                             _pyramid_scales(x, names), 2, False,
                                                             canonical_box_size=56),
                "levels", call=lambda m, x, b: m(x, b, [IMAGE] * 2),
                **_tv(tv.MultiScaleRoIAlign, names, SIZE, 2, canonical_scale=56)),
        # detectron2: the boxes cast to the map's dtype; rotated angles in degrees.
        Subject(d2.ROIAlign, lambda s: d2.ROIAlign(SIZE, SCALE, 0),
                lambda m, x, b: roiops.roi_align(x, b.to(x.dtype), SIZE, SCALE, 0, True)),
        Subject(d2.ROIAlignRotated, lambda s: d2.ROIAlignRotated(SIZE, SCALE, 2),
                lambda m, x, b: roiops.roi_align_rotated(x, b, SIZE, SCALE, 2, True, False, "degrees"), ROTATED),
        # faster-rcnn.pytorch: its corner RoIAlign (no roiops op: the loop oracle), Caffe RoIPool.
        Subject(frp.RoIAlign, lambda s: frp.RoIAlign(*SIZE, SCALE), _corners()),
        Subject(frp.RoIAlignAvg, lambda s: frp.RoIAlignAvg(*SIZE, SCALE), _corners("avg")),
        Subject(frp.RoIAlignMax, lambda s: frp.RoIAlignMax(*SIZE, SCALE), _corners("max")),
        Subject(frp.RoIPool, lambda s: frp.RoIPool(*SIZE, SCALE),
                lambda m, x, b: roiops.roi_pool(x, b, SIZE, SCALE, "caffe")),
        # maskrcnn-benchmark: legacy RoIAlign, Caffe RoIPool.
        Subject(mrb.ROIAlign, lambda s: mrb.ROIAlign(SIZE, SCALE, 2),
                lambda m, x, b: roiops.roi_align(x, b, SIZE, SCALE, 2, False)),
        Subject(mrb.ROIPool, lambda s: mrb.ROIPool(SIZE, SCALE),
                lambda m, x, b: roiops.roi_pool(x, b, SIZE, SCALE, "caffe")),
        # mmdetection v1 and simple-faster-rcnn: the continuous and the Caffe RoIPool.
        Subject(mmdet.RoIPool, lambda s: mmdet.RoIPool(SIZE, SCALE),
                lambda m, x, b: roiops.roi_pool(x, b, SIZE, SCALE, "mmdet")),
        Subject(sfr.RoIPooling2D, lambda s: sfr.RoIPooling2D(*SIZE, SCALE),
                lambda m, x, b: roiops.roi_pool(x, b, SIZE, SCALE, "caffe")),
        # mmcv.
        Subject(mmcv.RoIAlign, lambda s: mmcv.RoIAlign(SIZE, SCALE, 2, "max"),
                lambda m, x, b: roiops.roi_align(x, b, SIZE, SCALE, 2, True, "max")),
        Subject(mmcv.RoIPool, lambda s: mmcv.RoIPool(SIZE, SCALE),
                lambda m, x, b: roiops.roi_pool(x, b, SIZE, SCALE, "mmdet")),
        Subject(mmcv.RoIAlignRotated, lambda s: mmcv.RoIAlignRotated(SIZE, SCALE, 2, True, True),
                lambda m, x, b: roiops.roi_align_rotated(x, b, SIZE, SCALE, 2, True, True, "radians"), ROTATED),
        Subject(mmcv.RiRoIAlignRotated, lambda s: mmcv.RiRoIAlignRotated(SIZE, SCALE, 2, 4),
                lambda m, x, b: roiops.riroi_align_rotated(x, b, SIZE, SCALE, 2, 4, False), ROTATED, 4 * C),
        Subject(mmcv.PrRoIPool, lambda s: mmcv.PrRoIPool(SIZE, SCALE),
                lambda m, x, b: roiops.prroi_pool(x, b, SIZE, SCALE)),
        Subject(mmcv.DeformRoIPool, lambda s: mmcv.DeformRoIPool(SIZE, SCALE, 2, GAMMA),
                lambda m, x, b: roiops.deform_roi_pool(x, b, _offset(x, b), SIZE, SCALE, 2, GAMMA),
                call=lambda m, x, b: m(x, b, _offset(x, b))),
        Subject(mmcv.DeformRoIPoolPack, lambda s: _seeded(mmcv.DeformRoIPoolPack(SIZE, C, 8, SCALE, 2, GAMMA), s),
                _pack_oracle(False), fixed_channels=True, state=lambda m: _pack_state(m, False)),
        Subject(mmcv.ModulatedDeformRoIPoolPack,
                lambda s: _seeded(mmcv.ModulatedDeformRoIPoolPack(SIZE, C, 8, SCALE, 2, GAMMA), s),
                _pack_oracle(True), fixed_channels=True, state=lambda m: _pack_state(m, True)),
        Subject(mmcv.BezierAlign, lambda s: mmcv.BezierAlign(SIZE, SCALE, 2),
                lambda m, x, b: roiops.bezier_align(x, b, SIZE, SCALE, 2, True), BEZIER),
        Subject(mmcv.BorderAlign, lambda s: mmcv.BorderAlign(2),
                lambda m, x, b: roiops.border_align(x, b, 2), PER_IMAGE, 4 * C),
    ]
    return table


SUBJECTS = _entries()
BY_CLASS = {s.cls: s for s in SUBJECTS}


def subjects(select: Callable[[Subject], bool] = lambda s: True) -> list[Any]:
    return [pytest.param(s, id=s.id) for s in SUBJECTS if select(s)]


def test_every_class_has_an_entry():
    """A discovered class without an entry fails here (add its arguments and oracle to
    _entries); so does an entry for a class that is no longer public."""
    found = discovered()
    assert tv.MultiScaleRoIAlign in found and mmcv.ModulatedDeformRoIPoolPack in found
    missing = [f"{c.__module__}.{c.__name__}" for c in found if c not in BY_CLASS]
    stale = [s.id for s in SUBJECTS if s.cls not in found]
    assert not missing and not stale, (missing, stale)
    assert len(BY_CLASS) == len(SUBJECTS)


# ----------------------------------------------------------------------------- inputs and runs


def _apply(x: Any, f: Callable[[Tensor], Tensor]) -> Any:
    """``f`` on a map, or on each map of a dict of FPN maps."""
    return OrderedDict((k, f(v)) for k, v in x.items()) if isinstance(x, dict) else f(x)


def _tensors(x: Any) -> list[Tensor]:
    return list(x.values()) if isinstance(x, dict) else [x]


def inputs(s: Subject, dtype: torch.dtype = F32, channels_last: bool = False, channels: int | None = None,
           n: int = N, count: int = 4, seed: int = 0, nasty: bool = False) -> tuple[Any, Any]:
    """A map (or FPN maps) of ``n`` images and ``channels`` channels in ``dtype`` and layout,
    and ``count`` random boxes (and with ``nasty`` those of tests/boxes.py) in the subject's
    form, in the kernels' coordinate type."""
    c = s.channels if channels is None else channels
    box_dtype = F64 if dtype == F64 else F32
    if s.boxes == "levels":
        x = OrderedDict((name, feature(dtype, channels_last, seed + i, shape=(n, c, IMAGE[0] >> (i + 2),
                                                                               IMAGE[1] >> (i + 2))))
                        for i, name in enumerate(["0", "1", "pool"]))
        rows = boxes_for(AXIS_ALIGNED, box_dtype, seed, count, max(n, 1), IMAGE[1], IMAGE[0], nasty) \
            if count else torch.zeros(0, 5, dtype=box_dtype)
        return x, [rows[rows[:, 0] == i, 1:] for i in range(n)]
    x = feature(dtype, channels_last, seed, shape=(n, c, H, W))
    if s.boxes is PER_IMAGE:  # in cells
        rows = boxes_for(AXIS_ALIGNED, box_dtype, seed, n * count, 1, W, H, False)
        return x, rows[:, 1:].reshape(n, count, 4)
    if count == 0:
        return x, torch.zeros(0, s.boxes.width, dtype=box_dtype)
    return x, boxes_for(s.boxes, box_dtype, seed, count, max(n, 1), nasty=nasty)


def build(s: Subject, dtype: torch.dtype = F32, seed: int = 0) -> nn.Module:
    return s.make(seed).to(dtype)


def forward_backward(fn: Callable[[Any, Any], Tensor], x: Any, boxes: Any, grad_dtype: torch.dtype | None = None,
                     backend: str | None = None) -> tuple[Tensor, list[Tensor | None], list[Tensor | None]]:
    """``fn(x, boxes)``'s output and, for a fixed random upstream gradient (rounded to
    ``grad_dtype``, by default the output's dtype), the gradients of the maps and of the
    boxes (None where they get none), on ``backend``'s kernels."""
    x = _apply(x, lambda t: t.detach().clone().requires_grad_())
    if isinstance(boxes, Tensor):
        boxes = boxes.detach().clone().requires_grad_()
    elif isinstance(boxes, list):
        boxes = [b.detach().clone().requires_grad_() for b in boxes]
    with roiops.use_backend(backend) if backend else contextlib.nullcontext():
        out = fn(x, boxes)
        g = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=F64)
        out.backward(g.to(grad_dtype or out.dtype).to(out.dtype))
    box_list = boxes if isinstance(boxes, list) else [boxes]
    return out.detach(), [t.grad for t in _tensors(x)], [b.grad for b in box_list]


def module_run(s: Subject, m: nn.Module, x: Any, boxes: Any) -> tuple[Tensor, list, list]:
    return forward_backward(lambda t, b: s.call(m, t, b), x, boxes)


def oracle_run(s: Subject, m: nn.Module, x: Any, boxes: Any, dtype: torch.dtype,
               backend: str | None = None) -> tuple[Tensor, list, list]:
    """The oracle (on ``backend``'s kernels), fed the module's upstream gradient."""
    return forward_backward(lambda t, b: s.oracle(m, t, b), x, boxes, grad_dtype=dtype, backend=backend)


def _grads_close(got: list, want: list, dtype: torch.dtype, boxes: bool = False) -> None:
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert (a is None) == (b is None), (a, b)
        if a is None:
            continue
        assert a.shape == b.shape and a.dtype == b.dtype
        if boxes:  # sums of terms of both signs: against the size of their terms
            t = tol(dtype)["atol"]
            scale = 1 + float(b.abs().amax()) if b.numel() else 1
            torch.testing.assert_close(a.double(), b.double(), rtol=t, atol=t * scale)
        else:
            close(a, b, dtype)


def assert_matches(got: tuple, want: tuple, dtype: torch.dtype) -> None:
    """A module's (output, map gradients, box gradients) against its oracle's, to the dtype's
    rounding: the same shape, dtype and memory format."""
    out, ref = got[0], want[0]
    assert out.shape == ref.shape and out.dtype == ref.dtype
    assert out.numel() == 0 or out.is_contiguous(memory_format=CL) == ref.is_contiguous(memory_format=CL)
    close(out, ref, dtype)
    _grads_close(got[1], want[1], dtype)
    _grads_close(got[2], want[2], dtype, boxes=True)


def assert_same(got: tuple, want: tuple) -> None:
    """Two runs: the same bits, forward and backward."""
    assert torch.equal(got[0], want[0])
    for a, b in zip(got[1] + got[2], want[1] + want[2], strict=True):
        assert (a is None and b is None) or torch.equal(a, b)


# ----------------------------------------------------------------------------- against the oracle


def _dtype_id(dtype: torch.dtype) -> str:
    return str(dtype)[6:]


# Every dtype in NCHW, a half type and float32 in channels_last (the functions' own tests
# run every pair; the classes pass the map through).
LAYOUTS = [(d, False) for d in DTYPES] + [(F16, True), (F32, True)]


@pytest.mark.parametrize("dtype, channels_last", LAYOUTS,
                         ids=[f"{_dtype_id(d)}-{'cl' if cl else 'nchw'}" for d, cl in LAYOUTS])
@pytest.mark.parametrize("s", subjects())
def test_matches_oracle(s, dtype, channels_last):
    """Output, map gradient and box gradient in every dtype, NCHW and channels_last, against
    the oracle on the same values, to the dtype's rounding. In float64 NCHW the oracle runs on
    the reference kernels, with tests/boxes.py's nasty boxes too (slow); elsewhere on the
    default kernels, with 4 random boxes."""
    m = build(s, dtype)
    independent = dtype == F64 and not channels_last
    x, boxes = inputs(s, dtype, channels_last, nasty=independent)
    got = module_run(s, m, x, boxes)
    assert_matches(got, oracle_run(s, m, x, boxes, dtype, "reference" if independent else None), dtype)
    assert got[0].abs().sum() > 0 and sum(float(g.abs().sum()) for g in got[1] if g is not None) > 0


@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "cl"])
@pytest.mark.parametrize("s", subjects())
def test_no_boxes(s, channels_last):
    """K = 0 (an image without proposals): an empty output of the oracle's shape, and a
    backward that runs: zero map gradient, zero gradients of any learned weights."""
    m = build(s)
    x, boxes = inputs(s, channels_last=channels_last, count=0)
    got = module_run(s, m, x, boxes)
    want = oracle_run(s, m, x, boxes, F32)
    assert got[0].numel() == 0 and (s.boxes is PER_IMAGE or got[0].shape[0] == 0)
    assert_matches(got, want, F32)
    grads = [g for g in got[1] if g is not None]  # FPN maps: those of the levels the module reads
    assert grads and not any(g.any() for g in grads)
    assert all(p.grad is None or not p.grad.any() for p in m.parameters())


@pytest.mark.parametrize("s", subjects())
def test_no_channels(s):
    """A map of 0 channels: an output of 0 channels as the oracle's, and a backward; a class
    built for a channel count (learned layers) refuses it with roiops' ValueError."""
    m = build(s)
    x, boxes = inputs(s, channels=0)
    if s.fixed_channels:
        with pytest.raises(ValueError, match=f"output_channels={s.channels}"):
            s.call(m, x, boxes)
        return
    got = module_run(s, m, x, boxes)
    assert got[0].numel() == 0 and got[0].shape[1] == 0
    assert_matches(got, oracle_run(s, m, x, boxes, F32), F32)


@pytest.mark.parametrize("s", subjects())
def test_empty_batch(s):
    """A batch of no images (and so no boxes, or [0, K, 4] per image): an empty output of the
    oracle's shape, and a backward."""
    m = build(s)
    x, boxes = inputs(s, n=0, count=3 if s.boxes is PER_IMAGE else 0)
    got = module_run(s, m, x, boxes)
    assert got[0].numel() == 0 and got[0].shape[0] == 0
    assert_matches(got, oracle_run(s, m, x, boxes, F32), F32)


def _strided(t: Tensor) -> list[Tensor]:
    """``t``'s values in maps that are neither NCHW nor channels_last: batch and channels
    swapped in memory, every other column of a wider map."""
    swapped = t.transpose(0, 1).contiguous().transpose(0, 1)
    wide = t.new_zeros(*t.shape[:3], 2 * t.shape[3])
    wide[..., ::2] = t
    return [swapped, wide[..., ::2]]


@pytest.mark.parametrize("s", subjects())
def test_strided_input(s):
    """A strided map gives the bits of its contiguous copy, and the oracle's values."""
    m = build(s)
    x, boxes = inputs(s)
    want = module_run(s, m, x, boxes)
    for i in range(2):
        strided = _apply(x, lambda t: _strided(t)[i])
        t = _tensors(strided)[0]
        assert not t.is_contiguous() and not t.is_contiguous(memory_format=CL)
        got = module_run(s, m, strided, boxes)
        assert_same(got, want)
        if i == 0:
            assert_matches(got, oracle_run(s, m, strided, boxes, F32), F32)


# ----------------------------------------------------------------------------- saving and state


@pytest.mark.parametrize("s", subjects())
def test_save_and_load(s, tmp_path):
    """torch.save of the whole module and torch.load (weights_only=False), and a state_dict
    loaded into a module built with other weights: the same outputs, bit for bit."""
    m = build(s)
    x, boxes = inputs(s)
    want = module_run(s, m, x, boxes)
    torch.save(m, tmp_path / "module.pt")
    loaded = torch.load(tmp_path / "module.pt", weights_only=False)
    assert type(loaded) is s.cls and repr(loaded) == repr(m)
    assert_same(module_run(s, loaded, x, boxes), want)
    buffer = io.BytesIO()
    torch.save(m.state_dict(), buffer)
    buffer.seek(0)
    other = build(s, seed=1)
    other.load_state_dict(torch.load(buffer, weights_only=True))
    assert_same(module_run(s, other, x, boxes), want)


@pytest.mark.parametrize("s", subjects())
def test_state_dict_names_are_the_peers(s):
    """The state_dict's names and shapes are the peer's: torchvision's class built with the
    same arguments where torchvision is the peer; else the peer's documented ones (mmcv's
    Pack layers' offset_fc/mask_fc; no state in the others' layers)."""
    m = build(s)
    ours = {k: tuple(v.shape) for k, v in m.state_dict().items()}
    theirs = {k: tuple(v.shape) for k, v in s.peer().state_dict().items()} if s.peer else s.state(m)
    assert ours == theirs
    assert list(ours) == list(theirs)


# ----------------------------------------------------------------------------- compile, meta


@pytest.mark.parametrize("s", subjects())
def test_compile(s, fresh_dynamo):
    """torch.compile(fullgraph) of the module: the eager results bit for bit, forward and
    backward."""
    m = build(s)
    compiled = torch.compile(m, backend="eager", fullgraph=True)
    x, boxes = inputs(s)
    assert_same(module_run(s, compiled, x, boxes), module_run(s, m, x, boxes))


@pytest.mark.parametrize("s", subjects())
def test_meta_tensors(s):
    """The module and its inputs on the meta device: the output's shape and dtype, on meta."""
    m = build(s)
    x, boxes = inputs(s)
    want = s.call(m, x, boxes)
    meta = copy.deepcopy(m).to("meta")
    boxes = [b.to("meta") for b in boxes] if isinstance(boxes, list) else boxes.to("meta")
    got = s.call(meta, _apply(x, lambda t: t.to("meta")), boxes)
    assert got.device.type == "meta" and got.shape == want.shape and got.dtype == want.dtype


# ----------------------------------------------------------------------------- TorchScript


def _script(obj: Any) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.jit.script(obj)


def _saved_and_loaded(scripted: Any) -> Any:
    buffer = io.BytesIO()
    torch.jit.save(scripted, buffer)
    buffer.seek(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.jit.load(buffer)


@pytest.mark.parametrize("s", subjects(lambda s: s.script))
def test_torchscript_save_and_load(s):
    """torch.jit.script, torch.jit.save, torch.jit.load: the loaded module gives the eager
    outputs, bit for bit, on boxes and on no boxes, and the same gradient."""
    m = build(s)
    loaded = _saved_and_loaded(_script(build(s)))
    for count in (4, 0):
        x, boxes = inputs(s, count=count)
        assert_same(module_run(s, loaded, x, boxes), module_run(s, m, x, boxes))
    if s.boxes != "levels":  # a list of each image's boxes, as torchvision takes
        x, boxes = inputs(s)
        lists, ordered = per_image(boxes)
        assert torch.equal(s.call(loaded, x, lists), s.call(m, x, ordered))


def _roi_heads(pooler: nn.Module) -> nn.Module:
    """torchvision's detection RoIHeads (Faster R-CNN's box branch) with this box pooler."""
    from torchvision.models.detection.faster_rcnn import FastRCNNPredictor, TwoMLPHead
    from torchvision.models.detection.roi_heads import RoIHeads

    torch.manual_seed(0)
    head, predictor = TwoMLPHead(4 * 9, 16), FastRCNNPredictor(16, 3)
    return RoIHeads(pooler, head, predictor, 0.5, 0.5, 64, 0.25, None, 0.0, 0.5, 10).eval()


def test_scripted_roi_heads_with_roiops_pooler_survive_save_and_load():
    """A detector's RoIHeads with roiops' MultiScaleRoIAlign scripted, saved and loaded (how
    TorchScript models are deployed) gives the detections of the eager heads, which are those
    of the heads with torchvision's pooler; an image without proposals gets none."""
    names = ["0", "1"]
    ours = _roi_heads(tv.MultiScaleRoIAlign(names, 3, 2))
    theirs = _roi_heads(torchvision.ops.MultiScaleRoIAlign(names, 3, 2))
    x, rows = inputs(BY_CLASS[tv.MultiScaleRoIAlign], channels=4, seed=3)
    proposals = [rows[0], rows[1][:0]]  # the second image has no proposals
    shapes = [IMAGE, IMAGE]
    with torch.no_grad():
        eager, _ = ours(x, proposals, shapes)
        expected, _ = theirs(x, proposals, shapes)
        loaded = _saved_and_loaded(_script(_roi_heads(tv.MultiScaleRoIAlign(names, 3, 2))))
        got, _ = loaded(x, proposals, shapes)
    assert len(eager[0]["boxes"]) > 0 and len(eager[1]["boxes"]) == 0
    for e, t, g in zip(eager, expected, got):
        assert e.keys() == t.keys() == g.keys()
        for key in e:
            assert torch.equal(e[key], t[key]) and torch.equal(e[key], g[key]), key
