"""RoIAlign in Triton: "avg" (design.md sec. 3) and "max" (sec. 4), forward and backward.

Work mapping
------------
Forward and the atomic backward run one program per (box, block of bins, block of
channels): a 2-D tile of BLOCK_P bins x BLOCK_C channels. All bins of a tile belong to one
box, so they share its sampling grid, and the loop over the grid is a run-time loop whose
bounds the kernel computes from the box (never a compile-time constant taken from data).
Per sample, coordinates, taps and weights are [BLOCK_P] vectors, computed once and
broadcast over the tile's channels.

- channels_last input (CF=True): tiles are [bins, channels] with channels the fast axis;
  channels are contiguous in memory, so each tap is one coalesced, vectorised load, and
  with up to 256 channels per tile a box's coordinates are computed once for all of them.
- NCHW input (CF=False): tiles are [channels, bins] with the bins fast: a warp's lanes run
  along consecutive output cells of a box (neighbouring lanes read neighbouring pixels,
  and the stores are contiguous), its warps over 16 channels. The coordinates are then
  recomputed once per 16 channels: ~30 flops per sample, amortised over 16 x 4 gathers.

Backward
--------
Fast path: each tile scatters ``grad * weight / count`` to the four taps of every sample
with atomic adds (into a float32 scratch for half types, then one cast pass). The order
of the atomics varies between runs, so the last bits of the gradient do too.

Deterministic path (``torch.are_deterministic_algorithms_enabled()``,
``roiops.config.deterministic_backward`` or ``deterministic=True``) is a gather, not a scatter: one
program owns an 8x8-pixel tile x a block of channels of one image, keeps that part of the
gradient in registers, walks all boxes in box order and adds what every bin of each box
of its image contributes to its pixels (bilinear weights are separable: the weight of
pixel (y, x) is wy(y) * wx(x), each summed over the bin's samples), then writes its tile
once. Every grad address has a single writer and a fixed order of additions, so results
are bit-identical from run to run (and independent of the tiling). What it costs:

- every program reads all K box rows and recomputes the geometry of its image's boxes
  (O(K) serial loop per program, latency bound for large K);
- less parallelism: N x H/8 x W/8 x C/32 (NCHW) or C/64 (channels_last) programs, each
  serial over the boxes and bins that reach its tile (bins that cannot are skipped);
- max mode evaluates [pixels x channels] compare-selects per bin.
It needs no zero-fill and no float32 scratch for half types. Expect it to be a few times
slower than the atomic path on typical detection workloads.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import (GPU_TILE, LAUNCH_OPTS, cdiv, check_device, f64_bits, gather_blocks, is_channels_last, kernel,
                      memory_format, opmath, tile_blocks, use_deterministic)
from ._jit import align_geometry, axis_taps, beats, div_rn, load_roi, may_touch, sample_pos, with_flag
from ._jit import along_c as _c  # per-channel vector -> tile axis
from ._jit import along_p as _p  # per-bin / per-pixel vector -> tile axis



@kernel
def _align_fwd_kernel(
    x_ptr, rois_ptr, out_ptr, arg_ptr, scale_bits,
    N, C, H, W, ph, pw, sampling_ratio, n_pblocks,
    sxN, sxC, sxH, sxW, soK, soC, soH, soW,
    ALIGNED: tl.constexpr, MAX_MODE: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr,
    CF: tl.constexpr,
):
    T = rois_ptr.dtype.element_ty
    pid = tl.program_id(0)
    k = pid // n_pblocks
    pb = pid - k * n_pblocks
    cb = tl.program_id(1)
    scale = scale_bits.to(tl.int64).to(tl.float64, bitcast=True).to(T)

    ok, b, x1, y1, x2, y2 = load_roi(rois_ptr, k.to(tl.int64), N, scale)
    sx, sy, bw, bh, gwf, ghf, gw, gh, count = align_geometry(x1, y1, x2, y2, scale, ph, pw, sampling_ratio,
                                                             ALIGNED)

    p = pb * BLOCK_P + tl.arange(0, BLOCK_P)
    pm = p < ph * pw
    i = p // pw
    j = p - i * pw
    c = cb * BLOCK_C + tl.arange(0, BLOCK_C)
    cm = c < C
    tile_m = with_flag(_p(pm, CF) & _c(cm, CF), ok)
    x_base = x_ptr + b * sxN + _c(c.to(tl.int64) * sxC, CF)
    ybase = sy + i.to(T) * bh
    xbase = sx + j.to(T) * bw

    acc = _p(tl.zeros([BLOCK_P], dtype=T), CF) + _c(tl.zeros([BLOCK_C], dtype=T), CF)
    arg = _p(tl.full([BLOCK_P], -1, tl.int32), CF) + _c(tl.zeros([BLOCK_C], dtype=tl.int32), CF)
    for iy in range(0, gh):
        y = sample_pos(ybase, iy, bh, ghf)
        ylo, yhi, ly, hy, iny = axis_taps(y, H)
        oylo = ylo.to(tl.int64) * sxH
        oyhi = yhi.to(tl.int64) * sxH
        for ix in range(0, gw):
            x = sample_pos(xbase, ix, bw, gwf)
            xlo, xhi, lx, hx, inx = axis_taps(x, W)
            oxlo = xlo.to(tl.int64) * sxW
            oxhi = xhi.to(tl.int64) * sxW
            m = tile_m & _p(iny & inx, CF)
            v1 = tl.load(x_base + _p(oylo + oxlo, CF), mask=m, other=0.0).to(T)
            v2 = tl.load(x_base + _p(oylo + oxhi, CF), mask=m, other=0.0).to(T)
            v3 = tl.load(x_base + _p(oyhi + oxlo, CF), mask=m, other=0.0).to(T)
            v4 = tl.load(x_base + _p(oyhi + oxhi, CF), mask=m, other=0.0).to(T)
            val = (_p(hy * hx, CF) * v1 + _p(hy * lx, CF) * v2 + _p(ly * hx, CF) * v3
                   + _p(ly * lx, CF) * v4)
            if MAX_MODE:
                take = beats(val, acc, arg < 0)
                acc = tl.where(take, val, acc)
                arg = tl.where(take, iy * gw + ix, arg)
            else:
                acc += val

    # out is allocated with soH == pw * soW, so bin p sits at p * soW: with soW == 1 (NCHW)
    # the compiler sees the stores along the bins as contiguous.
    o = k.to(tl.int64) * soK + _c(c.to(tl.int64) * soC, CF) + _p(p.to(tl.int64) * soW, CF)
    om = _p(pm, CF) & _c(cm, CF)
    if MAX_MODE:
        arg = tl.where(tile_m, arg, -1)
        res = tl.where(arg >= 0, acc, 0.0)
        tl.store(arg_ptr + o, arg, mask=om)
    else:
        res = div_rn(acc, count)
    tl.store(out_ptr + o, res.to(out_ptr.dtype.element_ty), mask=om)


@kernel
def _align_bwd_atomic_kernel(
    grad_ptr, arg_ptr, rois_ptr, gi_ptr, scale_bits,
    N, C, H, W, ph, pw, sampling_ratio, n_pblocks,
    sgK, sgC, sgH, sgW, saK, saC, saH, saW, siN, siC, siH, siW,
    ALIGNED: tl.constexpr, MAX_MODE: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr,
    CF: tl.constexpr,
):
    T = rois_ptr.dtype.element_ty
    G = gi_ptr.dtype.element_ty
    pid = tl.program_id(0)
    k = pid // n_pblocks
    pb = pid - k * n_pblocks
    cb = tl.program_id(1)
    scale = scale_bits.to(tl.int64).to(tl.float64, bitcast=True).to(T)

    ok, b, x1, y1, x2, y2 = load_roi(rois_ptr, k.to(tl.int64), N, scale)
    sx, sy, bw, bh, gwf, ghf, gw, gh, count = align_geometry(x1, y1, x2, y2, scale, ph, pw, sampling_ratio,
                                                             ALIGNED)

    p = pb * BLOCK_P + tl.arange(0, BLOCK_P)
    pm = p < ph * pw
    i = p // pw
    j = p - i * pw
    c = cb * BLOCK_C + tl.arange(0, BLOCK_C)
    cm = c < C
    tile_m = with_flag(_p(pm, CF) & _c(cm, CF), ok)
    k64 = k.to(tl.int64)
    c64 = c.to(tl.int64)
    i64 = i.to(tl.int64)
    j64 = j.to(tl.int64)
    g = tl.load(grad_ptr + k64 * sgK + _c(c64 * sgC, CF) + _p(i64 * sgH + j64 * sgW, CF),
                mask=tile_m, other=0.0).to(T)
    gi_base = gi_ptr + b * siN + _c(c64 * siC, CF)
    ybase = sy + i.to(T) * bh
    xbase = sx + j.to(T) * bw

    if MAX_MODE:
        a = tl.load(arg_ptr + k64 * saK + _c(c64 * saC, CF) + _p(i64 * saH + j64 * saW, CF),
                    mask=tile_m, other=-1)
        has = tile_m & (a >= 0) & (a < gh * gw)
        gws = tl.maximum(gw, 1)
        iy = tl.where(has, a // gws, 0)
        ix = tl.where(has, a - (a // gws) * gws, 0)
        # max(., 1): a box without samples has no argmax; keep its lanes free of 0/0.
        y = sample_pos(_p(ybase, CF), iy, bh, tl.maximum(ghf, 1.0))
        x = sample_pos(_p(xbase, CF), ix, bw, tl.maximum(gwf, 1.0))
        ylo, yhi, ly, hy, iny = axis_taps(y, H)
        xlo, xhi, lx, hx, inx = axis_taps(x, W)
        m = has & iny & inx
        oylo = ylo.to(tl.int64) * siH
        oyhi = yhi.to(tl.int64) * siH
        oxlo = xlo.to(tl.int64) * siW
        oxhi = xhi.to(tl.int64) * siW
        tl.atomic_add(gi_base + oylo + oxlo, ((hy * hx) * g).to(G), mask=m, sem="relaxed")
        tl.atomic_add(gi_base + oylo + oxhi, ((hy * lx) * g).to(G), mask=m, sem="relaxed")
        tl.atomic_add(gi_base + oyhi + oxlo, ((ly * hx) * g).to(G), mask=m, sem="relaxed")
        tl.atomic_add(gi_base + oyhi + oxhi, ((ly * lx) * g).to(G), mask=m, sem="relaxed")
    else:
        for iy in range(0, gh):
            y = sample_pos(ybase, iy, bh, ghf)
            ylo, yhi, ly, hy, iny = axis_taps(y, H)
            oylo = ylo.to(tl.int64) * siH
            oyhi = yhi.to(tl.int64) * siH
            for ix in range(0, gw):
                x = sample_pos(xbase, ix, bw, gwf)
                xlo, xhi, lx, hx, inx = axis_taps(x, W)
                oxlo = xlo.to(tl.int64) * siW
                oxhi = xhi.to(tl.int64) * siW
                m = tile_m & _p(iny & inx, CF)
                tl.atomic_add(gi_base + _p(oylo + oxlo, CF), div_rn(g * _p(hy * hx, CF), count).to(G),
                              mask=m, sem="relaxed")
                tl.atomic_add(gi_base + _p(oylo + oxhi, CF), div_rn(g * _p(hy * lx, CF), count).to(G),
                              mask=m, sem="relaxed")
                tl.atomic_add(gi_base + _p(oyhi + oxlo, CF), div_rn(g * _p(ly * hx, CF), count).to(G),
                              mask=m, sem="relaxed")
                tl.atomic_add(gi_base + _p(oyhi + oxhi, CF), div_rn(g * _p(ly * lx, CF), count).to(G),
                              mask=m, sem="relaxed")


@kernel
def _align_bwd_gather_kernel(
    grad_ptr, arg_ptr, rois_ptr, gi_ptr, scale_bits,
    K, N, C, H, W, ph, pw, sampling_ratio, n_tw, n_tiles,
    sgK, sgC, sgH, sgW, saK, saC, saH, saW, siN, siC, siH, siW,
    ALIGNED: tl.constexpr, MAX_MODE: tl.constexpr,
    TILE_H: tl.constexpr, TILE_W: tl.constexpr, BLOCK_C: tl.constexpr, CF: tl.constexpr,
):
    T = rois_ptr.dtype.element_ty
    pid = tl.program_id(0)
    n = pid // n_tiles
    t = pid - n * n_tiles
    th = t // n_tw
    tw = t - th * n_tw
    cb = tl.program_id(1)
    scale = scale_bits.to(tl.int64).to(tl.float64, bitcast=True).to(T)

    q = tl.arange(0, TILE_H * TILE_W)
    r = th * TILE_H + q // TILE_W
    s = tw * TILE_W + q % TILE_W
    c = cb * BLOCK_C + tl.arange(0, BLOCK_C)
    cm = c < C
    c64 = c.to(tl.int64)
    # The tile's cells, inclusive, as coordinates for the skip tests.
    r_lo = (th * TILE_H).to(T)
    r_hi = (tl.minimum(th * TILE_H + TILE_H, H) - 1).to(T)
    s_lo = (tw * TILE_W).to(T)
    s_hi = (tl.minimum(tw * TILE_W + TILE_W, W) - 1).to(T)
    Hf = H.to(T)
    Wf = W.to(T)

    acc = _p(tl.zeros([TILE_H * TILE_W], dtype=T), CF) + _c(tl.zeros([BLOCK_C], dtype=T), CF)
    for k in range(0, K.to(tl.int64)):
        ok, b, x1, y1, x2, y2 = load_roi(rois_ptr, k, N, scale)
        sx, sy, bw, bh, gwf, ghf, gw, gh, count = align_geometry(x1, y1, x2, y2, scale, ph, pw, sampling_ratio,
                                                                 ALIGNED)
        use = ok & (b == n) & (gh > 0) & (gw > 0)
        use = use & may_touch(sy, sy + ph * bh, r_lo, r_hi, Hf) & may_touch(sx, sx + pw * bw, s_lo, s_hi, Wf)
        if use:
            for i in range(0, ph):
                ya = sy + i * bh
                if may_touch(ya, ya + bh, r_lo, r_hi, Hf):
                    if not MAX_MODE:
                        # Row weights of this bin row, summed over its samples.
                        wy = tl.zeros([TILE_H * TILE_W], dtype=T)
                        for iy in range(0, gh):
                            y = sample_pos(ya, iy, bh, ghf)
                            ylo, yhi, ly, hy, iny = axis_taps(y, H)
                            wy += tl.where(iny, tl.where(r == ylo, hy, 0.0) + tl.where(r == yhi, ly, 0.0), 0.0)
                    for j in range(0, pw):
                        xa = sx + j * bw
                        if may_touch(xa, xa + bw, s_lo, s_hi, Wf):
                            go = k * sgK + c64 * sgC + i * sgH + j * sgW
                            g = tl.load(grad_ptr + go, mask=cm, other=0.0).to(T)
                            if MAX_MODE:
                                a = tl.load(arg_ptr + k * saK + c64 * saC + i * saH + j * saW, mask=cm, other=-1)
                                has = cm & (a >= 0) & (a < gh * gw)
                                iy = tl.where(has, a // gw, 0)
                                ix = tl.where(has, a - (a // gw) * gw, 0)
                                y = sample_pos(ya, iy, bh, ghf)
                                x = sample_pos(xa, ix, bw, gwf)
                                ylo, yhi, ly, hy, iny = axis_taps(y, H)
                                xlo, xhi, lx, hx, inx = axis_taps(x, W)
                                g = tl.where(has & iny & inx, g, 0.0)
                                wy2 = (tl.where(_p(r, CF) == _c(ylo, CF), _c(hy, CF), 0.0)
                                       + tl.where(_p(r, CF) == _c(yhi, CF), _c(ly, CF), 0.0))
                                wx2 = (tl.where(_p(s, CF) == _c(xlo, CF), _c(hx, CF), 0.0)
                                       + tl.where(_p(s, CF) == _c(xhi, CF), _c(lx, CF), 0.0))
                                acc += (wy2 * wx2) * _c(g, CF)
                            else:
                                wx = tl.zeros([TILE_H * TILE_W], dtype=T)
                                for ix in range(0, gw):
                                    x = sample_pos(xa, ix, bw, gwf)
                                    xlo, xhi, lx, hx, inx = axis_taps(x, W)
                                    wx += tl.where(inx, tl.where(s == xlo, hx, 0.0) + tl.where(s == xhi, lx, 0.0),
                                                   0.0)
                                acc += div_rn(_c(g, CF) * _p(wy * wx, CF), count)

    om = _p((r < H) & (s < W), CF) & _c(cm, CF)
    o = n.to(tl.int64) * siN + _c(c64, CF) * siC + _p(r.to(tl.int64) * siH + s.to(tl.int64) * siW, CF)
    tl.store(gi_ptr + o, acc.to(gi_ptr.dtype.element_ty), mask=om)


# ----------------------------------------------------------------------------- launchers

def _forward(input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned, max_mode):
    check_device(input, _align_fwd_kernel)
    N, C, H, W = input.shape
    K = rois.shape[0]
    ph, pw = int(pooled_height), int(pooled_width)
    rois = rois.to(opmath(input.dtype)).contiguous()
    fmt = memory_format(is_channels_last(input))
    out = torch.empty((K, C, ph, pw), dtype=input.dtype, device=input.device, memory_format=fmt)
    argmax = torch.empty((K, C, ph, pw), dtype=torch.int32, device=input.device, memory_format=fmt) \
        if max_mode else None
    if out.numel() == 0:
        return out, argmax
    if H == 0 or W == 0:  # no cell to sample: zeros, and argmax "no sample"
        out.zero_()
        if argmax is not None:
            argmax.fill_(-1)
        return out, argmax
    lanes_c = input.stride(1) < input.stride(3)
    budget = GPU_TILE // 2 if input.dtype == torch.float64 else GPU_TILE
    block_p, block_c = tile_blocks(ph * pw, C, lanes_c, input.device.type == "cpu", budget)
    n_pb = triton.cdiv(ph * pw, block_p)
    grid = (K * n_pb, cdiv(C, block_c))
    assert ph == 1 or out.stride(2) == pw * out.stride(3)
    _align_fwd_kernel[grid](
        input, rois, out, argmax if max_mode else out, f64_bits(spatial_scale),
        N, C, H, W, ph, pw, int(sampling_ratio), n_pb,
        *input.stride(), *out.stride(),
        ALIGNED=bool(aligned), MAX_MODE=max_mode, BLOCK_P=block_p, BLOCK_C=block_c, CF=lanes_c, **LAUNCH_OPTS)
    return out, argmax


def _backward(grad, argmax, rois, spatial_scale, pooled_height, pooled_width, batch_size, channels, height, width,
              sampling_ratio, aligned, channels_last, max_mode, deterministic):
    check_device(grad, _align_bwd_atomic_kernel)
    N, C, H, W = int(batch_size), int(channels), int(height), int(width)
    K = rois.shape[0]
    ph, pw = int(pooled_height), int(pooled_width)
    rois = rois.to(opmath(grad.dtype)).contiguous()
    fmt = memory_format(bool(channels_last))
    on_cpu = grad.device.type == "cpu"
    if K == 0 or N * C * H * W == 0:
        return torch.empty((N, C, H, W), dtype=grad.dtype, device=grad.device, memory_format=fmt).zero_()
    arg = argmax if max_mode else grad
    common = (f64_bits(spatial_scale),)

    if use_deterministic(deterministic):
        gi = torch.empty((N, C, H, W), dtype=grad.dtype, device=grad.device, memory_format=fmt)
        tile_h, tile_w, block_c = gather_blocks(H, W, C, bool(channels_last), on_cpu, grad.dtype == torch.float64)
        n_tw = cdiv(W, tile_w)
        n_tiles = cdiv(H, tile_h) * n_tw
        grid = (N * n_tiles, cdiv(C, block_c))
        _align_bwd_gather_kernel[grid](
            grad, arg, rois, gi, *common,
            K, N, C, H, W, ph, pw, int(sampling_ratio), n_tw, n_tiles,
            *grad.stride(), *arg.stride(), *gi.stride(),
            ALIGNED=bool(aligned), MAX_MODE=max_mode, TILE_H=tile_h, TILE_W=tile_w, BLOCK_C=block_c,
            # [pixels, channels] for both layouts: the NCHW tile's single store gets its own
            # coalesced layout from the compiler, while [channels, pixels] would about triple
            # the registers of the per-bin updates (ptxas: 255 vs ~90).
            CF=True,
            **LAUNCH_OPTS)
        return gi

    # Half types accumulate in a float32 scratch (one extra cast pass), as the CPU kernels do.
    acc_dtype = grad.dtype if grad.dtype in (torch.float32, torch.float64) else torch.float32
    gi = torch.empty((N, C, H, W), dtype=acc_dtype, device=grad.device, memory_format=fmt).zero_()
    lanes_c = bool(channels_last)
    # Max mode carries per-element sample coordinates: smaller tiles.
    budget = GPU_TILE // 2 if (max_mode or grad.dtype == torch.float64) else GPU_TILE
    block_p, block_c = tile_blocks(ph * pw, C, lanes_c, on_cpu, budget)
    n_pb = triton.cdiv(ph * pw, block_p)
    grid = (K * n_pb, cdiv(C, block_c))
    _align_bwd_atomic_kernel[grid](
        grad, arg, rois, gi, *common,
        N, C, H, W, ph, pw, int(sampling_ratio), n_pb,
        *grad.stride(), *arg.stride(), *gi.stride(),
        ALIGNED=bool(aligned), MAX_MODE=max_mode, BLOCK_P=block_p, BLOCK_C=block_c, CF=lanes_c, **LAUNCH_OPTS)
    return gi if acc_dtype == grad.dtype else gi.to(grad.dtype)


def roi_align_forward(input: torch.Tensor, rois: torch.Tensor, spatial_scale: float, pooled_height: int,
                      pooled_width: int, sampling_ratio: int, aligned: bool) -> torch.Tensor:
    """RoIAlign "avg" forward: [K, C, ph, pw] in the input's dtype and memory format."""
    return _forward(input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned, False)[0]


