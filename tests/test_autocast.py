"""Autocast: the ops are not on autocast's cast lists, so they run in their input's dtype.

float16/bfloat16 kernels read the reduced-precision values, compute in float32 and round
the result once, so the output is bit for bit ``op(input.float()).to(input.dtype)``: what
an upcasting autocast rule (torchvision's) would give, without the float32 copy of the
feature map. A float32 input stays float32. See docs/ecosystem.md.
"""

from __future__ import annotations

import pytest
import torch

import roiops
from cases import tol

BOXES = torch.tensor([[0, 1.0, 2.0, 13.0, 11.0], [1, -3.0, -2.0, 20.0, 9.0], [0, 5.5, 6.25, 5.75, 9.0],
                      [1, 30.0, 30.0, 40.0, 44.0], [0, 8.0, 9.0, 3.0, 1.0]])


def _ops(f: torch.Tensor, boxes: torch.Tensor) -> list[torch.Tensor]:
    return [roiops.roi_align(f, boxes, 3, 0.5, 2, True), roiops.roi_align(f, boxes, 3, 0.5, 0, True),
            roiops.roi_align(f, boxes, (3, 2), 0.5, 0, False, mode="max"), roiops.roi_pool(f, boxes, 3, 0.5),
            roiops.roi_pool(f, boxes, 3, 0.5, convention="mmdet")]


def _check(device: str, dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(3, 8, 3, padding=1).to(device)
    x = torch.randn(2, 3, 16, 16, device=device)
    boxes = BOXES.to(device)
    with torch.autocast(device, dtype=dtype):
        f = conv(x)
        assert f.dtype == dtype  # the conv ran in reduced precision
        outs = _ops(f, boxes)
        assert all(o.dtype == torch.float32 for o in _ops(x, boxes))  # float32 input: float32 result
    reference = _ops(f.float(), boxes)
    for out, ref in zip(outs, reference):
        assert out.dtype == dtype
        assert torch.equal(out, ref.to(dtype))  # one rounding of the float32 result
        torch.testing.assert_close(out.float(), ref, **tol(dtype))

    # Backward: the input gradient also accumulates in float32 and is rounded once.
    grad_out = torch.randn(len(boxes), 8, 3, 3, device=device).to(dtype)
    leaf = f.detach().requires_grad_()
    leaf32 = f.detach().float().requires_grad_()
    with torch.autocast(device, dtype=dtype):
        roiops.roi_align(leaf, boxes, 3, 0.5, 2, True).backward(grad_out)
    roiops.roi_align(leaf32, boxes, 3, 0.5, 2, True).backward(grad_out.float())
    assert leaf.grad.dtype == dtype
    if device == "cpu":
        assert torch.equal(leaf.grad, leaf32.grad.to(dtype))
    else:  # the GPU backward may add with atomics, in any order
        torch.testing.assert_close(leaf.grad.float(), leaf32.grad, **tol(dtype))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cpu_autocast(dtype):
    _check("cpu", dtype)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cuda_autocast(dtype):
    _check("cuda", dtype)


def test_autocast_under_torch_compile():
    torch._dynamo.reset()
    conv = torch.nn.Conv2d(3, 4, 3, padding=1)

    def head(x: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return roiops.roi_align(conv(x), boxes, 2, 0.5, 2, True)

    x = torch.randn(2, 3, 16, 16)
    out = torch.compile(head, backend="aot_eager", fullgraph=True)(x, BOXES)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, head(x, BOXES))
    torch._dynamo.reset()
