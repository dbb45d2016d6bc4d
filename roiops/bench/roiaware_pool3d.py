"""RoIAwarePool3d's workloads: PartA2's second stage on one LiDAR sweep of 16,384 points,
each proposal cut into 14x14x14 voxels of at most 128 points; its segmentation features
(16 channels) max-pooled, its part features (4 channels) averaged. The peer is the
vectorised PyTorch formulation (roiops' reference kernels: whole-tensor inside test, sort and
scatters), what a user without mmcv's CUDA build writes."""

from __future__ import annotations

from types import ModuleType
from typing import Literal, cast

import torch
from torch import Tensor

from .._boxes import LIDAR
from ..ops.roiaware_pool3d import roiaware_pool3d
from ._case import Bench, Inputs, Peer, Target, Workload, read_and_written

CAP = 128


def _draw(w: Workload, g: torch.Generator, dtype: torch.dtype) -> tuple[Tensor, ...]:
    """A street scene's ``w.height`` points with ``w.channels`` features and ``w.boxes``
    proposals."""
    points, boxes = LIDAR.scene(1, w.height, w.boxes, g)
    features = torch.randn(w.height, w.channels, generator=g)
    return points[0].to(dtype), features.to(dtype), boxes[0].to(dtype)


def _mode(w: Workload) -> Literal["max", "avg"]:
    return cast(Literal["max", "avg"], w.name.split()[-1])


def _reference(ref: ModuleType, w: Workload, points: Tensor, features: Tensor, boxes: Tensor) -> Tensor:
    return ref.roiaware_pool3d_forward(points, features, boxes, w.size, w.size, w.size, CAP, _mode(w) == "max")[0]


BENCH = (Bench("roiaware_pool3d", "RoIAwarePool3d",
               lambda w, p, f, b: roiaware_pool3d(p, f, b, w.size, CAP, _mode(w)),
               Peer("roiops.reference", _reference,
                    note="the vectorised PyTorch formulation: roiops' reference kernels (an inside test over every "
                         "box and point, a stable sort for the per-voxel cap, scatters)"),
               (Workload("parta2 segmentation max", 1, 16, 16384, 1, 1.0, 128, 14),
                Workload("parta2 segmentation 512 max", 1, 16, 16384, 1, 1.0, 512, 14),
                Workload("parta2 parts avg", 1, 4, 16384, 1, 1.0, 512, 14)),
               sampled=False, target=Target(10, None),
               inputs=Inputs(_draw, read_and_written, lambda w: (
                   f"{w.boxes} proposals, {w.size}^3 voxels of <= {CAP} points, {w.height} points with "
                   f"{w.channels} features, mode {_mode(w)}"))),)
