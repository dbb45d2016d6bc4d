"""ONNX export of ``polygon_targets`` (Mask R-CNN mask targets rasterised from polygons), checked
in onnxruntime against roiops' CPU kernel bit for bit: random COCO-like polygons, degenerate
and self-intersecting ones, coordinates far outside the box or not finite, long y-major edges
(where float rounding moves the traced crossings), tiny and inverted boxes, instances without
polygons, no targets and no vertices.

The graph takes the packed polygons the op takes (what a model feeds it: the flattening of
Python lists happens before the op), with the counts of targets, instances, polygons and
vertices dynamic. One export, shared by the tests.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from torch.export import Dim

from onnx_runs import export, run

pytest.importorskip("onnx")

SIZE = 28

pytestmark = pytest.mark.filterwarnings("ignore:# The axis name")  # boxes and indices share the Dim P, as intended


class _Targets(torch.nn.Module):
    """Mask targets from packed polygons: instance ``indices[p]``'s polygons within ``boxes[p]``."""

    def forward(self, coords: torch.Tensor, vertex_offsets: torch.Tensor, polygon_offsets: torch.Tensor,
                boxes: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        return torch.ops.roiops.polygon_targets(coords, vertex_offsets, polygon_offsets, boxes, indices, SIZE)


def _pack(instances: list[list[Any]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Instances of flat ``[x0, y0, x1, y1, ...]`` polygons -> ``(coords [2V] float64,
    vertex_offsets [n + 1], polygon_offsets [G + 1])``, as the op takes them."""
    flat = [np.asarray(p, dtype=np.float64).reshape(-1) for instance in instances for p in instance]
    vertex_offsets = np.cumsum([0] + [a.size // 2 for a in flat])
    polygon_offsets = np.cumsum([0] + [len(instance) for instance in instances])
    coords = np.concatenate(flat) if flat else np.zeros(0)
    return torch.from_numpy(coords), torch.from_numpy(vertex_offsets), torch.from_numpy(polygon_offsets)


def _export(**kwargs: Any) -> tuple[Any, Any]:
    example = [[[1.0, 1.0, 10.0, 2.0, 6.0, 9.0]], [[0.0, 0.0, 8.0, 0.0, 8.0, 8.0], [2.0, 2.0, 3.0, 2.0, 3.0, 3.0]], []]
    boxes = torch.tensor([[0.0, 0.0, 10.0, 10.0], [1.0, 1.0, 7.0, 9.0], [0.0, 0.0, 3.0, 3.0]])
    p = Dim("P")
    shapes = {"coords": {0: Dim("coords")}, "vertex_offsets": {0: Dim("polygons")},
              "polygon_offsets": {0: Dim("instances")}, "boxes": {0: p}, "indices": {0: p}}
    return export(_Targets(), (*_pack(example), boxes, torch.tensor([0, 1, 2])), shapes, **kwargs)


@pytest.fixture(scope="module")
def exported() -> tuple[Any, Any]:
    return _export()


def _check(exported: tuple[Any, Any], instances: list[list[Any]], boxes: Any, indices: Any) -> None:
    boxes = torch.as_tensor(np.asarray(boxes, dtype=np.float32).reshape(-1, 4))
    indices = torch.as_tensor(np.asarray(indices, dtype=np.int64).reshape(-1))
    args = (*_pack(instances), boxes, indices)
    (got,) = run(exported[1], args)
    expected = _Targets()(*args).numpy()
    assert got.dtype == expected.dtype and got.shape == expected.shape == (len(boxes), SIZE, SIZE)
    wrong = np.argwhere(got != expected)
    assert not len(wrong), f"{len(wrong)} pixels differ, first (target, row, column): {wrong[:4].tolist()}"


def test_graph_uses_standard_onnx_only(exported):
    model, _ = exported
    assert {n.domain for n in model.graph.node} == {""}


def test_exports_at_opset_16():
    """The lowest opset it needs (ScatterElements' reduction), as torch.onnx converts it (the
    optimiser left out: the other tests check its graph)."""
    exported = _export(opset_version=16, optimize=False)
    assert {o.domain: o.version for o in exported[0].opset_import}[""] == 16
    rng = np.random.default_rng(9)
    instances = _coco_like(rng, 4) + [[]]
    indices = np.array([0, 1, 2, 3, 4, 0])
    _check(exported, instances, _boxes_around(rng, instances, indices), indices)


def _coco_like(rng: np.random.Generator, instances: int) -> list[list[np.ndarray]]:
    out = []
    for _ in range(instances):
        centre = rng.uniform(0, 200, 2)
        polys = []
        for _ in range(int(rng.integers(0, 4))):
            pts = centre + rng.normal(0, rng.uniform(3, 60), (int(rng.integers(3, 16)), 2))
            if rng.random() < 0.3:  # whole or tenth pixels: rounding ties on the lattice
                pts = np.round(pts * 10) / 10
            polys.append(pts.reshape(-1))
        out.append(polys)
    return out


def _boxes_around(rng: np.random.Generator, instances: list[list[np.ndarray]], indices: np.ndarray) -> np.ndarray:
    centres = np.array([inst[0][:2] if inst else (100.0, 100.0) for inst in instances])[indices]
    wh = rng.uniform(0.05, 120, (len(indices), 2))
    return np.concatenate([centres - wh * rng.uniform(0, 1, wh.shape), centres + wh * rng.uniform(0, 1, wh.shape)], 1)


@pytest.mark.parametrize("seed", range(3))
def test_random_polygons(exported, seed):
    rng = np.random.default_rng(seed)
    instances = _coco_like(rng, 12)
    indices = rng.integers(0, 12, 40)
    _check(exported, instances, _boxes_around(rng, instances, indices), indices)


def test_degenerate_polygons(exported):
    instances = [
        [[5.0, 5.0, 5.0, 5.0, 5.0, 5.0]],                                        # one point, repeated
        [[1.0, 1.0, 20.0, 20.0, 10.0, 10.0]],                                    # zero area
        [[2.0, 2.0, 25.0, 25.0, 25.0, 2.0, 2.0, 25.0]],                          # bowtie
        [[14.0, 1.0, 22.0, 27.0, 1.0, 10.0, 27.0, 10.0, 6.0, 27.0]],             # pentagram
        [[3.0, 4.0], [3.0, 4.0, 22.0, 9.0], []],                                  # 1 and 2 vertices, none
        [[2.0, 2.0, 2.0, 2.0, 20.0, 3.0, 20.0, 3.0, 20.0, 3.0, 11.0, 24.0, 2.0, 2.0]],  # repeated vertices
        [[0.0, 0.0, 28.0, 0.0, 28.0, 28.0, 0.0, 28.0], [7.0, 7.0, 21.0, 7.0, 21.0, 21.0, 7.0, 21.0],
         [7.0, 7.0, 21.0, 7.0, 21.0, 21.0, 7.0, 21.0]],                           # overlapping polygons: union
        [],                                                                        # no polygons
        [[-0.3, -0.3, 28.3, -0.29, 14.0, 28.3], [0.1, 0.5, 27.9, 0.5, 27.9, 27.5, 0.1, 27.5]],  # lattice ties
    ]
    boxes = [[0.0, 0.0, 28.0, 28.0], [1.5, -2.0, 22.5, 26.0], [0.0, 0.0, 7.0, 28.0]]
    indices = [[g, b] for g in range(len(instances)) for b in range(len(boxes))]
    _check(exported, instances, [boxes[b] for _, b in indices], [g for g, _ in indices])


def test_far_outside_the_box_and_not_finite(exported):
    rng = np.random.default_rng(7)
    instances = [
        [[-1e6, -1e6, 1e6, -1e6, 1e6, 1e6, -1e6, 1e6]],                          # covers the box
        [[-1e9, 5.0, 1e9, 7.0, 3.0, 1e9]],                                        # crosses it from far away
        [[1e15, 1e15, -1e15, 3.0, 4.0, -1e16]],                                   # lattice clamped to +-2^40
        [[np.inf, 3.0, 10.0, np.nan, 20.0, 20.0, -np.inf, -np.inf]],              # not finite
        [[1e5, 1e5, 1e5 + 3.0, 1e5, 1e5, 1e5 + 3.0]],                             # far away
        [list(rng.uniform(-3e4, 3e4, 40)), list(rng.uniform(-50.0, 80.0, 60))],
    ]
    boxes = [[0.0, 0.0, 28.0, 28.0], [-3.0, 2.5, 5.0, 70.0], [1e5 - 1, 1e5 - 1, 1e5 + 4, 1e5 + 4]]
    indices = [[g, b] for g in range(len(instances)) for b in range(len(boxes))]
    _check(exported, instances, [boxes[b] for _, b in indices], [g for g, _ in indices])


# y-major edges (x0, y0, x1, y1), in the pixels of the box (0, 0, 28, 28), along which the
# kernel's float64 trace crosses a column centre one lattice row away from where the exact
# real-valued trace would (the real crossing lies on a lattice point: a tie).
_MOVED_BY_ROUNDING = [
    (81.65, 107.25, -5.35, -5.75), (264533.05, 344353481.25, -88161.15, -114784459.75),
    (1246.25, 4325.65, -385.55, -1434.55), (33042899.05, 56160407.65, -11014267.15, -18720100.55),
    (3796178.05, 4986492.65, -759233.95, -997269.15), (-15.35, -647785.35, 147.65, 1943422.05),
    (-22.55, -2855863.55, 127.05, 14279350.65), (-382.35, -5391898.95, 2028.05, 26959563.65),
    (108.05, 1435.65, -13.95, -276.95), (-3205345.75, -19997554.15, 3205364.65, 19997585.25),
]


def test_long_y_major_edges(exported):
    """Edges of up to 2^41 lattice steps, near-diagonal or nearly vertical, far from the box:
    along them float64 rounding moves where the trace crosses a column centre, and
    near-diagonal ones can skip a column, so the crossings carry into the next columns."""
    rng = np.random.default_rng(3)
    instances = [[[x0, y0, x1, y1, x0, y1]] for x0, y0, x1, y1 in _MOVED_BY_ROUNDING]
    boxes = [[0.0, 0.0, SIZE, SIZE]] * len(instances)
    for i in range(48):
        span = 2.0 ** rng.uniform(4, 37)
        y0 = -span * rng.uniform(0, 1)
        y1 = y0 + span * rng.uniform(0.5, 1) * rng.choice([-1, 1])
        kind = i % 3
        if kind == 0:    # nearly vertical, a few columns across the box
            x0 = rng.uniform(-1, SIZE + 1)
            x1 = x0 + rng.uniform(-3, 3)
        elif kind == 1:  # near-diagonal
            x0 = rng.uniform(-3, 3) - span / 2
            x1 = x0 + abs(y1 - y0) * rng.uniform(0.999, 1.0) * rng.choice([-1, 1])
        else:            # from far away
            x0, x1 = rng.uniform(-span, 0), rng.uniform(SIZE, SIZE + span)
        instances.append([[x0, y0, x1, y1, x0 + rng.uniform(-2, 2), (y0 + y1) / 2]])
        boxes.append([0.0, 0.0, SIZE, SIZE] if i % 2 else [-1.0, -2.0, SIZE + 1.0, SIZE + 0.5])
    _check(exported, instances, boxes, np.arange(len(instances)))


def test_tiny_and_odd_boxes(exported):
    instances = [[[0.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0, 1.0]], [[0.01, 0.02, 0.09, 0.03, 0.05, 0.08]]]
    boxes = [[0.0, 0.0, 0.05, 0.05], [0.0, 0.0, 0.1, 0.1], [0.0, 0.0, 0.0999, 0.5], [0.2, 0.3, 0.2, 0.3],
             [1.0, 1.0, 0.0, 0.0], [0.5, 0.0, -0.5, 1.0], [0.0, 0.0, 1e-7, 1.0], [-1e4, -1e4, 1e4, 1e4],
             [0.0, 0.0, 1.0, 1.0000001], [0.03, 0.03, 0.1, 0.1], [0.0, 0.0, 3.0, 7.0]]
    indices = [g for g in range(2) for _ in boxes]
    _check(exported, instances, boxes * 2, indices)


def test_no_targets_and_no_vertices(exported):
    square = [[0.0, 0.0, 8.0, 0.0, 8.0, 8.0, 0.0, 8.0]]
    _check(exported, [square, []], np.zeros((0, 4)), [])
    _check(exported, [[], [], [[]]], [[0.0, 0.0, 4.0, 4.0]] * 3, [0, 2, 1])
