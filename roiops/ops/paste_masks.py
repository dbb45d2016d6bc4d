"""Mask pasting (Mask R-CNN inference): each box's mask resampled into its own image-sized
plane, as a bool (thresholded) or a soft mask. Registered ops, public function, and the
calls the peers' drop-ins make (``roiops.compat``). Semantics: docs/semantics.md,
"paste_masks".

Two registered ops: ``roiops::paste_masks``, the continuous rule (pixel centres mapped into
the box, bilinear with zeros outside the mask: detectron2's), and
``roiops::paste_masks_torchvision``, torchvision's rule (integer boxes, the mask padded and
resized). Neither has a gradient."""

from __future__ import annotations

import torch
from torch import Tensor

from .. import _backend
from .. import _validation as v
from ._declare import define_plain, fx_leaf


def _forward(masks: Tensor, boxes: Tensor, height: int, width: int, threshold: float, binary: bool,
             box_window: bool) -> Tensor:
    return _backend.kernels_of(masks).paste_masks_forward(masks, boxes, height, width, threshold, binary, box_window)


def _fake(masks: Tensor, boxes: Tensor, height: int, width: int, threshold: float, binary: bool,
          box_window: bool) -> Tensor:
    return masks.new_empty((masks.shape[0], height, width), dtype=torch.bool if binary else masks.dtype)


def _torchvision_forward(masks: Tensor, boxes: Tensor, height: int, width: int, padding: int, fused: bool) -> Tensor:
    return _backend.kernels_of(masks).paste_masks_torchvision_forward(masks, boxes, height, width, padding, fused)


def _torchvision_fake(masks: Tensor, boxes: Tensor, height: int, width: int, padding: int, fused: bool) -> Tensor:
    return masks.new_empty((masks.shape[0], height, width))


_paste = define_plain("paste_masks", "(Tensor masks, Tensor boxes, int height, int width, float threshold, "
                      "bool binary, bool box_window) -> Tensor", _forward, _fake)
_paste_torchvision = define_plain("paste_masks_torchvision", "(Tensor masks, Tensor boxes, int height, int width, "
                                  "int padding, bool fused) -> Tensor", _torchvision_forward, _torchvision_fake)


def paste(masks: Tensor, boxes: Tensor, height: int, width: int, threshold: float | None,
          box_window: bool = False) -> Tensor:
    """The continuous rule on checked arguments (masks ``[K, Mh, Mw]``, boxes ``[K, 4]`` in
    the masks' coordinate type): bool with a threshold, the masks' dtype without."""
    return _paste(masks, boxes, height, width, 0.0 if threshold is None else threshold, threshold is not None,
                  box_window)


def paste_torchvision(masks: Tensor, boxes: Tensor, height: int, width: int, padding: int, fused: bool) -> Tensor:
    """The torchvision rule on checked arguments (int64 boxes, already expanded by the
    padding's scale and truncated)."""
    return _paste_torchvision(masks, boxes, height, width, padding, fused)


@fx_leaf
def paste_masks(masks: Tensor, boxes: Tensor, image_size: tuple[int, int], threshold: float | None = 0.5) -> Tensor:
    """Pastes each box's mask into an image-sized plane (Mask R-CNN inference): mask k is
    resampled over box k, and the plane is 0 elsewhere.

    Pixel ``(y, x)`` takes the mask's bilinear value (zero outside the mask) at the point
    its centre maps to: ``((x + 0.5 - x1) / (x2 - x1)) * Mw - 0.5`` mask cells along x,
    likewise along y, in the arithmetic of detectron2's ``paste_masks_in_image``, whose
    results it equals bit for bit on the CPU (float32). Work and memory grow with the
    output; only the pixels a box's mask reaches are computed. Semantics (inverted and
    empty boxes, boxes outside the image, the peers' rules): docs/semantics.md,
    "paste_masks".

    Args:
        masks: ``Tensor[K, Mh, Mw]`` (or ``[K, 1, Mh, Mw]``, a mask head's output for one
            class), float16/bfloat16/float32/float64: mask probabilities.
        boxes: ``Tensor[K, 4]`` of rows ``(x1, y1, x2, y2)`` in image pixels, any floating
            dtype (converted to float64 for float64 masks, float32 otherwise), finite and
            within 2^24.
        image_size: ``(height, width)`` of the image, ints in [0, 2^24].
        threshold: a pixel is True where its value is ``>= threshold``; None returns the
            values themselves.

    Returns:
        ``Tensor[K, height, width]``: bool with a threshold, the masks' dtype without. No
        gradient flows through it.

    Examples:
        >>> masks = torch.zeros(1, 28, 28)
        >>> masks[0, 7:21, 7:21] = 1.0
        >>> pasted = roiops.paste_masks(masks, torch.tensor([[10.0, 20.0, 38.0, 48.0]]), (64, 64))
        >>> pasted.shape, pasted.dtype, int(pasted.sum())
        (torch.Size([1, 64, 64]), torch.bool, 196)
    """
    masks = v.paste_masks_stack(masks).detach()
    rows = v.paste_boxes(boxes, masks).detach()
    height, width = v.image_size(image_size)
    return paste(masks, rows, height, width, v.threshold(threshold))
