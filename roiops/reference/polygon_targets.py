"""Mask targets from polygons (docs/semantics.md, "mask_targets"): each proposal's instance
rasterised within its box by pycocotools' rule (_polygons.py), on the host."""

from __future__ import annotations

import torch
from torch import Tensor

from .. import _kernel_checks as checks

__all__ = ["polygon_targets_forward"]


def polygon_targets_forward(coords: Tensor, vertex_offsets: Tensor, polygon_offsets: Tensor, boxes: Tensor,
                            indices: Tensor, size: int) -> Tensor:
    """``[P, size, size]`` bool: instance ``indices[p]``'s polygons (``coords`` pairs, polygon
    i's vertices ``vertex_offsets[i]`` to ``vertex_offsets[i + 1]``, instance g's polygons
    ``polygon_offsets[g]`` to ``polygon_offsets[g + 1]``) rasterised within ``boxes[p]``."""
    checks.polygon_targets(coords, vertex_offsets, polygon_offsets, boxes, indices, size)
    # NumPy only here: roiops needs it for polygons alone
    import numpy as np

    from ._polygons import rasterize_in_box

    xy = coords.numpy().reshape(-1, 2)
    vo, po = vertex_offsets.tolist(), polygon_offsets.tolist()
    out = torch.zeros((boxes.shape[0], size, size), dtype=torch.bool)
    for p, (g, box) in enumerate(zip(indices.tolist(), boxes.numpy())):
        polygons = [xy[vo[i]:vo[i + 1]].reshape(-1).copy() for i in range(po[g], po[g + 1])]
        out[p] = torch.from_numpy(rasterize_in_box(polygons, box.astype(np.float32), size))
    return out
