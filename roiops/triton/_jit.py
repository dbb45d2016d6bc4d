"""Device functions shared by the RoIAlign and RoIPool kernels (semantics: docs/semantics.md).

Arithmetic follows the C++ kernels operation by operation (scale first, then shift; the
same association order), so that with fp fusion off float32 results agree bit for bit
where the formulas are the same.
"""

import triton
import triton.language as tl

from .._geometry import MAX_COORDINATE

# Coordinates beyond MAX_COORDINATE feature-map cells are refused by the validation layer
# and the C++ kernels (float32 cannot place a sample there, and adaptive sampling loops
# sized from them would not end); here such a row is masked like any other bad row.
MAX_COORD = tl.constexpr(MAX_COORDINATE)
# Upper bound for a sampling grid side before it is converted to int32.
MAX_GRID = tl.constexpr(1073741824.0)
INF = tl.constexpr(float("inf"))
# The CF value of flat per-box tiles (bin_tile); True (1) and False (0) are the others.
FLAT = tl.constexpr(2)


@triton.jit
def div_rn(a, b):
    """Correctly rounded IEEE division, as the CPU kernels and nvcc's `/` divide. Triton's
    float32 `/` is div.full (up to 2 ulp off), and `tl.fdiv(..., ieee_rounding=True)`
    also lowers to it under Triton 3.6: either would move bin edges and adaptive grid
    sizes. `tl.div_rn` is div.rn.f32 on every supported Triton (tests/test_ptx.py)."""
    if a.dtype == tl.float64:
        res = a / b  # div.rn.f64; tl.div_rn is float32 only
    else:
        res = tl.div_rn(a, b)
    return res


@triton.jit
def sample_pos(start, idx, bin, grid):
    """Coordinate of sample idx of a bin: start + (idx + 0.5) * bin / grid, associated as
    in the CPU kernels so that forward and backward agree bit for bit."""
    return start + div_rn((idx + 0.5) * bin, grid)


@triton.jit
def sample_taps(start, idx, bin, grid, size, stride):
    """Sample idx of a bin along an axis of `size` cells (sample_pos) and its bilinear taps
    (axis_taps), the cells as offsets of the axis' stride: (v, lo offset, hi offset, l, h,
    inside)."""
    v = sample_pos(start, idx, bin, grid)
    lo, hi, l, h, inside = axis_taps(v, size)
    return v, lo.to(tl.int64) * stride, hi.to(tl.int64) * stride, l, h, inside


@triton.jit
def sample_span(base, bin, gridf, lo_edge, hi_edge):
    """[first, last) of the sample indices i whose positions base + (i + 0.5) * bin / grid
    can lie in [lo_edge, hi_edge], as int32. A superset: widened by more than a float32
    position's rounding and by a sample each side; callers still test each sample. Loops
    over it cost what the samples near the map (or a tile) cost, however large the box.
    Solved in float64, where the quotients of 2^30-sample grids stay exact enough."""
    b = base.to(tl.float64)
    d = bin.to(tl.float64)
    g = gridf.to(tl.float64)
    slack = (tl.abs(b) + tl.abs(d)) * 1e-6 + 1e-6
    lo = lo_edge - slack - b
    hi = hi_edge + slack - b
    moving = d != 0.0
    step = tl.where(moving, d, 1.0)
    ta = lo * g / step - 0.5
    tb = hi * g / step - 0.5
    first = tl.floor(tl.minimum(ta, tb)) - 1.0
    last = tl.floor(tl.maximum(ta, tb)) + 2.0
    # A zero-size bin puts every sample at base: all of them or none.
    hit = (lo <= 0.0) & (hi >= 0.0)
    first = tl.where(moving, first, tl.where(hit, 0.0, g))
    last = tl.where(moving, last, tl.where(hit, g, 0.0))
    first = tl.minimum(tl.maximum(first, 0.0), g)
    last = tl.minimum(tl.maximum(last, first), g)
    return first.to(tl.int32), last.to(tl.int32)


