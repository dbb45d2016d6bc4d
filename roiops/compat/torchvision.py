"""Drop-in replacement for the RoI layers of ``torchvision.ops``.

Port with one import:

    from torchvision.ops import MultiScaleRoIAlign, RoIAlign, RoIPool, roi_align, roi_pool
    # becomes
    from roiops.compat.torchvision import MultiScaleRoIAlign, RoIAlign, RoIPool, roi_align, roi_pool

and likewise ``ps_roi_align``, ``ps_roi_pool``, ``PSRoIAlign`` and ``PSRoIPool`` (R-FCN).

Same names, argument order, defaults (``aligned=False``, ``sampling_ratio=-1``, Caffe
RoIPool) and box formats; results are torchvision's bit for bit (docs/semantics.md).
The functions and modules script with ``torch.jit.script`` (torchvision's annotations),
and a scripted model holding them saves and loads (``torch.jit.save``/``torch.jit.load``);
they are torch.fx leaves, as torchvision's. Boxes of the wrong shape raise an
``AssertionError``, as torchvision's (also roiops' ``ValueError``). What differs: invalid
box values (a batch index outside the batch, NaN/inf coordinates) raise ``ValueError``
instead of reading out of bounds; ``aligned=True`` boxes of size <= 0 with adaptive
sampling give 0, and so do ``ps_roi_align`` bins with an empty adaptive grid
(torchvision: NaN); ``ps_roi_pool`` bins on the last row or column average it
(torchvision's forward leaves it out, its backward does not); quantized tensors are
refused (PyTorch deprecates them).
"""

import platform
from typing import Any, Callable, Optional, Union

import torch
from torch import Tensor, nn
from torch.jit.annotations import BroadcastingList2

import roiops as F

from .. import _validation as v
from ..ops._declare import fx_leaf, fx_node
from ..ops.mask_targets import targets
from ..ops.multi_scale import levels_of, multi_scale_call
from ..ops.paste_masks import paste_torchvision
from ._util import box_assertions

__all__ = ["LevelMapper", "MultiScaleRoIAlign", "RoIAlign", "RoIPool", "roi_align", "roi_pool"]
__all__ += ["PSRoIAlign", "PSRoIPool", "ps_roi_align", "ps_roi_pool"]

# The annotations are torchvision's, which TorchScript reads (this module has no
# `from __future__ import annotations` for that reason).
Boxes = Union[Tensor, list[Tensor]]
OutputSize = Union[int, tuple[int, int], list[int]]


@box_assertions
def _eager(public: Callable[..., Tensor], function: Callable[..., Tensor], input: Tensor, boxes: Boxes,
           *args: Any) -> Tensor:
    """An eager call of the roiops ``function`` behind the drop-in ``public``: one torch.fx
    node of ``public`` while fx traces (a leaf, as torchvision's); a list with fewer
    tensors than images padded with empty ones (torchvision gives the last images no
    boxes); boxes of the wrong shape raise :class:`BoxAssertionError`, an AssertionError
    as torchvision's ``check_roi_boxes_shape``."""
    node = fx_node(public, (input, boxes, *args))
    if node is not None:
        return node
    if isinstance(boxes, (list, tuple)) and boxes and isinstance(input, Tensor) and input.dim() == 4:
        missing = input.shape[0] - len(boxes)
        if missing > 0 and isinstance(boxes[0], Tensor):
            boxes = [*boxes, *[boxes[0].new_zeros((0, 4))] * missing]
    return function(input, boxes, *args)


def _refuse_non_float(t: Tensor) -> None:
    if t.is_quantized:
        raise ValueError("roiops does not support quantized tensors, which PyTorch deprecates; dequantize the "
                         "input and boxes first (.dequantize())")
    if not t.is_floating_point():
        raise ValueError("the input and boxes must be floating point")


