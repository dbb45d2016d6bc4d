"""RoIAwarePool3d (PartA2): each LiDAR box's points pooled into a grid of voxels in the
box's frame, by max or average. Registered ops with a gradient for the point features,
public function and Module. Semantics: docs/semantics.md, "roiaware_pool3d"."""

from __future__ import annotations

from typing import Any, Literal, cast

import torch
from torch import Tensor, nn

from .. import _backend
from .. import _validation as v
from ._declare import PlainBackward, define_plain, fx_leaf


def _forward(points: Tensor, features: Tensor, boxes: Tensor, out_x: int, out_y: int, out_z: int, max_points: int,
             max_mode: bool) -> tuple[Tensor, Tensor]:
    return _backend.kernels_of(points).roiaware_pool3d_forward(points, features, boxes, out_x, out_y, out_z,
                                                               max_points, max_mode)


def _fake(points: Tensor, features: Tensor, boxes: Tensor, out_x: int, out_y: int, out_z: int, max_points: int,
          max_mode: bool) -> tuple[Tensor, Tensor]:
    grid = (boxes.shape[0], out_x, out_y, out_z)
    out = features.new_empty((*grid, features.shape[1]))
    return out, features.new_empty((*grid, features.shape[1] if max_mode else 2), dtype=torch.int32)


def _backward(grad: Tensor, saved: Tensor, points: Tensor, boxes: Tensor, num_points: int,
              max_mode: bool) -> Tensor:
    return _backend.kernels_of(grad).roiaware_pool3d_backward(grad, saved, points, boxes, num_points, max_mode)


def _backward_fake(grad: Tensor, saved: Tensor, points: Tensor, boxes: Tensor, num_points: int,
                   max_mode: bool) -> Tensor:
    return grad.new_empty((num_points, grad.shape[-1]))


def _save(ctx: Any, inputs: tuple[Any, ...], output: tuple[Tensor, Tensor]) -> None:
    points, features, boxes, *_, max_mode = inputs
    ctx.save_for_backward(output[1], points, boxes)
    ctx.num_points, ctx.max_mode = features.shape[0], max_mode


def _gradients(ctx: Any, backward: Any, grad: Tensor, _saved: Any) -> tuple[Tensor | None, ...]:
    grads: list[Tensor | None] = [None] * 8
    if ctx.needs_input_grad[1]:
        saved, points, boxes = ctx.saved_tensors
        grads[1] = backward(grad.contiguous(), saved, points, boxes, ctx.num_points, ctx.max_mode)
    return tuple(grads)


_pool = define_plain(
    "roiaware_pool3d", "(Tensor points, Tensor features, Tensor boxes, int out_x, int out_y, int out_z, "
    "int max_points, bool max_mode) -> (Tensor, Tensor)", _forward, _fake,
    PlainBackward("(Tensor grad, Tensor saved, Tensor points, Tensor boxes, int num_points, bool max_mode) -> Tensor",
                  _backward, _backward_fake, _save, _gradients, "RoIAwarePool3d"))


@fx_leaf
def roiaware_pool3d(points: Tensor, features: Tensor, boxes: Tensor, out_size: int | tuple[int, int, int],
                    max_points: int = 128, mode: Literal["max", "avg"] = "max") -> Tensor:
    """RoIAwarePool3d (PartA2): each box cut into ``out_size`` voxels along its own axes, each
    voxel the max or mean of the features of the points in it.

    A point belongs to a box by [`points_in_boxes`][roiops.points_in_boxes]' rule, and to the voxel its
    box-frame coordinates fall in. Each voxel keeps its first ``max_points`` points in
    point order; an empty voxel gives 0. Max takes the first strictly greater value (NaN
    never), the mean sums in point order. mmcv's ``RoIAwarePool3d`` in its arithmetic
    (its ``max_pts_per_voxel`` keeps one point fewer: ``max_points = max_pts_per_voxel -
    1``). Semantics: docs/semantics.md, "roiaware_pool3d".

    Args:
        points: ``Tensor[N, 3]`` of rows ``(x, y, z)``, floating.
        features: ``Tensor[N, C]`` of the points' features, any floating dtype; the output's
            dtype. Differentiable.
        boxes: ``Tensor[K, 7]`` of LiDAR boxes ``(x, y, z, dx, dy, dz, yaw)``
            ([`points_in_boxes`][roiops.points_in_boxes]), converted to the points' dtype.
        out_size: voxels per box, an int ``s`` for ``(s, s, s)`` or ``(x, y, z)``, each in
            [1, 1024].
        max_points: points kept per voxel, >= 1.
        mode: ``"max"`` or ``"avg"``.

    Returns:
        ``Tensor[K, X, Y, Z, C]``. Memory grows with the output and the points; time with
        points x boxes.

    Examples:
        >>> points = torch.tensor([[0.1, 0.1, 0.1], [-0.1, 0.1, 0.1], [0.1, 0.1, 0.9]])
        >>> features = torch.tensor([[1.0], [2.0], [4.0]])
        >>> boxes = torch.tensor([[0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0]])
        >>> out = roiops.roiaware_pool3d(points, features, boxes, (2, 1, 2), mode="avg")
        >>> out[0, :, 0, :, 0]
        tensor([[2., 0.],
                [1., 4.]])
    """
    max_mode = v.choice("mode", mode, ("max", "avg")) == "max"
    points = v.lidar_points(points, batched=False)
    features = v.point_features(features, points)
    boxes = v.lidar_boxes(boxes, points)
    grid = v.voxel_grid(out_size)
    out, _ = _pool(points.detach().contiguous(), features.contiguous(), boxes.detach().contiguous(), *grid,
                   v.count("max_points", max_points), max_mode)
    return out


class RoIAwarePool3d(nn.Module):
    """Module form of [`roiaware_pool3d`][roiops.roiaware_pool3d]; ``forward(points, features, boxes)``.

    Args:
        out_size: voxels per box, an int or ``(x, y, z)``.
        max_points: points kept per voxel.
        mode: ``"max"`` or ``"avg"``.
    """

    def __init__(self, out_size: int | tuple[int, int, int], max_points: int = 128,
                 mode: Literal["max", "avg"] = "max") -> None:
        super().__init__()
        self.out_size = v.voxel_grid(out_size)
        self.max_points = v.count("max_points", max_points)
        self.mode = cast(Literal["max", "avg"], v.choice("mode", mode, ("max", "avg")))

    def forward(self, points: Tensor, features: Tensor, boxes: Tensor) -> Tensor:
        return roiaware_pool3d(points, features, boxes, self.out_size, self.max_points, self.mode)

    def extra_repr(self) -> str:
        return f"out_size={self.out_size}, max_points={self.max_points}, mode={self.mode!r}"
