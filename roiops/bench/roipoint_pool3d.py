"""RoIPointPool3d's workload: PointRCNN's second stage on one LiDAR sweep of 16,384 points
with 128 features, 512 points sampled in each of 512 proposals. The peer is the vectorised
PyTorch formulation (roiops' reference kernels: whole-tensor inside test, a cumulative count
for the first points, one gather)."""

from __future__ import annotations

from types import ModuleType

import torch
from torch import Tensor

from .._boxes import LIDAR
from ..ops.roipoint_pool3d import roipoint_pool3d
from ._case import Bench, Inputs, Peer, Target, Workload, read_and_written


def _draw(w: Workload, g: torch.Generator, dtype: torch.dtype) -> tuple[Tensor, ...]:
    """``w.n`` street scenes of ``w.height`` points with ``w.channels`` features and
    ``w.boxes`` proposals each."""
    points, boxes = LIDAR.scene(w.n, w.height, w.boxes, g)
    features = torch.randn(w.n, w.height, w.channels, generator=g)
    return points.to(dtype), features.to(dtype), boxes.to(dtype)


def _reference(ref: ModuleType, w: Workload, points: Tensor, features: Tensor, boxes: Tensor) -> Tensor:
    return ref.roipoint_pool3d_forward(points, features, boxes, w.size)[0]


BENCH = (Bench("roipoint_pool3d", "RoIPointPool3d", lambda w, p, f, b: roipoint_pool3d(p, f, b, w.size)[0],
               Peer("roiops.reference", _reference,
                    note="the vectorised PyTorch formulation: roiops' reference kernels (an inside test over every "
                         "box and point, a cumulative count, one gather)"),
               (Workload("pointrcnn", 1, 128, 16384, 1, 1.0, 512, 512),),
               sampled=False, target=Target(10, None),
               inputs=Inputs(_draw, read_and_written, lambda w: (
                   f"{w.boxes} proposals, {w.size} points each, from {w.height} points with {w.channels} "
                   f"features"))),)
