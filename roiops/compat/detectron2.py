"""Drop-in replacement for detectron2's ``ROIAlign`` (``detectron2.layers``).

Port with one import:

    from detectron2.layers import ROIAlign, roi_align
    # becomes
    from roiops.compat.detectron2 import ROIAlign, roi_align

``ROIAlign(output_size, spatial_scale, sampling_ratio, aligned=True)`` (note the default,
unlike torchvision's) with ``forward(input, rois)`` on ``rois[K, 5]``, and detectron2's
repr. detectron2's ``roi_align`` is torchvision's function, so it is
[`roiops.compat.torchvision.roi_align`][] here. Like detectron2, ``forward`` casts the
boxes to the input's dtype before pooling (under float16 the coordinates are rounded to
float16), so results match detectron2's exactly; pass boxes through
[`roiops.roi_align`][] directly to keep them in float32. Empty boxes (``aligned=True``,
adaptive sampling) give 0, as detectron2's tests require.

``ROIAlignRotated(output_size, spatial_scale, sampling_ratio)`` with ``forward(input,
rois)`` on ``rois[K, 6]`` rows ``(batch_index, cx, cy, w, h, angle)``, the angle in degrees,
counter-clockwise: [`roiops.roi_align_rotated`][] with the 0.5 offset always applied and
no minimum box size (detectron2's kernels have no ``aligned`` switch for rotated boxes).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

import roiops as F

from .. import _validation as v
from ..ops._declare import fx_leaf
from ..ops.mask_targets import polygon_targets, targets
from ..ops.paste_masks import paste
from ._util import BoxAssertionError
from . import torchvision as tv
from .torchvision import roi_align

__all__ = ["ROIAlign", "ROIAlignRotated", "roi_align"]


class ROIAlign(tv.RoIAlign):
    """detectron2 ``ROIAlign``: RoIAlign (average) with ``aligned=True`` by default; the same
    constructor checks and repr as torchvision's.

    ``module(input, rois)``, with ``rois`` a ``Tensor[K, 5]`` of rows ``(batch_index, x1,
    y1, x2, y2)``, returns ``Tensor[K, C, h, w]``; the boxes are cast to the input's dtype
    first, as detectron2 does. Other ``rois`` raise an ``AssertionError``
    ([`BoxAssertionError`][roiops.compat.BoxAssertionError]).

    Args:
        output_size: ``int`` or ``(h, w)``.
        spatial_scale: feature-map cells per input-image pixel (e.g. 1/16).
        sampling_ratio: sample points per bin along each axis; ``<= 0`` means adaptive.
        aligned: shift box corners by -0.5 cell; ``False`` is the original RoIAlign.

    Examples:
        >>> from roiops.compat.detectron2 import ROIAlign
        >>> pooler = ROIAlign((7, 7), spatial_scale=1 / 16, sampling_ratio=0)
        >>> pooler
        ROIAlign(output_size=(7, 7), spatial_scale=0.0625, sampling_ratio=0, aligned=True)
        >>> pooler(torch.randn(1, 8, 40, 60), torch.tensor([[0, 16.0, 32.0, 320.0, 240.0]])).shape
        torch.Size([1, 8, 7, 7])
    """

    def __init__(self, output_size: tv.OutputSize, spatial_scale: float, sampling_ratio: int,
                 aligned: bool = True) -> None:
        super().__init__(output_size, spatial_scale, sampling_ratio, aligned)

    def forward(self, input: Tensor, rois: Tensor) -> Tensor:  # type: ignore[override]
        return _roi_align(input, rois, self.output_size, self.spatial_scale, self.sampling_ratio, self.aligned)


def _assert_rows(rois: object, width: int, columns: str) -> None:
    """detectron2's assertion on ``rois``: a ``Tensor[K, width]`` of rows ``columns`` (a list
    of per-image boxes, which roiops' own functions take, is refused as there)."""
    if not isinstance(rois, Tensor) or rois.dim() != 2 or rois.shape[1] != width:
        shape = tuple(rois.shape) if isinstance(rois, Tensor) else type(rois).__name__
        raise BoxAssertionError(f"rois must be a Tensor[K, {width}] {columns}, got {shape}")


@fx_leaf
def _roi_align(input: Tensor, rois: Tensor, output_size: tv.OutputSize, spatial_scale: float, sampling_ratio: int,
               aligned: bool) -> Tensor:
    """``ROIAlign.forward``, which asserts the shape of ``rois`` as detectron2's."""
    _assert_rows(rois, 5, "(batch_index, x1, y1, x2, y2)")
    if isinstance(input, Tensor) and input.is_floating_point() and rois.is_floating_point():
        rois = rois.to(dtype=input.dtype)
    return F.roi_align(input, rois, output_size, spatial_scale, sampling_ratio, aligned)


