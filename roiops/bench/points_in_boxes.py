"""points_in_boxes' workloads: a LiDAR sweep of 16,384 points against 128 boxes, each
point's first box (mmcv's points_in_boxes_part, as ground-truth assignment uses it) and
every box (points_in_boxes_all). The peer is the vectorised PyTorch formulation (roiops'
reference kernels: whole-tensor inside test)."""

from __future__ import annotations

from types import ModuleType
from typing import Literal, cast

import torch
from torch import Tensor

from .._boxes import LIDAR
from ..ops.points_in_boxes import points_in_boxes
from ._case import Bench, Inputs, Peer, Workload, read_and_written


def _draw(w: Workload, g: torch.Generator, dtype: torch.dtype) -> tuple[Tensor, ...]:
    points, boxes = LIDAR.scene(w.n, w.height, w.boxes, g)
    return points.to(dtype), boxes.to(dtype)


def _mode(w: Workload) -> Literal["first", "all"]:
    return cast(Literal["first", "all"], w.name.split()[-1])


def _reference(ref: ModuleType, w: Workload, points: Tensor, boxes: Tensor) -> Tensor:
    return ref.points_in_boxes_forward(points, boxes, _mode(w) == "all")


BENCH = (Bench("points_in_boxes", "points_in_boxes", lambda w, p, b: points_in_boxes(p, b, _mode(w)),
               Peer("roiops.reference", _reference,
                    note="the vectorised PyTorch formulation: roiops' reference kernel (an inside test over every "
                         "box and point)"),
               (Workload("lidar sweep first", 1, 0, 16384, 1, 1.0, 128, 1),
                Workload("lidar sweep all", 1, 0, 16384, 1, 1.0, 128, 1)),
               sampled=False,
               inputs=Inputs(_draw, read_and_written, lambda w: (
                   f"{w.height} points against {w.boxes} boxes, mode {_mode(w)}"))),)
