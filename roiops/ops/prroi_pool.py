"""Precise RoI Pooling (IoU-Net): its registered ops (with a gradient to the boxes), public
function and Module. Semantics: docs/semantics.md, "prroi_pool"."""

from __future__ import annotations

import torch
from torch import Tensor

from .. import _validation as v
from .._spec import Kernels, OpSpec
from .._validation import BoxesType, OutputSize
from ._declare import RoIModule, fx_leaf, register

_KERNELS = Kernels(
    "prroi_pool", (("float", "spatial_scale"), ("int", "pooled_height"), ("int", "pooled_width")),
    ("spatial_scale", "pooled_height", "pooled_width", "batch_size", "channels", "height", "width", "channels_last"),
    title="prroi_pool", rois_grad=True,
    variants={"forward": (dict(), dict(rois_grad=True)), "backward": (dict(channels_last=True),),
              "rois_backward": (dict(),)})
_prroi_pool = register(_KERNELS)


@fx_leaf
def prroi_pool(
    input: Tensor,
    boxes: BoxesType,
    output_size: OutputSize,
    spatial_scale: float = 1.0,
) -> Tensor:
    """Precise RoI Pooling (IoU-Net, mmcv's ``prroi_pool``): the exact average over each bin
    of the bilinearly interpolated feature map, an integral with no sample points.

    Differentiable with respect to the input and to the box coordinates: ``boxes`` that
    require grad (a ``[K, 5]`` tensor or a list of ``[L, 4]``) receive their gradient, 0 in
    the batch-index column. Semantics, gradients and the points where the box derivative
    is one-sided: docs/semantics.md, "prroi_pool".

    Args:
        input: feature map ``Tensor[N, C, H, W]``, float16/bfloat16/float32/float64, NCHW
            or channels_last.
        boxes: ``Tensor[K, 5]`` with rows ``(batch_index, x1, y1, x2, y2)``, or a list of N
            ``Tensor[L_i, 4]`` (image i's boxes), in input-image pixels. No half-cell offset:
            cell ``(h, w)``'s value sits at ``(x, y) = (w, h) / spatial_scale``.
        output_size: ``int`` or ``(h, w)``.
        spatial_scale: feature-map cells per input-image pixel (e.g. 1/16).

    Returns:
        ``Tensor[K, C, h, w]`` of the input's dtype and memory format; a box with
        ``x2 <= x1`` or ``y2 <= y1`` gives 0 (and no gradient).

    Examples:
        >>> x = torch.randn(1, 8, 32, 32)
        >>> boxes = torch.tensor([[0, 4.0, 6.0, 20.5, 17.25]], requires_grad=True)
        >>> out = roiops.prroi_pool(x, boxes, 7)
        >>> out.sum().backward()
        >>> boxes.grad.shape
        torch.Size([1, 5])

        Fitting a box to a target crop by gradient descent (IoU-Net's box refinement):

        >>> f64 = dict(dtype=torch.float64)
        >>> yy, xx = torch.meshgrid(torch.arange(24.0, **f64), torch.arange(24.0, **f64), indexing="ij")
        >>> blobs = sum(torch.exp(-((xx - cx) ** 2 + (yy - cy) ** 2) / (2 * s * s))
        ...             for cx, cy, s in [(6, 8, 3), (15, 12, 4), (10, 17, 2.5)])
        >>> features = torch.stack([blobs, blobs * xx / 24])[None]  # [1, 2, 24, 24], a smooth map
        >>> goal = torch.tensor([[5.0, 6.0, 17.0, 15.0]], **f64)
        >>> crop = roiops.prroi_pool(features, [goal], 7)
        >>> box = torch.tensor([[6.5, 4.8, 19.0, 16.0]], **f64, requires_grad=True)  # 2 px off
        >>> optimizer = torch.optim.Adam([box], lr=0.1)
        >>> for _ in range(100):
        ...     optimizer.zero_grad()
        ...     loss = (roiops.prroi_pool(features, [box], 7) - crop).pow(2).mean()
        ...     loss.backward()
        ...     optimizer.step()
        >>> bool((box - goal).abs().max() < 0.05)
        True
    """
    input = v.feature_map(input)
    h, w = v.output_size(output_size)
    scale = v.spatial_scale(spatial_scale)
    rois = v.rois(input, boxes, scale)
    return _prroi_pool(input, rois, scale, h, w)


class PrRoIPool(RoIModule):
    """Module form of [`roiops.prroi_pool`][]: ``module(input, boxes)`` is
    ``prroi_pool(input, boxes, **options)``, returning ``Tensor[K, C, h, w]``; boxes that
    require grad receive their gradient. The options are checked when the module is
    built and shown in its repr.

    Args:
        output_size: ``int`` or ``(h, w)``.
        spatial_scale: feature-map cells per input-image pixel (e.g. 1/16).

    Examples:
        >>> pool = roiops.PrRoIPool(7, spatial_scale=1 / 16)
        >>> boxes = torch.tensor([[0, 16.0, 32.0, 320.0, 240.0]], requires_grad=True)
        >>> pool(torch.randn(1, 8, 40, 60), boxes).shape
        torch.Size([1, 8, 7, 7])
    """

    function = prroi_pool

    def __init__(self, output_size: OutputSize, spatial_scale: float = 1.0) -> None:
        super().__init__(output_size=output_size, spatial_scale=spatial_scale)


SPEC = OpSpec(prroi_pool, PrRoIPool, (_KERNELS,), title="Precise RoI Pooling (IoU-Net)", box_grad={},
              reference_bin_error=True)
