"""Border align in Triton (docs/semantics.md, "border_align").

One program per (image, border, block of boxes, block of channels), a [boxes x channels]
tile: a box's walk (its start and step, the samples placed by repeated addition) is
computed once per program row and shared by the channels. A box with a coordinate that is
not finite or lies beyond 2^24 cells is masked: zeros and argmax 0 in forward, nothing
scattered in backward (the CPU kernels raise).

Backward
--------
Each output's grad goes to the four taps of its argmax sample, at the point the forward's
walk reached (the walk replayed up to the argmax). Fast path: atomic adds from the
forward's tiles (float32 scratch for half types), in a run-dependent order. Deterministic
path: one program per (image, border, block of channels) adds its boxes one after another
in increasing k; each gradient address belongs to one program, whose adds to it follow
program order, so the sums are bit-identical from run to run. It has N * 4 * (C / block)
programs, each looping over all K boxes: far fewer programs than the fast path.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._geometry import dense, is_channels_last, memory_format
from .._kernel_checks import kernel_check
from ._common import LAUNCH_OPTS, cdiv, check_device, from_atomic, grad_input, kernel, next_pow2, opmath, \
    use_deterministic
from ._jit import MAX_COORD, axis_taps, beats, div_rn

__all__ = ["border_align_backward", "border_align_forward"]


@triton.jit
def _walk(rois_ptr, n, k, km, K, e, pool_size):
    """Box k's border e (k a vector, masked by km): (ok, x, y, step, along_x) of its walk,
    x and y its start point; ok is False for a box that is not finite or beyond 2^24
    cells (whose walk is then a harmless one at 0)."""
    base = rois_ptr + (n.to(tl.int64) * K + k) * 4
    x1 = tl.load(base, mask=km, other=0.0)
    y1 = tl.load(base + 1, mask=km, other=0.0)
    x2 = tl.load(base + 2, mask=km, other=0.0)
    y2 = tl.load(base + 3, mask=km, other=0.0)
    ok = km & (tl.abs(x1) <= MAX_COORD) & (tl.abs(y1) <= MAX_COORD) & (tl.abs(x2) <= MAX_COORD) & \
        (tl.abs(y2) <= MAX_COORD)
    x1 = tl.where(ok, x1, 0.0)
    y1 = tl.where(ok, y1, 0.0)
    x2 = tl.where(ok, x2, 0.0)
    y2 = tl.where(ok, y2, 0.0)
    along_x = e % 2 == 0
    first = e < 2
    n_steps = pool_size.to(x1.dtype)
    side = tl.where(along_x, div_rn(x2 - x1, n_steps), div_rn(y2 - y1, n_steps))
    step = tl.where(first, side, -side)
    return ok, tl.where(first, x1, x2), tl.where(first, y1, y2), step, along_x


@triton.jit
def _sample_taps(p, x, y, along_x, H, W):
    """The bilinear taps of the sample at moving coordinate p of a walk from (x, y):
    (cells y_lo, y_hi, x_lo, x_hi and weights w1..w4 in the sum's order, inside)."""
    px = tl.where(along_x, p, x)
    py = tl.where(along_x, y, p)
    ylo, yhi, ly, hy, yin = axis_taps(py, H)
    xlo, xhi, lx, hx, xin = axis_taps(px, W)
    return ylo, yhi, xlo, xhi, hy * hx, hy * lx, ly * hx, ly * lx, yin & xin


@triton.jit
def _box_tile(K, C, n_kblocks, BLOCK_K: tl.constexpr, BLOCK_C: tl.constexpr):
    """A per-box program's (image, border, boxes and their mask, channels and their mask)."""
    pid = tl.program_id(0)
    kb = pid % n_kblocks
    e = (pid // n_kblocks) % 4
    n = pid // (n_kblocks * 4)
    k = kb * BLOCK_K + tl.arange(0, BLOCK_K)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    return n, e, k, k < K, c, c < C


@kernel
def _border_fwd_kernel(
    x_ptr, rois_ptr, out_ptr, arg_ptr,
    C, H, W, K, pool_size, n_kblocks,
    sxN, sxC, sxH, sxW, soN, soC, soK, soE,
    BLOCK_K: tl.constexpr, BLOCK_C: tl.constexpr,
):
    T = rois_ptr.dtype.element_ty
    n, e, k, km, c, cm = _box_tile(K, C, n_kblocks, BLOCK_K, BLOCK_C)
    ok, x, y, step, along_x = _walk(rois_ptr, n, k, km, K, e, pool_size)
    m = ok[:, None] & cm[None, :]
    x_base = x_ptr + n.to(tl.int64) * sxN + ((e * C + c).to(tl.int64) * sxC)[None, :]
    p = tl.where(along_x, x, y)
    best = tl.zeros([BLOCK_K, BLOCK_C], dtype=T)
    arg = tl.zeros([BLOCK_K, BLOCK_C], dtype=tl.int32)
    for i in range(0, pool_size + 1):
        ylo, yhi, xlo, xhi, w1, w2, w3, w4, inside = _sample_taps(p, x, y, along_x, H, W)
        mi = m & inside[:, None]
        oylo = (ylo.to(tl.int64) * sxH)[:, None]
        oyhi = (yhi.to(tl.int64) * sxH)[:, None]
        oxlo = (xlo.to(tl.int64) * sxW)[:, None]
        oxhi = (xhi.to(tl.int64) * sxW)[:, None]
        v1 = tl.load(x_base + oylo + oxlo, mask=mi, other=0.0).to(T)
        v2 = tl.load(x_base + oylo + oxhi, mask=mi, other=0.0).to(T)
        v3 = tl.load(x_base + oyhi + oxlo, mask=mi, other=0.0).to(T)
        v4 = tl.load(x_base + oyhi + oxhi, mask=mi, other=0.0).to(T)
        v = ((w1[:, None] * v1 + w2[:, None] * v2) + w3[:, None] * v3) + w4[:, None] * v4
        v = tl.where(mi, v, 0.0)
        take = beats(v, best, i == 0)
        best = tl.where(take, v, best)
        arg = tl.where(take, i, arg)
        p = p + step
    o = n.to(tl.int64) * soN + (c.to(tl.int64) * soC)[None, :] + (k.to(tl.int64) * soK)[:, None] + e * soE
    om = km[:, None] & cm[None, :]
    tl.store(out_ptr + o, best.to(out_ptr.dtype.element_ty), mask=om)
    tl.store(arg_ptr + o, arg, mask=om)


@triton.jit
def _scatter(a, m, p0, x, y, step, along_x, pool_size, H, W):
    """The taps of the sample each argmax a names (m: the outputs that scatter, less those
    outside the map): the walk from p0 is replayed, steps added one after another as the
    forward placed its samples. (To the end of the walk: a loop up to the tile's largest
    argmax, a reduction, does not compile for float64 under Triton 3.6.)"""
    T = p0.dtype
    p = p0
    at = tl.zeros(a.shape, dtype=T) + p0[:, None]
    for i in range(1, pool_size + 1):
        p = p + step
        at = tl.where(a == i, p[:, None], at)
    ylo, yhi, xlo, xhi, w1, w2, w3, w4, inside = _sample_taps(at, x[:, None], y[:, None], along_x, H, W)
    m = m & inside
    return m, ylo, yhi, xlo, xhi, w1, w2, w3, w4


@triton.jit
def _add_grads(grad_ptr, arg_ptr, gi_ptr, n, e, C, k, c, m, x, y, step, along_x, pool_size, H, W,
               sgN, sgC, sgK, sgE, saN, saC, saK, saE, siN, siC, siH, siW):
    """Adds the grads of a [boxes x channels] tile (m: the outputs that scatter; k and c as
    [boxes, 1] and [1, channels]) at the taps of their argmax samples."""
    n64 = n.to(tl.int64)
    c64 = c.to(tl.int64)
    k64 = k.to(tl.int64)
    a = tl.load(arg_ptr + n64 * saN + c64 * saC + k64 * saK + e * saE, mask=m, other=0)
    m = m & (a >= 0) & (a <= pool_size)
    g = tl.load(grad_ptr + n64 * sgN + c64 * sgC + k64 * sgK + e * sgE, mask=m, other=0.0).to(step.dtype)
    m, ylo, yhi, xlo, xhi, w1, w2, w3, w4 = _scatter(a, m, tl.where(along_x, x, y), x, y, step, along_x, pool_size, H, W)
    dst = gi_ptr + n64 * siN + (e * C + c64) * siC
    dtype = gi_ptr.dtype.element_ty
    oylo = ylo.to(tl.int64) * siH
    oyhi = yhi.to(tl.int64) * siH
    oxlo = xlo.to(tl.int64) * siW
    oxhi = xhi.to(tl.int64) * siW
    tl.atomic_add(dst + oylo + oxlo, (g * w1).to(dtype), mask=m, sem="relaxed")
    tl.atomic_add(dst + oylo + oxhi, (g * w2).to(dtype), mask=m, sem="relaxed")
    tl.atomic_add(dst + oyhi + oxlo, (g * w3).to(dtype), mask=m, sem="relaxed")
    tl.atomic_add(dst + oyhi + oxhi, (g * w4).to(dtype), mask=m, sem="relaxed")


@kernel
def _border_bwd_atomic_kernel(
    grad_ptr, arg_ptr, rois_ptr, gi_ptr,
    C, H, W, K, pool_size, n_kblocks,
    sgN, sgC, sgK, sgE, saN, saC, saK, saE, siN, siC, siH, siW,
    BLOCK_K: tl.constexpr, BLOCK_C: tl.constexpr,
):
    n, e, k, km, c, cm = _box_tile(K, C, n_kblocks, BLOCK_K, BLOCK_C)
    ok, x, y, step, along_x = _walk(rois_ptr, n, k, km, K, e, pool_size)
    _add_grads(grad_ptr, arg_ptr, gi_ptr, n, e, C, k[:, None], c[None, :], ok[:, None] & cm[None, :], x, y, step,
               along_x, pool_size, H, W, sgN, sgC, sgK, sgE, saN, saC, saK, saE, siN, siC, siH, siW)


@kernel
def _border_bwd_ordered_kernel(
    grad_ptr, arg_ptr, rois_ptr, gi_ptr,
    C, H, W, K, pool_size, n_cblocks,
    sgN, sgC, sgK, sgE, saN, saC, saK, saE, siN, siC, siH, siW,
    BLOCK_C: tl.constexpr,
):
    """The deterministic backward: this program alone adds to its (image, border, block of
    channels) of the gradient, box after box, so its adds to an address follow program
    order."""
    pid = tl.program_id(0)
    cb = pid % n_cblocks
    e = (pid // n_cblocks) % 4
    n = pid // (n_cblocks * 4)
    c = cb * BLOCK_C + tl.arange(0, BLOCK_C)
    cm = c < C
    one = tl.arange(0, 1)
    for k0 in range(0, K):
        k = k0 + one
        ok, x, y, step, along_x = _walk(rois_ptr, n, k, k < K, K, e, pool_size)
        _add_grads(grad_ptr, arg_ptr, gi_ptr, n, e, C, k[:, None], c[None, :], ok[:, None] & cm[None, :], x, y,
                   step, along_x, pool_size, H, W, sgN, sgC, sgK, sgE, saN, saC, saK, saE, siN, siC, siH, siW)


# ----------------------------------------------------------------------------- launchers

_check_forward = kernel_check("border_align")
_check_backward = kernel_check("border_align", "backward")


def _blocks(K: int, C: int, on_cpu: bool) -> tuple[int, int]:
    """(BLOCK_K, BLOCK_C): channels first (contiguous in channels_last), then boxes, 256
    elements on the GPU (the interpreter takes as many as it can)."""
    budget = 1 << 14 if on_cpu else 256
    block_c = min(next_pow2(C), 64)
    return max(1, min(next_pow2(K), budget // block_c)), block_c


def border_align_forward(input: torch.Tensor, rois: torch.Tensor, pool_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Border align forward: (out, argmax int32, the index of the winning sample along its
    border), both [N, C, K, 4] in the input's dtype and memory format."""
    _check_forward(input, rois, pool_size)
    check_device(input, _border_fwd_kernel)
    N, C4, H, W = input.shape
    C, K = C4 // 4, rois.shape[1]
    rois = dense(rois, opmath(input.dtype))
    fmt = memory_format(is_channels_last(input))
    out = torch.empty((N, C, K, 4), dtype=input.dtype, device=input.device, memory_format=fmt)
    argmax = torch.empty((N, C, K, 4), dtype=torch.int32, device=input.device, memory_format=fmt)
    if out.numel():
        block_k, block_c = _blocks(K, C, input.is_cpu)
        n_kb = cdiv(K, block_k)
        _border_fwd_kernel[(N * 4 * n_kb, cdiv(C, block_c))](
            input, rois, out, argmax, C, H, W, K, int(pool_size), n_kb, *input.stride(), *out.stride(),
            BLOCK_K=block_k, BLOCK_C=block_c, **LAUNCH_OPTS)
    return out, argmax


def border_align_backward(grad: torch.Tensor, argmax: torch.Tensor, rois: torch.Tensor, pool_size: int,
                          batch_size: int, channels: int, height: int, width: int, channels_last: bool, *,
                          deterministic: bool | None = None) -> torch.Tensor:
    """Gradient of border_align_forward with respect to the input: each output's grad at
    the taps of its argmax sample.

    deterministic: None follows roiops.config.deterministic_backward, then torch's
    deterministic flag; see the module docstring for what the deterministic path costs.
    """
    _check_backward(grad, argmax, rois, pool_size, batch_size, channels, height, width, channels_last)
    check_device(grad, _border_bwd_atomic_kernel)
    N, C4, H, W = int(batch_size), int(channels), int(height), int(width)
    C, K = C4 // 4, rois.shape[1]
    rois = dense(rois, opmath(grad.dtype))
    gi = grad_input(grad, N, C4, H, W, bool(channels_last), atomic=True)
    if grad.numel() == 0:
        return from_atomic(gi, grad.dtype)
    block_k, block_c = _blocks(K, C, grad.is_cpu)
    strides = (*grad.stride(), *argmax.stride(), *gi.stride())
    if use_deterministic(deterministic):
        n_cb = cdiv(C, block_c)
        _border_bwd_ordered_kernel[(N * 4 * n_cb,)](grad, argmax, rois, gi, C, H, W, K, int(pool_size), n_cb,
                                                    *strides, BLOCK_C=block_c, **LAUNCH_OPTS)
    else:
        if rois.dtype == torch.float64 and not grad.is_cpu:
            block_k = 1  # Triton 3.6 fails to compile the float64 kernel for a tile of several boxes
        n_kb = cdiv(K, block_k)
        _border_bwd_atomic_kernel[(N * 4 * n_kb, cdiv(C, block_c))](
            grad, argmax, rois, gi, C, H, W, K, int(pool_size), n_kb, *strides, BLOCK_K=block_k, BLOCK_C=block_c,
            **LAUNCH_OPTS)
    return from_atomic(gi, grad.dtype)