class ROIAlignRotated(nn.Module):
    """detectron2 ``ROIAlignRotated``: rotated RoIAlign with the half-cell offset always
    applied and no minimum box size.

    ``module(input, rois)``, with ``rois`` a ``Tensor[K, 6]`` of rows ``(batch_index, cx,
    cy, w, h, angle)``, the angle in degrees, counter-clockwise, returns ``Tensor[K, C, h,
    w]``. Other ``rois`` raise an ``AssertionError``
    ([`BoxAssertionError`][roiops.compat.BoxAssertionError]).

    Args:
        output_size: ``int`` or ``(h, w)``.
        spatial_scale: feature-map cells per input-image pixel (e.g. 1/16).
        sampling_ratio: sample points per bin along each box axis; ``<= 0`` means adaptive.

    Examples:
        >>> from roiops.compat.detectron2 import ROIAlignRotated
        >>> pooler = ROIAlignRotated((7, 7), spatial_scale=1 / 16, sampling_ratio=0)
        >>> pooler(torch.randn(1, 8, 40, 60), torch.tensor([[0, 320.0, 240.0, 200.0, 100.0, 30.0]])).shape
        torch.Size([1, 8, 7, 7])
    """

    def __init__(self, output_size: tv.OutputSize, spatial_scale: float, sampling_ratio: int) -> None:
        super().__init__()
        self.output_size = v.output_size(output_size)
        self.spatial_scale = v.spatial_scale(spatial_scale)
        self.sampling_ratio = v.sampling_ratio(sampling_ratio)

    def forward(self, input: Tensor, rois: Tensor) -> Tensor:
        return _roi_align_rotated(input, rois, self.output_size, self.spatial_scale, self.sampling_ratio)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(output_size={self.output_size}, spatial_scale={self.spatial_scale}, "
                f"sampling_ratio={self.sampling_ratio})")


@fx_leaf
def _roi_align_rotated(input: Tensor, rois: Tensor, output_size: tuple[int, int], spatial_scale: float,
                       sampling_ratio: int) -> Tensor:
    """``ROIAlignRotated.forward``, which asserts the shape of ``rois`` as detectron2's."""
    _assert_rows(rois, 6, "(batch_index, cx, cy, w, h, angle)")
    return F.roi_align_rotated(input, rois, output_size, spatial_scale, sampling_ratio, aligned=True, clockwise=False,
                               angle="degrees")


# ---- Mask R-CNN's mask steps (detectron2.layers.mask_ops, detectron2.structures.masks) ---

@fx_leaf
def paste_masks_in_image(masks: Tensor, boxes: object, image_shape: tuple[int, int],
                         threshold: float = 0.5) -> Tensor:
    """Drop-in for detectron2's ``paste_masks_in_image`` (``detectron2.layers.mask_ops``),
    with its signature and result: bit for bit on the CPU for float32 masks and boxes.
    Each mask is sampled at the pixel centres of its box (``grid_sample``'s arithmetic,
    zeros outside the mask); on the CPU only pixels in ``[floor(x1) - 1, ceil(x2) + 1)``
    (and along y) are pasted, as detectron2 does there. Semantics: docs/semantics.md,
    "paste_masks".

    Args:
        masks: ``Tensor[N, M, M]`` of mask probabilities (square).
        boxes: ``Tensor[N, 4]`` or a detectron2 ``Boxes`` (its ``.tensor``), rows ``(x1,
            y1, x2, y2)`` in image pixels.
        image_shape: ``(height, width)``.
        threshold: ``>= 0``: bool masks, True where the value is ``>= threshold``;
            negative: uint8 masks of ``value * 255``.

    Returns:
        ``Tensor[N, height, width]``, bool (uint8 for a negative threshold).

    Examples:
        >>> masks = torch.ones(1, 28, 28)
        >>> out = roiops.compat.detectron2.paste_masks_in_image(masks, torch.tensor([[4.0, 4.0, 20.0, 12.0]]), (32, 32))
        >>> out.dtype, int(out.sum())
        (torch.bool, 128)
    """
    if not isinstance(masks, Tensor) or masks.dim() != 3 or masks.shape[-1] != masks.shape[-2]:
        raise ValueError("masks must be a Tensor[N, M, M] of square masks")
    height, width = v.image_size(image_shape)
    rows_of = getattr(boxes, "tensor", boxes)
    if masks.shape[0] == 0:
        return masks.new_empty((0, height, width), dtype=torch.uint8)
    if not masks.is_floating_point():
        masks = masks.float()
    stack = v.paste_masks_stack(masks).detach()
    rows = v.paste_boxes(rows_of, stack).detach()
    cut = v.finite("threshold", threshold)
    window = stack.device.type == "cpu"
    if cut >= 0:
        return paste(stack, rows, height, width, cut, window)
    return (paste(stack, rows, height, width, None, window) * 255).to(torch.uint8)