@triton.jit
def first_skipped(fy, ly, fx, lx, gh, gw):
    """Row-major index of the first sample of a gh x gw grid outside the visited rectangle
    [fy, ly) x [fx, lx), or 2^31 - 1 when it covers the grid (or the grid is empty)."""
    big = 2147483647
    tail = tl.minimum(tl.where(lx < gw, lx, big), tl.where(ly < gh, ly * gw, big))
    idx = tl.where((fy > 0) | (fx > 0), 0, tail)
    return tl.where((gh > 0) & (gw > 0), idx, big)


@triton.jit
def scale_of(bits, T: tl.constexpr):
    """spatial_scale in T from the IEEE-754 bits that _common.f64_bits passes (an int64
    travels exactly where a Python float argument would be rounded to float32)."""
    return bits.to(tl.int64).to(tl.float64, bitcast=True).to(T)


@triton.jit
def map_spans(live, ybase, xbase, bh, bw, ghf, gwf, H, W):
    """Per bin, the samples that can touch an H x W map: [fy, ey) x [fx, ex) (sample_span)
    and the counts ny, nx to loop over (0 for a bin that is not live)."""
    fy, ey = sample_span(ybase, bh, ghf, -1.0, H.to(ybase.dtype))
    fx, ex = sample_span(xbase, bw, gwf, -1.0, W.to(xbase.dtype))
    return fy, ey, tl.where(live, ey - fy, 0), fx, ex, tl.where(live, ex - fx, 0)


@triton.jit
def tap_share(g, w, count, DIVIDE: tl.constexpr):
    """What a sample gives a tap of weight w: g * w / count (RoIAlign's order), or g * w
    where g is already divided (deformable RoI pooling divides first, as mmcv)."""
    if DIVIDE:
        r = div_rn(g * w, count)
    else:
        r = g * w
    return r


@triton.jit
def scatter_samples(gi_base, g, count, live, tile_m, ybase, xbase, bh, bw, ghf, gwf, H, W, siH, siW,
                    CF: tl.constexpr, DIVIDE: tl.constexpr = True):
    """The atomic RoIAlign backward of a [bins x channels] tile: adds g * weight / count
    (tap_share) to the four taps of each sample that can touch the map (map_spans; bins
    not `live` have none), at gi_base (per element) plus the tap's offset, for the
    elements in tile_m."""
    G = gi_base.dtype.element_ty
    fy, ey, ny, fx, ex, nx = map_spans(live, ybase, xbase, bh, bw, ghf, gwf, H, W)
    for dy in range(0, tl.max(ny, axis=0)):
        _, oylo, oyhi, ly, hy, iny = sample_taps(ybase, fy + dy, bh, ghf, H, siH)
        iny = iny & (dy < ny)
        for dx in range(0, tl.max(nx, axis=0)):
            _, oxlo, oxhi, lx, hx, inx = sample_taps(xbase, fx + dx, bw, gwf, W, siW)
            m = tile_m & along_p(iny & inx & (dx < nx), CF)
            tl.atomic_add(gi_base + along_p(oylo + oxlo, CF), tap_share(g, along_p(hy * hx, CF), count, DIVIDE).to(G),
                          mask=m, sem="relaxed")
            tl.atomic_add(gi_base + along_p(oylo + oxhi, CF), tap_share(g, along_p(hy * lx, CF), count, DIVIDE).to(G),
                          mask=m, sem="relaxed")
            tl.atomic_add(gi_base + along_p(oyhi + oxlo, CF), tap_share(g, along_p(ly * hx, CF), count, DIVIDE).to(G),
                          mask=m, sem="relaxed")
            tl.atomic_add(gi_base + along_p(oyhi + oxhi, CF), tap_share(g, along_p(ly * lx, CF), count, DIVIDE).to(G),
                          mask=m, sem="relaxed")


