"""ONNX export (roiops.onnx): how it joins torch.onnx (the default translations, a user's
own, the routes where torch moves its registry), that every registered op has a
translation, and RoIAlign's and RoIPool's graphs checked with onnxruntime against roiops
on nasty boxes. The other operators' graphs: tests/test_onnx_ops.py (the graphs do not
depend on the torch release, so only the pinned torch runs that file).

Exports are slow (seconds each), so each fixture exports one model holding many ops.
"""

from __future__ import annotations

import subprocess
import sys
import types
from typing import List

import numpy as np
import pytest
import torch
from torch.export import Dim

import roiops
from boxes import nasty_coordinates
from cases import registered_ops
from onnx_runs import OUT, SCALE, boxes_for_tests, compare, example, export, inputs, same
from roiops import _geometry as geometry
from roiops import _registry
from roiops.compat import torchvision as tv

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
roiops_onnx = pytest.importorskip("roiops.onnx")

# (mode, aligned, sampling_ratio)
ALIGN_CONFIGS = [("avg", True, 0), ("avg", False, 2), ("avg", True, 2), ("avg", False, -1),
                 ("max", True, 0), ("max", False, 2), ("max", True, 3), ("max", False, -1)]


class _AllOps(torch.nn.Module):
    """Every op through the public API, and the raw ops with their argmax outputs."""

    def forward(self, x: torch.Tensor, boxes: torch.Tensor) -> tuple[torch.Tensor, ...]:
        outs = [roiops.roi_align(x, boxes, OUT, SCALE, r, a, mode=m) for m, a, r in ALIGN_CONFIGS]
        outs.append(roiops.roi_pool(x, boxes, OUT, SCALE))
        outs.append(roiops.roi_pool(x, boxes, OUT, SCALE, convention="mmdet"))
        outs.extend(torch.ops.roiops.roi_align_max(x, boxes, SCALE, *OUT, 0, True))
        outs.extend(torch.ops.roiops.roi_pool(x, boxes, SCALE, *OUT, False))
        outs.extend(torch.ops.roiops.roi_pool(x, boxes, SCALE, *OUT, True))
        return tuple(outs)


