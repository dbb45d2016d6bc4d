"""Device functions shared by the RoIAlign and RoIPool kernels (design.md sections 2-5).

Arithmetic follows the C++ kernels operation by operation (scale first, then shift; the
same association order), so that with fp fusion off float32 results agree bit for bit
where the formulas are the same.
"""

import triton
import triton.language as tl

# Coordinates beyond 2^24 feature-map cells are refused by the C++ kernels (float32
# cannot place a sample there, and adaptive sampling loops sized from them would not
# end); here such a row is masked like any other bad row.
MAX_COORD = tl.constexpr(16777216.0)
# Upper bound for a sampling grid side before it is converted to int32.
MAX_GRID = tl.constexpr(1073741824.0)
INF = tl.constexpr(float("inf"))


@triton.jit
def div_rn(a, b):
    """IEEE division. Triton's `/` on float32 is div.full (up to 2 ulp off), which could
    move a bin edge or an adaptive grid size away from the CPU kernels' (nvcc's `/` is
    IEEE by default, so torchvision's CUDA kernels round like the CPU)."""
    if a.dtype == tl.float64:
        res = a / b  # already div.rn.f64; the precise op has no float64 lowering
    else:
        res = tl.fdiv(a, b, ieee_rounding=True)
    return res


@triton.jit
def sample_pos(start, idx, bin, grid):
    """Coordinate of sample idx of a bin: start + (idx + 0.5) * bin / grid, associated as
    in the CPU kernels so that forward and backward agree bit for bit."""
    return start + div_rn((idx + 0.5) * bin, grid)


@triton.jit
def load_roi(rois_ptr, k, N, scale, SCALED: tl.constexpr = True):
    """Row k of rois as (ok, batch, x1, y1, x2, y2).

    ok is False for a batch index that is not an integer in [0, N) or a coordinate that
    is not finite or (SCALED) beyond MAX_COORD cells after scaling; NaN fails every
    comparison. A bad row comes back as batch 0 and zero coordinates, so that nothing
    derived from it (addresses, loop bounds) is out of range; callers mask it on `ok`.
    """
    base = rois_ptr + k * 5
    bf = tl.load(base)
    x1 = tl.load(base + 1)
    y1 = tl.load(base + 2)
    x2 = tl.load(base + 3)
    y2 = tl.load(base + 4)
    ok = (bf >= 0) & (bf < N) & (bf == tl.floor(bf))
    if SCALED:
        ok = ok & (tl.abs(x1 * scale) <= MAX_COORD) & (tl.abs(y1 * scale) <= MAX_COORD)
        ok = ok & (tl.abs(x2 * scale) <= MAX_COORD) & (tl.abs(y2 * scale) <= MAX_COORD)
    else:
        ok = ok & (tl.abs(x1) < INF) & (tl.abs(y1) < INF) & (tl.abs(x2) < INF) & (tl.abs(y2) < INF)
    b = tl.where(ok, bf, 0.0).to(tl.int64)
    x1 = tl.where(ok, x1, 0.0)
    y1 = tl.where(ok, y1, 0.0)
    x2 = tl.where(ok, x2, 0.0)
    y2 = tl.where(ok, y2, 0.0)
    return ok, b, x1, y1, x2, y2


@triton.jit
def align_geometry(x1, y1, x2, y2, scale, ph, pw, sampling_ratio, ALIGNED: tl.constexpr):
    """Box start, bin size and sampling grid of design.md sec. 3, per axis.

    Returns (sx, sy, bw, bh, gwf, ghf, gw, gh, count); a grid side <= 0 becomes 0 (no
    samples), count = max(gh * gw, 1) in the coordinate type.
    """
    if ALIGNED:
        off = 0.5
    else:
        off = 0.0
    sx = x1 * scale - off
    sy = y1 * scale - off
    rw = x2 * scale - off - sx
    rh = y2 * scale - off - sy
    if not ALIGNED:
        rw = tl.maximum(rw, 1.0)
        rh = tl.maximum(rh, 1.0)
    bw = div_rn(rw, pw.to(rw.dtype))
    bh = div_rn(rh, ph.to(rh.dtype))
    sr = sampling_ratio.to(bw.dtype)
    gwf = tl.where(sampling_ratio > 0, sr, tl.ceil(bw))
    ghf = tl.where(sampling_ratio > 0, sr, tl.ceil(bh))
    gwf = tl.minimum(tl.maximum(gwf, 0.0), MAX_GRID)
    ghf = tl.minimum(tl.maximum(ghf, 0.0), MAX_GRID)
    count = tl.maximum(ghf * gwf, 1.0)
    return sx, sy, bw, bh, gwf, ghf, gwf.to(tl.int32), ghf.to(tl.int32), count


