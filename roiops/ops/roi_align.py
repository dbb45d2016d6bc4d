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

    Each bin of a box averages (mode ``"avg"``) or takes the largest of (mode ``"max"``)
    the bilinearly interpolated map at a ``sampling_ratio`` x ``sampling_ratio`` grid of
    points. Differentiable with respect to ``input``; with ``box_grad=True`` also with
    respect to the box coordinates. Semantics: docs/semantics.md, "roi_align".

    Args:
        input: feature map ``Tensor[N, C, H, W]``, float16/bfloat16/float32/float64, NCHW
            or channels_last.
        boxes: ``Tensor[K, 5]`` with rows ``(batch_index, x1, y1, x2, y2)``, or a list of N
            ``Tensor[L_i, 4]`` (image i's boxes), in input-image pixels.
        output_size: ``int`` or ``(h, w)``.
        spatial_scale: feature-map cells per input-image pixel (e.g. 1/16).
        sampling_ratio: sample points per bin along each axis; ``<= 0`` means adaptive,
            ``ceil(bin size)`` per axis.
        aligned: shift box corners by -0.5 cell (detectron2's ``aligned=True``); with
            ``False`` (the original RoIAlign, torchvision's default) boxes are also
            widened to at least 1 cell.
        mode: ``"avg"`` (Mask R-CNN) or ``"max"`` (the largest sample, as mmcv's
            ``pool_mode="max"``).
        box_grad: also differentiate with respect to the box coordinates (both modes): the
            gradient reaches ``boxes`` (the ``[K, 5]`` tensor, with 0 in the batch-index
            column, or the list's ``[L, 4]`` tensors). Needs a fixed ``sampling_ratio >
            0``. With ``False`` (the default, as torchvision) the boxes get no gradient.
            The gradient jumps where a sample crosses a cell edge or the map border, where
            the 1-cell minimum size (``aligned=False``) starts or stops holding, and, in
            mode ``"max"``, where another sample becomes the largest (docs/semantics.md,
            "roi_align box gradient").

    Returns:
        ``Tensor[K, C, h, w]`` of the input's dtype and memory format.

    Raises:
        ValueError: ``box_grad=True`` with an adaptive ``sampling_ratio`` (``<= 0``), or an
            argument out of its range.

    Examples:
        Boxes as ``[K, 5]`` rows or as a list of per-image ``[L_i, 4]`` boxes:

        >>> x = torch.randn(2, 16, 50, 84)
        >>> boxes = torch.tensor([[0, 10.0, 20.0, 200.0, 150.0], [1, 0.0, 0.0, 64.0, 64.0]])
        >>> roiops.roi_align(x, boxes, 7, spatial_scale=1 / 4, sampling_ratio=2, aligned=True).shape
        torch.Size([2, 16, 7, 7])
        >>> roiops.roi_align(x, [boxes[:1, 1:], boxes[1:, 1:]], (7, 5), 1 / 4, mode="max").shape
        torch.Size([2, 16, 7, 5])

        Fitting a box by gradient descent: move it until its crop matches a target crop.
        The map must vary smoothly enough for the crop's error to guide the box; here a
        few Gaussian bumps:

        >>> yy, xx = torch.meshgrid(torch.arange(32.0), torch.arange(40.0), indexing="ij")
        >>> bumps = sum(torch.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / (2 * r * r))
        ...             for cy, cx, r in [(8, 10, 4), (20, 28, 6), (25, 9, 5)])
        >>> features = torch.stack([bumps, bumps.square(), yy / 32])[None]  # [1, 3, 32, 40]
        >>> goal = torch.tensor([[6.0, 4.0, 22.0, 16.0]])                    # (x1, y1, x2, y2)
        >>> target = roiops.roi_align(features, [goal], 7, 1.0, 2, aligned=True)
        >>> box = torch.tensor([[9.0, 7.0, 25.0, 20.0]], requires_grad=True)
        >>> optimizer = torch.optim.Adam([box], lr=0.2)
        >>> for _ in range(100):
        ...     optimizer.zero_grad()
        ...     crop = roiops.roi_align(features, [box], 7, 1.0, 2, aligned=True, box_grad=True)
        ...     (crop - target).square().mean().backward()
        ...     optimizer.step()
        >>> bool((box - goal).abs().max() < 0.1)
        True
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
    """Module form of [`roiops.roi_align`][]: ``module(input, boxes)`` is
    ``roi_align(input, boxes, **options)``, returning ``Tensor[K, C, h, w]``. The options
    are checked when the module is built and shown in its repr.

    Args:
        output_size: ``int`` or ``(h, w)``.
        spatial_scale: feature-map cells per input-image pixel (e.g. 1/16).
        sampling_ratio: sample points per bin along each axis; ``<= 0`` means adaptive.
        aligned: shift box corners by -0.5 cell (detectron2's ``aligned=True``).
        mode: ``"avg"`` or ``"max"``.
        box_grad: also differentiate with respect to the box coordinates (needs
            ``sampling_ratio > 0``).

    Examples:
        >>> pool = roiops.RoIAlign(7, spatial_scale=1 / 16, sampling_ratio=2, aligned=True)
        >>> pool
        RoIAlign(output_size=(7, 7), spatial_scale=0.0625, sampling_ratio=2, aligned=True, mode='avg', box_grad=False)
        >>> pool(torch.randn(1, 8, 40, 60), torch.tensor([[0, 16.0, 32.0, 320.0, 240.0]])).shape
        torch.Size([1, 8, 7, 7])
    """

    function = roi_align

    def __init__(self, output_size: OutputSize, spatial_scale: float, sampling_ratio: int = -1,
                 aligned: bool = False, mode: Literal["avg", "max"] = "avg", box_grad: bool = False) -> None:
        _box_grad(v.flag("box_grad", box_grad), v.sampling_ratio(sampling_ratio))
        super().__init__(output_size=output_size, spatial_scale=spatial_scale, sampling_ratio=sampling_ratio,
                         aligned=aligned, mode=mode, box_grad=box_grad)


SPEC = OpSpec(roi_align, RoIAlign, (_AVG, _MAX), title="RoIAlign (average and max)",
              box_grad=dict(sampling_ratio=2, box_grad=True))
