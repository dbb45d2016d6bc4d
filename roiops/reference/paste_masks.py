"""Mask pasting (docs/semantics.md, "paste_masks"), written with the peers' own primitives:
the continuous rule is detectron2's grid (pixel centres mapped into the box) sampled by
``F.grid_sample``; the torchvision rule resizes the padded mask to the integer box with
``F.interpolate`` and copies its window. One box at a time, over the whole image."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import _kernel_checks as checks

__all__ = ["paste_masks_forward", "paste_masks_torchvision_forward"]


def paste_masks_forward(masks: Tensor, boxes: Tensor, height: int, width: int, threshold: float, binary: bool,
                        box_window: bool) -> Tensor:
    """Continuous rule: pixel ``(y, x)`` of box k's plane is mask k bilinearly sampled (zero
    outside it) at ``((x + 0.5 - x1) / (x2 - x1)) * M - 0.5`` and likewise along y; a
    sample at a coordinate that is not finite (a box of zero size) is 0. ``binary``: the
    value ``>= threshold``. ``box_window``: only pixels in ``[floor(x1) - 1, ceil(x2) + 1)``
    (and along y) are pasted, as detectron2 does on the CPU."""
    checks.paste_masks(masks, boxes, height, width, integer_boxes=False)
    checks.finite_threshold(threshold, binary)
    dtype = torch.float64 if masks.dtype == torch.float64 else torch.float32
    out = torch.zeros((masks.shape[0], height, width), dtype=torch.bool if binary else masks.dtype,
                      device=masks.device)
    for k in range(masks.shape[0]):
        x1, y1, x2, y2 = boxes[k].to(dtype)
        cols = torch.arange(width, device=masks.device, dtype=dtype)
        rows = torch.arange(height, device=masks.device, dtype=dtype)
        gx = (cols + 0.5 - x1) / (x2 - x1) * 2 - 1
        gy = (rows + 0.5 - y1) / (y2 - y1) * 2 - 1
        grid = torch.stack([gx[None, :].expand(height, width), gy[:, None].expand(height, width)], dim=2)
        v = F.grid_sample(masks[k][None, None].to(dtype), grid[None], mode="bilinear", padding_mode="zeros",
                          align_corners=False)[0, 0]
        v = torch.where(gy.isfinite()[:, None] & gx.isfinite()[None, :], v, 0)
        if box_window:
            inside_x = (cols >= x1.floor() - 1) & (cols < x2.ceil() + 1)
            inside_y = (rows >= y1.floor() - 1) & (rows < y2.ceil() + 1)
            v = torch.where(inside_y[:, None] & inside_x[None, :], v, 0)
            out[k] = (v >= threshold) & inside_y[:, None] & inside_x[None, :] if binary else v.to(out.dtype)
        else:
            out[k] = v >= threshold if binary else v.to(out.dtype)
    return out


def paste_masks_torchvision_forward(masks: Tensor, boxes: Tensor, height: int, width: int, padding: int,
                                    fused: bool) -> Tensor:
    """torchvision rule: mask k, padded with ``padding`` zero cells on each side, resized to
    ``(y2 - y1 + 1) x (x2 - x1 + 1)`` cells (at least 1) by ``F.interpolate`` (bilinear,
    ``align_corners=False``), its cell ``(d, e)`` at pixel ``(y1 + d, x1 + e)`` of the plane.
    Boxes are whole pixels (int64). ``fused`` is the C++ kernels' choice of arithmetic;
    ``F.interpolate`` here uses its own. Memory grows with the boxes' sizes."""
    checks.paste_masks(masks, boxes, height, width, integer_boxes=True)
    checks.paste_padding(padding)
    out = torch.zeros((masks.shape[0], height, width), dtype=masks.dtype, device=masks.device)
    padded = F.pad(masks, (padding,) * 4)
    for k, (x1, y1, x2, y2) in enumerate(boxes.tolist()):
        w, h = max(x2 - x1 + 1, 1), max(y2 - y1 + 1, 1)
        c0, c1, r0, r1 = max(x1, 0), min(x2 + 1, width), max(y1, 0), min(y2 + 1, height)
        if c0 >= c1 or r0 >= r1:
            continue
        resized = F.interpolate(padded[k][None, None], size=(h, w), mode="bilinear", align_corners=False)[0, 0]
        out[k, r0:r1, c0:c1] = resized[r0 - y1:r1 - y1, c0 - x1:c1 - x1]
    return out