def _rois(input: Tensor, boxes: Boxes) -> Tensor:
    """Under TorchScript: ``boxes`` as the registered ops' ``[K, 5]`` rows in their
    coordinate type, after torchvision's shape assertions; quantized and integer tensors
    refused. The ops' kernels check the rest: argument ranges, and on CPU batch indices and
    finite coordinates (on CUDA an invalid row gives 0, as in eager calls by default).
    ``boxes`` is refined once, by the branch that uses it: TorchScript's serialized code
    could not be loaded back (torch.jit.load) when one variable held the refined Tensor in
    one branch and the list in the other."""
    _refuse_non_float(input)
    if isinstance(boxes, Tensor):
        _refuse_non_float(boxes)
        torch._assert(boxes.dim() == 2 and boxes.size(1) == 5,
                      "boxes must have shape [K, 5] (rows (batch_index, x1, y1, x2, y2))")
        rois = boxes
    else:
        for b in boxes:
            _refuse_non_float(b)
        rows: list[Tensor] = []
        for i, b in enumerate(boxes):
            torch._assert(b.dim() == 2 and b.size(1) == 4, "boxes[i] must have shape [K, 4] (rows (x1, y1, x2, y2))")
            rows.append(torch.cat([torch.full_like(b[:, :1], i), b], dim=1))
        rois = torch.cat(rows) if len(rows) > 0 else input.new_zeros((0, 5))
    # Detached: the boxes get no gradient, as in eager calls and torchvision.
    return rois.detach().to(torch.float64 if input.dtype == torch.float64 else torch.float32).contiguous()


def roi_align(input: Tensor, boxes: Boxes, output_size: BroadcastingList2[int], spatial_scale: float = 1.0,
              sampling_ratio: int = -1, aligned: bool = False) -> Tensor:
    """``torchvision.ops.roi_align``: RoIAlign (average), [`roiops.roi_align`][] with
    torchvision's signature.

    Args:
        input: feature map ``Tensor[N, C, H, W]``.
        boxes: ``Tensor[K, 5]`` with rows ``(batch_index, x1, y1, x2, y2)``, or a list of
            ``Tensor[L_i, 4]``, one per image (a shorter list gives the last images no
            boxes), in input-image pixels.
        output_size: ``int`` or ``(h, w)``.
        spatial_scale: feature-map cells per input-image pixel (e.g. 1/16).
        sampling_ratio: sample points per bin along each axis; ``<= 0`` means adaptive.
        aligned: shift box corners by -0.5 cell; ``False`` (the default) also widens
            boxes to at least 1 cell.

    Returns:
        ``Tensor[K, C, h, w]``.

    Examples:
        >>> from roiops.compat.torchvision import roi_align
        >>> roi_align(torch.randn(1, 8, 32, 32), [torch.tensor([[0.0, 0.0, 60.0, 40.0]])], 7, 0.5, 2).shape
        torch.Size([1, 8, 7, 7])
    """
    if not torch.jit.is_scripting():
        return _eager(roi_align, F.roi_align, input, boxes, output_size, spatial_scale, sampling_ratio, aligned)
    return torch.ops.roiops.roi_align(input, _rois(input, boxes), spatial_scale, output_size[0], output_size[1],
                                      sampling_ratio, aligned)


def _caffe_roi_pool(input: Tensor, boxes: Boxes, output_size: OutputSize, spatial_scale: float) -> Tensor:
    return F.roi_pool(input, boxes, output_size, spatial_scale, "caffe")


def roi_pool(input: Tensor, boxes: Boxes, output_size: BroadcastingList2[int], spatial_scale: float = 1.0) -> Tensor:
    """``torchvision.ops.roi_pool``: Fast R-CNN RoIPool (Caffe convention),
    [`roiops.roi_pool`][] with torchvision's signature.

    Args:
        input: feature map ``Tensor[N, C, H, W]``.
        boxes: ``Tensor[K, 5]`` with rows ``(batch_index, x1, y1, x2, y2)``, or a list of
            ``Tensor[L_i, 4]``, one per image (a shorter list gives the last images no
            boxes), in input-image pixels.
        output_size: ``int`` or ``(h, w)``.
        spatial_scale: feature-map cells per input-image pixel (e.g. 1/16).

    Returns:
        ``Tensor[K, C, h, w]``.

    Examples:
        >>> from roiops.compat.torchvision import roi_pool
        >>> roi_pool(torch.randn(1, 8, 32, 32), [torch.tensor([[0.0, 0.0, 60.0, 40.0]])], 7, 0.5).shape
        torch.Size([1, 8, 7, 7])
    """
    if not torch.jit.is_scripting():
        return _eager(roi_pool, _caffe_roi_pool, input, boxes, output_size, spatial_scale)
    return torch.ops.roiops.roi_pool(input, _rois(input, boxes), spatial_scale, output_size[0], output_size[1],
                                     False)[0]


