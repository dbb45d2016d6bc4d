"""Bezier alignment (ABCNet's BezierAlign, AdelaiDet's and mmcv's ``bezier_align``): its
registered ops, public function and Module. Semantics: docs/semantics.md, "bezier_align".

Each box is a text region bounded by two cubic Bezier curves, rows ``(batch_index, top
curve P0..P3 left to right, bottom curve right to left)``; bin (i, j) of the output is
centred between the curves' points at ``u = j / pw``, a fraction ``v = i / ph`` of the way
from the top one to the bottom one, and averages an axis-aligned grid of bilinear
samples. The input gets a gradient, the control points none (as in mmcv)."""

from __future__ import annotations

from torch import Tensor

from .. import _validation as v
from .._boxes import BEZIER
from .._spec import Kernels, OpSpec
from .._validation import BoxesType, OutputSize
from ._declare import RoIModule, fx_leaf, register

_KERNELS = Kernels(
    "bezier_align",
    (("float", "spatial_scale"), ("int", "pooled_height"), ("int", "pooled_width"), ("int", "sampling_ratio"),
     ("bool", "aligned")),
    ("spatial_scale", "pooled_height", "pooled_width", "batch_size", "channels", "height", "width", "sampling_ratio",
     "aligned", "channels_last"),
    title="bezier_align",
    variants={"forward": (dict(sampling_ratio=1, aligned=True), dict(sampling_ratio=0, aligned=False)),
              "backward": (dict(sampling_ratio=1, aligned=True, channels_last=False),
                           dict(sampling_ratio=0, aligned=False, channels_last=True))})
_bezier_align = register(_KERNELS)


@fx_leaf
def bezier_align(
    input: Tensor,
    beziers: BoxesType,
    output_size: OutputSize,
    spatial_scale: float = 1.0,
    sampling_ratio: int = 0,
    aligned: bool = True,
) -> Tensor:
    """Bezier alignment (ABCNet; mmcv's ``bezier_align``, AdelaiDet's ``BezierAlign``):
    pools the text region between two cubic Bezier curves into ``h x w`` bins, row i a
    fraction ``i / h`` of the way from the top curve to the bottom one, column j at the
    curves' parameter ``j / w``.

    Each bin is the mean of an axis-aligned grid of bilinear samples around its centre.
    Bins are sized from the curves' end-point spans, so a horizontal line has bins of
    height 0, as in mmcv. Semantics: docs/semantics.md, "bezier_align".

    Args:
        input: feature map ``Tensor[N, C, H, W]``, float16/bfloat16/float32/float64, NCHW
            or channels_last.
        beziers: ``Tensor[K, 17]`` with rows ``(batch_index, x0, y0, ..., x7, y7)``: the top
            curve's four control points left to right, then the bottom curve's right to
            left (the region's outline, clockwise), or a list of N ``Tensor[L_i, 16]``
            (image i's rows without the index), in input-image pixels.
        output_size: ``int`` or ``(h, w)``, e.g. ``(8, 32)``.
        spatial_scale: feature-map cells per input-image pixel (e.g. 1/4).
        sampling_ratio: sample points per bin along each axis; ``<= 0`` means adaptive,
            ``ceil(bin size)``.
        aligned: shift the bin centres by -0.5 cell (pixel model of RoIAlign's
            ``aligned=True``); when False, bins are at least 1 cell high and wide.

    Returns:
        ``Tensor[K, C, h, w]`` of the input's dtype and memory format. The input receives
        a gradient; the control points do not.

    Examples:
        >>> x = torch.randn(1, 16, 50, 84)
        >>> beziers = torch.tensor([[0, 10.0, 20, 40, 18, 80, 18, 110, 20,
        ...                          110, 40, 80, 42, 40, 42, 10, 40]])
        >>> roiops.bezier_align(x, beziers, (8, 32), spatial_scale=1 / 4, sampling_ratio=1).shape
        torch.Size([1, 16, 8, 32])
    """
    input = v.feature_map(input)
    h, w = v.output_size(output_size)
    scale = v.spatial_scale(spatial_scale)
    ratio = v.sampling_ratio(sampling_ratio)
    aligned = v.flag("aligned", aligned)
    rois = v.bezier_rois(input, beziers, scale).detach()
    return _bezier_align(input, rois, scale, h, w, ratio, aligned)


class BezierAlign(RoIModule):
    """Module form of [`roiops.bezier_align`][]: ``module(input, beziers)`` is
    ``bezier_align(input, beziers, **options)``, returning ``Tensor[K, C, h, w]``. The
    options are checked when the module is built and shown in its repr. mmcv's signature
    (no defaults for ``spatial_scale`` and ``sampling_ratio``) is
    ``roiops.compat.mmcv.BezierAlign``.

    Args:
        output_size: ``int`` or ``(h, w)``, e.g. ``(8, 32)``.
        spatial_scale: feature-map cells per input-image pixel (e.g. 1/4).
        sampling_ratio: sample points per bin along each axis; ``<= 0`` means adaptive.
        aligned: shift the bin centres by -0.5 cell.

    Examples:
        >>> pool = roiops.BezierAlign((8, 32), spatial_scale=1 / 4, sampling_ratio=1)
        >>> beziers = torch.tensor([[0, 10.0, 20, 40, 18, 80, 18, 110, 20,
        ...                          110, 40, 80, 42, 40, 42, 10, 40]])
        >>> pool(torch.randn(1, 8, 50, 84), beziers).shape
        torch.Size([1, 8, 8, 32])
    """

    function = bezier_align

    def __init__(self, output_size: OutputSize, spatial_scale: float = 1.0, sampling_ratio: int = 0,
                 aligned: bool = True) -> None:
        super().__init__(output_size=output_size, spatial_scale=spatial_scale, sampling_ratio=sampling_ratio,
                         aligned=aligned)


SPEC = OpSpec(bezier_align, BezierAlign, (_KERNELS,), title="Bezier alignment (ABCNet)", boxes=BEZIER)
