"""LiDAR box geometry of the reference kernels (docs/semantics.md, "Point clouds"): the
inside test and the voxel of a point, each rounding step of the definition one tensor op in
the compute type (float32 for float16/bfloat16/float32 coordinates, float64 for float64),
for a chunk of boxes at a time so that memory stays O(points * chunk)."""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
from torch import Tensor

# Box-point pairs a chunk of boxes tests at once.
_PAIRS = 2**22


def compute_type(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def chunks(boxes: int, points: int) -> Iterator[slice]:
    step = max(1, _PAIRS // max(points, 1))
    for start in range(0, boxes, step):
        yield slice(start, min(start + step, boxes))


def inside(points: Tensor, boxes: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``points [N, 3]`` and ``boxes [m, 7]`` in the compute type: ``(mask [m, N], lx, ly)``,
    whether each point is in each box and its coordinates in the box's frame."""
    x, y, z, dx, dy, dz, yaw = (c[:, None] for c in boxes.unbind(1))
    px, py, pz = points.unbind(1)
    t = boxes.dtype
    zc = (z.double() + dz.double() / 2).to(t)  # the sum in double, rounded once
    # libm's float64 cosine and sine, as the C++ kernels take them (torch's vectorised ones
    # differ in the last bit for about one angle in a thousand).
    angles = (-yaw[:, 0].double()).tolist()
    c = torch.tensor([math.cos(a) for a in angles], dtype=torch.float64, device=boxes.device).to(t)[:, None]
    s = torch.tensor([math.sin(a) for a in angles], dtype=torch.float64, device=boxes.device).to(t)[:, None]
    sx, sy = px - x, py - y
    lx = sx * c + sy * -s
    ly = sx * s + sy * c
    hx, hy = dx / 2, dy / 2
    mask = ~((pz - zc).abs() > dz / 2) & (lx > -hx) & (lx < hx) & (ly > -hy) & (ly < hy)
    return mask, lx, ly


def _cell(q: Tensor, n: int) -> Tensor:
    # Clamped as a float, so NaN and infinities never reach the conversion.
    return torch.nan_to_num(q.trunc(), nan=0.0).clamp(0, n - 1).long()


def voxel(points: Tensor, boxes: Tensor, lx: Tensor, ly: Tensor, grid: tuple[int, int, int]) -> Tensor:
    """The voxel ``(ix * oy + iy) * oz + iz`` of each (box, point) of :func:`inside`."""
    ox, oy, oz = grid
    z, dx, dy, dz = (boxes[:, i, None] for i in (2, 3, 4, 5))
    ix = _cell((lx + dx / 2) / (dx / ox), ox)
    iy = _cell((ly + dy / 2) / (dy / oy), oy)
    iz = _cell((points[:, 2] - z) / (dz / oz), oz)
    return (ix * oy + iy) * oz + iz