class RoIAlign(nn.Module):
    """``torchvision.ops.RoIAlign``: ``module(input, rois)`` is [`roi_align`][roiops.compat.torchvision.roi_align]
    with the module's options. The options are checked when the module is built and kept
    as given (torchvision's repr shows them so).

    Args:
        output_size: ``int`` or ``(h, w)``.
        spatial_scale: feature-map cells per input-image pixel (e.g. 1/16).
        sampling_ratio: sample points per bin along each axis; ``<= 0`` means adaptive.
        aligned: shift box corners by -0.5 cell.

    Examples:
        >>> from roiops.compat.torchvision import RoIAlign
        >>> RoIAlign(7, spatial_scale=0.5, sampling_ratio=2)
        RoIAlign(output_size=7, spatial_scale=0.5, sampling_ratio=2, aligned=False)
    """

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
    """``torchvision.ops.RoIPool``: ``module(input, rois)`` is [`roi_pool`][roiops.compat.torchvision.roi_pool]
    with the module's options, checked when the module is built and kept as given.

    Args:
        output_size: ``int`` or ``(h, w)``.
        spatial_scale: feature-map cells per input-image pixel (e.g. 1/16).

    Examples:
        >>> from roiops.compat.torchvision import RoIPool
        >>> RoIPool((7, 7), 0.5)
        RoIPool(output_size=(7, 7), spatial_scale=0.5)
    """

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


def ps_roi_align(input: Tensor, boxes: Boxes, output_size: BroadcastingList2[int], spatial_scale: float = 1.0,
                 sampling_ratio: int = -1) -> Tensor:
    """``torchvision.ops.ps_roi_align``: position-sensitive RoIAlign (R-FCN),
    [`roiops.ps_roi_align`][] with torchvision's signature.

    Args:
        input: feature map ``Tensor[N, C_out * h * w, H, W]``.
        boxes: ``Tensor[K, 5]`` with rows ``(batch_index, x1, y1, x2, y2)``, or a list of
            ``Tensor[L_i, 4]``, one per image (a shorter list gives the last images no
            boxes), in input-image pixels.
        output_size: ``int`` or ``(h, w)``.
        spatial_scale: feature-map cells per input-image pixel (e.g. 1/16).
        sampling_ratio: sample points per bin along each axis; ``<= 0`` means adaptive.

    Returns:
        ``Tensor[K, C_out, h, w]``.

    Examples:
        >>> from roiops.compat.torchvision import ps_roi_align
        >>> ps_roi_align(torch.randn(1, 4 * 9, 32, 32), [torch.tensor([[0.0, 0.0, 60.0, 40.0]])], 3, 0.5).shape
        torch.Size([1, 4, 3, 3])
    """
    if not torch.jit.is_scripting():
        return _eager(ps_roi_align, F.ps_roi_align, input, boxes, output_size, spatial_scale, sampling_ratio)
    return torch.ops.roiops.ps_roi_align(input, _rois(input, boxes), spatial_scale, output_size[0], output_size[1],
                                         sampling_ratio)


def ps_roi_pool(input: Tensor, boxes: Boxes, output_size: BroadcastingList2[int],
                spatial_scale: float = 1.0) -> Tensor:
    """``torchvision.ops.ps_roi_pool``: position-sensitive RoIPool (R-FCN),
    [`roiops.ps_roi_pool`][] with torchvision's signature.

    Args:
        input: feature map ``Tensor[N, C_out * h * w, H, W]``.
        boxes: ``Tensor[K, 5]`` with rows ``(batch_index, x1, y1, x2, y2)``, or a list of
            ``Tensor[L_i, 4]``, one per image (a shorter list gives the last images no
            boxes), in input-image pixels.
        output_size: ``int`` or ``(h, w)``.
        spatial_scale: feature-map cells per input-image pixel (e.g. 1/16).

    Returns:
        ``Tensor[K, C_out, h, w]``.

    Examples:
        >>> from roiops.compat.torchvision import ps_roi_pool
        >>> ps_roi_pool(torch.randn(1, 4 * 9, 32, 32), [torch.tensor([[0.0, 0.0, 60.0, 40.0]])], 3, 0.5).shape
        torch.Size([1, 4, 3, 3])
    """
    if not torch.jit.is_scripting():
        return _eager(ps_roi_pool, F.ps_roi_pool, input, boxes, output_size, spatial_scale)
    return torch.ops.roiops.ps_roi_pool(input, _rois(input, boxes), spatial_scale, output_size[0], output_size[1])


