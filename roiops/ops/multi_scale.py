"""Multi-level (FPN) RoIAlign: the level rules, its registered ops and public function.
Semantics: docs/semantics.md, "multi_scale_roi_align".

Box k is pooled from inputs[levels[k]] at spatial_scales[levels[k]]; a level outside
[0, len(inputs)) gives 0. The Triton kernels do all levels in one launch; the other
backends run their single-level kernels once per level.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from contextlib import nullcontext
from types import ModuleType
from typing import Any, Literal

import torch
from torch import Tensor

from .. import _backend
from .. import _validation as v
from .._geometry import MAX_LEVELS, is_channels_last
from .._validation import BoxesType, OutputSize
from . import roi_align as _single_level  # noqa: F401  (the per-level kernels' ops)
from ._declare import (backward_call, define, direct, empty_grad, empty_output, fx_leaf,
                       refuse_double_backward, register_autograd)

#: What users call it (the command line's list of operators; the other operators' specs
#: hold theirs).
TITLE = "multi-scale RoIAlign (FPN)"


def fpn_levels(rois: Tensor, k_min: int, k_max: int, canonical_box_size: float = 224.0, canonical_level: int = 4,
               rule: Literal["torchvision", "detectron2"] = "torchvision", eps: float = 1e-6) -> Tensor:
    """FPN level of each box (Feature Pyramid Networks, eq. 1), as an int64 offset from
    ``k_min``, computed on the boxes' device (no host synchronisation).

    The level is ``floor(canonical_level + log2(sqrt(area) / canonical_box_size) + eps)``
    with ``rule="torchvision"``, ``floor(canonical_level + log2(sqrt(area) /
    canonical_box_size + 1e-8))`` with ``rule="detectron2"``, both in the boxes' dtype, as
    those libraries compute them, clamped to ``[k_min, k_max]``.

    Args:
        rois: ``Tensor[K, 5]`` of rows ``(batch_index, x1, y1, x2, y2)`` in input-image
            pixels.
        k_min: the finest level (2 for a stride-4 map).
        k_max: the coarsest level.
        canonical_box_size: a box of this size (the square root of its area, in pixels)
            goes to ``canonical_level``.
        canonical_level: the level of a box of ``canonical_box_size``.
        rule: ``"torchvision"`` (``MultiScaleRoIAlign``) or ``"detectron2"``
            (``ROIPooler``).
        eps: added before the floor with ``rule="torchvision"``.

    Returns:
        ``Tensor[K]`` of int64, ``level - k_min``; -1 for a box of negative area, which has
        no level (it pools to 0).

    Examples:
        >>> rois = torch.tensor([[0, 0.0, 0.0, 32.0, 32.0], [0, 0.0, 0.0, 224.0, 224.0],
        ...                      [0, 0.0, 0.0, 900.0, 900.0], [0, 10.0, 10.0, 0.0, 20.0]])
        >>> roiops.fpn_levels(rois, 2, 5)
        tensor([ 0,  2,  3, -1])
    """
    return levels_of(rois, k_min, k_max, float(canonical_box_size), canonical_level, rule == "torchvision", eps)


def levels_of(rois: Tensor, k_min: int, k_max: int, canonical_box_size: float, canonical_level: int,
              torchvision_rule: bool, eps: float) -> Tensor:
    """:func:`fpn_levels` in the subset of Python that TorchScript compiles (the scripted
    torchvision drop-in calls it)."""
    size = ((rois[:, 3] - rois[:, 1]) * (rois[:, 4] - rois[:, 2])).sqrt()
    if torchvision_rule:
        level = (torch.log2(size / canonical_box_size) + canonical_level) + torch.tensor(eps, dtype=size.dtype)
    else:
        level = torch.log2(size / canonical_box_size + 1e-8) + canonical_level
    level = level.floor().clamp(min=k_min, max=k_max)
    return torch.where(level.isnan(), k_min - 1, level).to(torch.int64) - k_min


@fx_leaf
def multi_scale_roi_align(
    features: Sequence[Tensor],
    boxes: BoxesType,
    output_size: OutputSize,
    spatial_scales: Sequence[float],
    sampling_ratio: int = -1,
    aligned: bool = False,
    *,
    level_rule: Literal["torchvision", "detectron2"] = "torchvision",
    canonical_box_size: float = 224.0,
    canonical_level: int = 4,
) -> Tensor:
    """Multi-level (FPN) RoIAlign, mode ``"avg"``: each box is pooled from the feature map
    its size selects.

    The level of a box is [`roiops.fpn_levels`][] with ``level_rule`` (torchvision's
    ``MultiScaleRoIAlign`` or detectron2's ``ROIPooler``); the result equals
    [`roiops.roi_align`][] on each box's level. On CUDA the levels are chosen on the device
    and all levels run in one kernel launch per pass (no host synchronisation); on the CPU
    each level runs the CPU kernels. Semantics: docs/semantics.md, "multi_scale_roi_align".

    Args:
        features: 1 to 5 maps ``[N, C, H_l, W_l]``, finest first, same N, C, dtype and
            device (channels_last if the first one is).
        boxes: ``Tensor[K, 5]`` with rows ``(batch_index, x1, y1, x2, y2)``, or a list of N
            ``Tensor[L_i, 4]``, in input-image pixels.
        output_size: ``int`` or ``(h, w)``.
        spatial_scales: one per map, consecutive powers of two, e.g. ``[1/4, 1/8, 1/16,
            1/32]``.
        sampling_ratio: sample points per bin along each axis; ``<= 0`` means adaptive, as
            for [`roiops.roi_align`][].
        aligned: shift box corners by -0.5 cell, as for [`roiops.roi_align`][].
        level_rule: ``"torchvision"`` or ``"detectron2"``: the level formula (see
            [`roiops.fpn_levels`][]).
        canonical_box_size: a box of this size (pixels) goes to ``canonical_level``.
        canonical_level: the level of a box of ``canonical_box_size``.

    Returns:
        ``Tensor[K, C, h, w]`` in box order; a box of negative area has no level and gives
        0.

    Examples:
        >>> maps = [torch.randn(2, 16, 200 // 2**i, 336 // 2**i) for i in range(4)]  # P2-P5
        >>> boxes = [torch.tensor([[10.0, 20.0, 300.0, 250.0]]), torch.tensor([[0.0, 0.0, 64.0, 64.0]])]
        >>> roiops.multi_scale_roi_align(maps, boxes, 7, [1 / 4, 1 / 8, 1 / 16, 1 / 32], 2).shape
        torch.Size([2, 16, 7, 7])
    """
    maps = v.feature_maps(features)
    scales = v.spatial_scales(spatial_scales, len(maps), pyramid=True)
    k_min = -int(math.log2(scales[0]))
    h, w = v.output_size(output_size)
    ratio = v.sampling_ratio(sampling_ratio)
    aligned = v.flag("aligned", aligned)
    rule = v.choice("level_rule", level_rule, ("torchvision", "detectron2"))
    rois = v.rois(maps[0], boxes, max(scales))
    levels = fpn_levels(rois, k_min, k_min + len(maps) - 1, canonical_box_size, canonical_level,
                        rule)  # type: ignore[arg-type]
    return multi_scale_call(maps, rois, levels, scales, h, w, ratio, aligned)


def _levels_forward(kernels: ModuleType, inputs: list[Tensor], rois: Tensor, levels: Tensor,
                    spatial_scales: list[float], ph: int, pw: int, sampling_ratio: int, aligned: bool) -> Tensor:
    out = empty_output(inputs[0], rois, ph, pw).zero_()
    for level, (x, scale) in enumerate(zip(inputs, spatial_scales)):
        chosen = (levels == level).nonzero().squeeze(1)  # a sync, which only CPU-side kernels reach
        if chosen.numel():
            out.index_copy_(0, chosen, kernels.roi_align_forward(x, rois[chosen], scale, ph, pw, sampling_ratio,
                                                                 aligned))
    return out


def _levels_backward(kernels: ModuleType, grad: Tensor, rois: Tensor, levels: Tensor, spatial_scales: list[float],
                     ph: int, pw: int, batch_size: int, channels: int, heights: list[int], widths: list[int],
                     sampling_ratio: int, aligned: bool, channels_last: bool) -> list[Tensor]:
    grads = []
    for level, (scale, h, w) in enumerate(zip(spatial_scales, heights, widths)):
        chosen = (levels == level).nonzero().squeeze(1)
        grads.append(kernels.roi_align_backward(grad[chosen], rois[chosen], scale, ph, pw, batch_size, channels, h, w,
                                                sampling_ratio, aligned, channels_last))
    return grads


def _level_count(count: int, *per_level: list[Any]) -> None:
    if not 1 <= count <= MAX_LEVELS or any(len(values) != count for values in per_level):
        raise ValueError(f"roiops: multi_scale_roi_align takes 1 to {MAX_LEVELS} levels, each with its scale and "
                         f"size, got {count} levels and lists of {[len(values) for values in per_level]}")


def _multi_scale_forward(inputs: list[Tensor], rois: Tensor, levels: Tensor, spatial_scales: list[float],
                         pooled_height: int, pooled_width: int, sampling_ratio: int, aligned: bool) -> Tensor:
    kernels = _backend.kernels_of(rois)
    if hasattr(kernels, "multi_scale_roi_align_forward"):
        # One kernel reads every level with the first's layout: check them as the public
        # function does, for direct op calls (the per-level kernels check their own).
        _level_count(len(v.feature_maps(inputs)), spatial_scales)
        return kernels.multi_scale_roi_align_forward(inputs, rois, levels, spatial_scales, pooled_height,
                                                     pooled_width, sampling_ratio, aligned)
    return _levels_forward(kernels, inputs, rois, levels, spatial_scales, pooled_height, pooled_width,
                           sampling_ratio, aligned)


def _multi_scale_backward(grad: Tensor, rois: Tensor, levels: Tensor, spatial_scales: list[float],
                          pooled_height: int, pooled_width: int, batch_size: int, channels: int, heights: list[int],
                          widths: list[int], sampling_ratio: int, aligned: bool, channels_last: bool) -> list[Tensor]:
    kernels = _backend.kernels_of(grad)
    args = (grad, rois, levels, spatial_scales, pooled_height, pooled_width, batch_size, channels, heights, widths,
            sampling_ratio, aligned, channels_last)
    if hasattr(kernels, "multi_scale_roi_align_backward"):
        _level_count(len(heights), spatial_scales, widths)
        return kernels.multi_scale_roi_align_backward(*args)
    return _levels_backward(kernels, *args)


def _multi_scale_forward_fake(inputs: list[Tensor], rois: Tensor, levels: Tensor, spatial_scales: list[float],
                              pooled_height: int, pooled_width: int, sampling_ratio: int, aligned: bool) -> Tensor:
    return empty_output(inputs[0], rois, pooled_height, pooled_width)


def _multi_scale_backward_fake(grad: Tensor, rois: Tensor, levels: Tensor, spatial_scales: list[float],
                               pooled_height: int, pooled_width: int, batch_size: int, channels: int,
                               heights: list[int], widths: list[int], sampling_ratio: int, aligned: bool,
                               channels_last: bool) -> list[Tensor]:
    return [empty_grad(grad, batch_size, channels, h, w, channels_last) for h, w in zip(heights, widths)]


_multi_scale_roi_align_op = define(
    "multi_scale_roi_align",
    "(Tensor[] inputs, Tensor rois, Tensor levels, float[] spatial_scales, int pooled_height, int pooled_width, "
    "int sampling_ratio, bool aligned) -> Tensor",
    _multi_scale_forward, _multi_scale_forward_fake)
_multi_scale_roi_align_backward = define(
    "_multi_scale_roi_align_backward",
    "(Tensor grad, Tensor rois, Tensor levels, float[] spatial_scales, int pooled_height, int pooled_width, "
    "int batch_size, int channels, int[] heights, int[] widths, int sampling_ratio, bool aligned, "
    "bool channels_last) -> Tensor[]",
    _multi_scale_backward, _multi_scale_backward_fake)


def _setup_levels(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    maps, rois, levels, spatial_scales, ph, pw, sampling_ratio, aligned = inputs
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(rois, levels)
    ctx.args = (spatial_scales, ph, pw, maps[0].shape[0], maps[0].shape[1], [x.shape[2] for x in maps],
                [x.shape[3] for x in maps], sampling_ratio, aligned, is_channels_last(maps[0]))
    ctx.backend = _backend.current()
    ctx.no_grads = (None,) * (len(inputs) - 1)  # for the arguments after the maps


_levels_backward_call = backward_call(_multi_scale_roi_align_backward, _multi_scale_backward)


def _levels_grad(ctx: Any, grad: Tensor | None) -> tuple[Any, ...]:
    if grad is None:  # a list input takes a list of gradients
        return [None] * len(ctx.args[5]), *ctx.no_grads
    rois, levels = ctx.saved_tensors
    with _backend.use_backend(ctx.backend) if ctx.backend else nullcontext():
        grads = _levels_backward_call(grad, rois, levels, *ctx.args)
    return grads, *ctx.no_grads


register_autograd(_multi_scale_roi_align_op, _levels_grad, _setup_levels)
refuse_double_backward(_multi_scale_roi_align_backward, "multi_scale_roi_align")


class _Direct(torch.autograd.Function):
    """The op's autograd formula around its kernels for calls ``direct`` allows; the maps
    come last and one by one, so that each gets its gradient."""

    @staticmethod
    def forward(ctx: Any, rois: Tensor, levels: Tensor, spatial_scales: list[float], ph: int, pw: int,
                sampling_ratio: int, aligned: bool, *maps: Tensor) -> Tensor:
        inputs = (list(maps), rois, levels, spatial_scales, ph, pw, sampling_ratio, aligned)
        out = _multi_scale_forward(*inputs)
        _setup_levels(ctx, inputs, out)
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        grads = _levels_grad(ctx, grad)[0]
        return (None,) * 7 + tuple(grads)


def multi_scale_call(maps: list[Tensor], rois: Tensor, levels: Tensor, spatial_scales: list[float], ph: int, pw: int,
                     sampling_ratio: int, aligned: bool) -> Tensor:
    """``roiops::multi_scale_roi_align``, or where ``direct`` allows, its kernels with the
    same autograd formula."""
    if not direct(rois, levels, *maps):
        return _multi_scale_roi_align_op(maps, rois, levels, spatial_scales, ph, pw, sampling_ratio, aligned)
    if torch.is_grad_enabled() and any(m.requires_grad for m in maps):
        return _Direct.apply(rois, levels, spatial_scales, ph, pw, sampling_ratio, aligned, *maps)
    return _multi_scale_forward(maps, rois, levels, spatial_scales, ph, pw, sampling_ratio, aligned)
