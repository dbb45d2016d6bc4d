"""torch.compile with inductor: every roiops op (each spec with each of its option sets)
compiles into one graph, forward and backward, with a dynamic number of boxes, and
matches eager; their Modules with lists of boxes do not recompile. (Each op alone under
AOT autograd, its box gradient included, and torch.export: test_generic.py.)

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

from cases import CASES

# 8 channels: 2 x 2 bins of two output channels for the position-sensitive ops, whole fields
# of 8 (or fewer) orientations for rotation-invariant RoIAlign.
CHANNELS, OUT = 8, (2, 2)


def _boxes(k: int, n_images: int = 2, size: float = 16.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(k)
    b = torch.rand(k, 5, generator=g) * size - 2
    b[:, 0] = torch.arange(k) % n_images
    b[:, 3:] += b[:, 1:3] * 0.5  # some boxes larger, some smaller than a bin
    b[0, 1:] = torch.tensor([5.0, 6.0, 1.0, 2.0])  # inverted: zeros with adaptive aligned sampling
    return b


def _all_ops(x: torch.Tensor, boxes: torch.Tensor, tensors: list[dict]) -> torch.Tensor:
    """Every case on the same map and boxes (turned into the op's box form in the graph),
    with its per-bin tensors (made outside the compiled function)."""
    return torch.cat([case(x, case.spec.boxes.from_axis_aligned(boxes), OUT, 0.5, **t)
                      for case, t in zip(CASES, tensors)], dim=1)


def _channels() -> int:
    """The output channels of _all_ops: two per position-sensitive op, the map's per other op."""
    return sum(CHANNELS // (OUT[0] * OUT[1]) if case.spec.position_sensitive else CHANNELS for case in CASES)


def _run(fn, x: torch.Tensor, boxes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x = x.detach().clone().requires_grad_(True)
    out = fn(x, boxes, [case.tensors(x, boxes, OUT) for case in CASES])
    (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
    return out.detach(), x.grad


def test_inductor_fullgraph_dynamic_boxes_forward_backward(fresh_dynamo):
    counter = CompileCounterWithBackend("inductor")
    compiled = torch.compile(_all_ops, backend=counter, fullgraph=True, dynamic=True)
    x = torch.randn(2, CHANNELS, 8, 8)
    compiles = []
    for k in (6, 11):
        boxes = _boxes(k)
        out, grad = _run(compiled, x, boxes)
        ref_out, ref_grad = _run(_all_ops, x, boxes)
        assert out.shape == (k, _channels(), *OUT)
        torch.testing.assert_close(out, ref_out, rtol=0, atol=0)
        torch.testing.assert_close(grad, ref_grad)
        compiles.append(counter.frame_count)
    # The first count can be 2: with a cold inductor cache dynamo may restart its analysis
    # of the one frame (tensorifying the Python float scales) and call the backend again.
    assert compiles[0] >= 1
    assert compiles[1] == compiles[0], "a second box count recompiled"


class _Head(torch.nn.Module):
    """A conv, the Module of every case and a list-of-boxes input."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, CHANNELS, 3, padding=1)
        self.pools = torch.nn.ModuleList([case.module(OUT, 0.5) for case in CASES])

    def forward(self, x: torch.Tensor, boxes: list[torch.Tensor]) -> torch.Tensor:
        f = self.conv(x)
        outs = []
        for case, pool in zip(CASES, self.pools):
            # Each image's rows in the op's box form, without the batch index.
            rows = [case.spec.boxes.from_axis_aligned(torch.cat([torch.zeros_like(b[:, :1]), b], 1))[:, 1:]
                    for b in boxes]
            outs.append(pool(f, rows).sum(dim=(1, 2, 3)))
        return torch.stack(outs, 1)


def test_mark_dynamic_list_of_boxes_and_modules_no_recompile(fresh_dynamo):
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


def test_box_value_checks_are_skipped_while_compiling_but_kernels_still_refuse(fresh_dynamo):
    # Validation of box *values* needs a host sync, which a graph cannot contain; the
    # CPU kernels raise on an out-of-range batch index all the same.
    compiled = torch.compile(_all_ops, backend="aot_eager", fullgraph=True)
    bad = _boxes(6)
    bad[2, 0] = 7
    x = torch.randn(2, CHANNELS, 8, 8)
    with pytest.raises(Exception, match="batch index"):
        compiled(x, bad, [case.tensors(x, bad, OUT) for case in CASES])