class PSRoIAlign(nn.Module):
    """``torchvision.ops.PSRoIAlign``: ``module(input, rois)`` is
    [`ps_roi_align`][roiops.compat.torchvision.ps_roi_align] with the module's options,
    checked when the module is built and kept as given.

    Args:
        output_size: ``int`` or ``(h, w)``.
        spatial_scale: feature-map cells per input-image pixel (e.g. 1/16).
        sampling_ratio: sample points per bin along each axis; ``<= 0`` means adaptive.

    Examples:
        >>> from roiops.compat.torchvision import PSRoIAlign
        >>> PSRoIAlign(3, 0.5, 2)(torch.randn(1, 4 * 9, 32, 32), [torch.tensor([[0.0, 0.0, 60.0, 40.0]])]).shape
        torch.Size([1, 4, 3, 3])
    """

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
    """``torchvision.ops.PSRoIPool``: ``module(input, rois)`` is
    [`ps_roi_pool`][roiops.compat.torchvision.ps_roi_pool] with the module's options,
    checked when the module is built and kept as given.

    Args:
        output_size: ``int`` or ``(h, w)``.
        spatial_scale: feature-map cells per input-image pixel (e.g. 1/16).

    Examples:
        >>> from roiops.compat.torchvision import PSRoIPool
        >>> PSRoIPool(3, 0.5)(torch.randn(1, 4 * 9, 32, 32), [torch.tensor([[0.0, 0.0, 60.0, 40.0]])]).shape
        torch.Size([1, 4, 3, 3])
    """

    def forward(self, input: Tensor, rois: Boxes) -> Tensor:
        return ps_roi_pool(input, rois, self.output_size, self.spatial_scale)


class LevelMapper:
    """``torchvision.ops.poolers.LevelMapper``: the FPN level of each box (Feature Pyramid
    Networks, eq. 1):

        level = floor(canonical_level + log2(sqrt(area) / canonical_scale) + eps)

    clamped to ``[k_min, k_max]``. The arithmetic is torchvision's, in the boxes' dtype, so
    boxes on a level boundary land on the same level. ``mapper(boxlists)``, with
    ``boxlists`` a list of ``Tensor[L_i, 4]`` boxes ``(x1, y1, x2, y2)``, returns the int64
    ``Tensor[K]`` of ``level - k_min``; a box of negative area has no level (-1: it matches
    none and pools to 0).

    Args:
        k_min: the finest level.
        k_max: the coarsest level.
        canonical_scale: a box of this size (the square root of its area, in pixels) goes
            to ``canonical_level``.
        canonical_level: the level of a box of ``canonical_scale``.
        eps: added before the floor.

    Examples:
        >>> from roiops.compat.torchvision import LevelMapper
        >>> LevelMapper(2, 5)([torch.tensor([[0.0, 0.0, 32.0, 32.0], [0.0, 0.0, 224.0, 224.0]])])
        tensor([0, 2])
    """

    def __init__(self, k_min: int, k_max: int, canonical_scale: int = 224, canonical_level: int = 4,
                 eps: float = 1e-6) -> None:
        self.k_min = k_min
        self.k_max = k_max
        self.s0 = canonical_scale
        self.lvl0 = canonical_level
        self.eps = eps

    def __call__(self, boxlists: list[Tensor]) -> Tensor:
        boxes = torch.cat(boxlists)
        rois = torch.cat([boxes.new_zeros((boxes.shape[0], 1)), boxes], dim=1)
        return levels_of(rois, self.k_min, self.k_max, float(self.s0), self.lvl0, True, self.eps)


