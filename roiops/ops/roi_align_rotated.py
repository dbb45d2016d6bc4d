"""Rotated RoIAlign (oriented boxes, as in rotated Faster R-CNN): its registered ops, public
function and Module. Semantics: docs/semantics.md, "roi_align_rotated".

The registered op takes ``rois[K, 6]`` rows ``(batch_index, cx, cy, w, h, theta)`` with
theta in counter-clockwise radians, in the kernels' coordinate type; the public function
converts degrees and clockwise angles to that."""

from __future__ import annotations

from typing import Literal

from torch import Tensor

from .. import _validation as v
from .._boxes import ROTATED
from .._spec import Kernels, OpSpec
from .._validation import BoxesType, OutputSize
from ._declare import ALIGN_ARGS, ALIGN_BACKWARD, RoIModule, fx_leaf, register

_KERNELS = Kernels("roi_align_rotated", ALIGN_ARGS, ALIGN_BACKWARD, title="roi_align_rotated",
                   variants={"forward": (dict(sampling_ratio=2, aligned=True), dict(sampling_ratio=0, aligned=False)),
                             "backward": (dict(sampling_ratio=2, aligned=True, channels_last=False),
                                          dict(sampling_ratio=-1, aligned=False, channels_last=True))})
_roi_align_rotated = register(_KERNELS)


@fx_leaf
def roi_align_rotated(
    input: Tensor,
    boxes: BoxesType,
    output_size: OutputSize,
    spatial_scale: float = 1.0,
    sampling_ratio: int = -1,
    aligned: bool = True,
    clockwise: bool = False,
    angle: Literal["degrees", "radians"] = "degrees",
) -> Tensor:
    """RoIAlign on rotated boxes (rotated Faster R-CNN, oriented detection): the bins of an
    oriented box, each the mean of its bilinear samples taken on the box's rotated grid.

    As detectron2's ``ROIAlignRotated`` (degrees) and mmcv's ``roi_align_rotated``
    (radians, ``clockwise``) compute it. Semantics: docs/semantics.md,
    "roi_align_rotated".

    Args:
        input: feature map ``Tensor[N, C, H, W]``, float16/bfloat16/float32/float64, NCHW
            or channels_last.
        boxes: ``Tensor[K, 6]`` with rows ``(batch_index, cx, cy, w, h, angle)``, or a list
            of N ``Tensor[L_i, 5]`` with rows ``(cx, cy, w, h, angle)``, in input-image
            pixels: centre, width and height before rotation, and the angle that turns the
            box about its centre.
        output_size: ``int`` or ``(h, w)``.
        spatial_scale: feature-map cells per input-image pixel (e.g. 1/16).
        sampling_ratio: sample points per bin along each box axis; ``<= 0`` means adaptive,
            ``ceil(bin size)``.
        aligned: shift the centre by -0.5 cell (detectron2 always does; mmcv's default);
            with ``False`` the box is also widened to at least 1 cell per side.
        clockwise: the angle turns clockwise (mmcv's ``clockwise=True``).
        angle: unit of the angle, ``"degrees"`` (detectron2) or ``"radians"`` (mmcv).

    Returns:
        ``Tensor[K, C, h, w]`` of the input's dtype and memory format; row 0 of the output
        lies along the box's top edge before rotation.

    Examples:
        >>> x = torch.randn(2, 16, 50, 84)
        >>> boxes = torch.tensor([[0, 100.0, 80.0, 120.0, 40.0, 30.0]])  # 30 degrees
        >>> roiops.roi_align_rotated(x, boxes, 7, spatial_scale=1 / 4, sampling_ratio=2).shape
        torch.Size([1, 16, 7, 7])
    """
    input = v.feature_map(input)
    h, w = v.output_size(output_size)
    scale = v.spatial_scale(spatial_scale)
    ratio = v.sampling_ratio(sampling_ratio)
    aligned = v.flag("aligned", aligned)
    clockwise = v.flag("clockwise", clockwise)
    unit = v.choice("angle", angle, ("degrees", "radians"))
    rois = v.rotated_rois(input, boxes, scale, unit == "degrees", clockwise)
    return _roi_align_rotated(input, rois, scale, h, w, ratio, aligned)


class RoIAlignRotated(RoIModule):
    """Module form of [`roiops.roi_align_rotated`][]: ``module(input, boxes)``, with rotated
    boxes (``Tensor[K, 6]`` or a list of ``Tensor[L_i, 5]``), is ``roi_align_rotated(input,
    boxes, **options)``, returning ``Tensor[K, C, h, w]``. The options are checked when the
    module is built and shown in its repr.

    Args:
        output_size: ``int`` or ``(h, w)``.
        spatial_scale: feature-map cells per input-image pixel (e.g. 1/16).
        sampling_ratio: sample points per bin along each box axis; ``<= 0`` means adaptive.
        aligned: shift the centre by -0.5 cell.
        clockwise: the angle turns clockwise.
        angle: ``"degrees"`` or ``"radians"``.

    Examples:
        >>> pool = roiops.RoIAlignRotated(7, spatial_scale=1 / 16, sampling_ratio=2)
        >>> pool(torch.randn(1, 8, 40, 60), torch.tensor([[0, 320.0, 240.0, 200.0, 100.0, 45.0]])).shape
        torch.Size([1, 8, 7, 7])
    """

    function = roi_align_rotated

    def __init__(self, output_size: OutputSize, spatial_scale: float, sampling_ratio: int = -1,
                 aligned: bool = True, clockwise: bool = False,
                 angle: Literal["degrees", "radians"] = "degrees") -> None:
        super().__init__(output_size=output_size, spatial_scale=spatial_scale, sampling_ratio=sampling_ratio,
                         aligned=aligned, clockwise=clockwise, angle=angle)


SPEC = OpSpec(roi_align_rotated, RoIAlignRotated, (_KERNELS,), title="rotated RoIAlign", boxes=ROTATED)
