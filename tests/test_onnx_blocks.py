"""The RoI pooling decompositions run over blocks of boxes (an ONNX Loop): with blocks so
small that the boxes fall into chunks of a few rows, cut into blocks of one to several
boxes of many size classes, every operator still equals the kernels bit for bit, boxes
in any order; and the blocks bound the memory of a graph whose boxes would not fit at
once."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from torch.export import Dim

import roiops
from onnx_runs import OUT, SCALE, boxes_for_tests, export, inputs, run
from roiops._boxes import AXIS_ALIGNED, BEZIER, ROTATED

roiops_onnx = pytest.importorskip("roiops.onnx")
onnx = pytest.importorskip("onnx")

# Rows of OUT's 12 bins of 3 channels: chunks of BLOCK // 16 // 36 = 6 boxes, blocks of one
# box (the largest classes) to 6 (the smallest).
BLOCK = 4000


class _Every(torch.nn.Module):
    """Every blocked operator, adaptive grids (a class per box size) and a fixed one."""

    def forward(self, x: torch.Tensor, scores: torch.Tensor, boxes: torch.Tensor, offset: torch.Tensor,
                rotated: torch.Tensor, beziers: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (roiops.roi_align(x, boxes, OUT, SCALE, 0, True), roiops.roi_align(x, boxes, OUT, SCALE, 2, False),
                roiops.roi_align(x, boxes, OUT, SCALE, 0, False, mode="max"),
                *torch.ops.roiops.roi_pool(x, boxes, SCALE, *OUT, False),
                *torch.ops.roiops.roi_pool(x, boxes, SCALE, *OUT, True),
                roiops.ps_roi_align(scores, boxes, OUT, SCALE, 0), roiops.ps_roi_pool(scores, boxes, OUT, SCALE),
                roiops.deform_roi_pool(x, boxes, offset, OUT, SCALE, 0, 0.1), roiops.prroi_pool(x, boxes, OUT, SCALE),
                roiops.roi_align_rotated(x, rotated, OUT, SCALE, 0),
                roiops.riroi_align_rotated(scores, rotated, OUT, SCALE, 0, 4),
                roiops.bezier_align(x, beziers, OUT, SCALE, 0))


def _boxes(seed: int) -> tuple[torch.Tensor, ...]:
    """The nasty boxes, boxes of 1 to 60 map cells a side, in a shuffled order, and the same
    boxes rotated and as Bezier curves; offsets that move some bins off the map."""
    g = torch.Generator().manual_seed(seed)
    big = AXIS_ALIGNED.random(2, 30, 120, 120, g)
    boxes = torch.cat([boxes_for_tests(), big])[torch.randperm(len(boxes_for_tests()) + 30, generator=g)]
    rotated = torch.cat([ROTATED.nasty(2, 22, 18), ROTATED.from_axis_aligned(boxes)])[:len(boxes)]
    beziers = torch.cat([BEZIER.nasty(2, 22, 18), BEZIER.from_axis_aligned(boxes)])[:len(boxes)]
    offset = torch.randn(len(boxes), 2, *OUT, generator=g) * 2
    return boxes, offset, rotated, beziers


def _maps(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x, torch.cat([x * (i + 1) - i for i in range(8)], 1)  # 24 channels: 2 per bin


def test_small_blocks_equal_the_kernels_bit_for_bit():
    k = Dim("K")
    x, scores = _maps(inputs()["randn"])
    boxes, offset, rotated, beziers = _boxes(0)
    args = (x, scores, boxes[:3], offset[:3], rotated[:3], beziers[:3])
    shapes = {"x": None, "scores": None, "boxes": {0: k}, "offset": {0: k}, "rotated": {0: k}, "beziers": {0: k}}
    model, session = export(_Every(), args, shapes, optimize=False, align_avg="decompose", block_values=BLOCK)
    # One loop per operator call (roi_pool's argmax comes from the same loop), each body
    # typed as ONNX's checker and shape inference require.
    assert sum(n.op_type == "Loop" for n in model.graph.node) == 12
    onnx.checker.check_model(model, full_check=True)
    for name in ("nan", "inf"):
        x, scores = _maps(inputs()[name])
        for seed in (0, 1):
            boxes, offset, rotated, beziers = _boxes(seed)
            for keep in (slice(None), slice(0), slice(5, 6), slice(0, 7)):
                args = (x, scores, boxes[keep], offset[keep], rotated[keep], beziers[keep])
                for i, (a, e) in enumerate(zip(run(session, args), _Every()(*args), strict=True)):
                    torch.testing.assert_close(torch.from_numpy(a), e, rtol=0, atol=0, equal_nan=True,
                                               msg=f"output {i}, {name} map, seed {seed}, boxes {keep}")


_MEMORY = """
import resource, sys
import numpy as np, onnxruntime as ort
session = ort.InferenceSession(sys.argv[1], providers=["CPUExecutionProvider"])
x = np.random.default_rng(0).standard_normal((1, 64, 200, 200), dtype=np.float32)
boxes = np.tile(np.array([[0, 0, 0, 199, 199]], np.float32), (int(sys.argv[2]), 1))
out = session.run(None, {"x": x, "boxes": boxes})[0]
assert out.shape == (len(boxes), 64, 7, 7) and np.isfinite(out).all()
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def test_memory_does_not_grow_with_the_boxes(tmp_path):
    """Boxes over a whole 200x200 map, adaptive grids of 29x29 samples per bin: held at once,
    the samples of 64 boxes would take 64 * 64 * 49 * 841 * 4 bytes (675 MB) per
    intermediate, several GB for the graph. With blocks, 64 boxes take no more memory than
    8 (a block and the output)."""

    class Align(torch.nn.Module):
        def forward(self, x: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
            return roiops.roi_align(x, boxes, 7, 1.0, 0, True)

    x = torch.zeros(1, 64, 200, 200)
    boxes = torch.tensor([[0, 0, 0, 199.0, 199.0]]).repeat(3, 1)
    path = tmp_path / "align.onnx"
    program = roiops_onnx.export(Align(), (x, boxes), dynamic_shapes={"x": None, "boxes": {0: Dim("K")}},
                                 optimize=False, align_avg="decompose")
    program.save(str(path))

    def peak_kb(count: int) -> int:
        done = subprocess.run([sys.executable, "-c", _MEMORY, str(path), str(count)], capture_output=True, text=True,
                              check=True)
        return int(done.stdout.split()[-1])

    few, many = peak_kb(8), peak_kb(64)
    assert many < few + 200_000, (few, many)  # kB: the output of 56 more boxes is 3.5 MB


def test_block_values_must_be_none_or_a_positive_int():
    for bad in (0, -1, 2.5, True, "4"):
        with pytest.raises(ValueError, match="block_values must be None or a positive int"):
            roiops_onnx.translation_table(block_values=bad)


def test_without_blocks_every_box_at_once():
    """``block_values=None``: no Loop and no sequence, for runtimes without them."""
    x, scores = _maps(inputs()["nan"])
    boxes, offset, rotated, beziers = _boxes(1)
    args = (x, scores, boxes, offset, rotated, beziers)
    k = Dim("K")
    shapes = {"x": None, "scores": None, "boxes": {0: k}, "offset": {0: k}, "rotated": {0: k}, "beziers": {0: k}}
    model, session = export(_Every(), args, shapes, optimize=False, align_avg="decompose", block_values=None)
    assert not {n.op_type for n in model.graph.node} & {"Loop", "SequenceInsert", "ConcatFromSequence"}
    for i, (a, e) in enumerate(zip(run(session, args), _Every()(*args), strict=True)):
        torch.testing.assert_close(torch.from_numpy(a), e, rtol=0, atol=0, equal_nan=True, msg=f"output {i}")

