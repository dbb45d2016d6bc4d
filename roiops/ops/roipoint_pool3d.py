"""RoIPointPool3d (PointRCNN): a fixed number of each LiDAR box's points, as rows of their
coordinates and features. Registered ops with a gradient for the points and their
features, public function and Module. Semantics: docs/semantics.md, "roipoint_pool3d"."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from .. import _backend
from .. import _validation as v
from ._declare import PlainBackward, define_plain, fx_leaf


def _forward(points: Tensor, features: Tensor, boxes: Tensor, num_samples: int) -> tuple[Tensor, Tensor, Tensor]:
    return _backend.kernels_of(points).roipoint_pool3d_forward(points, features, boxes, num_samples)


def _fake(points: Tensor, features: Tensor, boxes: Tensor, num_samples: int) -> tuple[Tensor, Tensor, Tensor]:
    B, M = boxes.shape[:2]
    return (points.new_empty((B, M, num_samples, 3 + features.shape[-1])),
            points.new_empty((B, M), dtype=torch.bool), points.new_empty((B, M, num_samples), dtype=torch.int32))


def _backward(grad: Tensor, index: Tensor, num_points: int) -> tuple[Tensor, Tensor]:
    return _backend.kernels_of(grad).roipoint_pool3d_backward(grad, index, num_points)


def _backward_fake(grad: Tensor, index: Tensor, num_points: int) -> tuple[Tensor, Tensor]:
    B, W = grad.shape[0], grad.shape[-1]
    return grad.new_empty((B, num_points, 3)), grad.new_empty((B, num_points, W - 3))


def _save(ctx: Any, inputs: tuple[Any, ...], output: tuple[Tensor, Tensor, Tensor]) -> None:
    ctx.save_for_backward(output[2])
    ctx.num_points = inputs[0].shape[1]


def _gradients(ctx: Any, backward: Any, grad: Tensor, *_int_outputs: Any) -> tuple[Tensor | None, ...]:
    if not (ctx.needs_input_grad[0] or ctx.needs_input_grad[1]):
        return None, None, None, None
    grad_points, grad_features = backward(grad.contiguous(), ctx.saved_tensors[0], ctx.num_points)
    return (grad_points if ctx.needs_input_grad[0] else None, grad_features if ctx.needs_input_grad[1] else None,
            None, None)


_pool = define_plain(
    "roipoint_pool3d", "(Tensor points, Tensor features, Tensor boxes, int num_samples) -> (Tensor, Tensor, Tensor)",
    _forward, _fake,
    PlainBackward("(Tensor grad, Tensor index, int num_points) -> (Tensor, Tensor)", _backward, _backward_fake,
                  _save, _gradients, "RoIPointPool3d"))


@fx_leaf
def roipoint_pool3d(points: Tensor, features: Tensor, boxes: Tensor, num_samples: int = 512) -> tuple[Tensor, Tensor]:
    """RoIPointPool3d (PointRCNN): each box's first ``num_samples`` points, in point order,
    as rows ``(x, y, z, *features)``; a box holding fewer repeats them cyclically (point
    ``j mod n`` of its ``n``), an empty box gives zero rows and is flagged.

    Points belong to boxes by [`points_in_boxes`][roiops.points_in_boxes]' rule. mmcv's ``RoIPointPool3d``
    (which has no gradient); here the rows' gradient flows back to the points and
    features they copy. Semantics: docs/semantics.md, "roipoint_pool3d".

    Args:
        points: ``Tensor[B, N, 3]`` of rows ``(x, y, z)``, floating. Differentiable.
        features: ``Tensor[B, N, C]`` of the points' features, converted to the points'
            dtype. Differentiable.
        boxes: ``Tensor[B, M, 7]`` of LiDAR boxes ``(x, y, z, dx, dy, dz, yaw)``
            ([`points_in_boxes`][roiops.points_in_boxes]), converted to the points' dtype.
        num_samples: rows per box, >= 1.

    Returns:
        ``(pooled, empty)``: ``Tensor[B, M, num_samples, 3 + C]`` in the points' dtype and
        bool ``Tensor[B, M]``, True for a box holding no point.

    Examples:
        >>> points = torch.tensor([[[0.0, 0.0, 0.5], [5.0, 0.0, 0.5], [0.2, 0.1, 0.5]]])
        >>> features = torch.tensor([[[1.0], [2.0], [3.0]]])
        >>> boxes = torch.tensor([[[0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0], [9.0, 9.0, 0.0, 1.0, 1.0, 1.0, 0.0]]])
        >>> pooled, empty = roiops.roipoint_pool3d(points, features, boxes, 3)
        >>> pooled[0, 0, :, 3], empty
        (tensor([1., 3., 1.]), tensor([[False,  True]]))
    """
    points = v.lidar_points(points, batched=True)
    features = v.point_features(features, points).to(points.dtype)
    boxes = v.lidar_boxes(boxes, points)
    pooled, empty, _ = _pool(points.contiguous(), features.contiguous(), boxes.detach().contiguous(),
                             v.count("num_samples", num_samples))
    return pooled, empty


class RoIPointPool3d(nn.Module):
    """Module form of [`roipoint_pool3d`][roiops.roipoint_pool3d]; ``forward(points, features, boxes)``.

    Args:
        num_samples: rows per box.
    """

    def __init__(self, num_samples: int = 512) -> None:
        super().__init__()
        self.num_samples = v.count("num_samples", num_samples)

    def forward(self, points: Tensor, features: Tensor, boxes: Tensor) -> tuple[Tensor, Tensor]:
        return roipoint_pool3d(points, features, boxes, self.num_samples)

    def extra_repr(self) -> str:
        return f"num_samples={self.num_samples}"
