"""ONNX export of the point-cloud operators (points_in_boxes, roiaware_pool3d,
roipoint_pool3d), checked in onnxruntime against roiops' CPU kernels bit for bit: every
output (the argmax and counts the backward uses included), in float32, float16 and
float64, on street scenes with points exactly on faces, a box of zero size, crowded voxels,
tied, signed-zero, infinite and NaN features, no boxes and no points, with the box and point
counts dynamic; and the public functions and mmcv's drop-ins exported at opset 16.

Exports are slow (seconds each): each model is exported once.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch.export import Dim

import roiops
from onnx_runs import export, run
from roiops._boxes import LIDAR
from roiops.compat import mmcv

pytest.importorskip("onnx")

GRID, CAP, SAMPLES = (3, 2, 4), 3, 24
DTYPES = (torch.float32, torch.float64, torch.float16)


def _cloud(dtype: torch.dtype, seed: int = 0, points: int = 400, boxes: int = 8) -> tuple[torch.Tensor, ...]:
    """Two street scenes ``(points [2, N, 3], boxes [2, M, 7], features [2, N, 5])``. Box 0
    is unrotated, with points exactly on its faces (outside on the sides, inside on the top
    and bottom) and a crowd of equal points in one voxel; box 1 has zero size along x.
    Features: small integers (ties), signed zeros, NaN and -inf."""
    pts, bxs = LIDAR.scene(2, points, boxes, torch.Generator().manual_seed(seed))
    bxs[:, 0] = torch.tensor([10.0, 5.0, -1.0, 4.0, 2.0, 2.0, 0.0])
    bxs[:, 1] = torch.tensor([10.0, 5.0, -1.0, 0.0, 2.0, 2.0, 0.3])
    faces = torch.tensor([[12.0, 5.0, 0.0], [8.0, 5.0, 0.0], [10.0, 6.0, 0.0], [10.0, 4.0, 0.0], [10.0, 5.0, -1.0],
                          [10.0, 5.0, 1.0], [11.999, 5.0, 0.999], [10.0, 5.0, 0.0], [9.5, 5.5, 0.5],
                          [10.0, 5.0, 1.001], [8.0, 4.0, -1.0], [12.0, 6.0, 1.0]])
    pts[:, :len(faces)] = faces
    pts[:, 20:60:2] = torch.tensor([10.5, 5.25, 0.25])  # 20 points in one voxel of box 0
    g = torch.Generator().manual_seed(seed + 1)
    feats = torch.randint(-3, 4, (2, points, 5), generator=g).float()
    feats = torch.where(torch.rand(feats.shape, generator=g) < 0.5, feats, -feats)  # -0.0 and +0.0
    feats[:, ::7, 1] = math.nan
    feats[:, 3::11, 2] = -math.inf
    feats[:, 5::13, 3] = math.inf
    return pts.to(dtype), bxs.to(dtype), feats.to(dtype)


def _same(actual: np.ndarray, expected: torch.Tensor, what: str) -> None:
    """Equal bit for bit (NaN to any NaN): shape, dtype, values and the sign of zeros."""
    e = expected.numpy()
    assert actual.shape == e.shape and actual.dtype == e.dtype, what
    if e.dtype.kind == "f":
        nan = np.isnan(e)
        assert np.array_equal(np.isnan(actual), nan), what
        actual, e = actual[~nan], e[~nan]
        assert np.array_equal(np.signbit(actual), np.signbit(e)), what
    assert np.array_equal(actual, e), what


def _outputs(p32: torch.Tensor, b32: torch.Tensor, f32: torch.Tensor, p64: torch.Tensor, b64: torch.Tensor,
             f64: torch.Tensor, p16: torch.Tensor, b16: torch.Tensor, f16: torch.Tensor) -> dict[str, torch.Tensor]:
    """Every output of the registered ops, by name: the points_in_boxes membership and
    roipoint_pool3d in each dtype (the inside test in each coordinate type), each point's
    first box in float32, and roiaware_pool3d (on scene 1) in float32, float64 and with
    float16 features at float32 points (the float32 accumulation of half features)."""
    ops = torch.ops.roiops
    out = {}
    for name, (p, b, f) in {"float32": (p32, b32, f32), "float64": (p64, b64, f64), "float16": (p16, b16, f16)}.items():
        out[f"{name} inside"] = ops.points_in_boxes(p, b, True)
        out[f"{name} pooled"], out[f"{name} empty"], out[f"{name} index"] = ops.roipoint_pool3d(p, f, b, SAMPLES)
    out["float32 first box"] = ops.points_in_boxes(p32, b32, False)
    for name, (p, b, f) in {"float32": (p32, b32, f32), "float64": (p64, b64, f64),
                            "float16 features": (p32, b32, f16)}.items():
        for mode in ("max", "avg"):
            out[f"{name} {mode}"], out[f"{name} {mode} saved"] = ops.roiaware_pool3d(p[1], f[1], b[1], *GRID, CAP,
                                                                                     mode == "max")
    return out


class _Ops(torch.nn.Module):
    def forward(self, p32: torch.Tensor, b32: torch.Tensor, f32: torch.Tensor, p64: torch.Tensor, b64: torch.Tensor,
                f64: torch.Tensor, p16: torch.Tensor, b16: torch.Tensor, f16: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(_outputs(p32, b32, f32, p64, b64, f64, p16, b16, f16).values())


def _args(points: torch.Tensor, boxes: torch.Tensor, features: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return tuple(t.to(d) for d in DTYPES for t in (points, boxes, features))


@pytest.fixture(scope="module")
def ops():
    m, n = Dim("M"), Dim("N")
    shapes = {}
    for d in ("32", "64", "16"):
        shapes.update({f"p{d}": {1: n}, f"b{d}": {1: m}, f"f{d}": {1: n}})
    points, boxes, features = _cloud(torch.float32)
    return export(_Ops(), _args(points, boxes[:, :3], features), shapes)


def _check(session, args: tuple[torch.Tensor, ...], what: str, skip: str = "") -> dict[str, torch.Tensor]:
    """The session's outputs against the kernels' (but those whose names start with ``skip``)."""
    got, expected = run(session, args), _outputs(*args)
    assert len(got) == len(expected)
    for a, (name, e) in zip(got, expected.items()):
        if not (skip and name.startswith(skip)):
            _same(a, e, f"{what}: {name}")
    return dict(zip(expected, (torch.from_numpy(a) for a in got)))


@pytest.mark.filterwarnings("ignore:# The axis name")  # the inputs share the Dims M and N, as intended
def test_ops_equal_the_kernels_bit_for_bit(ops):
    """Every output in three dtypes, on scenes of other sizes than the export's, with no
    boxes and with no points."""
    model, session = ops
    assert {n.domain for n in model.graph.node} == {""}  # standard ONNX operators only
    points, boxes, features = _cloud(torch.float32)
    expected = _outputs(*_args(points, boxes, features))
    inside = expected["float32 inside"]
    assert (inside.any(-1) & ~inside.all(-1)).any() and (inside.sum(-1) > 1).any()  # some boxes, not all; overlaps
    assert (expected["float32 max saved"] >= 0).any() and (expected["float32 avg saved"][..., 0] == CAP).any()
    _check(session, _args(points, boxes, features), "scene")
    _check(session, _args(points, boxes[:, :0], features), "no boxes")
    _check(session, _args(points[:, :0], boxes, features[:, :0]), "no points")
    points, boxes, features = _cloud(torch.float32, seed=1, points=1500, boxes=30)
    _check(session, _args(points, boxes, features), "larger scene")


class _Public(torch.nn.Module):
    """What users call: roiops' functions and mmcv's drop-ins."""

    def __init__(self) -> None:
        super().__init__()
        self.mmcv_aware = mmcv.RoIAwarePool3d(out_size=(3, 2, 2), max_pts_per_voxel=4, mode="avg")
        self.mmcv_sample = mmcv.RoIPointPool3d(7)

    def forward(self, points: torch.Tensor, features: torch.Tensor, boxes: torch.Tensor) -> tuple[torch.Tensor, ...]:
        p, f, b = points[0], features[0], boxes[0]
        return (roiops.points_in_boxes(p, b), mmcv.points_in_boxes_part(points, boxes),
                mmcv.points_in_boxes_all(points, boxes), roiops.roiaware_pool3d(p, f, b, 3),
                self.mmcv_aware(b, p, f), *roiops.roipoint_pool3d(points, features, boxes, 9),
                *self.mmcv_sample(points, features, boxes))


@pytest.mark.filterwarnings("ignore:# The axis name")
def test_public_functions_and_mmcv_drop_ins_export_at_opset_16():
    """At the lowest opset roiops exports to; RoIAware max pooling with 128 points a voxel
    (7 doubling steps)."""
    points, boxes, features = _cloud(torch.float32, seed=2, points=600, boxes=10)
    module = _Public().eval()
    model, session = export(module, (points, features, boxes[:, :4]),
                            {"points": {1: Dim("N")}, "features": {1: Dim("N")}, "boxes": {1: Dim("M")}},
                            opset_version=16)
    assert model.opset_import[0].version == 16 and {n.domain for n in model.graph.node} == {""}
    for what, args in (("scene", (points, features, boxes)), ("no boxes", (points, features, boxes[:, :0])),
                       ("one box", (points, features, boxes[:, 2:3]))):
        got, expected = run(session, args), module(*args)
        assert len(got) == len(expected)
        for i, (a, e) in enumerate(zip(got, expected)):
            _same(a, e, f"{what}: output {i}")


def _on_turned_faces(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Turned boxes with points on their side faces, computed in float64 and rounded to
    ``dtype``: each about one unit in the last place in or out."""
    g = torch.Generator().manual_seed(5)
    boxes = torch.cat([torch.rand(2, 16, 3, generator=g, dtype=torch.float64) * 40,
                       torch.rand(2, 16, 3, generator=g, dtype=torch.float64) * 3 + 0.5,
                       (torch.rand(2, 16, 1, generator=g, dtype=torch.float64) - 0.5) * 2 * math.pi], -1)
    t = torch.rand(2, 16, 32, generator=g, dtype=torch.float64) * 2 - 1  # along the face
    side = torch.randint(0, 4, (2, 16, 32), generator=g)
    hx, hy = (boxes[..., i:i + 1].expand_as(t) / 2 for i in (3, 4))
    u = torch.where(side[..., None] % 2 == 0, torch.stack([hx, t * hy], -1), torch.stack([t * hx, hy], -1))
    u = torch.where(side[..., None] >= 2, -u, u)
    c, s = torch.cos(boxes[..., 6:7]), torch.sin(boxes[..., 6:7])
    x = boxes[..., 0:1] + u[..., 0] * c - u[..., 1] * s
    y = boxes[..., 1:2] + u[..., 0] * s + u[..., 1] * c
    z = boxes[..., 2:3] + boxes[..., 5:6] * torch.rand(2, 16, 32, generator=g, dtype=torch.float64)
    points = torch.stack([x, y, z], -1).reshape(2, 16 * 32, 3)
    return points.to(dtype), boxes.to(dtype)