@triton.jit
def axis_taps(v, size):
    """Bilinear taps of coordinate v on an axis of `size` cells (design.md sec. 3).

    Returns (lo, hi, l, h, inside): weight h at cell lo, l at cell hi; inside is False for
    a point with value 0 (v < -1 or v > size), whose taps are then harmless zeros.
    """
    inside = (v >= -1.0) & (v <= size)
    v = tl.where(inside, tl.maximum(v, 0.0), 0.0)
    lo = v.to(tl.int32)  # v >= 0, so truncation is floor
    top = lo >= size - 1
    lo = tl.where(top, size - 1, lo)
    hi = tl.where(top, lo, lo + 1)
    v = tl.where(top, lo.to(v.dtype), v)
    l = v - lo.to(v.dtype)
    h = 1.0 - l
    return lo, hi, l, h, inside


@triton.jit
def may_touch(a, b, t_lo, t_hi, size):
    """Whether samples between coordinates a and b (either order) can interpolate from a
    cell in [t_lo, t_hi]. Conservative by a cell each side, so that rounding of the
    sample positions never makes it skip a real contribution."""
    lo = tl.minimum(a, b)
    hi = tl.maximum(a, b)
    return (tl.floor(hi) + 2.0 >= t_lo) & (tl.minimum(tl.floor(lo) - 1.0, size - 1.0) <= t_hi)


@triton.jit
def c_round(v):
    """C's round(): half away from zero (floor(|v| + 0.5) can round up 0.49999997)."""
    a = tl.abs(v)
    t = tl.floor(a)
    r = t + tl.where(a - t >= 0.5, 1.0, 0.0)
    return tl.where(v < 0, -r, r)


@triton.jit
def pool_axis(c1, c2, scale, idx, pooled, size, CONTINUOUS: tl.constexpr):
    """RoIPool bin edges [lo, hi) along one axis (design.md sec. 5), clipped to [0, size].

    Returns (lo, hi, nonempty_box): the box-level emptiness of mmdetection's rule (Caffe
    boxes are never empty; their bins can still be clipped away).
    """
    if CONTINUOUS:
        st = c1 * scale
        length = (c2 + 1.0) * scale - st
        bin = div_rn(length, pooled.to(length.dtype))
        lo = tl.floor(idx * bin + st)
        hi = tl.ceil((idx + 1) * bin + st)
    else:
        st = c_round(c1 * scale)
        length = tl.maximum(c_round(c2 * scale) - st + 1.0, 1.0)
        bin = div_rn(length, pooled.to(length.dtype))
        lo = tl.floor(idx * bin) + st
        hi = tl.ceil((idx + 1) * bin) + st
    lo = tl.minimum(tl.maximum(lo, 0.0), size)
    hi = tl.minimum(tl.maximum(hi, 0.0), size)
    return lo.to(tl.int32), hi.to(tl.int32), length > 0


@triton.jit
def beats(v, best, first):
    """The running maximum of design.md: the first candidate, a strictly greater value, or
    the first NaN."""
    return first | (v > best) | ((v != v) & (best == best))


@triton.jit
def with_flag(mask, flag):
    """mask & flag for a block mask and a scalar flag. Written as a select because Triton
    3.8's interpreter mistypes a broadcast scalar comparison result (the `&` then fails)."""
    return tl.where(flag, mask, False)


@triton.jit
def along_p(v, CF: tl.constexpr):
    """A per-position (bin or pixel) vector as a tile axis. CF ("channels fast"): tiles are
    [positions, channels] with channels the fastest axis (channels_last input); else
    [channels, positions] with positions fastest (NCHW). Triton's default layout spreads
    a warp's lanes over the last axis, so this picks which one is coalesced."""
    if CF:
        r = v[:, None]
    else:
        r = v[None, :]
    return r


@triton.jit
def along_c(v, CF: tl.constexpr):
    """A per-channel vector as a tile axis (see along_p)."""
    if CF:
        r = v[None, :]
    else:
        r = v[:, None]
    return r