@triton.jit
def tile_axis_weights(cells, start, bin, gridf, lo, hi, size):
    """Per cell of `cells` (a tile's rows or columns, lo to hi inclusive, as coordinates),
    the bilinear weights it gets along one axis from the samples of a bin (start, bin,
    gridf: sample_pos), summed over those that can reach the tile (sample_span)."""
    w = tl.zeros_like(cells).to(start.dtype)
    first, end = sample_span(start, bin, gridf, lo - 1.0, hi + 1.0)
    for t in range(first, end):
        v = sample_pos(start, t, bin, gridf)
        vlo, vhi, l, h, inside = axis_taps(v, size)
        w += tl.where(inside, tl.where(cells == vlo, h, 0.0) + tl.where(cells == vhi, l, 0.0), 0.0)
    return w


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
    """Box start, bin size and sampling grid (docs/semantics.md, RoIAlign), per axis.

    Returns (sx, sy, bw, bh, gwf, ghf, gw, gh, count); a grid side <= 0 becomes 0 (no
    samples), count = max(gh * gw, 1) in the coordinate type.
    """
    if ALIGNED:
        off = 0.5
    else:
        off = 0.0
    sx = x1 * scale - off
    sy = y1 * scale - off
    _, _, bw, bh, gwf, ghf, count = bin_grid(x2 * scale - off - sx, y2 * scale - off - sy, ph, pw,
                                             sampling_ratio, ALIGNED)
    return sx, sy, bw, bh, gwf, ghf, gwf.to(tl.int32), ghf.to(tl.int32), count


@triton.jit
def bin_grid(rw, rh, ph, pw, sampling_ratio, ALIGNED: tl.constexpr):
    """Bin size and sampling grid of a box of rw x rh cells (docs/semantics.md, RoIAlign;
    rotated RoIAlign): without ALIGNED the sides are at least 1 cell.

    Returns (rw, rh, bw, bh, gwf, ghf, count): the sides after that rule, the bin sizes,
    the grid sides in the coordinate type (<= 0 becoming 0: no samples) and
    count = max(gh * gw, 1).
    """
    if not ALIGNED:
        rw = tl.maximum(rw, 1.0)
        rh = tl.maximum(rh, 1.0)
    bw = div_rn(rw, pw.to(rw.dtype))
    bh = div_rn(rh, ph.to(rh.dtype))
    sr = sampling_ratio.to(bw.dtype)
    gwf = tl.minimum(tl.maximum(tl.where(sampling_ratio > 0, sr, tl.ceil(bw)), 0.0), MAX_GRID)
    ghf = tl.minimum(tl.maximum(tl.where(sampling_ratio > 0, sr, tl.ceil(bh)), 0.0), MAX_GRID)
    return rw, rh, bw, bh, gwf, ghf, tl.maximum(ghf * gwf, 1.0)


@triton.jit
def argmax_fits(ghf, gwf):
    """Whether a max-mode bin's sample index iy * grid_w + ix fits the int32 argmax (the
    CPU kernels refuse such a box; here it is masked like an invalid row)."""
    return ghf.to(tl.float64) * gwf.to(tl.float64) <= 2147483647.0


@triton.jit
def axis_taps(v, size):
    """Bilinear taps of coordinate v on an axis of `size` cells (docs/semantics.md).

    Returns (lo, hi, l, h, inside): weight h at cell lo, l at cell hi; inside is False for
    a point with value 0 (v < -1 or v > size), whose taps are then harmless zeros.
    """
    inside = (v >= -1.0) & (v <= size)
    v = tl.where(inside, tl.maximum(v, 0.0), 0.0)
    lo = v.to(tl.int32)  # v >= 0, so truncation is floor
    top = lo >= size - 1
    lo = tl.where(top, size - 1, lo)
    hi = tl.where(top, lo, lo + 1)
    # Both as if from lo (v >= 0, so floor(v) == lo), without converting the int tensor:
    # Triton 3.6 fails to compile that conversion in float64 max-mode gather tiles.
    v = tl.where(top, (size - 1).to(v.dtype), v)
    l = v - tl.floor(v)
    h = 1.0 - l
    return lo, hi, l, h, inside


@triton.jit
def axis_slides(v, size):
    """Whether the bilinear value moves with coordinate v along an axis of `size` cells
    (axis_taps): v is in the map and clamped neither to the first cell (v <= 0) nor to the
    last (v >= size - 1). Elsewhere its derivative along the axis is 0."""
    return (v > 0.0) & (v < size - 1)


