"""mmdetection v1 RoIPool (``mmdet.ops.RoIPool``, ``mmdet.ops.roi_pool``).

``RoIPool(out_size, spatial_scale, use_torchvision=False)`` and ``roi_pool(features, rois,
out_size, spatial_scale)``, ``rois`` a ``Tensor[K, 5]`` of ``(batch_index, x1, y1, x2, y2)``.
The numbers are mmdetection's continuous-coordinate RoIPool (``roiops.roi_pool(...,
convention="mmdet")``): no rounding, the box spans ``x1*s`` to ``(x2 + 1)*s``, a box of
width or height <= 0 gives zeros. ``use_torchvision=True`` switches to the Caffe RoIPool
of ``torchvision.ops.roi_pool``, as the original did.

``out_size`` must be an int or a tuple of two ints (``TypeError`` otherwise, as in
mmdetection 1.0; a positive value is also required, ``ValueError``); unlike the original
it is checked when the module is built, not at the first forward.

Differences from the original: a box of width or height <= 0 gets no gradient (the
original left its argmax at 0 and sent the gradient to element ``[0, 0]`` of each channel);
float64 works in backward (the original exited the process); CPU tensors work.
"""

from __future__ import annotations

from typing import Literal

from torch import Tensor, nn

import roiops

from .. import _validation as v
from ..ops._declare import fx_leaf

__all__ = ["RoIPool", "roi_pool"]


def _out_hw(out_size) -> tuple[int, int]:
    def is_int(v):
        return isinstance(v, int) and not isinstance(v, bool)

    if is_int(out_size):
        hw = (out_size, out_size)
    elif isinstance(out_size, tuple) and len(out_size) == 2 and all(map(is_int, out_size)):
        hw = out_size
    else:
        raise TypeError(f'"out_size" must be an integer or a tuple of two integers, '
                        f"got {out_size!r}")
    if min(hw) < 1:
        raise ValueError(f'"out_size" must be positive, got {out_size!r}')
    return hw


@fx_leaf
def roi_pool(features: Tensor, rois, out_size, spatial_scale: float) -> Tensor:
    """mmdetection v1's ``roi_pool``: continuous-coordinate RoIPool
    (``roiops.roi_pool(..., convention="mmdet")``).

    Args:
        features: feature map ``Tensor[N, C, H, W]``.
        rois: ``Tensor[K, 5]`` of rows ``(batch_index, x1, y1, x2, y2)`` in image pixels.
        out_size: an int or a tuple of two ints, positive.
        spatial_scale: feature-map cells per input-image pixel (e.g. 1/16).

    Returns:
        ``Tensor[K, C, h, w]``.

    Raises:
        TypeError: ``out_size`` is neither an int nor a tuple of two ints.
        ValueError: ``out_size`` is not positive.

    Examples:
        >>> from roiops.compat.mmdet import roi_pool
        >>> x = torch.randn(1, 8, 40, 60)
        >>> rois = torch.tensor([[0, 16.0, 32.0, 320.0, 240.0]])
        >>> roi_pool(x, rois, 7, 1 / 16).shape
        torch.Size([1, 8, 7, 7])
    """
    return roiops.roi_pool(features, rois, _out_hw(out_size), spatial_scale,
                           convention="mmdet")


class RoIPool(nn.Module):
    """mmdetection v1's ``RoIPool``: ``module(features, rois)`` is
    [`roi_pool`][roiops.compat.mmdet.roi_pool], or with ``use_torchvision=True`` the Caffe
    RoIPool of ``torchvision.ops.roi_pool``, as the original did. ``out_size`` is checked
    when the module is built.

    Args:
        out_size: an int or a tuple of two ints, positive.
        spatial_scale: feature-map cells per input-image pixel (e.g. 1/16).
        use_torchvision: pool with the Caffe convention instead of the continuous one.

    Examples:
        >>> from roiops.compat.mmdet import RoIPool
        >>> pool = RoIPool(7, 1 / 16)
        >>> pool
        RoIPool(out_size=7, spatial_scale=0.0625, use_torchvision=False)
        >>> pool(torch.randn(1, 8, 40, 60), torch.tensor([[0, 16.0, 32.0, 320.0, 240.0]])).shape
        torch.Size([1, 8, 7, 7])
    """

    def __init__(self, out_size, spatial_scale, use_torchvision=False):
        super().__init__()
        _out_hw(out_size)
        self.out_size = out_size
        self.spatial_scale = v.spatial_scale(spatial_scale)
        self.use_torchvision = bool(use_torchvision)

    def forward(self, features: Tensor, rois) -> Tensor:
        convention: Literal["caffe", "mmdet"] = "caffe" if self.use_torchvision else "mmdet"
        return roiops.roi_pool(features, rois, _out_hw(self.out_size), self.spatial_scale,
                               convention=convention)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(out_size={self.out_size}, "
                f"spatial_scale={self.spatial_scale}, use_torchvision={self.use_torchvision})")
