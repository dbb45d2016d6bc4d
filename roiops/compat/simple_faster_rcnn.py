"""chenyuntc/simple-faster-rcnn-pytorch RoI pooling (``model.roi_module.RoIPooling2D``).

``RoIPooling2D(outh, outw, spatial_scale)`` computes the Caffe RoIPool, the same numbers
as chainer's ``roi_pooling_2d`` that the original tested itself against (forward and
backward equal bit for bit, for boxes with ``x1 <= x2`` and ``y1 <= y2``).

``forward`` accepts both forms the project used:

- ``forward(x, rois)``: the original module's form, ``rois`` a ``Tensor[R, 5]`` of rows
  ``(index, x1, y1, x2, y2)``, already in x-y order;
- ``forward(x, rois, roi_indices)``: the form its ``VGG16RoIHead.forward`` received, and
  chainer >= 4's: ``rois`` ``[R, 4]`` in the project's **(y_min, x_min, y_max, x_max)**
  order and ``roi_indices`` ``[R]`` the image of each box (tensors or numpy arrays). The
  head's ``yx -> xy`` column swap happens here.

Differences from the original (which ran float32 CUDA tensors only):

- An inverted box (``x2 < x1`` or ``y2 < y1`` after rounding) is pooled as a 1x1 box at
  ``(x1, y1)`` in both. The original backward then gave *no* gradient (its "pixel inside
  the box" test rejects every pixel of an inverted box) although the forward read a pixel;
  roiops sends the gradient to the pixel the forward read, the exact adjoint.
- The original started each max at ``-1e37``: a bin whose values are all below that
  returned ``-1e37`` with no gradient; roiops returns the true maximum.
- Any float dtype and device; the output has the input's dtype.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

import roiops

from .. import _validation as v
from ..ops._declare import fx_leaf
from ._util import as_int

__all__ = ["RoIPooling2D"]


class RoIPooling2D(nn.Module):
    """simple-faster-rcnn-pytorch's ``RoIPooling2D``: the Caffe RoIPool to ``outh x outw``
    bins (``roiops.roi_pool(..., convention="caffe")``).

    Args:
        outh: output height, a whole number >= 1.
        outw: output width, a whole number >= 1.
        spatial_scale: feature-map cells per input-image pixel (e.g. 1/16).

    Examples:
        >>> from roiops.compat.simple_faster_rcnn import RoIPooling2D
        >>> pool = RoIPooling2D(7, 7, 1 / 16)
        >>> pool
        RoIPooling2D(outh=7, outw=7, spatial_scale=0.0625)
        >>> x = torch.randn(1, 8, 40, 60)
        >>> pool(x, torch.tensor([[0, 16.0, 32.0, 320.0, 240.0]])).shape
        torch.Size([1, 8, 7, 7])
        >>> pool(x, torch.tensor([[32.0, 16.0, 240.0, 320.0]]), torch.tensor([0])).shape  # (y, x) boxes
        torch.Size([1, 8, 7, 7])
    """

    def __init__(self, outh, outw, spatial_scale):
        super().__init__()
        self.outh = as_int(outh, "outh", 1)
        self.outw = as_int(outw, "outw", 1)
        self.spatial_scale = v.spatial_scale(spatial_scale)

    def forward(self, x: Tensor, rois, roi_indices=None) -> Tensor:
        """Pools the boxes, in either of the project's two forms.

        Args:
            x: feature map ``Tensor[N, C, H, W]``.
            rois: without ``roi_indices``, ``Tensor[R, 5]`` of rows ``(index, x1, y1, x2,
                y2)``; with it, ``[R, 4]`` rows ``(y_min, x_min, y_max, x_max)`` (a tensor
                or a numpy array).
            roi_indices: None, or the image of each box, ``[R]`` (a tensor or a numpy
                array).

        Returns:
            ``Tensor[R, C, outh, outw]``, the input's dtype.
        """
        if roi_indices is not None:
            rois = _yx_rois_with_indices(x, rois, roi_indices)
        return roiops.roi_pool(x, rois, (self.outh, self.outw), self.spatial_scale,
                               convention="caffe")

    def extra_repr(self) -> str:
        return f"outh={self.outh}, outw={self.outw}, spatial_scale={self.spatial_scale}"


@fx_leaf
def _yx_rois_with_indices(x: Tensor, rois, roi_indices) -> Tensor:
    dtype = torch.float64 if isinstance(x, Tensor) and x.dtype == torch.float64 else torch.float32
    device = x.device if isinstance(x, Tensor) else None
    rois = torch.as_tensor(rois, dtype=dtype, device=device)
    roi_indices = torch.as_tensor(roi_indices, dtype=dtype, device=device)
    if rois.dim() != 2 or rois.shape[1] != 4:
        raise ValueError(f"with roi_indices, rois must be [R, 4] (y_min, x_min, y_max, x_max), "
                         f"got shape {tuple(rois.shape)}")
    if roi_indices.shape != (rois.shape[0],):
        raise ValueError(f"roi_indices must have shape ({rois.shape[0]},) to match rois, "
                         f"got {tuple(roi_indices.shape)}")
    return torch.cat([roi_indices[:, None], rois[:, [1, 0, 3, 2]]], 1)
