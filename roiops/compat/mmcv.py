"""Drop-in replacement for the RoI layers of ``mmcv.ops`` (mmcv 1.x and 2.x).

Port with one import:

    from mmcv.ops import RoIAlign, RoIPool, roi_align, roi_pool
    # becomes
    from roiops.compat.mmcv import RoIAlign, RoIPool, roi_align, roi_pool

(``PrRoIPool``/``prroi_pool``, ``RoIAlignRotated``/``roi_align_rotated``,
``RiRoIAlignRotated``/``riroi_align_rotated`` and the deformable RoI pooling layers
``DeformRoIPool``/``deform_roi_pool``, ``DeformRoIPoolPack`` and
``ModulatedDeformRoIPoolPack``, ``BezierAlign``/``bezier_align`` and
``BorderAlign``/``border_align`` likewise.)

Same signatures, defaults (``sampling_ratio=0`` adaptive, ``aligned=True``), ``rois[K, 5]``
boxes and reprs. Semantics:

- ``roi_align``/``RoIAlign``: ``pool_mode="avg"`` is roiops' average mode, ``"max"`` its
  max mode (mmcv's CUDA kernel; mmcv's CPU kernel starts its maximum at -10000, so it
  differs on bins whose samples are all below -10000). ``use_torchvision=True`` calls
  torchvision's roi_align in mmcv, which always averages: here too, whatever ``pool_mode``.
- ``roi_pool``/``RoIPool``: mmcv's RoIPool is the continuous (mmdetection) convention,
  not Caffe's: ``x1 * s`` to ``(x2 + 1) * s`` unrounded, a box of size <= 0 gives zeros
  (mmcv's CUDA kernel; mmcv has no CPU RoIPool, roiops runs it on CPU too). It is
  ``roiops.roi_pool(..., convention="mmdet")``. mmcv's running maximum starts at
  -FLT_MAX and skips NaN; roiops gives ``-inf`` for an all ``-inf`` bin and NaN for a bin
  holding one.
- ``roi_align_rotated``/``RoIAlignRotated``: ``rois[K, 6]`` rows ``(batch_index, cx, cy, w,
  h, angle)`` with the angle in radians, counter-clockwise unless ``clockwise=True``;
  ``aligned=False`` means no half-cell offset and sides of at least one cell. It is
  [`roiops.roi_align_rotated`][] with ``angle="radians"``.
- ``riroi_align_rotated``/``RiRoIAlignRotated``: ReDet's rotation-invariant RoIAlign,
  [`roiops.riroi_align_rotated`][] (``num_samples`` is its ``sampling_ratio``): channels
  ``c' * num_orientations + o``, which must divide evenly (mmcv does not check), rows
  ``(batch_index, cx, cy, w, h, angle)`` in radians. The module keeps ``out_size`` as given
  (MMRotate reads it). mmcv runs it on CUDA only and accumulates float16 in float16;
  roiops on CPU and GPU in every floating dtype, in float32 for the half types.
- ``prroi_pool``/``PrRoIPool``: Precise RoI Pooling, [`roiops.prroi_pool`][]; as in mmcv,
  ``rois`` that require grad receive their gradient (zero in the batch-index column).
  mmcv runs it on CUDA in float32 only; roiops on CPU and GPU in every floating dtype.
- ``deform_roi_pool``/``DeformRoIPool``: [`roiops.deform_roi_pool`][] (``offset=None``:
  no offset). The input's gradient is mmcv's; the offset's is the derivative of the
  forward, which differs from mmcv's where a sample is held by the map's border
  (docs/semantics.md). mmcv runs it on GPUs only; roiops on CPU and GPU, in every
  floating dtype, with an offset of any floating dtype.
- ``DeformRoIPoolPack``/``ModulatedDeformRoIPoolPack``: pooling without offset, a fully
  connected head that predicts the offset (and, modulated, a second one that predicts a
  sigmoid mask multiplying the output), pooling again. Parameter names and shapes are
  mmcv's (``offset_fc.0/2/4``, ``mask_fc.0/2``; last layers zero at initialisation), so a
  state_dict saved from mmcv's layers loads unchanged.

- ``bezier_align``/``BezierAlign``: ABCNet's Bezier alignment, [`roiops.bezier_align`][],
  ``beziers[K, 17]`` rows ``(batch_index, top curve left to right, bottom curve right to
  left)``; the module's ``spatial_scale`` and ``sampling_ratio`` have no defaults, as in
  mmcv. The bin centres follow mmcv's CPU arithmetic bit for bit in float32; the input
  gets mmcv's gradient, the control points none. mmcv has no bfloat16; roiops runs every
  floating dtype (float16 and bfloat16 in float32 arithmetic).
- ``border_align``/``BorderAlign``: BorderDet's border align, [`roiops.border_align`][]:
  boxes ``[N, K, 4]`` per image in feature-map cells, output ``[N, C, K, 4]``. mmcv runs it
  on CUDA only; roiops on CPU and GPU in every floating dtype. Where they differ: a NaN
  sample wins the maximum here (the first one), where mmcv keeps its running maximum
  unless the first sample is NaN; the backward scatters at the point the forward sampled
  (mmcv recomputes it as start + argmax * step, which can differ in the last bits) and
  adds nothing for a sample outside the map; ``pool_size`` must be in [1, 1024].

- ``RoIAwarePool3d``, ``RoIPointPool3d``, ``points_in_boxes_part``, ``points_in_boxes_all``
  and ``points_in_boxes_cpu``: the point-cloud ops, [`roiops.roiaware_pool3d`][],
  [`roiops.roipoint_pool3d`][] and [`roiops.points_in_boxes`][], in mmcv's arithmetic
  (docs/semantics.md, "Point clouds"). mmcv runs them on CUDA only (points_in_boxes_cpu
  on the CPU); roiops on CPU and GPU. Where they differ: ``max_pts_per_voxel`` keeps
  ``max_pts_per_voxel - 1`` points as in mmcv, and 1 (no point at all) is refused;
  ``out_size`` sides above 256, which mmcv's packed voxel index cannot hold, are refused;
  mmcv's float64 mean sums in float32, roiops' in float64; ``RoIPointPool3d`` has a
  gradient (mmcv raises ``NotImplementedError``) and returns its empty flag as int32 as
  mmcv does.

``RoIAlign`` and ``RoIAlignRotated`` also take mmcv's deprecated keywords ``out_size`` and
``sample_num`` (for ``output_size`` and ``sampling_ratio``), with mmcv's
``DeprecationWarning``; giving both names of one argument is a ``TypeError``.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import Any, TypeVar, Union

import torch
from torch import Tensor, nn


import roiops as F

from .. import _validation as v
from ..ops._declare import fx_leaf
from ._util import box_assertions

__all__ = ["BezierAlign", "BorderAlign", "DeformRoIPool", "DeformRoIPoolPack", "ModulatedDeformRoIPoolPack", "PrRoIPool",
           "RiRoIAlignRotated", "RoIAlign", "RoIAlignRotated", "RoIAwarePool3d", "RoIPointPool3d", "RoIPool",
           "bezier_align", "border_align", "deform_roi_pool", "points_in_boxes_all", "points_in_boxes_cpu",
           "points_in_boxes_part", "prroi_pool", "riroi_align_rotated", "roi_align", "roi_align_rotated", "roi_pool"]

OutputSize = Union[int, tuple[int, int], list[int]]
_Init = TypeVar("_Init", bound=Callable[..., None])

# mmcv 1.x renamed these and kept the old keywords working, with a warning.
_RENAMED = {"out_size": "output_size", "sample_num": "sampling_ratio"}


def _old_keywords(init: _Init) -> _Init:
    """Accepts mmcv's deprecated keyword names in a layer's ``__init__`` (whose signature,
    seen through ``functools.wraps``, stays mmcv's current one)."""
    @functools.wraps(init)
    def wrapper(self: nn.Module, *args: Any, **kwargs: Any) -> None:
        for old, new in _RENAMED.items():
            if old in kwargs:
                if new in kwargs:
                    raise TypeError(f"{type(self).__name__}() got both {old!r} and {new!r}; {old!r} is mmcv's "
                                    f"deprecated name of {new!r}")
                warnings.warn(f'"{old}" is deprecated in `{type(self).__name__}`, please use "{new}" instead',
                              DeprecationWarning, stacklevel=2)
                kwargs[new] = kwargs.pop(old)
        init(self, *args, **kwargs)

    return wrapper  # type: ignore[return-value]


def _pair(value: OutputSize) -> tuple[int, int]:
    return v.output_size(value)


def _sampling_ratio(value: object) -> int:
    """mmcv applies int(): a whole float from a config (2.0) is accepted, 2.5 refused
    rather than truncated."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return v.sampling_ratio(value)


@fx_leaf
@box_assertions
def roi_align(input: Tensor, rois: Tensor, output_size: OutputSize, spatial_scale: float = 1.0,
              sampling_ratio: int = 0, pool_mode: str = "avg", aligned: bool = True) -> Tensor:
    """``mmcv.ops.roi_align``: RoIAlign, [`roiops.roi_align`][] with mmcv's signature and
    defaults.

    Args:
        input: feature map ``Tensor[N, C, H, W]``.
        rois: ``Tensor[K, 5]`` of rows ``(batch_index, x1, y1, x2, y2)`` in image pixels;
            other shapes raise an ``AssertionError`` ([`BoxAssertionError`][roiops.compat.BoxAssertionError]).
        output_size: ``int`` or ``(h, w)``.
        spatial_scale: feature-map cells per input-image pixel (e.g. 1/16).
        sampling_ratio: sample points per bin along each axis; ``<= 0`` (the default)
            means adaptive.
        pool_mode: ``"avg"`` or ``"max"`` (the largest sample, as mmcv's CUDA kernel).
        aligned: shift box corners by -0.5 cell.

    Returns:
        ``Tensor[K, C, h, w]``.

    Examples:
        >>> from roiops.compat.mmcv import roi_align
        >>> x = torch.randn(1, 8, 40, 60)
        >>> rois = torch.tensor([[0, 16.0, 32.0, 320.0, 240.0]])
        >>> roi_align(x, rois, 7, 1 / 16, pool_mode="max").shape
        torch.Size([1, 8, 7, 7])
    """
    mode = v.choice("pool_mode", pool_mode, ("avg", "max"))
    return F.roi_align(input, rois, output_size, spatial_scale, sampling_ratio, aligned,
                       "max" if mode == "max" else "avg")


@fx_leaf
@box_assertions
def roi_pool(input: Tensor, rois: Tensor, output_size: OutputSize, spatial_scale: float = 1.0) -> Tensor:
    """``mmcv.ops.roi_pool``: continuous-coordinate RoIPool, ``roiops.roi_pool(...,
    convention="mmdet")``: ``x1 * s`` to ``(x2 + 1) * s`` unrounded, a box of size <= 0
    gives zeros.

    Args:
        input: feature map ``Tensor[N, C, H, W]``.
        rois: ``Tensor[K, 5]`` of rows ``(batch_index, x1, y1, x2, y2)`` in image pixels;
            other shapes raise an ``AssertionError`` ([`BoxAssertionError`][roiops.compat.BoxAssertionError]).
        output_size: ``int`` or ``(h, w)``.
        spatial_scale: feature-map cells per input-image pixel (e.g. 1/16).

    Returns:
        ``Tensor[K, C, h, w]``.

    Examples:
        >>> from roiops.compat.mmcv import roi_pool
        >>> x = torch.randn(1, 8, 40, 60)
        >>> rois = torch.tensor([[0, 16.0, 32.0, 320.0, 240.0]])
        >>> roi_pool(x, rois, 7, 1 / 16).shape
        torch.Size([1, 8, 7, 7])
    """
    return F.roi_pool(input, rois, output_size, spatial_scale, "mmdet")


class RoIAlign(nn.Module):
    """``mmcv.ops.RoIAlign``: ``module(input, rois)`` is [`roi_align`][roiops.compat.mmcv.roi_align]
    with the module's options, checked when it is built. mmcv's deprecated keywords
    ``out_size`` and ``sample_num`` work too, with mmcv's ``DeprecationWarning``.

    Args:
        output_size: ``int`` or ``(h, w)``.
        spatial_scale: feature-map cells per input-image pixel (e.g. 1/16).
        sampling_ratio: sample points per bin along each axis; ``<= 0`` means adaptive. A
            whole float (``2.0``, from a config) is taken as an int.
        pool_mode: ``"avg"`` or ``"max"``.
        aligned: shift box corners by -0.5 cell.
        use_torchvision: average whatever ``pool_mode`` says, as mmcv's call of
            torchvision's ``roi_align`` does.

    Examples:
        >>> from roiops.compat.mmcv import RoIAlign
        >>> layer = RoIAlign(7, spatial_scale=1 / 16)  # as in mmdetection's roi_layer
        >>> layer
        RoIAlign(output_size=(7, 7), spatial_scale=0.0625, sampling_ratio=0, pool_mode=avg, aligned=True,
                 use_torchvision=False)
        >>> layer(torch.randn(1, 8, 40, 60), torch.tensor([[0, 16.0, 32.0, 320.0, 240.0]])).shape
        torch.Size([1, 8, 7, 7])
    """

    @_old_keywords
    def __init__(self, output_size: OutputSize, spatial_scale: float = 1.0, sampling_ratio: int = 0,
                 pool_mode: str = "avg", aligned: bool = True, use_torchvision: bool = False) -> None:
        super().__init__()
        self.output_size = _pair(output_size)
        self.spatial_scale = v.spatial_scale(float(spatial_scale))
        self.sampling_ratio = _sampling_ratio(sampling_ratio)
        self.pool_mode = v.choice("pool_mode", pool_mode, ("avg", "max"))
        self.aligned = v.flag("aligned", aligned)
        self.use_torchvision = v.flag("use_torchvision", use_torchvision)

    def forward(self, input: Tensor, rois: Tensor) -> Tensor:
        mode = "avg" if self.use_torchvision else self.pool_mode
        return roi_align(input, rois, self.output_size, self.spatial_scale, self.sampling_ratio, mode, self.aligned)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(output_size={self.output_size}, spatial_scale={self.spatial_scale}, "
                f"sampling_ratio={self.sampling_ratio}, pool_mode={self.pool_mode}, aligned={self.aligned}, "
                f"use_torchvision={self.use_torchvision})")


class _SizeAndScale(nn.Module):
    """A layer of mmcv's ``(output_size, spatial_scale=1.0)`` form calling ``function(input,
    rois, output_size, spatial_scale)``."""

    function: Callable[..., Tensor]

    def __init__(self, output_size: OutputSize, spatial_scale: float = 1.0) -> None:
        super().__init__()
        self.output_size = _pair(output_size)
        self.spatial_scale = v.spatial_scale(float(spatial_scale))

    def forward(self, input: Tensor, rois: Tensor) -> Tensor:
        return type(self).function(input, rois, self.output_size, self.spatial_scale)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(output_size={self.output_size}, spatial_scale={self.spatial_scale})"


class RoIPool(_SizeAndScale):
    """``mmcv.ops.RoIPool``: ``module(input, rois)`` is [`roi_pool`][roiops.compat.mmcv.roi_pool]
    (continuous coordinates) with the module's options.

    Args:
        output_size: ``int`` or ``(h, w)``.
        spatial_scale: feature-map cells per input-image pixel (e.g. 1/16).

    Examples:
        >>> from roiops.compat.mmcv import RoIPool
        >>> x = torch.randn(1, 8, 40, 60)
        >>> rois = torch.tensor([[0, 16.0, 32.0, 320.0, 240.0]])
        >>> RoIPool(7, 1 / 16)(x, rois).shape
        torch.Size([1, 8, 7, 7])
    """

    function = roi_pool


@fx_leaf
def roi_align_rotated(input: Tensor, rois: Tensor, output_size: OutputSize, spatial_scale: float = 1.0,
                      sampling_ratio: int = 0, aligned: bool = True, clockwise: bool = False) -> Tensor:
    """``mmcv.ops.roi_align_rotated``: rotated RoIAlign, [`roiops.roi_align_rotated`][] with
    ``angle="radians"``.

    Args:
        input: feature map ``Tensor[N, C, H, W]``.
        rois: ``Tensor[K, 6]`` of rows ``(batch_index, cx, cy, w, h, angle)`` in image
            pixels, the angle in radians.
        output_size: ``int`` or ``(h, w)``.
        spatial_scale: feature-map cells per input-image pixel (e.g. 1/16).
        sampling_ratio: sample points per bin along each box axis; ``<= 0`` means adaptive.
        aligned: shift the centre by -0.5 cell; ``False``: no offset and sides of at
            least one cell.
        clockwise: the angle turns clockwise.

    Returns:
        ``Tensor[K, C, h, w]``.

    Examples:
        >>> from roiops.compat.mmcv import roi_align_rotated
        >>> x = torch.randn(1, 8, 40, 60)
        >>> rois = torch.tensor([[0, 320.0, 240.0, 200.0, 100.0, 0.5]])  # (batch_index, cx, cy, w, h, angle)
        >>> roi_align_rotated(x, rois, 7, 1 / 16, 2).shape
        torch.Size([1, 8, 7, 7])
    """
    return F.roi_align_rotated(input, rois, output_size, spatial_scale, _sampling_ratio(sampling_ratio), aligned,
                               clockwise, "radians")


class RoIAlignRotated(nn.Module):
    """``mmcv.ops.RoIAlignRotated``: ``module(input, rois)`` is
    [`roi_align_rotated`][roiops.compat.mmcv.roi_align_rotated] with the module's options,
    checked when it is built (``spatial_scale`` defaults to 1.0 here). mmcv's deprecated
    keywords ``out_size`` and ``sample_num`` work too, with mmcv's ``DeprecationWarning``.

    Args:
        output_size: ``int`` or ``(h, w)``.
        spatial_scale: feature-map cells per input-image pixel (e.g. 1/16).
        sampling_ratio: sample points per bin along each box axis; ``<= 0`` means adaptive.
        aligned: shift the centre by -0.5 cell.
        clockwise: the angle turns clockwise.

    Examples:
        >>> from roiops.compat.mmcv import RoIAlignRotated
        >>> layer = RoIAlignRotated(7, spatial_scale=1 / 16, sampling_ratio=2, clockwise=True)
        >>> x = torch.randn(1, 8, 40, 60)
        >>> rois = torch.tensor([[0, 320.0, 240.0, 200.0, 100.0, 0.5]])  # (batch_index, cx, cy, w, h, angle)
        >>> layer(x, rois).shape
        torch.Size([1, 8, 7, 7])
    """

    @_old_keywords
    def __init__(self, output_size: OutputSize, spatial_scale: float = 1.0, sampling_ratio: int = 0,
                 aligned: bool = True, clockwise: bool = False) -> None:
        super().__init__()
        self.output_size = _pair(output_size)
        self.spatial_scale = v.spatial_scale(float(spatial_scale))
        self.sampling_ratio = _sampling_ratio(sampling_ratio)
        self.aligned = v.flag("aligned", aligned)
        self.clockwise = v.flag("clockwise", clockwise)

    def forward(self, input: Tensor, rois: Tensor) -> Tensor:
        return roi_align_rotated(input, rois, self.output_size, self.spatial_scale, self.sampling_ratio, self.aligned,
                                 self.clockwise)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(output_size={self.output_size}, spatial_scale={self.spatial_scale}, "
                f"sampling_ratio={self.sampling_ratio}, aligned={self.aligned}, clockwise={self.clockwise})")


def _out_size(value: object) -> tuple[int, int]:
    """mmcv's ``out_size``: an int or a tuple of two ints (a list is refused, as mmcv does)."""
    if not isinstance(value, (int, tuple)):
        raise TypeError(f"out_size must be an int or a tuple (h, w) of ints, got {value!r}")
    return v.output_size(value)


def _whole(value: Any) -> Any:
    """A whole float from a config (8.0) as the int mmcv's int() makes of it; anything else
    as given, for the checks to accept or refuse."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


@fx_leaf
def riroi_align_rotated(features: Tensor, rois: Tensor, out_size: int | tuple[int, int], spatial_scale: float,
                        num_samples: int = 0, num_orientations: int = 8, clockwise: bool = False) -> Tensor:
    """``mmcv.ops.riroi_align_rotated``: ReDet's rotation-invariant RoIAlign,
    [`roiops.riroi_align_rotated`][] with mmcv's signature.

    Args:
        features: feature map ``Tensor[N, C, H, W]``, ``C`` a multiple of
            ``num_orientations`` (channel ``c' * num_orientations + o``).
        rois: ``Tensor[K, 6]`` of rows ``(batch_index, cx, cy, w, h, angle)`` in image
            pixels, the angle in radians.
        out_size: an int or a tuple ``(h, w)`` of ints (a list is refused, as mmcv does).
        spatial_scale: feature-map cells per input-image pixel (e.g. 1/4).
        num_samples: sample points per bin along each box axis; ``<= 0`` means adaptive.
        num_orientations: orientations per channel field.
        clockwise: the angle turns the box clockwise.

    Returns:
        ``Tensor[K, C, h, w]``.

    Examples:
        >>> from roiops.compat.mmcv import riroi_align_rotated
        >>> x = torch.randn(1, 8, 40, 60)
        >>> rois = torch.tensor([[0, 320.0, 240.0, 200.0, 100.0, 0.5]])  # (batch_index, cx, cy, w, h, angle)
        >>> riroi_align_rotated(x, rois, 7, 1 / 16, 2, num_orientations=4).shape
        torch.Size([1, 8, 7, 7])
    """
    return F.riroi_align_rotated(features, rois, _out_size(out_size), spatial_scale, _sampling_ratio(num_samples),
                                 _whole(num_orientations), clockwise)


class RiRoIAlignRotated(nn.Module):
    """``mmcv.ops.RiRoIAlignRotated``: ``module(features, rois)`` is
    [`riroi_align_rotated`][roiops.compat.mmcv.riroi_align_rotated] with the module's
    options, checked when it is built; ``out_size`` is kept as given (MMRotate reads it).

    Args:
        out_size: an int or a tuple ``(h, w)`` of ints.
        spatial_scale: feature-map cells per input-image pixel (e.g. 1/4).
        num_samples: sample points per bin along each box axis; ``<= 0`` means adaptive.
        num_orientations: orientations per channel field.
        clockwise: the angle turns the box clockwise.

    Examples:
        >>> from roiops.compat.mmcv import RiRoIAlignRotated
        >>> layer = RiRoIAlignRotated(7, 1 / 16, num_samples=2, clockwise=True)  # MMRotate's ReDet
        >>> layer
        RiRoIAlignRotated(out_size=7, spatial_scale=0.0625, num_samples=2, num_orientations=8, clockwise=True)
        >>> x = torch.randn(1, 8, 40, 60)
        >>> rois = torch.tensor([[0, 320.0, 240.0, 200.0, 100.0, 0.5]])  # (batch_index, cx, cy, w, h, angle)
        >>> layer(x, rois).shape
        torch.Size([1, 8, 7, 7])
    """

    def __init__(self, out_size: int | tuple[int, int], spatial_scale: float, num_samples: int = 0,
                 num_orientations: int = 8, clockwise: bool = False) -> None:
        super().__init__()
        _out_size(out_size)
        self.out_size = out_size
        self.spatial_scale = v.spatial_scale(float(spatial_scale))
        self.num_samples = _sampling_ratio(num_samples)
        self.num_orientations = v.orientations(_whole(num_orientations))
        self.clockwise = v.flag("clockwise", clockwise)

    def forward(self, features: Tensor, rois: Tensor) -> Tensor:
        return riroi_align_rotated(features, rois, self.out_size, self.spatial_scale, self.num_samples,
                                   self.num_orientations, self.clockwise)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(out_size={self.out_size}, spatial_scale={self.spatial_scale}, "
                f"num_samples={self.num_samples}, num_orientations={self.num_orientations}, "
                f"clockwise={self.clockwise})")


@fx_leaf
def prroi_pool(input: Tensor, rois: Tensor, output_size: OutputSize, spatial_scale: float = 1.0) -> Tensor:
    """``mmcv.ops.prroi_pool``: Precise RoI Pooling, [`roiops.prroi_pool`][]: differentiable
    with respect to ``input`` and to ``rois`` when they require grad.

    Args:
        input: feature map ``Tensor[N, C, H, W]``.
        rois: ``Tensor[K, 5]`` of rows ``(batch_index, x1, y1, x2, y2)`` in image pixels.
        output_size: ``int`` or ``(h, w)``.
        spatial_scale: feature-map cells per input-image pixel (e.g. 1/16).

    Returns:
        ``Tensor[K, C, h, w]``.

    Examples:
        >>> from roiops.compat.mmcv import prroi_pool
        >>> x = torch.randn(1, 8, 40, 60)
        >>> rois = torch.tensor([[0, 16.0, 32.0, 320.0, 240.0]])
        >>> prroi_pool(x, rois, 7, 1 / 16).shape
        torch.Size([1, 8, 7, 7])
    """
    return F.prroi_pool(input, rois, output_size, spatial_scale)


class PrRoIPool(_SizeAndScale):
    """``mmcv.ops.PrRoIPool``: ``module(input, rois)`` is
    [`prroi_pool`][roiops.compat.mmcv.prroi_pool] with the module's options.

    Args:
        output_size: ``int`` or ``(h, w)``.
        spatial_scale: feature-map cells per input-image pixel (e.g. 1/16).

    Examples:
        >>> from roiops.compat.mmcv import PrRoIPool
        >>> x = torch.randn(1, 8, 40, 60)
        >>> rois = torch.tensor([[0, 16.0, 32.0, 320.0, 240.0]])
        >>> PrRoIPool(7, spatial_scale=1 / 16)(x, rois).shape
        torch.Size([1, 8, 7, 7])
    """

    function = prroi_pool


@fx_leaf
@box_assertions
def deform_roi_pool(input: Tensor, rois: Tensor, offset: Tensor | None, output_size: OutputSize,
                    spatial_scale: float = 1.0, sampling_ratio: int = 0, gamma: float = 0.1) -> Tensor:
    """``mmcv.ops.deform_roi_pool``: deformable RoI pooling, [`roiops.deform_roi_pool`][]
    with mmcv's signature.

    Args:
        input: feature map ``Tensor[N, C, H, W]``.
        rois: ``Tensor[K, 5]`` of rows ``(batch_index, x1, y1, x2, y2)`` in image pixels;
            other shapes raise an ``AssertionError`` ([`BoxAssertionError`][roiops.compat.BoxAssertionError]).
        offset: ``Tensor[K, 2, h, w]``, or None for no offset.
        output_size: ``int`` or ``(h, w)``.
        spatial_scale: feature-map cells per input-image pixel (e.g. 1/16).
        sampling_ratio: sample points per bin along each axis; ``<= 0`` means adaptive.
        gamma: scale of the offset.

    Returns:
        ``Tensor[K, C, h, w]``.

    Examples:
        >>> from roiops.compat.mmcv import deform_roi_pool
        >>> x = torch.randn(1, 8, 40, 60)
        >>> rois = torch.tensor([[0, 16.0, 32.0, 320.0, 240.0]])
        >>> deform_roi_pool(x, rois, torch.zeros(1, 2, 7, 7), 7, 1 / 16).shape
        torch.Size([1, 8, 7, 7])
    """
    return F.deform_roi_pool(input, rois, offset, output_size, spatial_scale, _sampling_ratio(sampling_ratio), gamma)


class DeformRoIPool(nn.Module):
    """``mmcv.ops.DeformRoIPool``: ``module(input, rois, offset=None)`` is
    [`deform_roi_pool`][roiops.compat.mmcv.deform_roi_pool] with the module's options,
    checked when it is built.

    Args:
        output_size: ``int`` or ``(h, w)``.
        spatial_scale: feature-map cells per input-image pixel (e.g. 1/16).
        sampling_ratio: sample points per bin along each axis; ``<= 0`` means adaptive.
        gamma: scale of the offset.

    Examples:
        >>> from roiops.compat.mmcv import DeformRoIPool
        >>> x = torch.randn(1, 8, 40, 60)
        >>> rois = torch.tensor([[0, 16.0, 32.0, 320.0, 240.0]])
        >>> DeformRoIPool(7, 1 / 16)(x, rois, 0.1 * torch.randn(1, 2, 7, 7)).shape
        torch.Size([1, 8, 7, 7])
    """

    def __init__(self, output_size: OutputSize, spatial_scale: float = 1.0, sampling_ratio: int = 0,
                 gamma: float = 0.1) -> None:
        super().__init__()
        self.output_size = _pair(output_size)
        self.spatial_scale = v.spatial_scale(float(spatial_scale))
        self.sampling_ratio = _sampling_ratio(sampling_ratio)
        self.gamma = v.finite("gamma", float(gamma))

    def forward(self, input: Tensor, rois: Tensor, offset: Tensor | None = None) -> Tensor:
        """Pools ``rois`` of ``input``, each bin moved by ``offset``.

        Args:
            input: feature map ``Tensor[N, C, H, W]``.
            rois: ``Tensor[K, 5]``.
            offset: ``Tensor[K, 2, h, w]``, or None for no offset.

        Returns:
            ``Tensor[K, C, h, w]``.
        """
        return deform_roi_pool(input, rois, offset, self.output_size, self.spatial_scale, self.sampling_ratio,
                               self.gamma)


def _head(*sizes: int, last: nn.Module | None = None) -> nn.Sequential:
    """Linear layers of these sizes with ReLU between them (mmcv's indices: 0, 2, 4, ...), the
    last one zero, so that the head starts by predicting 0."""
    layers: list[nn.Module] = []
    for a, b in zip(sizes[:-2], sizes[1:-1]):
        layers += [nn.Linear(a, b), nn.ReLU(inplace=True)]
    final = nn.Linear(sizes[-2], sizes[-1])
    nn.init.zeros_(final.weight)
    nn.init.zeros_(final.bias)
    return nn.Sequential(*layers, final, *([last] if last is not None else []))


class DeformRoIPoolPack(DeformRoIPool):
    """``mmcv.ops.DeformRoIPoolPack``: pools the boxes, predicts each bin's offset from the
    result (``offset_fc``: three linear layers, the last one zero at first), and pools again
    with it; ``module(input, rois)`` returns ``Tensor[K, output_channels, h, w]``.
    Parameter names and shapes are mmcv's, so a state_dict saved from mmcv's layer loads
    unchanged.

    Args:
        output_size: ``int`` or ``(h, w)``.
        output_channels: the input's channels, C.
        deform_fc_channels: width of the offset head's hidden layers.
        spatial_scale: feature-map cells per input-image pixel (e.g. 1/16).
        sampling_ratio: sample points per bin along each axis; ``<= 0`` means adaptive.
        gamma: scale of the offset.

    Examples:
        >>> from roiops.compat.mmcv import DeformRoIPoolPack
        >>> layer = DeformRoIPoolPack(7, 8, deform_fc_channels=32, spatial_scale=1 / 16)  # mmdetection's dpool
        >>> layer(torch.randn(1, 8, 40, 60), torch.tensor([[0, 16.0, 32.0, 320.0, 240.0]])).shape
        torch.Size([1, 8, 7, 7])
    """

    def __init__(self, output_size: OutputSize, output_channels: int, deform_fc_channels: int = 1024,
                 spatial_scale: float = 1.0, sampling_ratio: int = 0, gamma: float = 0.1) -> None:
        super().__init__(output_size, spatial_scale, sampling_ratio, gamma)
        self.output_channels = _positive("output_channels", output_channels)
        self.deform_fc_channels = _positive("deform_fc_channels", deform_fc_channels)
        h, w = self.output_size
        self.offset_fc = _head(h * w * self.output_channels, self.deform_fc_channels, self.deform_fc_channels,
                               h * w * 2)

    def forward(self, input: Tensor, rois: Tensor) -> Tensor:  # type: ignore[override]
        flat = self._pooled(input, rois)
        offset = self.offset_fc(flat).view(flat.size(0), 2, *self.output_size)
        return super().forward(input, rois, offset)

    def _pooled(self, input: Tensor, rois: Tensor) -> Tensor:
        """The boxes pooled without offset, one row per box (``flatten``: a reshape to ``(K,
        -1)`` fails for no boxes, an image without proposals)."""
        if input.dim() == 4 and input.size(1) != self.output_channels:
            raise ValueError(f"input has {input.size(1)} channels but the layer was built for output_channels="
                             f"{self.output_channels}")
        return super().forward(input, rois).flatten(1)


class ModulatedDeformRoIPoolPack(DeformRoIPoolPack):
    """``mmcv.ops.ModulatedDeformRoIPoolPack``: as
    [`DeformRoIPoolPack`][roiops.compat.mmcv.DeformRoIPoolPack], its output multiplied by
    a mask per box and bin that a second head predicts (``mask_fc``: two linear layers and
    a sigmoid; 0.5 at first).

    Args:
        output_size: ``int`` or ``(h, w)``.
        output_channels: the input's channels, C.
        deform_fc_channels: width of the heads' hidden layers.
        spatial_scale: feature-map cells per input-image pixel (e.g. 1/16).
        sampling_ratio: sample points per bin along each axis; ``<= 0`` means adaptive.
        gamma: scale of the offset.

    Examples:
        >>> from roiops.compat.mmcv import ModulatedDeformRoIPoolPack
        >>> layer = ModulatedDeformRoIPoolPack(7, 8, deform_fc_channels=32, spatial_scale=1 / 16)
        >>> layer(torch.randn(1, 8, 40, 60), torch.tensor([[0, 16.0, 32.0, 320.0, 240.0]])).shape
        torch.Size([1, 8, 7, 7])
    """

    def __init__(self, output_size: OutputSize, output_channels: int, deform_fc_channels: int = 1024,
                 spatial_scale: float = 1.0, sampling_ratio: int = 0, gamma: float = 0.1) -> None:
        super().__init__(output_size, output_channels, deform_fc_channels, spatial_scale, sampling_ratio, gamma)
        h, w = self.output_size
        self.mask_fc = _head(h * w * self.output_channels, self.deform_fc_channels, h * w, last=nn.Sigmoid())

    def forward(self, input: Tensor, rois: Tensor) -> Tensor:  # type: ignore[override]
        flat = self._pooled(input, rois)
        offset = self.offset_fc(flat).view(flat.size(0), 2, *self.output_size)
        mask = self.mask_fc(flat).view(flat.size(0), 1, *self.output_size)
        return DeformRoIPool.forward(self, input, rois, offset) * mask


def _positive(name: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


@fx_leaf
@box_assertions
def bezier_align(input: Tensor, beziers: Tensor, output_size: OutputSize, spatial_scale: float = 1.0,
                 sampling_ratio: int = 0, aligned: bool = True) -> Tensor:
    """``mmcv.ops.bezier_align``: ABCNet's Bezier alignment, [`roiops.bezier_align`][] with
    mmcv's signature.

    Args:
        input: feature map ``Tensor[N, C, H, W]``.
        beziers: ``Tensor[K, 17]`` of rows ``(batch_index, top curve left to right, bottom
            curve right to left)`` in image pixels; other shapes raise an
            ``AssertionError``.
        output_size: ``int`` or ``(h, w)``.
        spatial_scale: feature-map cells per input-image pixel (e.g. 1/4).
        sampling_ratio: sample points per bin along each axis; ``<= 0`` means adaptive.
        aligned: shift the bin centres by -0.5 cell.

    Returns:
        ``Tensor[K, C, h, w]``.

    Examples:
        >>> from roiops.compat.mmcv import bezier_align
        >>> beziers = torch.tensor([[0, 10.0, 20, 40, 18, 80, 18, 110, 20, 110, 40, 80, 42, 40, 42, 10, 40]])
        >>> bezier_align(torch.randn(1, 8, 50, 84), beziers, (8, 32), 1 / 4, 1).shape
        torch.Size([1, 8, 8, 32])
    """
    return F.bezier_align(input, beziers, output_size, spatial_scale, _sampling_ratio(sampling_ratio), aligned)


class BezierAlign(nn.Module):
    """``mmcv.ops.BezierAlign``: ``module(input, beziers)`` is
    [`bezier_align`][roiops.compat.mmcv.bezier_align] with the module's options, checked
    when it is built. ``spatial_scale`` and ``sampling_ratio`` have no defaults, as in
    mmcv, and are cast with ``float()`` and ``int()`` (a whole float such as MMOCR's
    ``1.0`` works; ``2.5`` raises).

    Args:
        output_size: ``int`` or ``(h, w)``.
        spatial_scale: feature-map cells per input-image pixel (e.g. 1/4).
        sampling_ratio: sample points per bin along each axis; ``<= 0`` means adaptive.
        aligned: shift the bin centres by -0.5 cell.

    Examples:
        >>> from roiops.compat.mmcv import BezierAlign
        >>> layer = BezierAlign((8, 32), 1 / 4, 1.0)  # MMOCR's ABCNet
        >>> layer
        BezierAlign(output_size=(8, 32), spatial_scale=0.25, sampling_ratio=1, aligned=True)
        >>> beziers = torch.tensor([[0, 10.0, 20, 40, 18, 80, 18, 110, 20, 110, 40, 80, 42, 40, 42, 10, 40]])
        >>> layer(torch.randn(1, 8, 50, 84), beziers).shape
        torch.Size([1, 8, 8, 32])
    """

    def __init__(self, output_size: OutputSize, spatial_scale: float, sampling_ratio: int,
                 aligned: bool = True) -> None:
        super().__init__()
        self.output_size = _pair(output_size)
        self.spatial_scale = v.spatial_scale(float(spatial_scale))
        self.sampling_ratio = _sampling_ratio(sampling_ratio)
        self.aligned = v.flag("aligned", aligned)

    def forward(self, input: Tensor, beziers: Tensor) -> Tensor:
        return bezier_align(input, beziers, self.output_size, self.spatial_scale, self.sampling_ratio, self.aligned)

    def extra_repr(self) -> str:
        return (f"output_size={self.output_size}, spatial_scale={self.spatial_scale}, "
                f"sampling_ratio={self.sampling_ratio}, aligned={self.aligned}")


@fx_leaf
@box_assertions
def border_align(input: Tensor, boxes: Tensor, pool_size: int) -> Tensor:
    """``mmcv.ops.border_align``: BorderDet's border align, [`roiops.border_align`][].

    Args:
        input: feature map ``Tensor[N, 4C, H, W]``: the top, left, bottom and right
            borders' channel groups.
        boxes: ``Tensor[N, K, 4]`` of rows ``(x1, y1, x2, y2)`` per image, in feature-map
            cells.
        pool_size: samples per border minus one, in [1, 1024].

    Returns:
        ``Tensor[N, C, K, 4]``.

    Examples:
        >>> from roiops.compat.mmcv import border_align
        >>> border_align(torch.randn(1, 4 * 8, 20, 30), torch.tensor([[[2.0, 3.0, 10.0, 9.0]]]), 10).shape
        torch.Size([1, 8, 1, 4])
    """
    return F.border_align(input, boxes, pool_size)


class BorderAlign(nn.Module):
    """``mmcv.ops.BorderAlign``: ``module(input, boxes)`` is
    [`border_align`][roiops.compat.mmcv.border_align] with the module's ``pool_size``.

    Args:
        pool_size: samples per border minus one, in [1, 1024].

    Examples:
        >>> from roiops.compat.mmcv import BorderAlign
        >>> BorderAlign(10)
        BorderAlign(pool_size=10)
    """

    def __init__(self, pool_size: int) -> None:
        super().__init__()
        self.pool_size = v.pool_size(pool_size)

    def forward(self, input: Tensor, boxes: Tensor) -> Tensor:
        return border_align(input, boxes, self.pool_size)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(pool_size={self.pool_size})"


# ---- point clouds


def _mmcv_voxels(value: object) -> tuple[int, int, int]:
    # mmcv packs a voxel's indices in 8 bits each: beyond 256 it would pool into wrong voxels.
    grid = v.voxel_grid(value)
    if max(grid) > 256:
        raise ValueError(f"out_size sides must be at most 256 (mmcv's voxel index holds 8 bits a side), got {value!r}")
    return grid


class RoIAwarePool3d(nn.Module):
    """``mmcv.ops.RoIAwarePool3d``: ``module(rois, pts, pts_feature)`` is
    [`roiops.roiaware_pool3d`][] with ``max_points = max_pts_per_voxel - 1`` (mmcv's count
    slot takes one of its ``max_pts_per_voxel``).

    Args:
        out_size: voxels per box, an int or ``(x, y, z)``, each in [1, 256].
        max_pts_per_voxel: mmcv's per-voxel capacity, >= 2: the first
            ``max_pts_per_voxel - 1`` points of a voxel are pooled.
        mode: ``"max"`` or ``"avg"``.

    Examples:
        >>> from roiops.compat.mmcv import RoIAwarePool3d
        >>> pool = RoIAwarePool3d(out_size=4, max_pts_per_voxel=128, mode="avg")
        >>> pts = torch.rand(100, 3)
        >>> pool(torch.tensor([[0.5, 0.5, 0.0, 1.0, 1.0, 1.0, 0.3]]), pts, pts).shape
        torch.Size([1, 4, 4, 4, 3])
    """

    def __init__(self, out_size: int | tuple[int, int, int], max_pts_per_voxel: int = 128, mode: str = "max") -> None:
        super().__init__()
        self.out_size = out_size
        _mmcv_voxels(out_size)
        if v.count("max_pts_per_voxel", max_pts_per_voxel) < 2:
            raise ValueError("max_pts_per_voxel must be at least 2: mmcv keeps max_pts_per_voxel - 1 points a voxel, "
                             "so 1 would pool none")
        self.max_pts_per_voxel = max_pts_per_voxel
        self.mode = {"max": 0, "avg": 1}[v.choice("mode", mode, ("max", "avg"))]

    def forward(self, rois: Tensor, pts: Tensor, pts_feature: Tensor) -> Tensor:
        return F.roiaware_pool3d(pts, pts_feature, rois, _mmcv_voxels(self.out_size), self.max_pts_per_voxel - 1,
                                 "avg" if self.mode else "max")


class RoIPointPool3d(nn.Module):
    """``mmcv.ops.RoIPointPool3d``: ``module(points, point_features, boxes3d)`` is
    [`roiops.roipoint_pool3d`][], with the empty flag as int32.

    Args:
        num_sampled_points: rows per box.

    Examples:
        >>> from roiops.compat.mmcv import RoIPointPool3d
        >>> pts = torch.rand(1, 100, 3)
        >>> pooled, empty = RoIPointPool3d(8)(pts, pts, torch.tensor([[[0.5, 0.5, 0.0, 1.0, 1.0, 1.0, 0.3]]]))
        >>> pooled.shape, empty
        (torch.Size([1, 1, 8, 6]), tensor([[0]], dtype=torch.int32))
    """

    def __init__(self, num_sampled_points: int = 512) -> None:
        super().__init__()
        self.num_sampled_points = v.count("num_sampled_points", num_sampled_points)

    def forward(self, points: Tensor, point_features: Tensor, boxes3d: Tensor) -> tuple[Tensor, Tensor]:
        pooled, empty = F.roipoint_pool3d(points, point_features, boxes3d, self.num_sampled_points)
        return pooled, empty.int()


@fx_leaf
def points_in_boxes_part(points: Tensor, boxes: Tensor) -> Tensor:
    """``mmcv.ops.points_in_boxes_part``: each point's first box, [`roiops.points_in_boxes`][].

    Args:
        points: ``Tensor[B, N, 3]``.
        boxes: ``Tensor[B, M, 7]`` of LiDAR boxes ``(x, y, z, dx, dy, dz, yaw)``, ``(x, y,
            z)`` the bottom centre.

    Returns:
        int32 ``Tensor[B, N]``: the index of the first box holding each point, -1 for none.

    Examples:
        >>> from roiops.compat.mmcv import points_in_boxes_part
        >>> points_in_boxes_part(torch.tensor([[[0.0, 0.0, 0.5], [5.0, 0.0, 0.5]]]),
        ...                      torch.tensor([[[0.0, 0.0, 0.0, 2.0, 2.0, 1.0, 0.0]]]))
        tensor([[ 0, -1]], dtype=torch.int32)
    """
    return F.points_in_boxes(v.lidar_points(points, batched=True), boxes).int()


@fx_leaf
def points_in_boxes_all(points: Tensor, boxes: Tensor) -> Tensor:
    """``mmcv.ops.points_in_boxes_all``: every box of each point, [`roiops.points_in_boxes`][].

    Args:
        points: ``Tensor[B, N, 3]``.
        boxes: ``Tensor[B, M, 7]`` of LiDAR boxes.

    Returns:
        int32 ``Tensor[B, N, M]``: 1 where the box holds the point.

    Examples:
        >>> from roiops.compat.mmcv import points_in_boxes_all
        >>> points_in_boxes_all(torch.tensor([[[0.0, 0.0, 0.5], [5.0, 0.0, 0.5]]]),
        ...                     torch.tensor([[[0.0, 0.0, 0.0, 2.0, 2.0, 1.0, 0.0]]]))
        tensor([[[1],
                 [0]]], dtype=torch.int32)
    """
    return F.points_in_boxes(v.lidar_points(points, batched=True), boxes, "all").int()


@fx_leaf
def points_in_boxes_cpu(points: Tensor, boxes: Tensor) -> Tensor:
    """``mmcv.ops.points_in_boxes_cpu``:
    [`points_in_boxes_all`][roiops.compat.mmcv.points_in_boxes_all] computed in float32, as
    mmcv's CPU kernel converts to it, on any device.

    Args:
        points: ``Tensor[B, N, 3]``.
        boxes: ``Tensor[B, M, 7]`` of LiDAR boxes.

    Returns:
        int32 ``Tensor[B, N, M]``: 1 where the box holds the point.

    Examples:
        >>> from roiops.compat.mmcv import points_in_boxes_cpu
        >>> points_in_boxes_cpu(torch.tensor([[[0.0, 0.0, 0.5]]]),
        ...                     torch.tensor([[[0.0, 0.0, 0.0, 2.0, 2.0, 1.0, 0.0]]]))
        tensor([[[1]]], dtype=torch.int32)
    """
    points = v.lidar_points(points, batched=True)
    if not isinstance(boxes, Tensor):
        raise TypeError(f"boxes must be a Tensor[B, M, 7], got {type(boxes).__name__}")
    return F.points_in_boxes(points.to(torch.float32), boxes.to(torch.float32), "all").int()
