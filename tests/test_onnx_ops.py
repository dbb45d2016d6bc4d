"""ONNX export of the operators beyond RoIAlign and RoIPool, checked in onnxruntime against
roiops' kernels bit for bit: on nasty boxes, maps with NaN and infinities, zero boxes, in
float16 and float64; and heads of real detectors built on them, against eager.

Exports are slow (seconds each): each operator's model is exported once.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
import torch
from torch.export import Dim

import roiops
from onnx_runs import OUT, SCALE, boxes_for_tests, export, inputs, run, same
from roiops.onnx import MIN_OPSET
from roiops._boxes import AXIS_ALIGNED, BEZIER, ROTATED
from roiops.compat import torchvision as tv

pytest.importorskip("onnx")


class _PositionSensitive(torch.nn.Module):
    """R-FCN's pooling: ps_roi_align with adaptive and fixed grids, ps_roi_pool."""

    def forward(self, x: torch.Tensor, boxes: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (roiops.ps_roi_align(x, boxes, OUT, SCALE, 0), roiops.ps_roi_align(x, boxes, OUT, SCALE, 2),
                roiops.ps_roi_align(x, boxes, OUT, SCALE, -1), roiops.ps_roi_pool(x, boxes, OUT, SCALE))


def _score_maps(x: torch.Tensor) -> torch.Tensor:
    """Two output channels of OUT's bins from a 3-channel map: 24 channels, each different."""
    return torch.cat([x * (i + 1) - i for i in range(2 * OUT[0] * OUT[1] // x.shape[1])], 1)


class _Deformable(torch.nn.Module):
    """Deformable RoI pooling with its offsets (adaptive and fixed grids) and without."""

    def forward(self, x: torch.Tensor, boxes: torch.Tensor, offset: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (roiops.deform_roi_pool(x, boxes, offset, OUT, SCALE, 0, 0.1),
                roiops.deform_roi_pool(x, boxes, offset, OUT, SCALE, 2, -0.7),
                roiops.deform_roi_pool(x, boxes, None, OUT, SCALE, 2))


def _offsets(k: int, seed: int = 0) -> torch.Tensor:
    """Offsets that move bins within the box (even boxes) and far outside the map (odd ones)."""
    reach = torch.where(torch.arange(k) % 2 == 0, 0.3, 8.0).view(k, 1, 1, 1)
    return torch.randn(k, 2, *OUT, generator=torch.Generator().manual_seed(seed)) * reach


def _degree(like: torch.Tensor) -> torch.Tensor:
    """pi / 180 as a tensor of ``like``'s dtype: torch.onnx stores a Python float in a
    float32 constant, which would round a float64 model's angles."""
    return like.new_tensor(math.pi / 180)


class _Rotated(torch.nn.Module):
    """Rotated RoIAlign: detectron2's (degrees, aligned) and mmcv's (radians, clockwise,
    unaligned) conventions, adaptive and fixed grids."""

    def forward(self, x: torch.Tensor, boxes: torch.Tensor) -> tuple[torch.Tensor, ...]:
        radians = torch.cat([boxes[:, :5], boxes[:, 5:] * _degree(boxes)], 1)
        return (roiops.roi_align_rotated(x, boxes, OUT, SCALE, 0),
                roiops.roi_align_rotated(x, boxes, OUT, SCALE, 2, aligned=False),
                roiops.roi_align_rotated(x, radians, OUT, SCALE, -1, clockwise=True, angle="radians"),
                roiops.roi_align_rotated(x, radians, OUT, SCALE, 3, aligned=False, angle="radians"))


def _rotated_boxes() -> torch.Tensor:
    return torch.cat([ROTATED.nasty(2, 22, 18), ROTATED.random(2, 9, 22, 18, torch.Generator().manual_seed(0)),
                      ROTATED.from_axis_aligned(boxes_for_tests())])


class _RotationInvariant(torch.nn.Module):
    """ReDet's rotation-invariant RoIAlign, 8 and 4 orientations, either sense."""

    def forward(self, x: torch.Tensor, boxes: torch.Tensor) -> tuple[torch.Tensor, ...]:
        radians = torch.cat([boxes[:, :5], boxes[:, 5:] * _degree(boxes)], 1)
        return (roiops.riroi_align_rotated(x, radians, OUT, SCALE, 0, 8),
                roiops.riroi_align_rotated(x, radians, OUT, SCALE, 2, 4, clockwise=True))


class _Bezier(torch.nn.Module):
    """ABCNet's BezierAlign, aligned (adaptive grid) and not (fixed)."""

    def forward(self, x: torch.Tensor, boxes: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return roiops.bezier_align(x, boxes, OUT, SCALE, 0), roiops.bezier_align(x, boxes, OUT, SCALE, 2, False)


def _beziers() -> torch.Tensor:
    return torch.cat([BEZIER.nasty(2, 22, 18), BEZIER.random(2, 9, 22, 18, torch.Generator().manual_seed(0)),
                      BEZIER.from_axis_aligned(boxes_for_tests())])


class _Precise(torch.nn.Module):
    def forward(self, x: torch.Tensor, boxes: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return roiops.prroi_pool(x, boxes, OUT, SCALE), roiops.prroi_pool(x, boxes, 2, 1.0)


class _Pyramid(torch.nn.Module):
    """FPN pooling: the level of each box chosen in the graph (both rules), then RoIAlign
    from that level's map."""

    def forward(self, p2: torch.Tensor, p3: torch.Tensor, p4: torch.Tensor, boxes: torch.Tensor
                ) -> tuple[torch.Tensor, ...]:
        maps, scales = [p2, p3, p4], [1 / 4, 1 / 8, 1 / 16]
        return (roiops.multi_scale_roi_align(maps, boxes, 7, scales, 2, False),
                roiops.multi_scale_roi_align(maps, boxes, (3, 5), scales, 0, True, level_rule="detectron2",
                                             canonical_box_size=32, canonical_level=3))


def _pyramid(seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(2, 3, 64 // 2**i, 96 // 2**i, generator=g) for i in range(3))


def _pyramid_boxes() -> torch.Tensor:
    """Boxes of every level (4 to 380 pixels), some of negative area (no level)."""
    boxes = AXIS_ALIGNED.random(2, 24, 384, 256, torch.Generator().manual_seed(2))
    extra = torch.tensor([[0, 10.0, 10.0, 14.0, 14.0], [1, 0.0, 0.0, 380.0, 250.0], [0, 50.0, 40.0, 20.0, 90.0],
                          [1, 30.0, 30.0, 30.0, 30.0], [0, 100.0, 80.0, 164.0, 144.0]])
    return torch.cat([boxes, extra])


@pytest.mark.parametrize("align_avg", ["RoiAlign", "decompose"])
def test_multi_scale_roi_align_exports_as_one_graph(align_avg):
    k = Dim("K")
    maps = _pyramid()
    boxes = _pyramid_boxes()
    model, session = export(_Pyramid(), (*maps, boxes[:6]), {"p2": None, "p3": None, "p4": None, "boxes": {0: k}},
                             align_avg=align_avg)
    assert {n.domain for n in model.graph.node} == {""}
    for b in (boxes, boxes[:0], boxes[-2:-1]):
        got = session.run(None, {"p2": maps[0].numpy(), "p3": maps[1].numpy(), "p4": maps[2].numpy(),
                                 "boxes": b.numpy()})
        for i, (a, e) in enumerate(zip(got, _Pyramid()(*maps, b))):
            # RoiAlign agrees with the kernels to float rounding on finite maps; the decomposition bit for bit.
            same(a, e, exact=align_avg == "decompose", what=f"output {i}, K={len(b)}")


class _ThreeDtypes(torch.nn.Module):
    """A module's outputs on a float32, a float16 and a float64 map (with boxes in the
    kernels' coordinate type of each), in one export."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x32: torch.Tensor, x16: torch.Tensor, x64: torch.Tensor, b32: torch.Tensor,
                b64: torch.Tensor, *extra: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (*self.inner(x32, b32, *extra), *self.inner(x16, b32, *extra), *self.inner(x64, b64, *extra))


# (the model, the map it reads from a 3-channel one, its boxes)
MODELS = [(_PositionSensitive, _score_maps, boxes_for_tests), (_Deformable, lambda x: x, boxes_for_tests),
          (_Rotated, lambda x: x, _rotated_boxes), (_RotationInvariant, _score_maps, _rotated_boxes),
          (_Bezier, lambda x: x, _beziers), (_Precise, lambda x: x, boxes_for_tests)]


def _args(module: type, x: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
    extra = (_offsets(len(b)),) if module is _Deformable else ()
    return (x, x.half(), x.double(), b, b.double(), *extra)


@functools.cache
def _session(module: type, maps, boxes):
    k = Dim("K")
    x32, x16, x64, b32, b64, *extra = _args(module, maps(inputs()["randn"]), boxes())
    args = (x32, x16, x64, b32[:4], b64[:4], *(e[:4] for e in extra))  # a few boxes; K is dynamic
    shapes = {"x32": None, "x16": None, "x64": None, "b32": {0: k}, "b64": {0: k}}
    if module is _Deformable:
        shapes["extra"] = ({0: k},)
    # The graph as roiops builds it: onnxscript's optimiser takes time quadratic in a graph's
    # nodes (half a minute for these bundles of twelve decomposed ops), and the graphs it
    # optimises are checked by the whole-model tests below and by tests/test_onnx.py. At the
    # lowest opset, to which torch.onnx converts its opset-18 graph.
    return export(_ThreeDtypes(module()), args, shapes, optimize=False, opset_version=MIN_OPSET)


@pytest.mark.filterwarnings("ignore:# The axis name")  # the inputs with boxes share the Dim K, as intended
@pytest.mark.parametrize("name", list(inputs()))
@pytest.mark.parametrize("module,maps,boxes", MODELS, ids=[m[0].__name__.strip("_") for m in MODELS])
def test_onnxruntime_equals_the_kernels_bit_for_bit(module, maps, boxes, name):
    """On maps with NaN, infinities and ties, nasty boxes (also at an inexact scale) and no
    boxes, in float32, float16 (computed in float32, rounded once) and float64. Rotated
    boxes in float64 are the exception: onnxruntime's float64 Cos and Sin are not libm's
    (up to 6e-16 off, about 3 units in the last place), which moves their samples by that
    much times the box's size."""
    model, session = _session(module, maps, boxes)
    assert {n.domain for n in model.graph.node} == {""}  # standard ONNX operators only
    assert not {n.op_type for n in model.graph.node} & {"RoiAlign", "MaxRoiPool"}
    x, b = maps(inputs()[name]), boxes()
    wider = b.clone()
    wider[:, 1:] *= 1.5
    for bs in (b, wider, b[:0]):
        args = _args(module, x, bs)
        for i, (a, e) in enumerate(zip(run(session, args), _ThreeDtypes(module())(*args))):
            assert a.dtype == e.numpy().dtype
            turned = module in (_Rotated, _RotationInvariant) and e.dtype == torch.float64
            torch.testing.assert_close(torch.from_numpy(a), e, rtol=0, atol=1e-12 if turned else 0, equal_nan=True,
                                       msg=f"output {i}, K={len(bs)}")


class _RoIStage(torch.nn.Module):
    """The second stage of torchvision's Mask R-CNN with roiops' poolers: from the FPN maps
    and the proposals to class scores, box deltas and mask logits (the whole detector does
    not pass torch.export: torchvision's batched_nms guards on a data-dependent size)."""

    def __init__(self) -> None:
        super().__init__()
        from torchvision.models.detection import maskrcnn_resnet50_fpn

        torch.manual_seed(0)
        heads = maskrcnn_resnet50_fpn(weights=None, weights_backbone=None, num_classes=3).roi_heads
        for name in ("box_roi_pool", "mask_roi_pool"):
            theirs = getattr(heads, name)
            setattr(heads, name, tv.MultiScaleRoIAlign(theirs.featmap_names, theirs.output_size, theirs.sampling_ratio))
        self.heads = heads.eval()

    def forward(self, p2: torch.Tensor, p3: torch.Tensor, p4: torch.Tensor, p5: torch.Tensor,
                proposals: torch.Tensor) -> tuple[torch.Tensor, ...]:
        h = self.heads
        maps = {"0": p2, "1": p3, "2": p4, "3": p5}
        sizes = [(256, 384)]
        scores, deltas = h.box_predictor(h.box_head(h.box_roi_pool(maps, [proposals], sizes)))
        masks = h.mask_predictor(h.mask_head(h.mask_roi_pool(maps, [proposals], sizes)))
        return scores, deltas, masks


class _Heads(torch.nn.Module):
    """Heads of other detectors: R-FCN (position-sensitive scores, averaged per box), a
    rotated box head and mmcv's deformable RoI pooling layer, which predicts its offsets."""

    def __init__(self) -> None:
        super().__init__()
        from roiops.compat.mmcv import DeformRoIPoolPack

        torch.manual_seed(0)
        self.scores = torch.nn.Conv2d(8, 3 * 49, 1)
        self.rotated = torch.nn.Linear(8 * 49, 5)
        self.deform = DeformRoIPoolPack(7, 8, deform_fc_channels=32, spatial_scale=1 / 8, sampling_ratio=2)

    def forward(self, x: torch.Tensor, boxes: torch.Tensor, rotated: torch.Tensor) -> tuple[torch.Tensor, ...]:
        rfcn = roiops.ps_roi_align(self.scores(x), boxes, 7, 1 / 8, 2).mean(dim=(2, 3))
        oriented = self.rotated(roiops.roi_align_rotated(x, rotated, 7, 1 / 8, 2).flatten(1))
        return rfcn, oriented, self.deform(x, boxes)


def _close_to_scale(actual: np.ndarray, expected: torch.Tensor, what: str) -> None:
    """Equal up to the float rounding of the layers around the pooling (onnxruntime's
    convolutions and matrix products sum in their own order): 1e-5 of the output's scale."""
    expected = expected.detach()
    torch.testing.assert_close(torch.from_numpy(actual), expected, rtol=0,
                               atol=1e-5 * max(float(expected.abs().max()), 1.0), msg=what)


@pytest.mark.filterwarnings("ignore:# The axis name")  # both box inputs share the Dim K, as intended
def test_detector_heads_export_and_equal_eager():
    torchvision = pytest.importorskip("torchvision")
    del torchvision

    g = torch.Generator().manual_seed(0)
    maps = tuple(torch.randn(1, 256, 64 // 2**i, 96 // 2**i, generator=g) for i in range(4))
    proposals = AXIS_ALIGNED.random(1, 12, 384, 256, g)[:, 1:]
    stage = _RoIStage()
    k = Dim("K")
    names = ("p2", "p3", "p4", "p5", "proposals")
    _, session = export(stage, (*maps, proposals[:3]), {**dict.fromkeys(names[:4]), "proposals": {0: k}})
    for p in (proposals, proposals[:1]):
        for i, (a, e) in enumerate(zip(run(session, (*maps, p)), stage(*maps, p))):
            _close_to_scale(a, e, f"output {i}, K={len(p)}")

    heads = _Heads().eval()
    x = torch.randn(2, 8, 32, 48, generator=g)
    boxes = AXIS_ALIGNED.random(2, 10, 384, 256, g)
    rotated = ROTATED.random(2, 10, 384, 256, g)
    _, session = export(heads, (x, boxes[:3], rotated[:3]), {"x": None, "boxes": {0: k}, "rotated": {0: k}})
    for i, (a, e) in enumerate(zip(run(session, (x, boxes, rotated)), heads(x, boxes, rotated))):
        _close_to_scale(a, e, f"output {i}")
