"""RoIAlign (Mask R-CNN), modes "avg" and "max": its registered ops, public function and
Module. Semantics: docs/semantics.md, "roi_align avg" and "roi_align max"."""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from .. import _validation as v
from .._spec import Kernels, OpSpec
from .._validation import BoxesType, OutputSize
from ._declare import ALIGN_ARGS, ALIGN_BACKWARD, RoIModule, fx_leaf, register

_AVG = Kernels("roi_align", ALIGN_ARGS, ALIGN_BACKWARD, title="roi_align", rois_grad=True, variants={
    "forward": (dict(sampling_ratio=2, aligned=True),),
    "backward": (dict(sampling_ratio=2, aligned=True, channels_last=False),),
    "rois_backward": (dict(sampling_ratio=2, aligned=False), dict(sampling_ratio=0, aligned=True))})
_MAX = Kernels("roi_align_max", ALIGN_ARGS, ALIGN_BACKWARD, saved=("argmax",), title="roi_align(mode='max')",
               rois_grad=True, variants={
                   "forward": (dict(sampling_ratio=-1, aligned=False),),
                   "backward": (dict(sampling_ratio=2, aligned=True, channels_last=True),),
                   "rois_backward": (dict(sampling_ratio=2, aligned=True),)})
_roi_align = register(_AVG)
_roi_align_max = register(_MAX)


def _box_grad(box_grad: bool, sampling_ratio: int) -> bool:
    if box_grad and sampling_ratio <= 0:
        raise ValueError(f"box_grad=True needs a fixed sampling_ratio > 0 (an adaptive grid changes size with the "
                         f"box), got sampling_ratio={sampling_ratio}")
    return box_grad


@fx_leaf
def roi_align(
    input: Tensor,
    boxes: BoxesType,
    output_size: OutputSize,
    spatial_scale: float = 1.0,
    sampling_ratio: int = -1,
    aligned: bool = False,
    mode: Literal["avg", "max"] = "avg",
    box_grad: bool = False,
) -> Tensor:
    """RoIAlign (Mask R-CNN): bilinear samples averaged (or maxed) over each output bin.

    Args:
        input: feature map ``Tensor[N, C, H, W]``, float16/bfloat16/float32/float64, NCHW
            or channels_last.
        boxes: ``Tensor[K, 5]`` with rows ``(batch_index, x1, y1, x2, y2)``, or a list of N
            ``Tensor[L_i, 4]`` (image i's boxes), in input-image pixels.
        output_size: ``int`` or ``(h, w)``.
        spatial_scale: feature-map cells per input-image pixel (e.g. 1/16).
        sampling_ratio: sample points per bin along each axis; ``<= 0`` means adaptive,
            ``ceil(bin size)``.
        aligned: shift box corners by -0.5 cell (detectron2 ``aligned=True``); with
            ``False`` (torchvision's default) boxes are also widened to at least 1 cell.
        mode: ``"avg"`` (Mask R-CNN) or ``"max"`` (largest sample, as mmcv's
            ``pool_mode="max"``).
        box_grad: also differentiate with respect to the box coordinates: the gradient
            reaches ``boxes`` (a tensor or the list's tensors; the batch-index column gets
            0). Needs a fixed ``sampling_ratio > 0``. With ``False`` (the default, as
            torchvision) the boxes get no gradient. The gradient jumps where a sample
            crosses a cell edge or the map border, where the 1-cell minimum size
            (``aligned=False``) starts or stops holding, and, in mode ``"max"``, where
            another sample becomes the largest (docs/semantics.md).

    Returns:
        ``Tensor[K, C, h, w]`` of the input's dtype and memory format.

    Example::

        >>> x = torch.randn(2, 256, 50, 84)
        >>> boxes = torch.tensor([[0, 10.0, 20.0, 200.0, 150.0]])
        >>> roiops.roi_align(x, boxes, 7, spatial_scale=1 / 4, sampling_ratio=2, aligned=True).shape
        torch.Size([1, 256, 7, 7])
    """
    input = v.feature_map(input)
    h, w = v.output_size(output_size)
    scale = v.spatial_scale(spatial_scale)
    ratio = v.sampling_ratio(sampling_ratio)
    aligned = v.flag("aligned", aligned)
    mode = v.choice("mode", mode, ("avg", "max"))  # type: ignore[assignment]
    box_grad = _box_grad(v.flag("box_grad", box_grad), ratio)
    rois = v.rois(input, boxes, scale, (h, w, ratio, aligned) if mode == "max" else None)
    if not box_grad:
        rois = rois.detach()
    if mode == "avg":
        return _roi_align(input, rois, scale, h, w, ratio, aligned)
    return _roi_align_max(input, rois, scale, h, w, ratio, aligned)[0]


class RoIAlign(RoIModule):
    """See :func:`roiops.roi_align`.

    Example::

        >>> pool = roiops.RoIAlign(7, spatial_scale=1 / 16, sampling_ratio=2, aligned=True)
        >>> pool(features, boxes).shape  # [K, C, 7, 7]
    """

    function = roi_align

    def __init__(self, output_size: OutputSize, spatial_scale: float, sampling_ratio: int = -1,
                 aligned: bool = False, mode: Literal["avg", "max"] = "avg", box_grad: bool = False) -> None:
        _box_grad(v.flag("box_grad", box_grad), v.sampling_ratio(sampling_ratio))
        super().__init__(output_size=output_size, spatial_scale=spatial_scale, sampling_ratio=sampling_ratio,
                         aligned=aligned, mode=mode, box_grad=box_grad)


SPEC = OpSpec(roi_align, RoIAlign, (_AVG, _MAX), title="RoIAlign (average and max)",
              box_grad=dict(sampling_ratio=2, box_grad=True))
