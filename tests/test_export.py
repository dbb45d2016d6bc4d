"""torch.export: a model calling every roiops operator (each spec's function with each of its
option sets) exports with a dynamic box count; the exported program (also saved, reloaded
and decomposed) runs and matches eager."""

from __future__ import annotations

import io

import pytest
import torch
from torch.export import Dim

import roiops
from cases import OPTIONS, ROI_SPECS, per_bin_tensors
from roiops._boxes import BEZIER, ROTATED


def _boxes(k: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(k)
    b = torch.rand(k, 5, generator=g) * 16 - 2
    b[:, 0] = torch.arange(k) % 2
    b[:, 3:] += b[:, 1:3] * 0.5
    return b


class _Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        # Rows (batch_index, x1, y1, x2, y2) -> (batch_index, cx, cy, w, h, angle 30): a
        # product with constants, not slices of the boxes (torch 2.6's export turns those
        # into a guard that a dynamic box count violates).
        self.register_buffer("to_rotated", torch.tensor([
            [1.0, 0, 0, 0, 0, 0], [0, 0.5, 0, -1, 0, 0], [0, 0, 0.5, 0, -1, 0], [0, 0.5, 0, 1, 0, 0],
            [0, 0, 0.5, 0, 1, 0]]))
        self.register_buffer("angle", torch.tensor([0.0, 0, 0, 0, 0, 30]))
        # Per-bin tensors (a deformable offset, [K, n, 2, 2]) made from the boxes, as a head
        # predicts them.
        self.register_buffer("to_bins", 0.02 * torch.randn(5, 16, generator=torch.Generator().manual_seed(1)))

    def forward(self, x: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
        f = self.conv(x)  # 8 channels: 2 x 2 x 2 for a position-sensitive op, one field of 8 orientations
        rotated = boxes @ self.to_rotated + self.angle  # the same boxes turned by 30 degrees
        bezier = BEZIER.from_axis_aligned(boxes)  # a band across each box
        outs = []
        for spec in ROI_SPECS:
            for options in OPTIONS[spec.name]:
                per_bin = per_bin_tensors(spec)
                extra = [None if n in options else (boxes @ self.to_bins[:, :4 * c]).view(-1, c, 2, 2)
                         for n, c in per_bin.items()]
                kw = {k: v for k, v in options.items() if k not in per_bin}
                rows = {ROTATED: rotated, BEZIER: bezier}.get(spec.boxes, boxes)
                outs.append(spec.function(f, rows, *extra, 2, 0.5, **kw))
        return torch.cat(outs, dim=1)


@pytest.fixture(scope="module")
def exported():
    torch.manual_seed(0)
    model = _Model().eval()
    ep = torch.export.export(model, (torch.randn(2, 3, 8, 8), _boxes(6)),
                             dynamic_shapes={"x": None, "boxes": {0: Dim("K")}})
    return model, ep


def test_graph_holds_the_roiops_ops(exported):
    """Every registered forward op is in the graph, as one node per call."""
    _, ep = exported
    targets = [str(n.target) for n in ep.graph.nodes if n.op == "call_function"]
    forward = {k.ops()["forward"] for spec in ROI_SPECS for k in spec.kernels}
    assert forward == {t.split(".")[1] for t in targets if t.startswith("roiops.")}
    assert sum(t.startswith("roiops.") for t in targets) == sum(len(OPTIONS[spec.name]) for spec in ROI_SPECS)


@pytest.mark.parametrize("k", [0, 1, 6, 13])
def test_exported_program_matches_eager_for_any_box_count(exported, k):
    model, ep = exported
    x = torch.randn(2, 3, 8, 8)
    torch.testing.assert_close(ep.module()(x, _boxes(k)), model(x, _boxes(k)), rtol=0, atol=0)


def test_save_load_and_decompositions(exported):
    model, ep = exported
    buf = io.BytesIO()
    torch.export.save(ep, buf)
    buf.seek(0)
    loaded = torch.export.load(buf)
    decomposed = ep.run_decompositions()  # the custom ops stay opaque nodes
    x, boxes = torch.randn(2, 3, 8, 8), _boxes(9)
    expected = model(x, boxes)
    torch.testing.assert_close(loaded.module()(x, boxes), expected, rtol=0, atol=0)
    torch.testing.assert_close(decomposed.module()(x, boxes), expected, rtol=0, atol=0)


def test_list_of_boxes_with_dynamic_lengths():
    class PerImage(torch.nn.Module):
        def forward(self, x: torch.Tensor, b0: torch.Tensor, b1: torch.Tensor) -> torch.Tensor:
            return roiops.roi_align(x, [b0, b1], 2, 0.5, 2, True)

    x = torch.randn(2, 3, 8, 8)
    ep = torch.export.export(PerImage(), (x, _boxes(6)[:, 1:], _boxes(7)[:, 1:]),
                             dynamic_shapes={"x": None, "b0": {0: Dim("L0")}, "b1": {0: Dim("L1")}})
    args = (x, _boxes(3)[:, 1:], _boxes(10)[:, 1:])
    torch.testing.assert_close(ep.module()(*args), PerImage()(*args), rtol=0, atol=0)
