"""Deformable RoI pooling (Deformable ConvNets; mmcv's ``deform_roi_pool``): its registered
ops, public function and Module. Semantics: docs/semantics.md, "deform_roi_pool".

RoIAlign average pooling with the half-cell shift and no minimum box size, each bin moved
by a per-box, per-bin offset scaled by ``gamma`` and the box's size. The registered op
takes the offset as an optional tensor input, differentiable like the map."""

from __future__ import annotations

from torch import Tensor

from .. import _validation as v
from .._spec import Kernels, OpSpec
from .._validation import BoxesType, OutputSize
from ._declare import RoIModule, fx_leaf, register

_ARGS = (("float", "spatial_scale"), ("int", "pooled_height"), ("int", "pooled_width"), ("int", "sampling_ratio"),
         ("float", "gamma"))
_KERNELS = Kernels(
    "deform_roi_pool", _ARGS,
    ("spatial_scale", "pooled_height", "pooled_width", "batch_size", "channels", "height", "width", "sampling_ratio",
     "gamma", "channels_last"),
    title="deform_roi_pool", tensors=(("offset", True),), bin_channels={"offset": 2}, onnx="deformable RoI pooling",
    variants={"forward": (dict(sampling_ratio=2, gamma=0.1), dict(sampling_ratio=0, gamma=0.5)),
              "backward": (dict(sampling_ratio=2, gamma=0.1, channels_last=False),
                           dict(sampling_ratio=0, gamma=0.5, channels_last=True)),
              "offset_backward": (dict(sampling_ratio=2, gamma=0.1), dict(sampling_ratio=0, gamma=-0.5))})
_deform_roi_pool = register(_KERNELS)


@fx_leaf
def deform_roi_pool(
    input: Tensor,
    boxes: BoxesType,
    offset: Tensor | None,
    output_size: OutputSize,
    spatial_scale: float = 1.0,
    sampling_ratio: int = 0,
    gamma: float = 0.1,
) -> Tensor:
    """Deformable RoI pooling: RoIAlign average pooling (box corners shifted by -0.5 cell,
    no minimum size) whose bins are each moved by an offset, in units of the box's size.

    Args:
        input: feature map ``Tensor[N, C, H, W]``, float16/bfloat16/float32/float64, NCHW
            or channels_last.
        boxes: ``Tensor[K, 5]`` with rows ``(batch_index, x1, y1, x2, y2)``, or a list of N
            ``Tensor[L_i, 4]`` (image i's boxes), in input-image pixels.
        offset: ``Tensor[K, 2, h, w]`` or None (no offset: ``roi_align(aligned=True)``).
            Bin ``(i, j)`` of box k starts ``gamma * box_width * offset[k, 0, i, j]``
            cells to the right and ``gamma * box_height * offset[k, 1, i, j]`` down. It
            receives a gradient; any floating dtype.
        output_size: ``int`` or ``(h, w)``.
        spatial_scale: feature-map cells per input-image pixel (e.g. 1/16).
        sampling_ratio: sample points per bin along each axis; ``<= 0`` means adaptive,
            ``ceil(bin size)``.
        gamma: scale of the offset.

    Returns:
        ``Tensor[K, C, h, w]`` of the input's dtype and memory format.

    Example::

        >>> x = torch.randn(2, 256, 50, 84)
        >>> boxes = torch.tensor([[0, 10.0, 20.0, 200.0, 150.0]])
        >>> offset = 0.1 * torch.randn(1, 2, 7, 7)
        >>> roiops.deform_roi_pool(x, boxes, offset, 7, spatial_scale=1 / 4).shape
        torch.Size([1, 256, 7, 7])
    """
    input = v.feature_map(input)
    h, w = v.output_size(output_size)
    scale = v.spatial_scale(spatial_scale)
    ratio = v.sampling_ratio(sampling_ratio)
    g = v.finite("gamma", gamma)
    rois = v.rois(input, boxes, scale).detach()
    offset = v.per_bin("offset", offset, input, rois, h, w, 2)
    return _deform_roi_pool(input, rois, offset, scale, h, w, ratio, g)


class DeformRoIPool(RoIModule):
    """See :func:`roiops.deform_roi_pool`; ``forward(input, boxes, offset=None)``.

    Example::

        >>> pool = roiops.DeformRoIPool(7, spatial_scale=1 / 16)
        >>> pool(features, boxes, offset).shape  # [K, C, 7, 7]
    """

    function = deform_roi_pool

    def __init__(self, output_size: OutputSize, spatial_scale: float = 1.0, sampling_ratio: int = 0,
                 gamma: float = 0.1) -> None:
        super().__init__(output_size=output_size, spatial_scale=spatial_scale, sampling_ratio=sampling_ratio,
                         gamma=gamma)

    def forward(self, input: Tensor, boxes: BoxesType, offset: Tensor | None = None) -> Tensor:
        return deform_roi_pool(input, boxes, offset, **{n: getattr(self, n) for n in self._options})


SPEC = OpSpec(deform_roi_pool, DeformRoIPool, (_KERNELS,), title="deformable RoI pooling")
