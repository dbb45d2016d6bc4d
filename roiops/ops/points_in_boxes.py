"""Points in LiDAR boxes: which 3-D boxes hold each point of a point cloud. Registered op,
public function and Module. Semantics: docs/semantics.md, "points_in_boxes"."""

from __future__ import annotations

from typing import Literal, cast

import torch
from torch import Tensor, nn

from .. import _backend
from .. import _validation as v
from ._declare import define_plain, fx_leaf


def _forward(points: Tensor, boxes: Tensor, all_boxes: bool) -> Tensor:
    return _backend.kernels_of(points).points_in_boxes_forward(points, boxes, all_boxes)


def _fake(points: Tensor, boxes: Tensor, all_boxes: bool) -> Tensor:
    if all_boxes:
        return points.new_empty((*points.shape[:2], boxes.shape[1]), dtype=torch.bool)
    return points.new_empty(points.shape[:2], dtype=torch.int64)


_points_in_boxes = define_plain("points_in_boxes", "(Tensor points, Tensor boxes, bool all_boxes) -> Tensor",
                                _forward, _fake)


@fx_leaf
def points_in_boxes(points: Tensor, boxes: Tensor, mode: Literal["first", "all"] = "first") -> Tensor:
    """Which LiDAR boxes hold each point.

    A point is in a box when, in the box's frame, ``|x| < dx / 2`` and ``|y| < dy / 2``
    (strictly) and its height is within ``dz / 2`` of the box's middle (inclusive): mmcv's
    ``points_in_boxes_*`` rule, in its arithmetic. Semantics: docs/semantics.md,
    "points_in_boxes".

    Args:
        points: ``Tensor[N, 3]`` or ``Tensor[B, N, 3]`` of rows ``(x, y, z)``, floating.
        boxes: ``Tensor[M, 7]`` (``Tensor[B, M, 7]`` for batched points) of LiDAR boxes
            ``(x, y, z, dx, dy, dz, yaw)``: ``(x, y, z)`` the centre of the bottom face,
            sizes along the box's axes, ``yaw`` counter-clockwise about +z in radians.
        mode: ``"first"``: the index of the first box holding each point (int64 ``[N]`` or
            ``[B, N]``, -1 for none); ``"all"``: bool ``[N, M]`` or ``[B, N, M]``, every box.

    Returns:
        The box indices or the membership matrix; time grows with points x boxes, memory
        with the output.

    Examples:
        >>> points = torch.tensor([[0.0, 0.0, 0.5], [3.0, 0.0, 0.5], [0.0, 0.0, 2.5]])
        >>> boxes = torch.tensor([[0.0, 0.0, 0.0, 2.0, 2.0, 1.0, 0.0], [2.5, 0.0, 0.0, 2.0, 2.0, 3.0, 0.0]])
        >>> roiops.points_in_boxes(points, boxes)
        tensor([ 0,  1, -1])
        >>> roiops.points_in_boxes(points, boxes, mode="all").int()
        tensor([[1, 0],
                [0, 1],
                [0, 0]], dtype=torch.int32)
    """
    all_boxes = v.choice("mode", mode, ("first", "all")) == "all"
    points = v.lidar_points(points, points.dim() == 3 if isinstance(points, Tensor) else False)
    boxes = v.lidar_boxes(boxes, points)
    if points.dim() == 2:
        return _points_in_boxes(points[None].contiguous(), boxes[None].contiguous(), all_boxes)[0]
    return _points_in_boxes(points.contiguous(), boxes.contiguous(), all_boxes)


class PointsInBoxes(nn.Module):
    """Module form of [`points_in_boxes`][roiops.points_in_boxes].

    Args:
        mode: ``"first"`` (the first box of each point) or ``"all"`` (every box).
    """

    def __init__(self, mode: Literal["first", "all"] = "first") -> None:
        super().__init__()
        self.mode = cast(Literal["first", "all"], v.choice("mode", mode, ("first", "all")))

    def forward(self, points: Tensor, boxes: Tensor) -> Tensor:
        return points_in_boxes(points, boxes, self.mode)

    def extra_repr(self) -> str:
        return f"mode={self.mode!r}"
