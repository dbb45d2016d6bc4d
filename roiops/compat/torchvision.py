"""Drop-in replacement for the RoI layers of ``torchvision.ops``.

Port with one import::

    from torchvision.ops import MultiScaleRoIAlign, RoIAlign, RoIPool, roi_align, roi_pool
    # becomes
    from roiops.compat.torchvision import MultiScaleRoIAlign, RoIAlign, RoIPool, roi_align, roi_pool

and likewise ``ps_roi_align``, ``ps_roi_pool``, ``PSRoIAlign`` and ``PSRoIPool`` (R-FCN).

Same names, argument order, defaults (``aligned=False``, ``sampling_ratio=-1``, Caffe
RoIPool) and box formats; results are torchvision's bit for bit (docs/semantics.md).
What differs: invalid boxes (a batch index outside the batch, NaN/inf coordinates) raise
``ValueError`` instead of reading out of bounds; ``aligned=True`` boxes of size <= 0 with
adaptive sampling give 0, and so do ``ps_roi_align`` bins with an empty adaptive grid
(torchvision: NaN); ``ps_roi_pool`` bins on the last row or column average it (torchvision's
forward leaves it out, its backward does not); quantized tensors are not supported.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Optional, Union

import torch
from torch import Tensor, nn

from .. import _validation as v
from .. import ops as F

__all__ = ["LevelMapper", "MultiScaleRoIAlign", "RoIAlign", "RoIPool", "roi_align", "roi_pool"]
__all__ += ["PSRoIAlign", "PSRoIPool", "ps_roi_align", "ps_roi_pool"]

Boxes = Union[Tensor, Sequence[Tensor]]
OutputSize = Union[int, tuple[int, int], list[int]]


def _boxes(input: Tensor, boxes: Boxes) -> Boxes:
    """torchvision accepts a list with fewer tensors than images (the last images get no
    boxes); roiops wants one per image, so pad with empty ones."""
    if isinstance(boxes, (list, tuple)) and boxes and isinstance(input, Tensor) and input.dim() == 4:
        missing = input.shape[0] - len(boxes)
        if missing > 0 and isinstance(boxes[0], Tensor):
            boxes = [*boxes, *[boxes[0].new_zeros((0, 4))] * missing]
    return boxes


def roi_align(input: Tensor, boxes: Boxes, output_size: OutputSize, spatial_scale: float = 1.0,
              sampling_ratio: int = -1, aligned: bool = False) -> Tensor:
    """``torchvision.ops.roi_align``: RoIAlign (average) of ``boxes`` (``Tensor[K, 5]`` or a
    list of ``Tensor[L, 4]``) on ``input[N, C, H, W]`` -> ``Tensor[K, C, h, w]``."""
    return F.roi_align(input, _boxes(input, boxes), output_size, spatial_scale, sampling_ratio, aligned)


def roi_pool(input: Tensor, boxes: Boxes, output_size: OutputSize, spatial_scale: float = 1.0) -> Tensor:
    """``torchvision.ops.roi_pool``: Fast R-CNN RoIPool (Caffe convention) -> ``Tensor[K, C, h, w]``."""
    return F.roi_pool(input, _boxes(input, boxes), output_size, spatial_scale, "caffe")


class RoIAlign(nn.Module):
    """``torchvision.ops.RoIAlign(output_size, spatial_scale, sampling_ratio, aligned=False)``."""

    def __init__(self, output_size: OutputSize, spatial_scale: float, sampling_ratio: int,
                 aligned: bool = False) -> None:
        super().__init__()
        # Checked now, stored as given (torchvision's repr shows them so).
        v.output_size(output_size)
        v.spatial_scale(spatial_scale)
        v.sampling_ratio(sampling_ratio)
        v.flag("aligned", aligned)
        self.output_size = output_size
        self.spatial_scale = spatial_scale
        self.sampling_ratio = sampling_ratio
        self.aligned = aligned

    def forward(self, input: Tensor, rois: Boxes) -> Tensor:
        return roi_align(input, rois, self.output_size, self.spatial_scale, self.sampling_ratio, self.aligned)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(output_size={self.output_size}, spatial_scale={self.spatial_scale}, "
                f"sampling_ratio={self.sampling_ratio}, aligned={self.aligned})")


class RoIPool(nn.Module):
    """``torchvision.ops.RoIPool(output_size, spatial_scale)``."""

    def __init__(self, output_size: OutputSize, spatial_scale: float) -> None:
        super().__init__()
        v.output_size(output_size)
        v.spatial_scale(spatial_scale)
        self.output_size = output_size
        self.spatial_scale = spatial_scale

    def forward(self, input: Tensor, rois: Boxes) -> Tensor:
        return roi_pool(input, rois, self.output_size, self.spatial_scale)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(output_size={self.output_size}, spatial_scale={self.spatial_scale})"


def ps_roi_align(input: Tensor, boxes: Boxes, output_size: OutputSize, spatial_scale: float = 1.0,
                 sampling_ratio: int = -1) -> Tensor:
    """``torchvision.ops.ps_roi_align``: position-sensitive RoIAlign (R-FCN) of ``input[N,
    C_out * h * w, H, W]`` -> ``Tensor[K, C_out, h, w]``."""
    return F.ps_roi_align(input, _boxes(input, boxes), output_size, spatial_scale, sampling_ratio)


def ps_roi_pool(input: Tensor, boxes: Boxes, output_size: OutputSize, spatial_scale: float = 1.0) -> Tensor:
    """``torchvision.ops.ps_roi_pool``: position-sensitive RoIPool (R-FCN) -> ``Tensor[K, C_out, h, w]``."""
    return F.ps_roi_pool(input, _boxes(input, boxes), output_size, spatial_scale)


class PSRoIAlign(nn.Module):
    """``torchvision.ops.PSRoIAlign(output_size, spatial_scale, sampling_ratio)``."""

    def __init__(self, output_size: OutputSize, spatial_scale: float, sampling_ratio: int) -> None:
        super().__init__()
        v.output_size(output_size)
        v.spatial_scale(spatial_scale)
        v.sampling_ratio(sampling_ratio)
        self.output_size = output_size
        self.spatial_scale = spatial_scale
        self.sampling_ratio = sampling_ratio

    def forward(self, input: Tensor, rois: Boxes) -> Tensor:
        return ps_roi_align(input, rois, self.output_size, self.spatial_scale, self.sampling_ratio)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(output_size={self.output_size}, spatial_scale={self.spatial_scale}, "
                f"sampling_ratio={self.sampling_ratio})")


class PSRoIPool(RoIPool):
    """``torchvision.ops.PSRoIPool(output_size, spatial_scale)``."""

    def forward(self, input: Tensor, rois: Boxes) -> Tensor:
        return ps_roi_pool(input, rois, self.output_size, self.spatial_scale)


class LevelMapper:
    """FPN level of each box (Feature Pyramid Networks, eq. 1)::

        level = floor(canonical_level + log2(sqrt(area) / canonical_scale) + eps)

    clamped to ``[k_min, k_max]`` and returned as an int64 offset from ``k_min``. The
    arithmetic is torchvision's, in the boxes' dtype, so boxes on a level boundary land on
    the same level. A box of negative area has no level (it matches none and pools to 0).
    """

    def __init__(self, k_min: int, k_max: int, canonical_scale: int = 224, canonical_level: int = 4,
                 eps: float = 1e-6) -> None:
        self.k_min = k_min
        self.k_max = k_max
        self.s0 = canonical_scale
        self.lvl0 = canonical_level
        self.eps = eps

    def __call__(self, boxlists: Sequence[Tensor]) -> Tensor:
        boxes = torch.cat(list(boxlists))
        rois = torch.cat([boxes.new_zeros((boxes.shape[0], 1)), boxes], dim=1)
        return F.fpn_levels(rois, self.k_min, self.k_max, self.s0, self.lvl0, "torchvision", self.eps)


def _power_of_two_scale(feature_size: int, image_size: int) -> float:
    """The stride of a feature map as a power of two: ``2 ** round(log2(feature / image))``,
    with the logarithm in float32 and ties rounded to even, as torchvision."""
    exponent = torch.tensor(float(feature_size) / float(image_size), dtype=torch.float32).log2().round()
    return 2.0 ** float(exponent)


class MultiScaleRoIAlign(nn.Module):
    """``torchvision.ops.MultiScaleRoIAlign``: RoIAlign on the FPN level that suits each box.

    ``forward(x, boxes, image_shapes)``: ``x`` maps names to feature maps ``[N, C, H_l, W_l]``
    (those named in ``featmap_names`` are used, in ``x``'s order, finest first); ``boxes``
    is one ``Tensor[L_i, 4]`` per image in image pixels; ``image_shapes`` the ``(height,
    width)`` of each image before the backbone. On the first call, each map's scale is
    inferred as the power of two nearest to ``H_l / max(height)`` and the levels
    ``k_min = -log2(first scale)``, ``k_max = -log2(last scale)`` are fixed for the
    module's life (as torchvision does). Each box is pooled from the level chosen by
    :class:`LevelMapper` with ``aligned=False``; the result is ``[K, C, h, w]`` in box order.

    Example::

        >>> pooler = MultiScaleRoIAlign(["0", "1", "2", "3"], output_size=7, sampling_ratio=2)
        >>> pooled = pooler(features, proposals, [(800, 1216), (800, 1088)])  # [K, 256, 7, 7]
    """

    scales: Optional[list[float]]
    map_levels: Optional[LevelMapper]

    def __init__(self, featmap_names: list[str], output_size: Union[int, tuple[int, ...], list[int]],
                 sampling_ratio: int, *, canonical_scale: int = 224, canonical_level: int = 4) -> None:
        super().__init__()
        size = (output_size, output_size) if isinstance(output_size, int) else tuple(output_size)
        v.sampling_ratio(sampling_ratio)
        self.featmap_names = featmap_names
        self.sampling_ratio = sampling_ratio
        self.output_size = v.output_size(size)  # a tuple, as torchvision's
        self.scales = None
        self.map_levels = None
        self.canonical_scale = canonical_scale
        self.canonical_level = canonical_level

    def _infer_levels(self, features: list[Tensor], image_shapes: Sequence[tuple[int, int]]) -> None:
        if not image_shapes:
            raise ValueError("image_shapes must list the size of at least one image")
        max_height = max(int(s[0]) for s in image_shapes)
        # torchvision infers each scale from the heights alone
        self.scales = [_power_of_two_scale(f.shape[-2], max_height) for f in features]
        k_min = -math.log2(self.scales[0])
        k_max = -math.log2(self.scales[-1])
        self.map_levels = LevelMapper(int(k_min), int(k_max), self.canonical_scale, self.canonical_level)

    def forward(self, x: Mapping[str, Tensor], boxes: list[Tensor],
                image_shapes: list[tuple[int, int]]) -> Tensor:
        features = [f for name, f in x.items() if name in self.featmap_names]
        if not features:
            raise ValueError(f"none of featmap_names {self.featmap_names} is in the features ({list(x)})")
        if self.scales is None or self.map_levels is None:
            self._infer_levels(features, image_shapes)
        assert self.scales is not None and self.map_levels is not None
        rois = torch.cat([torch.cat([b.new_full((b.shape[0], 1), i), b], dim=1) for i, b in enumerate(boxes)])
        if len(features) == 1:
            return roi_align(features[0], rois, self.output_size, self.scales[0], self.sampling_ratio)
        # All levels in one op: one launch per pass on CUDA, levels picked on the device.
        maps = v.feature_maps(features)
        rois = v.rois(maps[0], rois, max(self.scales))
        return F.multi_scale.multi_scale_call(maps, rois, self.map_levels(boxes), self.scales, *self.output_size,
                                              self.sampling_ratio, False)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(featmap_names={self.featmap_names}, output_size={self.output_size}, "
                f"sampling_ratio={self.sampling_ratio})")