@triton.jit
def bilinear_slopes(v1, v2, v3, v4, ly, hy, lx, hx, slides_y, slides_x):
    """(dv/dy, dv/dx) of the bilinear value hy*hx*v1 + hy*lx*v2 + ly*hx*v3 + ly*lx*v4 of the
    taps v1 = (ylo, xlo), v2 = (ylo, xhi), v3 = (yhi, xlo), v4 = (yhi, xhi) with axis_taps'
    weights; 0 along an axis whose coordinate does not slide (axis_slides)."""
    dy = hx * (v3 - v1) + lx * (v4 - v2)
    dx = hy * (v2 - v1) + ly * (v4 - v3)
    return tl.where(slides_y, dy, 0.0), tl.where(slides_x, dx, 0.0)


@triton.jit
def tap_slopes(x_base, m, oylo, oyhi, oxlo, oxhi, ly, hy, lx, hx, slides_y, slides_x, CF: tl.constexpr):
    """bilinear_slopes of one sample per bin of a tile: its taps read at x_base (per
    channel) plus their offsets (per bin) where m, in the type of the weights (axis_taps'
    ly, hy, lx, hx, per bin); slides_y, slides_x: axis_slides as tile axes."""
    T = ly.dtype
    v1 = tl.load(x_base + along_p(oylo + oxlo, CF), mask=m, other=0.0).to(T)
    v2 = tl.load(x_base + along_p(oylo + oxhi, CF), mask=m, other=0.0).to(T)
    v3 = tl.load(x_base + along_p(oyhi + oxlo, CF), mask=m, other=0.0).to(T)
    v4 = tl.load(x_base + along_p(oyhi + oxhi, CF), mask=m, other=0.0).to(T)
    return bilinear_slopes(v1, v2, v3, v4, along_p(ly, CF), along_p(hy, CF), along_p(lx, CF), along_p(hx, CF),
                           m & slides_y, m & slides_x)


@triton.jit
def corner_slopes(c1, c2, scale, bin, idx, gridf, pooled, ALIGNED: tl.constexpr):
    """d/dc1 and d/dc2 of the coordinate of sample idx of bin `bin` (sample_pos, grid gridf)
    along an axis of `pooled` bins whose box corners are c1 < c2 (align_geometry): the
    sample sits at fraction f = (bin + (idx + 0.5) / grid) / pooled of the box, so
    scale * (1 - f) and scale * f; scale and 0 where the box is widened to one cell (not
    ALIGNED and a size under 1 cell), which moves only with its start."""
    T = gridf.dtype
    f = div_rn(bin.to(T) + div_rn(idx.to(T) + 0.5, gridf), pooled.to(T))
    d1 = scale * (1.0 - f)
    d2 = scale * f
    if not ALIGNED:
        widened = c2 * scale - c1 * scale < 1.0
        d1 = tl.where(widened, scale, d1)
        d2 = tl.where(widened, 0.0, d2)
    return d1, d2


@triton.jit
def touched_cells(a, b, size):
    """(first, last, any) cells of an axis of `size` cells that samples between coordinates
    a and b (either order) can interpolate from: a sample at v reaches cells floor(v) and
    floor(v) + 1, and one more each side covers the rounding of its position. Both stay in
    [-1, size] (a deformable bin may lie any finite distance off the map), so they convert
    to int32 exactly."""
    lo = tl.minimum(a, b)
    hi = tl.maximum(a, b)
    first = tl.minimum(tl.maximum(tl.floor(lo) - 1.0, 0.0), size)
    last = tl.maximum(tl.minimum(tl.floor(hi) + 2.0, size - 1.0), -1.0)
    return first.to(tl.int32), last.to(tl.int32), first <= last


@triton.jit
def may_touch(a, b, t_lo, t_hi, size):
    """Whether samples between coordinates a and b (either order) can interpolate from a
    cell in [t_lo, t_hi] (touched_cells, so conservative by a cell each side)."""
    first, last, any = touched_cells(a, b, size)
    return any & (first <= t_hi) & (last >= t_lo)


