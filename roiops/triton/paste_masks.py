"""Mask pasting in Triton (docs/semantics.md, "paste_masks"): one program per (box, tile of
BLOCK_H x BLOCK_W image pixels), every pixel of the output written once (the mask's
value inside the box's reach, 0 elsewhere), in the C++ kernels' arithmetic: the
continuous rule (detectron2's grid_sample) and torchvision's resize of the padded mask.
Division is div_rn and the fused multiply-adds are explicit tl.fma (fp fusion is off):
compiled, both round as the CPU kernels do. Triton's interpreter evaluates tl.fma as a
multiply and an add, so under it the last bit may differ where the CPU fuses."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import _kernel_checks as checks
from ._common import LAUNCH_OPTS, cdiv, check_device, f64_bits, kernel
from ._jit import div_rn, scale_of

__all__ = ["paste_masks_forward", "paste_masks_torchvision_forward"]

# ATen's resize sums four products in one pass while the output's height plus width is at
# most this, in two passes beyond (csrc/paste_masks.cpp).
ONE_PASS_SIDES = tl.constexpr(128)


@kernel
def _paste_kernel(masks_ptr, boxes_ptr, out_ptr, thr_bits, H, W, MH, MW, n_tw, n_tiles,
                  BINARY: tl.constexpr, WINDOW: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_W: tl.constexpr):
    pid = tl.program_id(0)
    k = (pid // n_tiles).to(tl.int64)
    t = pid % n_tiles
    r = (t // n_tw) * BLOCK_H + tl.arange(0, BLOCK_H)
    c = (t % n_tw) * BLOCK_W + tl.arange(0, BLOCK_W)
    T = boxes_ptr.dtype.element_ty
    x1 = tl.load(boxes_ptr + 4 * k)
    y1 = tl.load(boxes_ptr + 4 * k + 1)
    x2 = tl.load(boxes_ptr + 4 * k + 2)
    y2 = tl.load(boxes_ptr + 4 * k + 3)
    # detectron2's grid coordinate, then grid_sample's unnormalisation
    gx = div_rn(c.to(T) + 0.5 - x1, x2 - x1) * 2 - 1
    gy = div_rn(r.to(T) + 0.5 - y1, y2 - y1) * 2 - 1
    u = tl.fma(gx + 1, MW.to(T) * 0.5, -0.5)
    v = tl.fma(gy + 1, MH.to(T) * 0.5, -0.5)
    ok_x = (u - u) == 0  # finite
    ok_y = (v - v) == 0
    u0 = tl.floor(tl.where(ok_x, u, 0))
    v0 = tl.floor(tl.where(ok_y, v, 0))
    wx = tl.where(ok_x, u, 0) - u0
    wy = tl.where(ok_y, v, 0) - v0
    ex = 1 - wx
    ey = 1 - wy
    # far outside, floor may not fit an int: clamp it where both taps are out anyway
    xl = tl.minimum(tl.maximum(u0, -2.0), MW.to(T) + 1).to(tl.int32)
    yl = tl.minimum(tl.maximum(v0, -2.0), MH.to(T) + 1).to(tl.int32)
    xa = (xl >= 0) & (xl < MW)
    xb = (xl + 1 >= 0) & (xl + 1 < MW)
    ya = (yl >= 0) & (yl < MH)
    yb = (yl + 1 >= 0) & (yl + 1 < MH)
    base = masks_ptr + k * MH * MW
    rows_a = yl[:, None].to(tl.int64) * MW
    rows_b = rows_a + MW
    cols = xl[None, :].to(tl.int64)
    m00 = tl.load(base + rows_a + cols, mask=ya[:, None] & xa[None, :], other=0).to(T)
    m01 = tl.load(base + rows_a + cols + 1, mask=ya[:, None] & xb[None, :], other=0).to(T)
    m10 = tl.load(base + rows_b + cols, mask=yb[:, None] & xa[None, :], other=0).to(T)
    m11 = tl.load(base + rows_b + cols + 1, mask=yb[:, None] & xb[None, :], other=0).to(T)
    val = m00 * (ey[:, None] * ex[None, :])
    val = tl.fma(m01, ey[:, None] * wx[None, :], val)
    val = tl.fma(m10, wy[:, None] * ex[None, :], val)
    val = tl.fma(m11, wy[:, None] * wx[None, :], val)
    val = tl.where(ok_y[:, None] & ok_x[None, :], val, 0)  # a coordinate that is not finite: 0
    if WINDOW:  # detectron2's CPU window: [floor(x1) - 1, ceil(x2) + 1), likewise in y
        win = ((r.to(T) >= tl.floor(y1) - 1) & (r.to(T) < tl.ceil(y2) + 1))[:, None] & \
            ((c.to(T) >= tl.floor(x1) - 1) & (c.to(T) < tl.ceil(x2) + 1))[None, :]
    else:
        win = (r >= 0)[:, None] & (c >= 0)[None, :]
    inside = (r < H)[:, None] & (c < W)[None, :]
    o = out_ptr + k * H * W + r[:, None].to(tl.int64) * W + c[None, :]
    if BINARY:
        tl.store(o, (val >= scale_of(thr_bits, T)) & win, mask=inside)
    else:
        tl.store(o, tl.where(win, val, 0).to(out_ptr.dtype.element_ty), mask=inside)


@triton.jit
def _resize_taps(d, IN, OUT, PAD, M, FUSED: tl.constexpr, T: tl.constexpr):
    """Output cells d's taps of ATen's resize from IN to OUT cells (csrc/paste_masks.cpp's
    resize_tap): the taps moved onto the unpadded mask (lo, hi), whether each lies on it,
    and their weights. The floor is taken in float32, as ATen's floorf."""
    scale = div_rn(IN.to(T), OUT.to(T))
    at = d.to(T) + 0.5
    if FUSED:
        s = tl.fma(scale, at, -0.5)
    else:
        s = scale * at - 0.5
    s = tl.maximum(s, 0.0)
    lo = tl.minimum(tl.floor(s.to(tl.float32)).to(tl.int64), IN - 1)
    l1 = tl.minimum(tl.maximum(s - lo.to(T), 0.0), 1.0)
    hi = lo + (lo < IN - 1).to(tl.int64)
    copy = IN == OUT
    lo = tl.where(copy, d, lo) - PAD
    hi = tl.where(copy, d, hi) - PAD
    l1 = tl.where(copy, 0.0, l1).to(T)
    return lo, hi, (lo >= 0) & (lo < M), (hi >= 0) & (hi < M), 1 - l1, l1


