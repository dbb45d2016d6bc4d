"""torch.export: a model calling every roiops op exports with a dynamic box count; the
exported program (also saved, reloaded and decomposed) runs and matches eager."""

from __future__ import annotations

import io

import pytest
import torch
from torch.export import Dim

import roiops


def _boxes(k: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(k)
    b = torch.rand(k, 5, generator=g) * 16 - 2
    b[:, 0] = torch.arange(k) % 2
    b[:, 3:] += b[:, 1:3] * 0.5
    return b


class _Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
        f = self.conv(x)
        return torch.cat([
            roiops.roi_align(f, boxes, 2, 0.5, 2, True),
            roiops.roi_align(f, boxes, 2, 0.5, 0, False),
            roiops.roi_align(f, boxes, 2, 0.5, -1, True, mode="max"),
            roiops.roi_pool(f, boxes, 2, 0.5),
            roiops.roi_pool(f, boxes, 2, 0.5, convention="mmdet"),
            roiops.prroi_pool(f, boxes, 2, 0.5),
            roiops.ps_roi_align(f, boxes, 2, 0.5, 2),  # 4 channels = 1 x 2 x 2
            roiops.ps_roi_pool(f, boxes, 2, 0.5),
        ], dim=1)


@pytest.fixture(scope="module")
def exported():
    torch.manual_seed(0)
    model = _Model().eval()
    ep = torch.export.export(model, (torch.randn(2, 3, 8, 8), _boxes(6)),
                             dynamic_shapes={"x": None, "boxes": {0: Dim("K")}})
    return model, ep


def test_graph_holds_the_roiops_ops(exported):
    _, ep = exported
    targets = {str(n.target) for n in ep.graph.nodes if n.op == "call_function"}
    for name in ("roi_align", "roi_align_max", "roi_pool", "prroi_pool", "ps_roi_align", "ps_roi_pool"):
        assert f"roiops.{name}.default" in targets


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
