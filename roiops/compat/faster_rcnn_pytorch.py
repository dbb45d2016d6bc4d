"""jwyang/faster-rcnn.pytorch RoI layers: ``RoIAlign``, ``RoIAlignAvg``, ``RoIAlignMax``, ``RoIPool``.

Replaces ``model.roi_align.modules.roi_align`` and ``model.roi_pooling.modules.roi_pool``
of that project (its master branch). Constructor arguments and ``forward(features, rois)``
are the original ones; ``rois`` is ``Tensor[K, 5]`` of rows ``(batch_index, x1, y1, x2, y2)``
in image pixels (a list of per-image ``Tensor[L, 4]`` is accepted too).

The project's RoIAlign is not the Mask R-CNN RoIAlign and is not a roiops op. It takes one
bilinear sample per output cell, on the cell *corners*: for a box, with ``s = spatial_scale``
and ``P`` output columns,

    w    = max(x2*s - x1*s + 1, 0)       (rows likewise)
    x_j  = x1*s + j * w / (P - 1)         j = 0 .. P-1
    out  = 0                              if x_j < 0 or x_j >= W (or the row is out)
    x0   = min(floor(x_j), W - 2)         bilinear between columns x0 and x0 + 1,
                                          weights 1 - (x_j - x0) and x_j - x0

so in the last column (``W-1 <= x_j < W``) it extrapolates from columns W-2 and W-1.
Here it is a vectorised pure-PyTorch composite: the sample indices and weights are
computed once per box (they do not depend on the features), the four neighbours are
gathered and blended, and autograd supplies the backward, which is therefore the exact
adjoint of the forward (the original CUDA backward; the original CPU backward had its
in-range test inverted and is not reproduced). It runs on any device and dtype; float16
and bfloat16 are computed in float32. The backward (autograd of ``index_select``, an
``index_add``) is deterministic on CPU, and on CUDA under
``torch.use_deterministic_algorithms(True)``; ``roiops.config.deterministic_backward``
does not apply to it.

Choices where the original had undefined behaviour:

- an output size of 1 divides by zero in the original (``w / (P - 1)``): ``ValueError``
  (``RoIAlignAvg``/``RoIAlignMax`` sample at ``P + 1``, so they accept 1);
- a feature map with ``H < 2`` or ``W < 2`` makes the original read outside the map
  (``x0 = min(floor(x), W - 2) = -1``): ``ValueError``.

``RoIPool`` is the Caffe RoIPool (``roiops.roi_pool(..., convention="caffe")``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import roiops

from .. import _validation as v
from ..ops._declare import fx_leaf
from ._util import as_int

__all__ = ["RoIAlign", "RoIAlignAvg", "RoIAlignMax", "RoIPool", "roi_align_corners"]


def _corner_axis(start: Tensor, end: Tensor, size: int, points: int):
    """Indices ``[K, P, 2]`` and weights ``[K, P, 2]`` of the samples along one axis."""
    extent = (end - start + 1).clamp_min(0)
    step = extent / (points - 1)
    pos = start[:, None] + torch.arange(points, device=start.device, dtype=start.dtype) * step[:, None]
    inside = (pos >= 0) & (pos < size)  # False for NaN too
    # the clamps only keep an outside point's index legal: its weight is 0 anyway
    lo = pos.nan_to_num(0.0).floor().clamp(0, size - 2)
    frac = pos - lo
    weights = torch.where(inside[..., None], torch.stack([1 - frac, frac], -1), 0.0)
    index = torch.stack([lo, lo + 1], -1).long()
    return index, weights


@fx_leaf
def roi_align_corners(features: Tensor, rois, aligned_height: int, aligned_width: int,
                      spatial_scale: float) -> Tensor:
    """faster-rcnn.pytorch's RoIAlign as a function: one bilinear sample per output cell,
    on the cell corners (the rule in this module's description).

    Args:
        features: feature map ``Tensor[N, C, H, W]``, at least 2 x 2.
        rois: ``Tensor[K, 5]`` of rows ``(batch_index, x1, y1, x2, y2)`` in image pixels,
            or a list of per-image ``Tensor[L, 4]``.
        aligned_height: output height, a whole number >= 2.
        aligned_width: output width, a whole number >= 2.
        spatial_scale: feature-map cells per input-image pixel (e.g. 1/16).

    Returns:
        ``Tensor[K, C, aligned_height, aligned_width]``, the input's dtype.

    Raises:
        ValueError: an output size below 2, or a map smaller than 2 x 2.

    Examples:
        >>> from roiops.compat.faster_rcnn_pytorch import roi_align_corners
        >>> x = torch.arange(16.0).view(1, 1, 4, 4)
        >>> roi_align_corners(x, torch.tensor([[0, 0.0, 0.0, 2.0, 2.0]]), 2, 2, 1.0)
        tensor([[[[ 0.,  3.],
                  [12., 15.]]]])
    """
    ph = as_int(aligned_height, "aligned_height", 2)
    pw = as_int(aligned_width, "aligned_width", 2)
    s = v.spatial_scale(spatial_scale)
    features = v.feature_map(features)
    rois = v.rois(features, rois, s).detach()
    n, c, h, w = features.shape
    if h < 2 or w < 2:
        raise ValueError(
            f"faster-rcnn.pytorch RoIAlign needs a feature map of at least 2x2 (it "
            f"interpolates between rows/columns min(floor(x), W-2) and the next), got {h}x{w}"
        )
    k = rois.shape[0]
    x1, y1, x2, y2 = (rois[:, i] * s for i in range(1, 5))
    iy, wy = _corner_axis(y1, y2, h, ph)  # [K, ph, 2]
    ix, wx = _corner_axis(x1, x2, w, pw)  # [K, pw, 2]
    # With roiops.config.check_box_values off nothing has checked the batch index: a bad
    # row reads image 0 with weight 0, i.e. gives zeros, as the Triton kernels do.
    b = rois[:, 0]
    ok = (b >= 0) & (b < n) & (b == b.floor())
    batch = torch.where(ok, b, 0.0).long()
    # flat index of neighbour (a, b) of sample (i, j): batch*H*W + row*W + col
    flat = (batch[:, None, None, None, None] * (h * w)
            + iy[:, :, None, :, None] * w + ix[:, None, :, None, :])  # [K, ph, pw, 2, 2]
    weight = wy[:, :, None, :, None] * wx[:, None, :, None, :] * ok[:, None, None, None, None]
    # channels last so that one gathered row holds all channels of a pixel
    table = features.to(rois.dtype).permute(0, 2, 3, 1).reshape(n * h * w, c)
    picked = table.index_select(0, flat.reshape(-1)).view(k, ph, pw, 4, c)
    out = (picked * weight.reshape(k, ph, pw, 4, 1)).sum(3)
    return out.permute(0, 3, 1, 2).contiguous().to(features.dtype)


@fx_leaf
def _windows(samples: Tensor, mode: str) -> Tensor:
    """The mean (``mode`` "avg") or maximum of each 2 x 2 window of the samples, stride 1,
    each box and channel pooled as one plane: torch's pooling refuses a map of 0 channels,
    which the other layers take. One fx node, as the project's pooling layer was."""
    k, c, h, w = samples.shape
    pool = F.avg_pool2d if mode == "avg" else F.max_pool2d
    return pool(samples.reshape(k * c, 1, h, w), kernel_size=2, stride=1).view(k, c, h - 1, w - 1)


class _CornerAlignBase(nn.Module):
    _extra = 0  # RoIAlignAvg/Max sample one more row and column than they output

    def __init__(self, aligned_height, aligned_width, spatial_scale):
        super().__init__()
        minimum = 2 - self._extra
        self.aligned_height = as_int(aligned_height, "aligned_height", minimum)
        self.aligned_width = as_int(aligned_width, "aligned_width", minimum)
        self.spatial_scale = v.spatial_scale(spatial_scale)

    def _sample(self, features, rois):
        return roi_align_corners(features, rois, self.aligned_height + self._extra,
                                 self.aligned_width + self._extra, self.spatial_scale)

    def extra_repr(self) -> str:
        return (f"aligned_height={self.aligned_height}, aligned_width={self.aligned_width}, "
                f"spatial_scale={self.spatial_scale}")


class RoIAlign(_CornerAlignBase):
    """faster-rcnn.pytorch's ``RoIAlign``: one corner sample per output cell;
    ``module(features, rois)`` is [`roi_align_corners`][roiops.compat.faster_rcnn_pytorch.roi_align_corners]
    with the module's options.

    Args:
        aligned_height: output height, a whole number >= 2.
        aligned_width: output width, a whole number >= 2.
        spatial_scale: feature-map cells per input-image pixel (e.g. 1/16).

    Examples:
        >>> from roiops.compat.faster_rcnn_pytorch import RoIAlign
        >>> align = RoIAlign(7, 7, 1 / 16)
        >>> align
        RoIAlign(aligned_height=7, aligned_width=7, spatial_scale=0.0625)
        >>> align(torch.randn(1, 8, 40, 60), torch.tensor([[0, 16.0, 32.0, 320.0, 240.0]])).shape
        torch.Size([1, 8, 7, 7])
    """

    def forward(self, features: Tensor, rois) -> Tensor:
        return self._sample(features, rois)


class RoIAlignAvg(_CornerAlignBase):
    """faster-rcnn.pytorch's ``RoIAlignAvg``: corner samples at ``(h + 1) x (w + 1)``, then
    2x2 average pooling with stride 1; ``module(features, rois)`` returns ``Tensor[K, C,
    aligned_height, aligned_width]``.

    Args:
        aligned_height: output height, a whole number >= 1.
        aligned_width: output width, a whole number >= 1.
        spatial_scale: feature-map cells per input-image pixel (e.g. 1/16).

    Examples:
        >>> from roiops.compat.faster_rcnn_pytorch import RoIAlignAvg
        >>> x = torch.randn(1, 8, 40, 60)
        >>> rois = torch.tensor([[0, 16.0, 32.0, 320.0, 240.0]])
        >>> RoIAlignAvg(7, 7, 1 / 16)(x, rois).shape
        torch.Size([1, 8, 7, 7])
    """

    _extra = 1

    def forward(self, features: Tensor, rois) -> Tensor:
        return _windows(self._sample(features, rois), "avg")


class RoIAlignMax(_CornerAlignBase):
    """faster-rcnn.pytorch's ``RoIAlignMax``: corner samples at ``(h + 1) x (w + 1)``, then
    2x2 max pooling with stride 1; ``module(features, rois)`` returns ``Tensor[K, C,
    aligned_height, aligned_width]``.

    Args:
        aligned_height: output height, a whole number >= 1.
        aligned_width: output width, a whole number >= 1.
        spatial_scale: feature-map cells per input-image pixel (e.g. 1/16).

    Examples:
        >>> from roiops.compat.faster_rcnn_pytorch import RoIAlignMax
        >>> x = torch.randn(1, 8, 40, 60)
        >>> rois = torch.tensor([[0, 16.0, 32.0, 320.0, 240.0]])
        >>> RoIAlignMax(7, 7, 1 / 16)(x, rois).shape
        torch.Size([1, 8, 7, 7])
    """

    _extra = 1

    def forward(self, features: Tensor, rois) -> Tensor:
        return _windows(self._sample(features, rois), "max")


class RoIPool(nn.Module):
    """faster-rcnn.pytorch's ``_RoIPooling``: the Caffe RoIPool (``roiops.roi_pool(...,
    convention="caffe")``); ``module(features, rois)`` returns ``Tensor[K, C,
    pooled_height, pooled_width]``. The original class name ``_RoIPooling`` is exported
    too.

    Args:
        pooled_height: output height, a whole number >= 1.
        pooled_width: output width, a whole number >= 1.
        spatial_scale: feature-map cells per input-image pixel (e.g. 1/16).

    Examples:
        >>> from roiops.compat.faster_rcnn_pytorch import RoIPool
        >>> pool = RoIPool(7, 7, 1 / 16)
        >>> pool
        RoIPool(pooled_height=7, pooled_width=7, spatial_scale=0.0625)
        >>> pool(torch.randn(1, 8, 40, 60), torch.tensor([[0, 16.0, 32.0, 320.0, 240.0]])).shape
        torch.Size([1, 8, 7, 7])
    """

    def __init__(self, pooled_height, pooled_width, spatial_scale):
        super().__init__()
        self.pooled_height = as_int(pooled_height, "pooled_height", 1)
        self.pooled_width = as_int(pooled_width, "pooled_width", 1)
        self.spatial_scale = v.spatial_scale(spatial_scale)

    def forward(self, features: Tensor, rois) -> Tensor:
        return roiops.roi_pool(features, rois, (self.pooled_height, self.pooled_width),
                               self.spatial_scale, convention="caffe")

    def extra_repr(self) -> str:
        return (f"pooled_height={self.pooled_height}, pooled_width={self.pooled_width}, "
                f"spatial_scale={self.spatial_scale}")


_RoIPooling = RoIPool
