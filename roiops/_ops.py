"""The registered ops, ``torch.ops.roiops.*``: schemas, fake kernels and autograd.

Each op's implementation hands its tensors to the kernel set ``_backend`` picks (C++ on
CPU, Triton on CUDA, the reference elsewhere). Arguments arrive normalised by
``_validation``; the kernels still check what they need to stay in bounds. The argument
orders are the kernel contract of docs/architecture.md.
"""

from __future__ import annotations

from contextlib import nullcontext

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