@pytest.mark.filterwarnings("ignore:# The axis name")
def test_points_on_turned_faces(ops):
    """Points within about an ulp of the side faces of turned boxes: float32 and float16
    agree bit for bit (onnxruntime's float64 Cos and Sin are not libm's, but rounded to
    float32 they are); in float64 a point can fall the other way only within 1e-15 of
    its distance from the box's centre of a face (the cosine and sine are up to 5.7e-16
    off)."""
    _, session = ops
    args = []
    for d in DTYPES:
        points, boxes = _on_turned_faces(d)
        args += [points, boxes, torch.zeros(2, points.shape[1], 5, dtype=d)]
    got = _check(session, tuple(args), "turned faces", skip="float64")
    inside = _outputs(*args)["float64 inside"]
    assert inside.any() and not inside.all()
    differ = got["float64 inside"] != inside
    points, boxes = _on_turned_faces(torch.float64)
    sx = points[:, :, None, 0] - boxes[:, None, :, 0]
    sy = points[:, :, None, 1] - boxes[:, None, :, 1]
    c, s = torch.cos(-boxes[:, None, :, 6]), torch.sin(-boxes[:, None, :, 6])
    lx, ly = sx * c - sy * s, sx * s + sy * c
    margin = torch.minimum((lx.abs() - boxes[:, None, :, 3] / 2).abs(), (ly.abs() - boxes[:, None, :, 4] / 2).abs())
    assert (margin[differ] <= 1e-15 * torch.hypot(sx, sy).clamp(min=1)[differ]).all()
