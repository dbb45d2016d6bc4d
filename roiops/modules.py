"""``nn.Module`` wrappers of the functional API; arguments are checked at construction."""

from __future__ import annotations

from typing import Literal

from torch import Tensor, nn

from . import _validation as v
from ._validation import BoxesType
from .functional import OutputSize, roi_align, roi_pool


class RoIAlign(nn.Module):
    """See :func:`roiops.roi_align`.

    Example::

        >>> pool = roiops.RoIAlign(7, spatial_scale=1 / 16, sampling_ratio=2, aligned=True)
        >>> pool(features, boxes).shape  # [K, C, 7, 7]
    """

    def __init__(self, output_size: OutputSize, spatial_scale: float, sampling_ratio: int = -1,
                 aligned: bool = False, mode: Literal["avg", "max"] = "avg") -> None:
        super().__init__()
        self.output_size = v.output_size(output_size)
        self.spatial_scale = v.spatial_scale(spatial_scale)
        self.sampling_ratio = v.sampling_ratio(sampling_ratio)
        self.aligned = v.flag("aligned", aligned)
        self.mode = v.choice("mode", mode, ("avg", "max"))

    def forward(self, input: Tensor, boxes: BoxesType) -> Tensor:
        return roi_align(input, boxes, self.output_size, self.spatial_scale, self.sampling_ratio,
                         self.aligned, self.mode)  # type: ignore[arg-type]

    def extra_repr(self) -> str:
        return (f"output_size={self.output_size}, spatial_scale={self.spatial_scale}, "
                f"sampling_ratio={self.sampling_ratio}, aligned={self.aligned}, mode={self.mode!r}")


class RoIPool(nn.Module):
    """See :func:`roiops.roi_pool`.

    Example::

        >>> pool = roiops.RoIPool((7, 7), spatial_scale=1 / 16)
        >>> pool(features, boxes).shape  # [K, C, 7, 7]
    """

    def __init__(self, output_size: OutputSize, spatial_scale: float,
                 convention: Literal["caffe", "mmdet"] = "caffe") -> None:
        super().__init__()
        self.output_size = v.output_size(output_size)
        self.spatial_scale = v.spatial_scale(spatial_scale)
        self.convention = v.choice("convention", convention, ("caffe", "mmdet"))

    def forward(self, input: Tensor, boxes: BoxesType) -> Tensor:
        return roi_pool(input, boxes, self.output_size, self.spatial_scale, self.convention)  # type: ignore[arg-type]

    def extra_repr(self) -> str:
        return f"output_size={self.output_size}, spatial_scale={self.spatial_scale}, convention={self.convention!r}"
