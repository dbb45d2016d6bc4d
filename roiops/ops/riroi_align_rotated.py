"""Rotation-invariant RoIAlign (ReDet's RiRoIAlign, mmcv's ``riroi_align_rotated``): its
registered ops, public function and Module. Semantics: docs/semantics.md,
"riroi_align_rotated".

The registered op takes ``rois[K, 6]`` rows ``(batch_index, cx, cy, w, h, theta)`` with
theta the sampling angle in counter-clockwise radians (negated by the public function when
``clockwise``), and ``clockwise``, from which the kernels recover the box's own angle (the
orientation) by negating theta back, exactly."""

from __future__ import annotations

from torch import Tensor

from .. import _validation as v
from .._boxes import ROTATED
from .._spec import Kernels, OpSpec
from .._validation import BoxesType, OutputSize
from ._declare import RoIModule, fx_leaf, register

_KERNELS = Kernels(
    "riroi_align_rotated",
    (("float", "spatial_scale"), ("int", "pooled_height"), ("int", "pooled_width"), ("int", "sampling_ratio"),
     ("int", "num_orientations"), ("bool", "clockwise")),
    ("spatial_scale", "pooled_height", "pooled_width", "batch_size", "channels", "height", "width", "sampling_ratio",
     "num_orientations", "clockwise", "channels_last"),
    title="riroi_align_rotated", channel_groups="num_orientations",
    variants={"forward": (dict(sampling_ratio=2, num_orientations=1, clockwise=False),
                          dict(sampling_ratio=0, num_orientations=1, clockwise=True)),
              "backward": (dict(sampling_ratio=2, num_orientations=1, clockwise=False, channels_last=False),
                           dict(sampling_ratio=-1, num_orientations=1, clockwise=True, channels_last=True))})
_riroi_align_rotated = register(_KERNELS)


@fx_leaf
def riroi_align_rotated(
    input: Tensor,
    boxes: BoxesType,
    output_size: OutputSize,
    spatial_scale: float = 1.0,
    sampling_ratio: int = 0,
    num_orientations: int = 8,
    clockwise: bool = False,
) -> Tensor:
    """Rotation-invariant RoIAlign (ReDet, mmcv's ``riroi_align_rotated``): rotated RoIAlign
    of each box, whose channel fields of ``num_orientations`` orientations are turned by the
    box's angle, so that the result does not depend on the box's orientation.

    Each box is pooled without the half-cell offset (sides of at least one cell); each
    output orientation then blends the two input orientations the box's angle falls
    between. Semantics: docs/semantics.md, "riroi_align_rotated".

    Args:
        input: feature map ``Tensor[N, C, H, W]``, float16/bfloat16/float32/float64, NCHW
            or channels_last; ``C = C' * num_orientations``, channel ``c' * num_orientations
            + o`` holding orientation ``o`` of field ``c'`` (e2cnn's regular fields).
        boxes: ``Tensor[K, 6]`` with rows ``(batch_index, cx, cy, w, h, angle)``, or a list
            of N ``Tensor[L_i, 5]`` with rows ``(cx, cy, w, h, angle)``, in input-image
            pixels, the angle in radians.
        output_size: ``int`` or ``(h, w)``.
        spatial_scale: feature-map cells per input-image pixel (e.g. 1/4).
        sampling_ratio: sample points per bin along each box axis; ``<= 0`` means adaptive,
            ``ceil(bin size)``.
        num_orientations: orientations per channel field, in [1, 65536], dividing ``C``.
        clockwise: the angle turns the box clockwise (MMRotate's ReDet); it turns the
            sampling only, and picks the orientations as the counter-clockwise angle does.

    Returns:
        ``Tensor[K, C, h, w]`` of the input's dtype and memory format.

    Examples:
        >>> x = torch.randn(2, 4 * 8, 50, 84)                    # 4 fields x 8 orientations
        >>> boxes = torch.tensor([[0, 100.0, 80.0, 120.0, 40.0, 0.5]])
        >>> roiops.riroi_align_rotated(x, boxes, 7, 1 / 4, sampling_ratio=2, clockwise=True).shape
        torch.Size([1, 32, 7, 7])
    """
    input = v.feature_map(input)
    h, w = v.output_size(output_size)
    scale = v.spatial_scale(spatial_scale)
    ratio = v.sampling_ratio(sampling_ratio)
    count = v.orientations(num_orientations)
    clockwise = v.flag("clockwise", clockwise)
    rois = v.rotated_rois(input, boxes, scale, False, clockwise)
    v.orientation_fields(input, count)
    return _riroi_align_rotated(input, rois, scale, h, w, ratio, count, clockwise)


class RiRoIAlignRotated(RoIModule):
    """Module form of [`roiops.riroi_align_rotated`][]: ``module(input, boxes)``, with
    rotated boxes (``Tensor[K, 6]`` or a list of ``Tensor[L_i, 5]``, angles in radians), is
    ``riroi_align_rotated(input, boxes, **options)``, returning ``Tensor[K, C, h, w]``. The
    options are checked when the module is built and shown in its repr.

    Args:
        output_size: ``int`` or ``(h, w)``.
        spatial_scale: feature-map cells per input-image pixel (e.g. 1/4).
        sampling_ratio: sample points per bin along each box axis; ``<= 0`` means adaptive.
        num_orientations: orientations per channel field, dividing the input's channels.
        clockwise: the angle turns the box clockwise.

    Examples:
        >>> pool = roiops.RiRoIAlignRotated(7, spatial_scale=1 / 4, sampling_ratio=2, clockwise=True)
        >>> pool(torch.randn(1, 16, 40, 60), torch.tensor([[0, 80.0, 60.0, 50.0, 20.0, 0.5]])).shape
        torch.Size([1, 16, 7, 7])
    """

    function = riroi_align_rotated

    def __init__(self, output_size: OutputSize, spatial_scale: float = 1.0, sampling_ratio: int = 0,
                 num_orientations: int = 8, clockwise: bool = False) -> None:
        super().__init__(output_size=output_size, spatial_scale=spatial_scale, sampling_ratio=sampling_ratio,
                         num_orientations=num_orientations, clockwise=clockwise)


SPEC = OpSpec(riroi_align_rotated, RiRoIAlignRotated, (_KERNELS,), title="rotation-invariant RoIAlign (ReDet)",
              boxes=ROTATED)
