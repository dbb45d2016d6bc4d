"""What the ONNX tests share: exporting a model and running it in onnxruntime, the example
and nasty inputs, and the comparisons."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from roiops._boxes import AXIS_ALIGNED

ort = pytest.importorskip("onnxruntime")
roiops_onnx = pytest.importorskip("roiops.onnx")

SCALE = 0.5
OUT = (3, 4)


def export(model: torch.nn.Module, args: tuple, dynamic_shapes: dict, **kwargs):
    program = roiops_onnx.export(model.eval(), args, dynamic_shapes=dynamic_shapes, **kwargs)
    session = ort.InferenceSession(program.model_proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return program.model_proto, session


def example() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(2, 3, 9, 11), AXIS_ALIGNED.random(2, 4, 22, 18, torch.Generator().manual_seed(1))


def boxes_for_tests() -> torch.Tensor:
    """Nasty boxes for a 22x18 image (the 9x11 map at scale 1/2), ordinary ones, and
    boxes inverted along one axis only (onnxruntime's RoiAlign fails on a negative
    height with adaptive aligned sampling)."""
    extra = torch.tensor([[0, 5.0, 2.0, 1.0, 9.0], [1, 2.0, 9.0, 8.0, 1.0], [0, 3.0, 3.0, 3.0, 9.0],
                          [1, -1e-3, 2.0, 0.0, 9.0], [0, 0.5, 0.5, 1.5, 1.5], [1, -1.5, -2.5, 2.5, 0.5],
                          [0, 19.0, 1.0, 21.9, 17.9], [1, 7.25, 3.75, 7.5, 4.0]])
    return torch.cat([AXIS_ALIGNED.nasty(2, 22, 18), AXIS_ALIGNED.random(2, 9, 22, 18, torch.Generator().manual_seed(0)), extra])


def inputs() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    x = torch.randn(2, 3, 9, 11)
    with_inf = x.clone()
    with_inf[0, 1, 2:5, 3:7] = -float("inf")  # bins of only -inf
    with_inf[1, 0, 4, 4] = float("inf")
    with_nan = x.clone()
    with_nan[0, 0, 3, 4] = float("nan")
    with_nan[0, 2, 5, 5] = float("nan")
    with_nan[1, 1, 8, 10] = float("nan")
    return {"randn": x, "negative": -torch.rand_like(x) - 1, "ties": torch.randint(-2, 2, x.shape).float(),
            "inf": with_inf, "nan": with_nan}


def same(actual: np.ndarray, expected: torch.Tensor, exact: bool, what: str) -> None:
    tol = 0 if exact else 1e-6
    torch.testing.assert_close(torch.from_numpy(actual), expected, rtol=0, atol=tol, equal_nan=True, msg=what)


def compare(session, model: torch.nn.Module, x: torch.Tensor, boxes: torch.Tensor, exact_from: int) -> None:
    got = session.run(None, {"x": x.numpy(), "boxes": boxes.numpy()})
    expected = model(x, boxes)
    assert len(got) == len(expected)
    for i, (a, e) in enumerate(zip(got, expected)):
        same(a, e, exact=i >= exact_from, what=f"output {i}, K={len(boxes)}")


def run(session, args: tuple[torch.Tensor, ...]) -> list:
    """The session's outputs for ``args``, its inputs in order."""
    return session.run(None, {i.name: a.numpy() for i, a in zip(session.get_inputs(), args)})