def _power_of_two_scale(feature_size: int, image_size: int) -> float:
    """The stride of a feature map as a power of two: ``2 ** round(log2(feature / image))``,
    with the logarithm in float32 and ties rounded to even, as torchvision."""
    exponent = torch.tensor(float(feature_size) / float(image_size), dtype=torch.float32).log2().round()
    return 2.0 ** float(exponent)


def _scales_and_levels(features: list[Tensor], image_shapes: list[tuple[int, int]], canonical_scale: int,
                       canonical_level: int) -> tuple[list[float], LevelMapper]:
    """Each map's scale, the power of two nearest to ``H_l / max(height)`` (torchvision
    infers it from the heights alone), and the level mapper of those scales."""
    if len(image_shapes) == 0:
        raise ValueError("image_shapes must list the size of at least one image")
    max_height = 0
    for shape in image_shapes:
        max_height = max(max_height, shape[0])
    scales = [_power_of_two_scale(f.shape[-2], max_height) for f in features]
    # Exact: each scale is a power of two.
    k_min = -int(torch.tensor(scales[0], dtype=torch.float64).log2())
    k_max = -int(torch.tensor(scales[-1], dtype=torch.float64).log2())
    return scales, LevelMapper(k_min, k_max, canonical_scale, canonical_level)


def _levels(map_levels: LevelMapper, boxes: list[Tensor], rois: Tensor) -> Tensor:
    """Each box's level offset; none for a batch of no images (whose list of boxes
    LevelMapper, as torchvision's, cannot concatenate)."""
    if len(boxes) == 0:
        return torch.zeros((0,), dtype=torch.int64, device=rois.device)
    return map_levels(boxes)


@box_assertions
def _pool_levels(features: list[Tensor], boxes: list[Tensor], scales: list[float], map_levels: LevelMapper,
                 output_size: tuple[int, int], sampling_ratio: int) -> Tensor:
    """Eager MultiScaleRoIAlign over several levels: all in one op (one launch per pass on
    CUDA, the levels picked on the device)."""
    maps = v.feature_maps(features)
    rois = v.rois(maps[0], boxes, max(scales))
    return multi_scale_call(maps, rois, _levels(map_levels, boxes, rois), scales, *output_size, sampling_ratio,
                            False)