class _AvgOnly(torch.nn.Module):
    def forward(self, x: torch.Tensor, boxes: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(roiops.roi_align(x, boxes, OUT, SCALE, r, a) for m, a, r in ALIGN_CONFIGS if m == "avg")


@pytest.fixture(scope="module")
def all_ops():
    # At the lowest opset: torch.onnx writes opset 18 and converts the graph down, which must
    # leave every node valid.
    return export(_AllOps(), example(), {"x": None, "boxes": {0: Dim("K")}}, opset_version=roiops_onnx.MIN_OPSET)


@pytest.fixture(scope="module")
def avg_decomposed():
    return export(_AvgOnly(), example(), {"x": None, "boxes": {0: Dim("K")}}, align_avg="decompose")


def test_mapping_of_each_op(all_ops):
    model, _ = all_ops
    nodes = model.graph.node
    assert not [n for n in nodes if n.op_type == "MaxRoiPool"]
    align = [n for n in nodes if n.op_type == "RoiAlign"]
    attrs = [{a.name: onnx.helper.get_attribute_value(a) for a in n.attribute} for n in align]
    # one RoiAlign per avg config (max mode and roi_pool are decomposed)
    got = sorted((a["coordinate_transformation_mode"].decode(), a["sampling_ratio"], a["mode"].decode(),
                  a["output_height"], a["output_width"], a["spatial_scale"]) for a in attrs)
    assert got == sorted([("half_pixel", 0, "avg", 3, 4, SCALE), ("output_half_pixel", 2, "avg", 3, 4, SCALE),
                          ("half_pixel", 2, "avg", 3, 4, SCALE), ("output_half_pixel", 0, "avg", 3, 4, SCALE)])
    # batch_indices: the boxes' first column cast to int64; rois: the other four columns
    producers = {out: n for n in nodes for out in n.output}
    for n in align:
        cast = producers[n.input[2]]
        assert cast.op_type == "Cast" and onnx.helper.get_attribute_value(cast.attribute[0]) == onnx.TensorProto.INT64
    assert model.opset_import[0].version >= roiops_onnx.MIN_OPSET


@pytest.mark.parametrize("name", list(inputs()))
def test_onnxruntime_matches_roiops_on_nasty_boxes(all_ops, name):
    _, session = all_ops
    x = inputs()[name]
    boxes = boxes_for_tests()
    # RoiAlign (the 4 avg outputs) to float rounding; the decompositions bit for bit
    compare(session, _AllOps(), x, boxes, exact_from=4)


@pytest.mark.parametrize("k", [0, 1])
def test_zero_and_one_box(all_ops, k):
    _, session = all_ops
    if k == 0 and tuple(int(v) for v in ort.__version__.split(".")[:2]) < (1, 32):
        # Seen with 1.30: the adaptive max-mode decomposition, run on zero boxes, fails in a
        # Mul ("Can broadcast 0 by 0 or 1. 3 is invalid"); 1.32 (pinned) runs it.
        pytest.skip(f"onnxruntime {ort.__version__} refuses the zero-box graph; tested with 1.32")
    compare(session, _AllOps(), inputs()["randn"], boxes_for_tests()[:k], exact_from=4)


def test_decomposed_avg_is_bit_exact_even_where_roialign_is_not(avg_decomposed):
    # onnxruntime's RoiAlign computes a sample outside the map as 0 * x[b, c, 0, 0], so a
    # NaN or inf there spreads to every bin with such a sample; roiops gives those
    # samples the value 0. The decomposition has no such sample.
    model, session = avg_decomposed
    assert not [n for n in model.graph.node if n.op_type == "RoiAlign"]
    for x in inputs().values():
        poisoned = x.clone()
        poisoned[:, :, 0, 0] = float("nan")
        for inp in (x, poisoned):
            compare(session, _AvgOnly(), inp, boxes_for_tests(), exact_from=0)


class _Dtypes(torch.nn.Module):
    """float16 and float64 feature maps in one export, at an inexact spatial scale."""

    def forward(self, x16: torch.Tensor, x64: torch.Tensor, b32: torch.Tensor,
                b64: torch.Tensor) -> tuple[torch.Tensor, ...]:
        s = 1 / 3
        outs = []
        for x, b in ((x16, b32), (x64, b64)):
            outs += [roiops.roi_align(x, b, 2, s, 0, True), roiops.roi_align(x, b, 2, s, 2, False),
                     roiops.roi_align(x, b, 2, s, 0, True, mode="max"), roiops.roi_pool(x, b, 2, s),
                     roiops.roi_pool(x, b, 2, s, convention="mmdet")]
        return tuple(outs)


@pytest.mark.filterwarnings("ignore:# The axis name")  # both box inputs share the Dim K, as intended
def test_float16_and_float64():
    x = torch.randn(2, 3, 9, 11)
    boxes = boxes_for_tests()
    boxes[:, 1:] *= 1.5
    args = (x.half(), x.double(), boxes, boxes.double())
    k = Dim("K")
    model, session = export(_Dtypes(), (args[0], args[1], boxes[:4], boxes[:4].double()),
                             {"x16": None, "x64": None, "b32": {0: k}, "b64": {0: k}})
    got = session.run(None, {name: a.numpy() for name, a in zip(("x16", "x64", "b32", "b64"), args)})
    expected = _Dtypes()(*args)
    for i, (a, e) in enumerate(zip(got, expected)):
        assert a.dtype == {torch.float16: np.float16, torch.float64: np.float64}[e.dtype]
        # float16: RoiAlign rounds its float32 result once, as the kernel does
        same(a, e, exact=i % 5 > 1, what=f"output {i}")


def test_export_refuses_what_it_cannot_do():
    with pytest.raises(ValueError, match="opset >= 16"):
        roiops_onnx.export(_AvgOnly(), example(), opset_version=15)
    with pytest.raises(ValueError, match="dynamo"):
        roiops_onnx.export(_AvgOnly(), example(), dynamo=False)
    with pytest.raises(ValueError, match="align_avg"):
        roiops_onnx.translation_table(align_avg="RoiAlignMax")  # type: ignore[arg-type]


def test_every_registered_forward_op_has_a_translation():
    forward = {op for op in registered_ops() if not op.startswith("_")}
    table = roiops_onnx.translation_table()
    assert {getattr(torch.ops.roiops, op).default for op in forward} == set(table)


def test_translation_table_with_torch_onnx_export():
    class One(torch.nn.Module):
        def forward(self, x: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
            return roiops.roi_pool(x, boxes, 2, SCALE)

    x, boxes = example()
    program = torch.onnx.export(One().eval(), (x, boxes), dynamo=True,
                                custom_translation_table=roiops_onnx.translation_table())
    session = ort.InferenceSession(program.model_proto.SerializeToString(), providers=["CPUExecutionProvider"])
    (got,) = session.run(None, {"x": x.numpy(), "boxes": boxes.numpy()})
    same(got, One()(x, boxes), exact=True, what="roi_pool")


class _Detector(torch.nn.Module):
    """A user's model: torchvision's RoI layers (through roiops.compat) and roiops' API."""

    def __init__(self) -> None:
        super().__init__()
        self.align = tv.RoIAlign(OUT, SCALE, sampling_ratio=2, aligned=True)
        self.pool = tv.RoIPool(OUT, SCALE)

    def forward(self, x: torch.Tensor, boxes: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (self.align(x, boxes), roiops.roi_align(x, boxes, OUT, SCALE, 0, True), self.pool(x, boxes),
                roiops.roi_align(x, boxes, OUT, SCALE, 0, True, mode="max"),
                roiops.roi_pool(x, boxes, OUT, SCALE, convention="mmdet"))


def _session(program):
    return ort.InferenceSession(program.model_proto.SerializeToString(), providers=["CPUExecutionProvider"])


def test_plain_torch_onnx_export():
    # No custom_translation_table: importing roiops is enough. The example boxes are the
    # test boxes, so their count (static without dynamic_shapes) fits.
    boxes = boxes_for_tests()
    program = torch.onnx.export(_Detector().eval(), (inputs()["randn"], boxes), dynamo=True)
    session = _session(program)
    assert len([n for n in program.model_proto.graph.node if n.op_type == "RoiAlign"]) == 2
    for x in inputs().values():
        compare(session, _Detector(), x, boxes, exact_from=2)


def test_own_translations_come_first_and_ours_fill_in():
    class AvgAndPool(torch.nn.Module):
        def forward(self, x: torch.Tensor, boxes: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return roiops.roi_align(x, boxes, OUT, SCALE, 0, True), roiops.roi_pool(x, boxes, OUT, SCALE)

    align = torch.ops.roiops.roi_align.default
    own = {align: roiops_onnx.translation_table(align_avg="decompose")[align]}  # roi_pool left to ours
    boxes = boxes_for_tests()
    program = torch.onnx.export(AvgAndPool().eval(), (inputs()["randn"], boxes), dynamo=True,
                                custom_translation_table=own)
    assert not [n for n in program.model_proto.graph.node if n.op_type == "RoiAlign"]
    compare(_session(program), AvgAndPool(), inputs()["nan"], boxes, exact_from=0)


def test_where_torch_moved_its_registry_a_warning_names_the_explicit_routes():
    match = r"roiops\.onnx\.export.*custom_translation_table=roiops\.onnx\.translation_table\(\)"
    with pytest.warns(UserWarning, match=match):
        roiops_onnx._extend_default_registry(types.ModuleType("no_registry"))

    class Registry:  # from_torchlib still there, register_op gone
        @classmethod
        def from_torchlib(cls) -> Registry:
            return cls()

    moved = types.ModuleType("moved_register_op")
    moved.ONNXRegistry = Registry
    roiops_onnx._extend_default_registry(moved)
    with pytest.warns(UserWarning, match=match):
        assert isinstance(Registry.from_torchlib(), Registry)  # exports go on, without ours


def test_import_roiops_loads_no_onnx_code():
    code = ("import sys, roiops; loaded = [m for m in sys.modules if m.split('.')[0] in ('onnx', 'onnxscript', "
            "'onnx_ir') or m.startswith(('torch.onnx', 'roiops.onnx'))]; assert not loaded, loaded")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


# The geometry primitives through both ArrayOps: one test op whose eager kernel calls them
# on torch tensors and whose ONNX translation builds them with the translations' _GraphOps.
@torch.library.custom_op("roiops_test::geometry", mutates_args=())
def _geometry_op(coord: torch.Tensor, size: torch.Tensor, start: torch.Tensor, bin_size: torch.Tensor,
                 grid: torch.Tensor, b: torch.Tensor, s: torch.Tensor) -> List[torch.Tensor]:  # torch 2.6's infer_schema rejects list[...]
    return [geometry.round_half_away(coord), *geometry.bilinear_taps(coord, int(size)),
            geometry.sample_position(start, bin_size, grid, b, s)]


@_geometry_op.register_fake
def _(coord, size, start, bin_size, grid, b, s):
    like = torch.empty_like(coord)
    index = torch.empty_like(coord, dtype=torch.int64)
    position = torch.empty(torch.broadcast_shapes(start.shape, b.shape, s.shape), dtype=start.dtype)
    return [like, index, index.clone(), like.clone(), like.clone(), torch.empty_like(coord, dtype=torch.bool),
            position]


def _geometry_graph(coord, size, start, bin_size, grid, b, s):
    ops = roiops_onnx._graph._GraphOps(coord.dtype)
    return [geometry.round_half_away(coord, ops), *geometry.bilinear_taps(coord, size, ops),
            geometry.sample_position(start, bin_size, grid, b, s, ops)]


class _Geometry(torch.nn.Module):
    def forward(self, *args: torch.Tensor) -> list[torch.Tensor]:
        return torch.ops.roiops_test.geometry(*args)


def _bits(a: torch.Tensor) -> torch.Tensor:
    return a.view({torch.float32: torch.int32, torch.float64: torch.int64}.get(a.dtype, a.dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_geometry_primitives_give_the_same_bits_in_torch_and_onnx(dtype):
    # Sample positions from nasty box starts and bin sizes (negative, tiny, huge); the taps
    # for maps of 0, 1 and 9 cells: the exported graph gives the torch results bit for
    # bit (NaN payloads aside), so the translations compute the reference's geometry.
    coord = nasty_coordinates(dtype)
    k = torch.Generator().manual_seed(2)
    start = torch.cat([coord[:40], torch.rand(20, generator=k, dtype=dtype) * 20 - 10]).view(-1, 1, 1)
    bin_size = torch.cat([coord[20:60], torch.rand(20, generator=k, dtype=dtype) * 6 - 1]).view(-1, 1, 1)
    grid = torch.randint(1, 6, start.shape, generator=k)
    b, s = torch.arange(7).view(1, -1, 1), torch.arange(5).view(1, 1, -1)
    args = (coord, torch.tensor(9), start, bin_size, grid, b, s)
    program = torch.onnx.export(_Geometry().eval(), args, dynamo=True,
                                custom_translation_table={torch.ops.roiops_test.geometry.default: _geometry_graph})
    session = _session(program)
    for size in (0, 1, 9):
        args = (coord, torch.tensor(size), start, bin_size, grid, b, s)
        got = session.run(None, {i.name: a.numpy() for i, a in zip(session.get_inputs(), args)})
        expected = _geometry_op(*args)
        assert len(got) == len(expected) == 7
        for i, (a, e) in enumerate(zip(got, expected)):
            a = torch.from_numpy(a)
            assert a.dtype == e.dtype and a.shape == e.shape, (size, i)
            nan = torch.isnan(e) if e.is_floating_point() else torch.zeros_like(e, dtype=torch.bool)
            assert torch.equal(torch.isnan(a) if a.is_floating_point() else nan, nan), (size, i)
            assert torch.equal(_bits(a[~nan]), _bits(e[~nan])), (size, i)