@triton.jit
def mark_box(mask_ptr, first_tile, k, r0, r1, c0, c1, W, n_words, TILE_H: tl.constexpr, TILE_W: tl.constexpr,
             BLOCK: tl.constexpr):
    """Sets bit k of the mask rows of the gather tiles that cover cells [r0, r1] x [c0, c1]
    of an image whose first tile row is first_tile (a deterministic backward's prepass)."""
    n_tw = (W + TILE_W - 1) // TILE_W
    bit = (1 << (k % 32)).to(tl.int32)
    c_first = c0 // TILE_W
    c_last = c1 // TILE_W
    for tr in range(r0 // TILE_H, r1 // TILE_H + 1):
        for tc0 in range(c_first, c_last + 1, BLOCK):
            tc = tc0 + tl.arange(0, BLOCK)
            tl.atomic_or(mask_ptr + (first_tile + tr * n_tw + tc).to(tl.int64) * n_words + k // 32, bit,
                         mask=tc <= c_last, sem="relaxed")


@triton.jit
def add_marked(acc, mask_ptr, tile, n_words, GATHER: tl.constexpr, args):
    """The walk of a deterministic backward's gather program over the boxes marked in row
    `tile` of the mask (mark_box), in increasing index: acc = GATHER(acc, k, *args) for
    each, k as int64 (grad is indexed k * sgK)."""
    row = mask_ptr + tile.to(tl.int64) * n_words
    for w in range(0, n_words.to(tl.int64)):
        bits = tl.load(row + w)
        if bits != 0:
            for j in range(0, 32):
                if ((bits >> j) & 1) != 0:
                    acc = GATHER(acc, w * 32 + j, *args)
    return acc


@triton.jit
def hat(t):
    """max(0, 1 - |t|): Precise RoIPool's weight of a cell at distance t along one axis."""
    return tl.maximum(1.0 - tl.abs(t), 0.0)


@triton.jit
def hat_integral(a, n):
    """The integral of the hat over [a, a + n] (n >= 0), a the window's start relative to
    the cell's centre: over each linear piece of the hat, the window's length inside it
    times the hat at that part's middle. A window inside one piece gets n itself as its
    length, not a difference of end points, so a short window's average (integral / n)
    keeps full precision far from the map's origin. The C++ kernels' arithmetic."""
    b = a + n
    l0 = tl.maximum(n - tl.maximum(-1.0 - a, 0.0) - tl.maximum(b, 0.0), 0.0)  # inside [-1, 0]
    l1 = tl.maximum(n - tl.maximum(-a, 0.0) - tl.maximum(b - 1.0, 0.0), 0.0)  # inside [0, 1]
    return l0 * (1.0 + tl.maximum(a, -1.0) + l0 * 0.5) + l1 * (1.0 - tl.maximum(a, 0.0) - l1 * 0.5)


@triton.jit
def c_round(v):
    """C's round(): half away from zero (floor(|v| + 0.5) can round up 0.49999997)."""
    a = tl.abs(v)
    t = tl.floor(a)
    r = t + tl.where(a - t >= 0.5, 1.0, 0.0)
    return tl.where(v < 0, -r, r)


@triton.jit
def pool_axis(c1, c2, scale, idx, pooled, size, CONTINUOUS: tl.constexpr):
    """RoIPool bin edges [lo, hi) along one axis (docs/semantics.md, RoIPool), clipped to [0, size].

    Returns (lo, hi, nonempty_box): the box-level emptiness of mmdetection's rule (Caffe
    boxes are never empty; their bins can still be clipped away).
    """
    if CONTINUOUS:
        st = c1 * scale
        length = (c2 + 1.0) * scale - st
    else:
        st = c_round(c1 * scale)
        length = tl.maximum(c_round(c2 * scale) - st + 1.0, 1.0)
    lo, hi = bin_edges(st, length, idx, pooled, size, CONTINUOUS)
    return lo, hi, length > 0


@triton.jit
def bin_edges(st, length, idx, pooled, size, CONTINUOUS: tl.constexpr):
    """RoIPool's bins along one axis (docs/semantics.md), [lo, hi) as int32 clipped to
    [0, size]: floor(idx * bin) and ceil((idx + 1) * bin), bin = length / pooled, plus the
    box start: a rounded start after floor and ceil, a continuous one (CONTINUOUS) before."""
    bin = div_rn(length, pooled.to(length.dtype))
    if CONTINUOUS:
        lo = tl.floor(idx * bin + st)
        hi = tl.ceil((idx + 1) * bin + st)
    else:
        lo = tl.floor(idx * bin) + st
        hi = tl.ceil((idx + 1) * bin) + st
    lo = tl.minimum(tl.maximum(lo, 0.0), size)
    hi = tl.minimum(tl.maximum(hi, 0.0), size)
    return lo.to(tl.int32), hi.to(tl.int32)


@triton.jit
def beats(v, best, first):
    """The running maximum of docs/semantics.md: the first candidate, a strictly greater
    value, or the first NaN."""
    return first | (v > best) | ((v != v) & (best == best))


@triton.jit
def with_flag(mask, flag):
    """mask & flag for a block mask and a scalar flag. Written as a select because Triton
    3.8's interpreter mistypes a broadcast scalar comparison result (the `&` then fails)."""
    return tl.where(flag, mask, False)


@triton.jit
def bin_tile(pb, cb, ph, pw, C, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr, CF: tl.constexpr):
    """A per-box program's tile (tile_blocks in _common.py): bins p = i * pw + j in
    [pb * BLOCK_P, +BLOCK_P) x channels c in [cb * BLOCK_C, +BLOCK_C); or, for CF == FLAT
    (one channel block), the box's outputs [pb * BLOCK_P, +BLOCK_P) in memory order, each
    with its own channel and bin. Returns p, its mask, i, j, c and its mask (per element
    for FLAT)."""
    P = ph * pw
    if CF == FLAT:
        start = pb.to(tl.int64) * BLOCK_P  # C * P may pass 2**31; the rest stays 32-bit
        c0 = start // P
        q = (start - c0 * P).to(tl.int32) + tl.arange(0, BLOCK_P)
        dc = q // P
        p = q - dc * P
        c = c0.to(tl.int32) + dc
        pm = c < C
        cm = pm
    else:
        p = pb * BLOCK_P + tl.arange(0, BLOCK_P)
        pm = p < P
        c = cb * BLOCK_C + tl.arange(0, BLOCK_C)
        cm = c < C
    i = p // pw
    return p, pm, i, p - i * pw, c, cm


@triton.jit
def box_program(n_pblocks):
    """The prologue of a per-box kernel (grid: _common.BoxGrid): box k, bin block pb and
    channel block cb of this program, program_id(0) = k * n_pblocks + pb, program_id(1) = cb."""
    pid = tl.program_id(0)
    k = pid // n_pblocks
    return k, pid - k * n_pblocks, tl.program_id(1)


@triton.jit
def box_tile(rois_ptr, scale_bits, n_pblocks, N, C, ph, pw, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr,
             CF: tl.constexpr):
    """box_program, the scale (scale_of), box k's row of rois (load_roi) and the program's
    tile of it (bin_tile): (k as int64, scale, ok, b, x1, y1, x2, y2, p, pm, i, j, c, cm)."""
    k, pb, cb = box_program(n_pblocks)
    scale = scale_of(scale_bits, rois_ptr.dtype.element_ty)
    ok, b, x1, y1, x2, y2 = load_roi(rois_ptr, k.to(tl.int64), N, scale)
    p, pm, i, j, c, cm = bin_tile(pb, cb, ph, pw, C, BLOCK_P, BLOCK_C, CF)
    return k.to(tl.int64), scale, ok, b, x1, y1, x2, y2, p, pm, i, j, c, cm


@triton.jit
def pixel_tile(th, tw, cb, H, W, C, TILE_H: tl.constexpr, TILE_W: tl.constexpr, BLOCK_C: tl.constexpr):
    """A deterministic-backward program's tile: map cells (r, s) of tile (th, tw), channels
    c in [cb * BLOCK_C, +BLOCK_C) with their mask, and the tile's first and last row and
    column inside the map (inclusive), for the tests that skip a box's samples."""
    q = tl.arange(0, TILE_H * TILE_W)
    r = th * TILE_H + q // TILE_W
    s = tw * TILE_W + q % TILE_W
    c = cb * BLOCK_C + tl.arange(0, BLOCK_C)
    r_lo = th * TILE_H
    s_lo = tw * TILE_W
    return r, s, c, c < C, r_lo, tl.minimum(r_lo + TILE_H, H) - 1, s_lo, tl.minimum(s_lo + TILE_W, W) - 1


@triton.jit
def store_tile(gi_ptr, acc, n, r, s, c, cm, H, W, siN, siC, siH, siW, CF: tl.constexpr):
    """Writes a pixel_tile's sums into image n of the gradient, cast to its dtype."""
    om = along_p((r < H) & (s < W), CF) & along_c(cm, CF)
    cell = r.to(tl.int64) * siH + s.to(tl.int64) * siW
    o = n.to(tl.int64) * siN + along_c(c.to(tl.int64), CF) * siC + along_p(cell, CF)
    tl.store(gi_ptr + o, acc.to(gi_ptr.dtype.element_ty), mask=om)


@triton.jit
def along_p(v, CF: tl.constexpr):
    """A per-position (bin or pixel) vector as a tile axis. CF ("channels fast", True):
    tiles are [positions, channels] with channels the fastest axis (channels_last input);
    False: [channels, positions] with positions fastest (NCHW); FLAT: [1, outputs], each
    output with its own position and channel (bin_tile). Triton's default layout spreads
    a warp's lanes over the last axis, so this picks which one is coalesced."""
    if CF == 1:
        r = v[:, None]
    else:
        r = v[None, :]
    return r


@triton.jit
def along_c(v, CF: tl.constexpr):
    """A per-channel vector as a tile axis (see along_p)."""
    if CF == 0:
        r = v[:, None]
    else:
        r = v[None, :]
    return r


@triton.jit
def pick(l, v0, v1, v2, v3, v4):
    """v_l for a level index l in [0, 5): the multi-level kernels take each level's map
    (pointer, size, scale) as separate arguments, so a launch needs no table in device
    memory (nothing to copy per call, and CUDA graphs capture the arguments by value)."""
    return tl.where(l == 0, v0, tl.where(l == 1, v1, tl.where(l == 2, v2, tl.where(l == 3, v3, v4))))


@triton.jit
def dense_strides(C, H, W, CHANNELS_LAST: tl.constexpr):
    """(sN, sC, sH, sW) of a dense [N, C, H, W] map, int64."""
    c = C.to(tl.int64)
    h = H.to(tl.int64)
    w = W.to(tl.int64)
    one = w * 0 + 1
    if CHANNELS_LAST:
        sn, sc, sh, sw = h * w * c, one, w * c, c
    else:
        sn, sc, sh, sw = c * h * w, h * w, w, one
    return sn, sc, sh, sw


@triton.jit
def level_map(l, C, sb0, sb1, sb2, sb3, sb4, H0, H1, H2, H3, H4, W0, W1, W2, W3, W4,
              T: tl.constexpr, CHANNELS_LAST: tl.constexpr):
    """Level l's dense map in a multi-level kernel: (H, W, sN, sC, sH, sW, scale in T)."""
    H = pick(l, H0, H1, H2, H3, H4)
    W = pick(l, W0, W1, W2, W3, W4)
    sN, sC, sH, sW = dense_strides(C, H, W, CHANNELS_LAST)
    return H, W, sN, sC, sH, sW, scale_of(pick(l, sb0, sb1, sb2, sb3, sb4), T)


@triton.jit
def box_level(lvl_ptr, k, n_levels, C, sb0, sb1, sb2, sb3, sb4, H0, H1, H2, H3, H4, W0, W1, W2, W3, W4,
              T: tl.constexpr, CHANNELS_LAST: tl.constexpr):
    """Box k's level in a multi-level kernel and that level's map: (valid, level, H, W,
    sN, sC, sH, sW, scale in T). A level outside [0, n_levels) is not valid (the box
    pools to 0; level 0's values keep its addresses in range)."""
    lvl = tl.load(lvl_ptr + k.to(tl.int64))
    valid = (lvl >= 0) & (lvl < n_levels)
    l = tl.where(valid, lvl, 0).to(tl.int32)
    H, W, sN, sC, sH, sW, scale = level_map(l, C, sb0, sb1, sb2, sb3, sb4, H0, H1, H2, H3, H4, W0, W1, W2, W3, W4,
                                            T, CHANNELS_LAST)
    return valid, l, H, W, sN, sC, sH, sW, scale


# ----------------------------------------------------------------------------- LiDAR boxes
# points_in_boxes, RoIAwarePool3d and RoIPointPool3d (docs/semantics.md, point clouds): box
# rows (x, y, z, dx, dy, dz, yaw), (x, y, z) the centre of the bottom face. Every step is
# rounded in the coordinate type T as the C++ kernels round it (fp fusion off: no FMA).


@triton.jit
def lidar_point(pts_ptr, row, mask, T: tl.constexpr):
    """Points `row` (int64, `mask`ed: masked rows are 0) of a [*, 3] point tensor in T:
    (px, py, pz)."""
    q = pts_ptr + row * 3
    px = tl.load(q, mask=mask, other=0.0).to(T)
    py = tl.load(q + 1, mask=mask, other=0.0).to(T)
    pz = tl.load(q + 2, mask=mask, other=0.0).to(T)
    return px, py, pz


@triton.jit
def lidar_box(boxes_ptr, trig_ptr, k, mask):
    """Box k (a scalar or a vector of rows, `mask`ed: masked rows are zero, which holds no
    point) of a [*, 7] box tensor in T and its [*, 2] (cos, sin) of -yaw, which the launcher
    computes in float64 and rounds to T (tl.cos/tl.sin are neither exact nor FMA-free):
    (x, y, z, dx, dy, dz, zc, c, s), zc the centre height z + dz / 2 summed in float64 and
    rounded once to T."""
    row = boxes_ptr + k * 7
    x = tl.load(row, mask=mask, other=0.0)
    y = tl.load(row + 1, mask=mask, other=0.0)
    z = tl.load(row + 2, mask=mask, other=0.0)
    dx = tl.load(row + 3, mask=mask, other=0.0)
    dy = tl.load(row + 4, mask=mask, other=0.0)
    dz = tl.load(row + 5, mask=mask, other=0.0)
    c = tl.load(trig_ptr + k * 2, mask=mask, other=0.0)
    s = tl.load(trig_ptr + k * 2 + 1, mask=mask, other=0.0)
    zc = (z.to(tl.float64) + dz.to(tl.float64) * 0.5).to(z.dtype)
    return x, y, z, dx, dy, dz, zc, c, s


@triton.jit
def lidar_inside(px, py, pz, x, y, dx, dy, dz, zc, c, s):
    """(inside, lx, ly): whether point (px, py, pz) lies in the box (broadcast operands) and
    its coordinates in the box's frame. Inclusive on the z faces, strict on the others;
    |pz - zc| > dz / 2 is the outside test, so a NaN there passes it (as mmcv's) and NaN in
    x or y fails the strict comparisons."""
    above = tl.abs(pz - zc) > dz * 0.5
    sx = px - x
    sy = py - y
    lx = sx * c - sy * s  # sx * c + sy * (-s): the same rounded products and sum
    ly = sx * s + sy * c
    hx = dx * 0.5
    hy = dy * 0.5
    inside = (lx > -hx) & (lx < hx) & (ly > -hy) & (ly < hy)
    return tl.where(above, False, inside), lx, ly


@triton.jit
def voxel_cell(q, n):
    """trunc(q) clamped to [0, n - 1] (n voxels along the axis) as int32: clamped as a
    float first, so that NaN (to 0), infinities and huge values never reach the conversion;
    truncating the clamped value is the same."""
    top = (n - 1).to(q.dtype)
    q = tl.where(q > 0.0, q, 0.0)
    q = tl.where(q < top, q, top)
    return q.to(tl.int32)


@triton.jit
def lidar_voxel(lx, ly, pz, z, dx, dy, dz, ox, oy, oz):
    """The voxel (ix * oy + iy) * oz + iz of an inside point (lidar_inside's lx, ly) of a
    box split into ox x oy x oz voxels, int32."""
    T = lx.dtype
    qx = div_rn(lx + dx * 0.5, div_rn(dx, ox.to(T)))
    qy = div_rn(ly + dy * 0.5, div_rn(dy, oy.to(T)))
    qz = div_rn(pz - z, div_rn(dz, oz.to(T)))
    return (voxel_cell(qx, ox) * oy + voxel_cell(qy, oy)) * oz + voxel_cell(qz, oz)