class MultiScaleRoIAlign(nn.Module):
    """``torchvision.ops.MultiScaleRoIAlign``: RoIAlign on the FPN level that suits each box.

    On the first call, each map's scale is inferred as the power of two nearest to ``H_l /
    max(height)`` and the levels ``k_min = -log2(first scale)``, ``k_max = -log2(last
    scale)`` are fixed for the module's life (as torchvision does). Each box is pooled from
    the level chosen by [`LevelMapper`][roiops.compat.torchvision.LevelMapper] with
    ``aligned=False``. Scripts with ``torch.jit.script``, as torchvision's.

    Args:
        featmap_names: the names of the feature maps to pool from, among the keys of the
            dict the module is called with.
        output_size: ``int`` or ``(h, w)``.
        sampling_ratio: sample points per bin along each axis; ``<= 0`` means adaptive.
        canonical_scale: a box of this size (pixels) goes to ``canonical_level``.
        canonical_level: the level of a box of ``canonical_scale``.

    Examples:
        >>> from roiops.compat.torchvision import MultiScaleRoIAlign
        >>> pooler = MultiScaleRoIAlign(["0", "1", "2", "3"], output_size=7, sampling_ratio=2)
        >>> features = {str(i): torch.randn(2, 16, 64 // 2**i, 80 // 2**i) for i in range(4)}
        >>> proposals = [torch.tensor([[10.0, 20.0, 200.0, 150.0]]), torch.tensor([[0.0, 0.0, 32.0, 32.0]])]
        >>> pooler(features, proposals, [(256, 320), (240, 300)]).shape
        torch.Size([2, 16, 7, 7])
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

    def forward(self, x: dict[str, Tensor], boxes: list[Tensor], image_shapes: list[tuple[int, int]]) -> Tensor:
        """Pools each box from its level.

        Args:
            x: feature maps ``[N, C, H_l, W_l]`` by name; those named in ``featmap_names``
                are used, in ``x``'s order, finest first.
            boxes: one ``Tensor[L_i, 4]`` of ``(x1, y1, x2, y2)`` per image, in image pixels.
            image_shapes: the ``(height, width)`` of each image before the backbone.

        Returns:
            ``Tensor[K, C, h, w]`` in box order.
        """
        features: list[Tensor] = []
        for name, f in x.items():
            if name in self.featmap_names:
                features.append(f)
        if len(features) == 0:
            raise ValueError(f"none of featmap_names {self.featmap_names} is in the features ({list(x.keys())})")
        scales, map_levels = self.scales, self.map_levels
        if scales is None or map_levels is None:
            scales, map_levels = _scales_and_levels(features, image_shapes, self.canonical_scale,
                                                    self.canonical_level)
            self.scales, self.map_levels = scales, map_levels
        h, w = self.output_size
        if not torch.jit.is_scripting():
            if len(features) == 1:
                return roi_align(features[0], boxes, self.output_size, scales[0], self.sampling_ratio)
            return _pool_levels(features, boxes, scales, map_levels, self.output_size, self.sampling_ratio)
        rois = _rois(features[0], boxes)
        if len(features) == 1:
            return torch.ops.roiops.roi_align(features[0], rois, scales[0], h, w, self.sampling_ratio, False)
        return torch.ops.roiops.multi_scale_roi_align(features, rois, _levels(map_levels, boxes, rois), scales, h, w,
                                                      self.sampling_ratio, False)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(featmap_names={self.featmap_names}, output_size={self.output_size}, "
                f"sampling_ratio={self.sampling_ratio})")


# ---- Mask R-CNN's mask steps (torchvision.models.detection.roi_heads) --------------------

def _aten_fuses() -> bool:
    """Whether ATen's CPU kernels run with fused multiply-adds: its x86-64 builds compile
    them with FMA contraction for the AVX2 and AVX512 dispatch levels, not for the baseline;
    GCC fuses on AArch64."""
    machine = platform.machine().lower()
    return machine not in ("x86_64", "amd64", "i686", "x86") or torch.backends.cpu.get_cpu_capability() != "DEFAULT"


@fx_leaf
def paste_masks_in_image(masks: Tensor, boxes: Tensor, img_shape: tuple[int, int], padding: int = 1) -> Tensor:
    """Drop-in for torchvision's ``paste_masks_in_image`` (Mask R-CNN inference), with its
    signature and result, bit for bit on the CPU for float32 and float64 masks: each mask
    (channel 0 of ``[K, C, M, M]``) padded by ``padding`` zero cells, resized to its box
    (expanded by ``(M + 2 * padding) / M`` and truncated to whole pixels) and pasted into
    a zero image. One output written once by the C++ kernels, where torchvision allocates,
    resizes and stacks a full image per mask.

    What differs: boxes wholly left of or above the image give a zero mask where
    torchvision raises a shape error; float16 and bfloat16 masks are resized in float32.
    On CUDA tensors the result is the CPU's arithmetic (torchvision's CUDA resize rounds
    differently in the last bit). Unlike the RoI drop-ins, the mask steps do not script
    with ``torch.jit.script``. Semantics: docs/semantics.md, "paste_masks".

    Plug it into torchvision's model by setting ``paste_masks_in_image`` in both
    ``torchvision.models.detection.transform`` (whose postprocess pastes at inference) and
    ``torchvision.models.detection.roi_heads`` (docs/porting.md).

    Args:
        masks: ``Tensor[K, C, M, M]`` (channel 0 is pasted), floating.
        boxes: ``Tensor[K, 4]`` of rows ``(x1, y1, x2, y2)`` in image pixels, floating.
        img_shape: ``(height, width)`` of the image.
        padding: zero cells added on each side of the mask before resizing.

    Returns:
        ``Tensor[K, 1, height, width]`` of the masks' dtype.

    Examples:
        >>> masks = torch.ones(1, 1, 28, 28)
        >>> out = roiops.compat.torchvision.paste_masks_in_image(masks, torch.tensor([[4.0, 4.0, 20.0, 12.0]]), (32, 32))
        >>> out.shape, float(out[0, 0, 8, 12])
        (torch.Size([1, 1, 32, 32]), 1.0)
    """
    if not isinstance(masks, Tensor) or masks.dim() != 4:
        raise ValueError(f"masks must be a Tensor[K, C, M, M], got {getattr(masks, 'shape', type(masks).__name__)}")
    height, width = v.image_size(img_shape)
    pad = _nonnegative("padding", padding)
    stack = v.paste_masks_stack(masks[:, 0])
    v.paste_boxes(boxes, stack)  # the checks; the expansion keeps the boxes' own dtype
    rows = _expanded(boxes, float(masks.shape[-1] + 2 * pad) / masks.shape[-1]).contiguous()
    dtype = stack.dtype
    if dtype in (torch.float16, torch.bfloat16):
        stack = stack.float()
    out = paste_torchvision(stack.detach(), rows, height, width, pad, _aten_fuses())
    return out.to(dtype)[:, None]


def _nonnegative(name: str, value: object) -> int:
    n = v._as_int(value)
    if n is None or not 0 <= n <= 2**24:
        raise ValueError(f"{name} must be an int in [0, 2^24], got {value!r}")
    return n


def _times(x: Tensor, scale: float) -> Tensor:
    """``x * scale``, float64 tensors times a float64 tensor: an exported graph stores a
    Python float as a float32 constant."""
    if x.dtype == torch.float64:
        return x * torch.tensor(scale, dtype=torch.float64, device=x.device)
    return x * scale


def _expanded(boxes: Tensor, scale: float) -> Tensor:
    """torchvision's ``expand_boxes`` then its truncation to int64: each box scaled about its
    centre, in the boxes' dtype and torchvision's order of operations."""
    half_w = _times((boxes[:, 2] - boxes[:, 0]) * 0.5, scale)
    half_h = _times((boxes[:, 3] - boxes[:, 1]) * 0.5, scale)
    cx = (boxes[:, 2] + boxes[:, 0]) * 0.5
    cy = (boxes[:, 3] + boxes[:, 1]) * 0.5
    return torch.stack([cx - half_w, cy - half_h, cx + half_w, cy + half_h], dim=1).to(torch.int64)


@fx_leaf
def project_masks_on_boxes(gt_masks: Tensor, boxes: Tensor, matched_idxs: Tensor, M: int) -> Tensor:
    """Drop-in for torchvision's ``project_masks_on_boxes`` (Mask R-CNN's mask targets), with
    its signature and result bit for bit: RoIAlign (``aligned=False``, adaptive sampling)
    of mask ``matched_idxs[p]`` over box p onto ``M x M``. The masks are read as they are
    stored (bool, uint8 or float32), where torchvision converts all of them to float first.

    Plug it into torchvision's model with
    ``torchvision.models.detection.roi_heads.project_masks_on_boxes = project_masks_on_boxes``
    (docs/porting.md).

    Args:
        gt_masks: ``Tensor[G, H, W]`` of one image's ground-truth masks.
        boxes: ``Tensor[P, 4]`` of the image's positive proposals ``(x1, y1, x2, y2)``.
        matched_idxs: ``Tensor[P]``: the ground-truth mask of each proposal.
        M: the targets' side.

    Returns:
        ``Tensor[P, M, M]`` of the boxes' dtype.

    Examples:
        >>> gt = torch.zeros(1, 16, 16, dtype=torch.uint8)
        >>> gt[0, 2:14, 2:14] = 1
        >>> t = roiops.compat.torchvision.project_masks_on_boxes(gt, torch.tensor([[4.0, 4.0, 12.0, 12.0]]),
        ...                                                      torch.tensor([0]), 2)
        >>> t.tolist()
        [[[1.0, 1.0], [1.0, 1.0]]]
    """
    masks = v.target_masks(gt_masks)
    if not isinstance(boxes, Tensor) or not boxes.is_floating_point():
        raise ValueError("boxes must be a floating-point Tensor[P, 4]")
    # torchvision converts the masks to the boxes' dtype; bool, uint8 and float32 masks
    # read as float32 give the same values.
    if boxes.dtype != torch.float32 or masks.dtype not in (torch.bool, torch.uint8, torch.float32):
        masks = masks.to(boxes.dtype)
    rois = v.target_rois(masks, boxes, matched_idxs)
    return targets(masks.detach(), rois.detach(), v.output_size(M), -1, False, None)


__all__ += ["paste_masks_in_image", "project_masks_on_boxes"]
