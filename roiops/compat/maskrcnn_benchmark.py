"""facebookresearch/maskrcnn-benchmark RoI layers (``maskrcnn_benchmark.layers``).

``ROIAlign(output_size, spatial_scale, sampling_ratio)``, ``ROIPool(output_size,
spatial_scale)`` and the functions ``roi_align(input, rois, output_size, spatial_scale,
sampling_ratio)`` and ``roi_pool(input, rois, output_size, spatial_scale)``, with the
original argument order, reprs and numbers: RoIAlign is the legacy (``aligned=False``)
Mask R-CNN RoIAlign, RoIPool the Caffe one. ``rois`` is ``Tensor[K, 5]`` of rows
``(batch_index, x1, y1, x2, y2)`` in image pixels.

Differences from the original, all extensions: float16/bfloat16 run natively and return
their own dtype (the original's apex ``amp.float_function`` cast them to float32, so its
output was float32); ``output_size`` may also be an int; ``rois`` may be a list of
per-image ``Tensor[L, 4]``; CPU tensors work in forward and backward (the original had
only RoIAlign's forward on CPU); bad arguments raise ``ValueError``/``TypeError`` instead
of failing inside the extension.
"""

from __future__ import annotations

from torch import Tensor, nn

import roiops
from roiops.ops._declare import fx_leaf

__all__ = ["ROIAlign", "ROIPool", "roi_align", "roi_pool"]


@fx_leaf
def roi_align(input: Tensor, rois, output_size, spatial_scale: float,
              sampling_ratio: int) -> Tensor:
    """maskrcnn-benchmark's ``roi_align``: the legacy Mask R-CNN RoIAlign
    (``roiops.roi_align(..., aligned=False)``).

    Args:
        input: feature map ``Tensor[N, C, H, W]``.
        rois: ``Tensor[K, 5]`` of rows ``(batch_index, x1, y1, x2, y2)`` in image pixels,
            or a list of per-image ``Tensor[L, 4]``.
        output_size: ``(h, w)``, or an int.
        spatial_scale: feature-map cells per input-image pixel (e.g. 1/16).
        sampling_ratio: sample points per bin along each axis; ``<= 0`` means adaptive.

    Returns:
        ``Tensor[K, C, h, w]``, the input's dtype.

    Examples:
        >>> from roiops.compat.maskrcnn_benchmark import roi_align
        >>> x = torch.randn(1, 8, 40, 60)
        >>> rois = torch.tensor([[0, 16.0, 32.0, 320.0, 240.0]])
        >>> roi_align(x, rois, (7, 7), 1 / 16, 2).shape
        torch.Size([1, 8, 7, 7])
    """
    return roiops.roi_align(input, rois, output_size, spatial_scale, sampling_ratio,
                            aligned=False)


@fx_leaf
def roi_pool(input: Tensor, rois, output_size, spatial_scale: float) -> Tensor:
    """maskrcnn-benchmark's ``roi_pool``: the Caffe RoIPool (``roiops.roi_pool(...,
    convention="caffe")``).

    Args:
        input: feature map ``Tensor[N, C, H, W]``.
        rois: ``Tensor[K, 5]`` of rows ``(batch_index, x1, y1, x2, y2)`` in image pixels,
            or a list of per-image ``Tensor[L, 4]``.
        output_size: ``(h, w)``, or an int.
        spatial_scale: feature-map cells per input-image pixel (e.g. 1/16).

    Returns:
        ``Tensor[K, C, h, w]``, the input's dtype.

    Examples:
        >>> from roiops.compat.maskrcnn_benchmark import roi_pool
        >>> x = torch.randn(1, 8, 40, 60)
        >>> rois = torch.tensor([[0, 16.0, 32.0, 320.0, 240.0]])
        >>> roi_pool(x, rois, (7, 7), 1 / 16).shape
        torch.Size([1, 8, 7, 7])
    """
    return roiops.roi_pool(input, rois, output_size, spatial_scale, convention="caffe")


class ROIAlign(nn.Module):
    """maskrcnn-benchmark's ``ROIAlign``: ``module(input, rois)`` is
    [`roi_align`][roiops.compat.maskrcnn_benchmark.roi_align] with the module's options.
    The options are kept as given, as the original did, so that the repr (which configs
    and logs print) is unchanged; they are checked at each call.

    Args:
        output_size: ``(h, w)``, or an int.
        spatial_scale: feature-map cells per input-image pixel (e.g. 1/16).
        sampling_ratio: sample points per bin along each axis; ``<= 0`` means adaptive.

    Examples:
        >>> from roiops.compat.maskrcnn_benchmark import ROIAlign
        >>> pooler = ROIAlign((7, 7), 1 / 16, 2)
        >>> pooler
        ROIAlign(output_size=(7, 7), spatial_scale=0.0625, sampling_ratio=2)
        >>> pooler(torch.randn(1, 8, 40, 60), torch.tensor([[0, 16.0, 32.0, 320.0, 240.0]])).shape
        torch.Size([1, 8, 7, 7])
    """

    # Arguments are stored as given, as the original did, so that the repr
    # (which configs and logs print) is unchanged; roiops checks them per call.
    def __init__(self, output_size, spatial_scale, sampling_ratio):
        super().__init__()
        self.output_size = output_size
        self.spatial_scale = spatial_scale
        self.sampling_ratio = sampling_ratio

    def forward(self, input: Tensor, rois) -> Tensor:
        return roi_align(input, rois, self.output_size, self.spatial_scale,
                         self.sampling_ratio)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(output_size={self.output_size}, "
                f"spatial_scale={self.spatial_scale}, sampling_ratio={self.sampling_ratio})")


class ROIPool(nn.Module):
    """maskrcnn-benchmark's ``ROIPool``: ``module(input, rois)`` is
    [`roi_pool`][roiops.compat.maskrcnn_benchmark.roi_pool] with the module's options,
    kept as given.

    Args:
        output_size: ``(h, w)``, or an int.
        spatial_scale: feature-map cells per input-image pixel (e.g. 1/16).

    Examples:
        >>> from roiops.compat.maskrcnn_benchmark import ROIPool
        >>> x = torch.randn(1, 8, 40, 60)
        >>> rois = torch.tensor([[0, 16.0, 32.0, 320.0, 240.0]])
        >>> ROIPool((7, 7), 1 / 16)(x, rois).shape
        torch.Size([1, 8, 7, 7])
    """

    def __init__(self, output_size, spatial_scale):
        super().__init__()
        self.output_size = output_size
        self.spatial_scale = spatial_scale

    def forward(self, input: Tensor, rois) -> Tensor:
        return roi_pool(input, rois, self.output_size, self.spatial_scale)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(output_size={self.output_size}, "
                f"spatial_scale={self.spatial_scale})")