def roi_align_backward(grad: torch.Tensor, rois: torch.Tensor, spatial_scale: float, pooled_height: int,
                       pooled_width: int, batch_size: int, channels: int, height: int, width: int,
                       sampling_ratio: int, aligned: bool, channels_last: bool, *,
                       deterministic: bool | None = None) -> torch.Tensor:
    """Gradient of roi_align_forward w.r.t. its input, [N, C, H, W] in grad's dtype.

    deterministic: None follows roiops.config.deterministic_backward, then torch's deterministic flag;
    see the module docstring for what the deterministic path costs.
    """
    return _backward(grad, None, rois, spatial_scale, pooled_height, pooled_width, batch_size, channels, height,
                     width, sampling_ratio, aligned, channels_last, False, deterministic)


def roi_align_max_forward(input: torch.Tensor, rois: torch.Tensor, spatial_scale: float, pooled_height: int,
                          pooled_width: int, sampling_ratio: int,
                          aligned: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """RoIAlign "max" forward: (out, argmax int32 = iy * grid_w + ix, -1 for no sample)."""
    return _forward(input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned, True)


def roi_align_max_backward(grad: torch.Tensor, argmax: torch.Tensor, rois: torch.Tensor, spatial_scale: float,
                           pooled_height: int, pooled_width: int, batch_size: int, channels: int, height: int,
                           width: int, sampling_ratio: int, aligned: bool, channels_last: bool, *,
                           deterministic: bool | None = None) -> torch.Tensor:
    """Gradient of roi_align_max_forward: each bin's grad goes to the four taps of its
    argmax sample with their bilinear weights."""
    return _backward(grad, argmax, rois, spatial_scale, pooled_height, pooled_width, batch_size, channels, height,
                     width, sampling_ratio, aligned, channels_last, True, deterministic)
