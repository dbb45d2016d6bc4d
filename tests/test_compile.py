"""torch.compile: every roiops op compiles into one graph, forward and backward, with a
dynamic number of boxes, and matches eager.

Models stay tiny: inductor compiles C++ on the CPU, which is slow on shared CI machines.
The box counts (6, 11) differ from every other dimension: with dynamic=True, dynamo's
duck shaping would give K the same symbol as an equal static size (the 5 box columns,
the channels) and specialise it.
"""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
from torch._dynamo.testing import CompileCounterWithBackend

import roiops


def _boxes(k: int, n_images: int = 2, size: float = 16.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(k)
    b = torch.rand(k, 5, generator=g) * size - 2
    b[:, 0] = torch.arange(k) % n_images
    b[:, 3:] += b[:, 1:3] * 0.5  # some boxes larger, some smaller than a bin
    b[0, 1:] = torch.tensor([5.0, 6.0, 1.0, 2.0])  # inverted: zeros with adaptive aligned sampling
    return b


def _all_ops(x: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
    return torch.cat([
        roiops.roi_align(x, boxes, 2, 0.5, 2, True),                       # avg, fixed grid
        roiops.roi_align(x, boxes, (2, 2), 0.5, 0, True),                  # avg, adaptive
        roiops.roi_align(x, boxes, 2, 0.5, -1, False, mode="max"),
        roiops.roi_pool(x, boxes, 2, 0.5),
        roiops.roi_pool(x, boxes, 2, 0.5, convention="mmdet"),
    ], dim=1)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _run(fn, x: torch.Tensor, boxes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x = x.detach().clone().requires_grad_(True)
    out = fn(x, boxes)
    (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
    return out.detach(), x.grad


def test_inductor_fullgraph_dynamic_boxes_forward_backward():
    counter = CompileCounterWithBackend("inductor")
    compiled = torch.compile(_all_ops, backend=counter, fullgraph=True, dynamic=True)
    x = torch.randn(2, 3, 8, 8)
    compiles = []
    for k in (6, 11):
        boxes = _boxes(k)
        out, grad = _run(compiled, x, boxes)
        ref_out, ref_grad = _run(_all_ops, x, boxes)
        assert out.shape == (k, 15, 2, 2)
        torch.testing.assert_close(out, ref_out, rtol=0, atol=0)
        torch.testing.assert_close(grad, ref_grad)
        compiles.append(counter.frame_count)
    # The first count can be 2: with a cold inductor cache dynamo may restart its analysis
    # of the one frame (tensorifying the Python float scales) and call the backend again.
    assert compiles[0] >= 1
    assert compiles[1] == compiles[0], "a second box count recompiled"


class _Head(torch.nn.Module):
    """A conv, the module forms of the ops and a list-of-boxes input."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.align = roiops.RoIAlign(2, spatial_scale=0.5, sampling_ratio=0, aligned=True)
        self.align_max = roiops.RoIAlign((2, 2), 0.5, sampling_ratio=2, mode="max")
        self.pool = roiops.RoIPool(2, 0.5)
        self.pool_mmdet = roiops.RoIPool(2, 0.5, convention="mmdet")

    def forward(self, x: torch.Tensor, boxes: list[torch.Tensor]) -> torch.Tensor:
        f = self.conv(x)
        return (self.align(f, boxes) + self.align_max(f, boxes) + self.pool(f, boxes)
                + self.pool_mmdet(f, boxes)).sum(dim=(2, 3))


def test_mark_dynamic_list_of_boxes_and_modules_no_recompile():
    torch.manual_seed(0)
    head = _Head()
    counter = CompileCounterWithBackend("aot_eager")  # dynamo + AOT autograd, no codegen
    compiled = torch.compile(head, backend=counter, fullgraph=True)
    x = torch.randn(2, 3, 8, 8)
    for k0, k1 in ((6, 7), (9, 13)):
        lists = [_boxes(k0)[:, 1:], _boxes(k1)[:, 1:]]
        for b in lists:
            torch._dynamo.mark_dynamic(b, 0)
        out = compiled(x, lists)
        out.sum().backward()
        grads = [p.grad.clone() for p in head.parameters()]
        head.zero_grad()
        ref = head(x, lists)
        ref.sum().backward()
        torch.testing.assert_close(out, ref, rtol=0, atol=0)
        for g, p in zip(grads, head.parameters()):
            torch.testing.assert_close(g, p.grad)
        head.zero_grad()
    assert counter.frame_count == 1


def test_box_value_checks_are_skipped_while_compiling_but_kernels_still_refuse():
    # Validation of box *values* needs a host sync, which a graph cannot contain; the
    # CPU kernels raise on an out-of-range batch index all the same.
    compiled = torch.compile(_all_ops, backend="aot_eager", fullgraph=True)
    bad = _boxes(6)
    bad[2, 0] = 7
    with pytest.raises(Exception, match="batch index"):
        compiled(torch.randn(2, 3, 8, 8), bad)


def test_box_grad_compiles_and_matches_eager():
    """box_grad=True: the boxes' gradient (roiops::_roi_align_rois_backward and its max
    twin, through their fake kernels) in one graph, forward and backward."""

    def fn(x, coords):
        boxes = torch.cat([torch.zeros_like(coords[:, :1]), coords], dim=1)
        return (roiops.roi_align(x, boxes, 2, 0.5, 2, True, box_grad=True)
                + roiops.roi_align(x, boxes, 2, 0.5, 2, False, mode="max", box_grad=True))

    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(fn, backend=counter, fullgraph=True)
    x = torch.randn(1, 3, 8, 8)
    coords = _boxes(6)[:, 1:]
    results = []
    for f in (compiled, fn):
        c = coords.clone().requires_grad_()
        out, grad_x = _run(lambda t, _: f(t, c), x, None)
        results.append((out, grad_x, c.grad))
    (out, grad_x, grad_c), (ref_out, ref_grad_x, ref_grad_c) = results
    torch.testing.assert_close(out, ref_out, rtol=0, atol=0)
    torch.testing.assert_close(grad_x, ref_grad_x)
    assert ref_grad_c.abs().sum() > 0
    torch.testing.assert_close(grad_c, ref_grad_c)
    assert counter.frame_count == 1