@kernel
def _paste_torchvision_kernel(masks_ptr, boxes_ptr, out_ptr, H, W, MH, MW, PAD, n_tw, n_tiles,
                              FUSED: tl.constexpr, F64: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_W: tl.constexpr):
    T: tl.constexpr = tl.float64 if F64 else tl.float32
    pid = tl.program_id(0)
    k = (pid // n_tiles).to(tl.int64)
    t = pid % n_tiles
    r = ((t // n_tw) * BLOCK_H + tl.arange(0, BLOCK_H)).to(tl.int64)
    c = ((t % n_tw) * BLOCK_W + tl.arange(0, BLOCK_W)).to(tl.int64)
    bx0 = tl.load(boxes_ptr + 4 * k)
    by0 = tl.load(boxes_ptr + 4 * k + 1)
    bx1 = tl.load(boxes_ptr + 4 * k + 2)
    by1 = tl.load(boxes_ptr + 4 * k + 3)
    w = tl.maximum(bx1 - bx0 + 1, 1)
    h = tl.maximum(by1 - by0 + 1, 1)
    col_in = (c >= bx0) & (c <= bx1) & (c < W)
    row_in = (r >= by0) & (r <= by1) & (r < H)
    xl, xh, xl_ok, xh_ok, lx0, lx1 = _resize_taps(tl.where(col_in, c - bx0, 0), MW + 2 * PAD, w, PAD, MW, FUSED, T)
    yl, yh, yl_ok, yh_ok, ly0, ly1 = _resize_taps(tl.where(row_in, r - by0, 0), MH + 2 * PAD, h, PAD, MH, FUSED, T)
    base = masks_ptr + k * MH * MW
    live = row_in[:, None] & col_in[None, :]
    v00 = tl.load(base + yl[:, None] * MW + xl[None, :], mask=live & yl_ok[:, None] & xl_ok[None, :], other=0).to(T)
    v01 = tl.load(base + yl[:, None] * MW + xh[None, :], mask=live & yl_ok[:, None] & xh_ok[None, :], other=0).to(T)
    v10 = tl.load(base + yh[:, None] * MW + xl[None, :], mask=live & yh_ok[:, None] & xl_ok[None, :], other=0).to(T)
    v11 = tl.load(base + yh[:, None] * MW + xh[None, :], mask=live & yh_ok[:, None] & xh_ok[None, :], other=0).to(T)
    a0 = ly0[:, None]
    a1 = ly1[:, None]
    b0 = lx0[None, :]
    b1 = lx1[None, :]
    if FUSED:
        one = tl.fma(v11, a1 * b1, tl.fma(v10, a1 * b0, tl.fma(v00, a0 * b0, v01 * (a0 * b1))))
        two = tl.fma(tl.fma(v00, b0, v01 * b1), a0, tl.fma(v10, b0, v11 * b1) * a1)
    else:
        one = v00 * (a0 * b0) + v01 * (a0 * b1) + v10 * (a1 * b0) + v11 * (a1 * b1)
        two = (v00 * b0 + v01 * b1) * a0 + (v10 * b0 + v11 * b1) * a1
    val = tl.where(live, tl.where(h + w > ONE_PASS_SIDES, two, one), 0)
    inside = (r < H)[:, None] & (c < W)[None, :]
    tl.store(out_ptr + k * H * W + r[:, None] * W + c[None, :], val.to(out_ptr.dtype.element_ty), mask=inside)


def _tiles(masks: torch.Tensor, H: int, W: int) -> tuple[int, int, int, int]:
    """(BLOCK_H, BLOCK_W, tile columns, tiles per box): larger tiles under the interpreter,
    where each tile op is one numpy call."""
    bh, bw = (64, 256) if masks.is_cpu else (16, 64)
    n_tw = cdiv(W, bw)
    return bh, bw, n_tw, cdiv(H, bh) * n_tw


def paste_masks_forward(masks: torch.Tensor, boxes: torch.Tensor, height: int, width: int, threshold: float,
                        binary: bool, box_window: bool) -> torch.Tensor:
    """The continuous rule: ``[K, height, width]``, bool with ``binary``, else the masks' dtype."""
    checks.paste_masks(masks, boxes, height, width, integer_boxes=False)
    checks.finite_threshold(threshold, binary)
    check_device(masks, _paste_kernel)
    K, MH, MW = masks.shape
    out = torch.empty((K, height, width), dtype=torch.bool if binary else masks.dtype, device=masks.device)
    if out.numel():
        bh, bw, n_tw, n_tiles = _tiles(masks, height, width)
        _paste_kernel[(K * n_tiles,)](masks.contiguous(), boxes.contiguous(), out, f64_bits(threshold), height, width,
                                      MH, MW, n_tw, n_tiles, BINARY=bool(binary), WINDOW=bool(box_window),
                                      BLOCK_H=bh, BLOCK_W=bw, **LAUNCH_OPTS)
    return out


def paste_masks_torchvision_forward(masks: torch.Tensor, boxes: torch.Tensor, height: int, width: int, padding: int,
                                    fused: bool) -> torch.Tensor:
    """torchvision's rule: ``[K, height, width]`` in the masks' dtype (float16 and bfloat16
    resized in float32)."""
    checks.paste_masks(masks, boxes, height, width, integer_boxes=True)
    checks.paste_padding(padding)
    check_device(masks, _paste_torchvision_kernel)
    K, MH, MW = masks.shape
    out = torch.empty((K, height, width), dtype=masks.dtype, device=masks.device)
    if out.numel():
        bh, bw, n_tw, n_tiles = _tiles(masks, height, width)
        _paste_torchvision_kernel[(K * n_tiles,)](masks.contiguous(), boxes.contiguous(), out, height, width, MH, MW,
                                                  int(padding), n_tw, n_tiles, FUSED=bool(fused),
                                                  F64=masks.dtype == torch.float64, BLOCK_H=bh, BLOCK_W=bw,
                                                  **LAUNCH_OPTS)
    return out
