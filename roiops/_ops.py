"""The registered ops, ``torch.ops.roiops.*``: schemas, fake kernels and autograd.

Each op's implementation hands its tensors to the kernel set ``_backend`` picks (C++ on
CPU, Triton on CUDA, the reference elsewhere). Arguments arrive normalised by
``_validation``; the kernels still check what they need to stay in bounds. The argument
orders are the kernel contract of docs/architecture.md.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import List  # noqa: UP035  (schema inference before torch 2.7 knows no list[...])

import torch
from torch import Tensor

from . import _backend


def _channels_last(t: Tensor) -> bool:
    return t.is_contiguous(memory_format=torch.channels_last) and not t.is_contiguous()


def _empty_out(input: Tensor, rois: Tensor, ph: int, pw: int, dtype: torch.dtype | None = None) -> Tensor:
    fmt = torch.channels_last if _channels_last(input) else torch.contiguous_format
    return torch.empty((rois.shape[0], input.shape[1], ph, pw), dtype=dtype or input.dtype, device=input.device,
                       memory_format=fmt)


def _empty_grad(grad: Tensor, n: int, c: int, h: int, w: int, channels_last: bool) -> Tensor:
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    return torch.empty((n, c, h, w), dtype=grad.dtype, device=grad.device, memory_format=fmt)


# ---- roi_align, mode "avg" -------------------------------------------------------------


@torch.library.custom_op("roiops::roi_align", mutates_args=())
def roi_align(
    input: Tensor, rois: Tensor, spatial_scale: float, pooled_height: int, pooled_width: int,
    sampling_ratio: int, aligned: bool,
) -> Tensor:
    return _backend.kernels(input.device).roi_align_forward(
        input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned)


@torch.library.custom_op("roiops::_roi_align_backward", mutates_args=())
def _roi_align_backward(
    grad: Tensor, rois: Tensor, spatial_scale: float, pooled_height: int, pooled_width: int,
    batch_size: int, channels: int, height: int, width: int, sampling_ratio: int, aligned: bool,
    channels_last: bool,
) -> Tensor:
    return _backend.kernels(grad.device).roi_align_backward(
        grad, rois, spatial_scale, pooled_height, pooled_width, batch_size, channels, height, width,
        sampling_ratio, aligned, channels_last)


@roi_align.register_fake
def _(input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned):
    return _empty_out(input, rois, pooled_height, pooled_width)


@_roi_align_backward.register_fake
def _(grad, rois, spatial_scale, pooled_height, pooled_width, batch_size, channels, height, width,
      sampling_ratio, aligned, channels_last):
    return _empty_grad(grad, batch_size, channels, height, width, channels_last)


def _setup_align(ctx, inputs, output):
    input, rois, spatial_scale, ph, pw, sampling_ratio, aligned = inputs
    ctx.max_mode = isinstance(output, tuple)
    # Otherwise autograd hands backward a zero tensor the size of the int argmax (51 MB
    # for a box head), costing more than a third of the backward itself.
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(rois, *(output[1:] if ctx.max_mode else ()))
    ctx.args = (spatial_scale, ph, pw, *input.shape, sampling_ratio, aligned, _channels_last(input))
    ctx.backend = _backend.current()


def _align_backward(ctx, grad, _grad_argmax=None):
    if grad is None:  # the output took no part in the loss
        return None, None, None, None, None, None, None
    rois = ctx.saved_tensors[0]
    with _backend.use_backend(ctx.backend) if ctx.backend else nullcontext():
        if ctx.max_mode:
            gi = torch.ops.roiops._roi_align_max_backward(grad, ctx.saved_tensors[1], rois, *ctx.args)
        else:
            gi = torch.ops.roiops._roi_align_backward(grad, rois, *ctx.args)
    return gi, None, None, None, None, None, None


roi_align.register_autograd(_align_backward, setup_context=_setup_align)


# ---- roi_align, mode "max" -------------------------------------------------------------


@torch.library.custom_op("roiops::roi_align_max", mutates_args=())
def roi_align_max(
    input: Tensor, rois: Tensor, spatial_scale: float, pooled_height: int, pooled_width: int,
    sampling_ratio: int, aligned: bool,
) -> tuple[Tensor, Tensor]:
    return _backend.kernels(input.device).roi_align_max_forward(
        input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned)


@torch.library.custom_op("roiops::_roi_align_max_backward", mutates_args=())
def _roi_align_max_backward(
    grad: Tensor, argmax: Tensor, rois: Tensor, spatial_scale: float, pooled_height: int,
    pooled_width: int, batch_size: int, channels: int, height: int, width: int, sampling_ratio: int,
    aligned: bool, channels_last: bool,
) -> Tensor:
    return _backend.kernels(grad.device).roi_align_max_backward(
        grad, argmax, rois, spatial_scale, pooled_height, pooled_width, batch_size, channels, height,
        width, sampling_ratio, aligned, channels_last)


@roi_align_max.register_fake
def _(input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned):
    return (_empty_out(input, rois, pooled_height, pooled_width),
            _empty_out(input, rois, pooled_height, pooled_width, torch.int32))


@_roi_align_max_backward.register_fake
def _(grad, argmax, rois, spatial_scale, pooled_height, pooled_width, batch_size, channels, height,
      width, sampling_ratio, aligned, channels_last):
    return _empty_grad(grad, batch_size, channels, height, width, channels_last)


roi_align_max.register_autograd(_align_backward, setup_context=_setup_align)


# ---- roi_pool --------------------------------------------------------------------------


@torch.library.custom_op("roiops::roi_pool", mutates_args=())
def roi_pool(
    input: Tensor, rois: Tensor, spatial_scale: float, pooled_height: int, pooled_width: int,
    continuous: bool,
) -> tuple[Tensor, Tensor]:
    return _backend.kernels(input.device).roi_pool_forward(
        input, rois, spatial_scale, pooled_height, pooled_width, continuous)


@torch.library.custom_op("roiops::_roi_pool_backward", mutates_args=())
def _roi_pool_backward(
    grad: Tensor, argmax: Tensor, rois: Tensor, batch_size: int, channels: int, height: int,
    width: int, channels_last: bool,
) -> Tensor:
    return _backend.kernels(grad.device).roi_pool_backward(
        grad, argmax, rois, batch_size, channels, height, width, channels_last)


@roi_pool.register_fake
def _(input, rois, spatial_scale, pooled_height, pooled_width, continuous):
    return (_empty_out(input, rois, pooled_height, pooled_width),
            _empty_out(input, rois, pooled_height, pooled_width, torch.int32))


@_roi_pool_backward.register_fake
def _(grad, argmax, rois, batch_size, channels, height, width, channels_last):
    return _empty_grad(grad, batch_size, channels, height, width, channels_last)


def _setup_pool(ctx, inputs, output):
    input, rois = inputs[:2]
    ctx.save_for_backward(rois, output[1])
    ctx.set_materialize_grads(False)  # no zero grad for the int argmax (see _setup_align)
    ctx.args = (*input.shape, _channels_last(input))
    ctx.backend = _backend.current()


def _pool_backward(ctx, grad, _grad_argmax):
    if grad is None:  # the output took no part in the loss
        return None, None, None, None, None, None
    rois, argmax = ctx.saved_tensors
    with _backend.use_backend(ctx.backend) if ctx.backend else nullcontext():
        gi = torch.ops.roiops._roi_pool_backward(grad, argmax, rois, *ctx.args)
    return gi, None, None, None, None, None


roi_pool.register_autograd(_pool_backward, setup_context=_setup_pool)


def _no_double_backward(op_name: str):
    def backward(ctx, *grads):
        raise RuntimeError(f"roiops: {op_name} has no double backward (gradient of its gradient); torchvision's "
                           "RoI ops have none either")
    return backward


# A clear error, instead of autograd's "no autograd formula was registered".
for _op, _name in ((_roi_align_backward, "roi_align"), (_roi_align_max_backward, "roi_align(mode='max')"),
                   (_roi_pool_backward, "roi_pool")):
    _op.register_autograd(_no_double_backward(_name))


# ---- multi-level roi_align (FPN poolers) -----------------------------------------------
#
# Box k is pooled from inputs[levels[k]] at spatial_scales[levels[k]]; a level outside
# [0, len(inputs)) gives 0. The Triton kernels do all levels in one launch; the other
# backends run their single-level kernels once per level.


def _levels_forward(kernels, inputs, rois, levels, spatial_scales, ph, pw, sampling_ratio, aligned):
    out = _empty_out(inputs[0], rois, ph, pw).zero_()
    for level, (x, scale) in enumerate(zip(inputs, spatial_scales)):
        chosen = (levels == level).nonzero().squeeze(1)  # a sync, which only CPU-side kernels reach
        if chosen.numel():
            out.index_copy_(0, chosen, kernels.roi_align_forward(x, rois[chosen], scale, ph, pw, sampling_ratio,
                                                                 aligned))
    return out


def _levels_backward(kernels, grad, rois, levels, spatial_scales, ph, pw, batch_size, channels, heights, widths,
                     sampling_ratio, aligned, channels_last):
    grads = []
    for level, (scale, h, w) in enumerate(zip(spatial_scales, heights, widths)):
        chosen = (levels == level).nonzero().squeeze(1)
        grads.append(kernels.roi_align_backward(grad[chosen], rois[chosen], scale, ph, pw, batch_size, channels, h, w,
                                                sampling_ratio, aligned, channels_last))
    return grads


@torch.library.custom_op("roiops::multi_scale_roi_align", mutates_args=())
def multi_scale_roi_align(
    inputs: List[Tensor], rois: Tensor, levels: Tensor, spatial_scales: List[float], pooled_height: int,
    pooled_width: int, sampling_ratio: int, aligned: bool,
) -> Tensor:
    kernels = _backend.kernels(rois.device)
    if hasattr(kernels, "multi_scale_roi_align_forward"):
        return kernels.multi_scale_roi_align_forward(inputs, rois, levels, spatial_scales, pooled_height,
                                                     pooled_width, sampling_ratio, aligned)
    return _levels_forward(kernels, inputs, rois, levels, spatial_scales, pooled_height, pooled_width,
                           sampling_ratio, aligned)


@torch.library.custom_op("roiops::_multi_scale_roi_align_backward", mutates_args=())
def _multi_scale_roi_align_backward(
    grad: Tensor, rois: Tensor, levels: Tensor, spatial_scales: List[float], pooled_height: int, pooled_width: int,
    batch_size: int, channels: int, heights: List[int], widths: List[int], sampling_ratio: int, aligned: bool,
    channels_last: bool,
) -> List[Tensor]:
    kernels = _backend.kernels(grad.device)
    args = (grad, rois, levels, spatial_scales, pooled_height, pooled_width, batch_size, channels, heights, widths,
            sampling_ratio, aligned, channels_last)
    if hasattr(kernels, "multi_scale_roi_align_backward"):
        return kernels.multi_scale_roi_align_backward(*args)
    return _levels_backward(kernels, *args)


@multi_scale_roi_align.register_fake
def _(inputs, rois, levels, spatial_scales, pooled_height, pooled_width, sampling_ratio, aligned):
    return _empty_out(inputs[0], rois, pooled_height, pooled_width)


@_multi_scale_roi_align_backward.register_fake
def _(grad, rois, levels, spatial_scales, pooled_height, pooled_width, batch_size, channels, heights, widths,
      sampling_ratio, aligned, channels_last):
    return [_empty_grad(grad, batch_size, channels, h, w, channels_last) for h, w in zip(heights, widths)]


def _setup_levels(ctx, inputs, output):
    maps, rois, levels, spatial_scales, ph, pw, sampling_ratio, aligned = inputs
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(rois, levels)
    ctx.args = (spatial_scales, ph, pw, maps[0].shape[0], maps[0].shape[1], [x.shape[2] for x in maps],
                [x.shape[3] for x in maps], sampling_ratio, aligned, _channels_last(maps[0]))
    ctx.backend = _backend.current()


def _levels_grad(ctx, grad):
    if grad is None:  # a list input takes a list of gradients
        return [None] * len(ctx.args[5]), None, None, None, None, None, None, None
    rois, levels = ctx.saved_tensors
    with _backend.use_backend(ctx.backend) if ctx.backend else nullcontext():
        grads = torch.ops.roiops._multi_scale_roi_align_backward(grad, rois, levels, *ctx.args)
    return grads, None, None, None, None, None, None, None


multi_scale_roi_align.register_autograd(_levels_grad, setup_context=_setup_levels)