@fx_leaf
def bitmasks_crop_and_resize(masks: Tensor, boxes: Tensor, mask_size: int) -> Tensor:
    """Drop-in for detectron2's ``BitMasks.crop_and_resize(boxes, mask_size)`` (mask
    targets from bit masks), as a function of the masks: mask i cropped to box i and
    resized by RoIAlign (``aligned=True``, adaptive sampling), then ``>= 0.5``. Bit for bit
    detectron2's, reading the masks as stored (no float copy).

    Args:
        masks: ``Tensor[N, H, W]`` of bit masks (bool, uint8 or floating): ``BitMasks.tensor``.
        boxes: ``Tensor[N, 4]``, one box per mask.
        mask_size: the side of the targets.

    Returns:
        ``Tensor[N, mask_size, mask_size]`` of bool.

    Examples:
        >>> m = torch.zeros(1, 16, 16, dtype=torch.bool)
        >>> m[0, :, 8:] = True
        >>> roiops.compat.detectron2.bitmasks_crop_and_resize(m, torch.tensor([[0.0, 0.0, 16.0, 16.0]]), 2).tolist()
        [[[False, True], [False, True]]]
    """
    stack = v.target_masks(masks)
    if not isinstance(boxes, Tensor) or boxes.dim() != 2 or boxes.shape[0] != stack.shape[0]:
        raise ValueError(f"boxes must be a Tensor[N, 4] with N = {stack.shape[0]} masks")
    indices = torch.arange(stack.shape[0], device=stack.device)
    rois = v.target_rois(stack, boxes.to(torch.float32), indices)
    return targets(stack.detach(), rois.detach(), v.output_size(mask_size), 0, True, 0.5)


@fx_leaf
def polygons_crop_and_resize(polygons: list, boxes: Tensor, mask_size: int) -> Tensor:
    """Drop-in for detectron2's ``PolygonMasks.crop_and_resize(boxes, mask_size)`` (mask
    targets from polygons), as a function of the polygons: instance i's polygons shifted to
    box i's corner, scaled onto a ``mask_size`` grid and rasterised by pycocotools' rule,
    their union; bit for bit detectron2's (with NumPy 2), without pycocotools. The C++
    kernel rasterises on the host (as detectron2 does); the result goes to the boxes'
    device. Semantics: docs/semantics.md, "mask_targets".

    Args:
        polygons: ``PolygonMasks.polygons``: one list per instance of flat ``[x0, y0, x1,
            y1, ...]`` arrays, in image pixels.
        boxes: ``Tensor[N, 4]``, one box per instance, read as float32 (detectron2's
            ``Boxes``).
        mask_size: the side of the targets.

    Returns:
        ``Tensor[N, mask_size, mask_size]`` of bool.

    Examples:
        >>> square = [[[2.0, 2.0, 14.0, 2.0, 14.0, 14.0, 2.0, 14.0]]]
        >>> t = roiops.compat.detectron2.polygons_crop_and_resize(square, torch.tensor([[0.0, 0.0, 16.0, 16.0]]), 4)
        >>> t.int().tolist()
        [[[0, 0, 0, 0], [0, 1, 1, 1], [0, 1, 1, 1], [0, 1, 1, 1]]]
    """
    if not isinstance(polygons, (list, tuple)):
        raise TypeError(f"polygons must be a list (one per instance) of lists of polygons, got {type(polygons).__name__}")
    if not isinstance(boxes, Tensor) or boxes.dim() != 2 or boxes.shape[0] != len(polygons):
        raise ValueError(f"boxes must be a Tensor[N, 4] with N = {len(polygons)} instances")
    size = v.output_size(mask_size)
    indices = torch.arange(len(polygons), device=boxes.device)
    v.polygon_rows(polygons, boxes, indices)
    return polygon_targets(polygons, boxes, indices, size[0])


__all__ += ["bitmasks_crop_and_resize", "paste_masks_in_image", "polygons_crop_and_resize"]
