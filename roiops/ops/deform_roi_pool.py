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
    title="deform_roi_pool", tensors=(("offset", True),), bin_channels={"offset": 2},
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
    """Deformable RoI pooling (mmcv's ``deform_roi_pool``, mmdetection's deformable RoI
    heads): RoIAlign average pooling (box corners shifted by -0.5 cell, no minimum size)
    whose bins are each moved by an offset, in units of the box's size.

    With ``offset=None`` it is ``roi_align(..., aligned=True)``, bit for bit. The offset
    receives a gradient, the derivative of the output. Semantics: docs/semantics.md,
    "deform_roi_pool".

    Args:
        input: feature map ``Tensor[N, C, H, W]``, float16/bfloat16/float32/float64, NCHW
            or channels_last.
        boxes: ``Tensor[K, 5]`` with rows ``(batch_index, x1, y1, x2, y2)``, or a list of N
            ``Tensor[L_i, 4]`` (image i's boxes), in input-image pixels.
        offset: ``Tensor[K, 2, h, w]`` (any floating dtype) or None (no offset). Bin ``(i,
            j)`` of box k is moved right by ``gamma * box_width * offset[k, 0, i, j]`` and
            down by ``gamma * box_height * offset[k, 1, i, j]``.
        output_size: ``int`` or ``(h, w)``.
        spatial_scale: feature-map cells per input-image pixel (e.g. 1/16).
        sampling_ratio: sample points per bin along each axis; ``<= 0`` means adaptive,
            ``ceil(bin size)``.
        gamma: scale of the offset.

    Returns:
        ``Tensor[K, C, h, w]`` of the input's dtype and memory format.

    Examples:
        A head predicts the offset from the boxes pooled without one, then pools again:

        >>> x = torch.randn(2, 16, 50, 84)
        >>> boxes = torch.tensor([[0, 10.0, 20.0, 200.0, 150.0]])
        >>> head = torch.nn.Linear(16 * 7 * 7, 2 * 7 * 7)
        >>> offset = head(roiops.deform_roi_pool(x, boxes, None, 7, 1 / 4).flatten(1)).view(-1, 2, 7, 7)
        >>> roiops.deform_roi_pool(x, boxes, offset, 7, spatial_scale=1 / 4).shape
        torch.Size([1, 16, 7, 7])
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
    """Module form of [`roiops.deform_roi_pool`][]: ``module(input, boxes, offset=None)`` is
    ``deform_roi_pool(input, boxes, offset, **options)``. The options are checked when the
    module is built and shown in its repr. The layers that predict the offset themselves
    are mmcv's ``DeformRoIPoolPack`` and ``ModulatedDeformRoIPoolPack``, in
    ``roiops.compat.mmcv``.

    Args:
        output_size: ``int`` or ``(h, w)``.
        spatial_scale: feature-map cells per input-image pixel (e.g. 1/16).
        sampling_ratio: sample points per bin along each axis; ``<= 0`` means adaptive.
        gamma: scale of the offset.

    Examples:
        >>> pool = roiops.DeformRoIPool(7, spatial_scale=1 / 16)
        >>> boxes = torch.tensor([[0, 16.0, 32.0, 320.0, 240.0]])
        >>> pool(torch.randn(1, 8, 40, 60), boxes, 0.1 * torch.randn(1, 2, 7, 7)).shape
        torch.Size([1, 8, 7, 7])
    """

    function = deform_roi_pool

    def __init__(self, output_size: OutputSize, spatial_scale: float = 1.0, sampling_ratio: int = 0,
                 gamma: float = 0.1) -> None:
        super().__init__(output_size=output_size, spatial_scale=spatial_scale, sampling_ratio=sampling_ratio,
                         gamma=gamma)

    def forward(self, input: Tensor, boxes: BoxesType, offset: Tensor | None = None) -> Tensor:
        """Pools ``boxes`` of ``input``, each bin moved by ``offset``.

        Args:
            input: feature map ``Tensor[N, C, H, W]``.
            boxes: ``Tensor[K, 5]`` or a list of N ``Tensor[L_i, 4]``.
            offset: ``Tensor[K, 2, h, w]``, or None for no offset.

        Returns:
            ``Tensor[K, C, h, w]``.
        """
        return deform_roi_pool(input, boxes, offset, **{n: getattr(self, n) for n in self._options})


SPEC = OpSpec(deform_roi_pool, DeformRoIPool, (_KERNELS,), title="deformable RoI pooling")
