"""ONNX translations of the mask steps of Mask R-CNN: mask targets (RoIAlign of the masks, by
``roi_align``'s translation) and mask pasting (detectron2's and torchvision's rules), each
pixel computed with the kernels' arithmetic, fused multiply-adds included (semantics.md,
"paste_masks"). ONNX has no fused multiply-add: ``_fma`` builds one, rounded once, from
separately rounded operations."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from onnxscript import ir

from ._graph import (op, _DOUBLE, _FLOAT, _INT64, _Constants, _In, _columns, _compute_type, _const, _i64,
                     _largest_or_one, _restore, _to_int)

# Veltkamp's constant for float64: 2^27 + 1 splits a double into two halves of 26 bits.
_SPLIT = 134217729.0


# ---- fused multiply-add --------------------------------------------------------------------


def _two_sum(a: ir.Value, b: ir.Value) -> tuple[ir.Value, ir.Value]:
    """Knuth's TwoSum: ``s = a + b`` rounded and its error, ``s + e == a + b`` exactly."""
    s = op.Add(a, b)
    bb = op.Sub(s, a)
    return s, op.Add(op.Sub(a, op.Sub(s, bb)), op.Sub(b, bb))


def _same_signs(a: ir.Value, b: ir.Value, n: _Constants) -> ir.Value:
    """``a`` and ``b`` both positive or both negative (the signs: ``a * b`` can underflow to 0)."""
    return op.Greater(op.Mul(op.Sign(a), op.Sign(b)), n(0, _DOUBLE))


def _fma_float(a: ir.Value, b: ir.Value, c: ir.Value, n: _Constants) -> ir.Value:
    """float32 ``fma(a, b, c)``. The product is exact in float64 and TwoSum makes
    ``hi + lo == a * b + c`` exactly; rounding ``hi`` to float32 gives the fma unless ``hi``
    is a tie between two floats (double rounding) that ``lo`` breaks: then the other one."""
    wide = [op.Cast(v, to=_DOUBLE) for v in (a, b, c)]
    hi, lo = _two_sum(op.Mul(wide[0], wide[1]), wide[2])
    r = op.Cast(hi, to=_FLOAT)
    r_wide = op.Cast(r, to=_DOUBLE)
    d = op.Sub(hi, r_wide)  # exact: r is hi's nearest float
    other = op.Add(r_wide, op.Add(d, d))  # the float across the tie, if hi is one
    other_f = op.Cast(other, to=_FLOAT)
    tie = op.Equal(op.Cast(other_f, to=_DOUBLE), other)
    return op.Where(op.And(tie, _same_signs(lo, d, n)), other_f, r)


def _fma_double(a: ir.Value, b: ir.Value, c: ir.Value, n: _Constants) -> ir.Value:
    """float64 ``fma(a, b, c)``, exact unless ``a * b`` underflows (below about 2^-969) or a
    value exceeds 2^995. Dekker's product and three TwoSums give ``a * b + c == h + l + v``
    exactly, ``|l|`` at most half of ``h``'s spacing and ``v`` too small to cross a rounding
    boundary unless ``h + l`` lies on one: there the fma is ``h``'s neighbour ``h + 2l`` if
    ``v`` points past the tie, else ``h``. Infinities and NaN take the unfused result,
    which is then the fma's."""
    def split(x: ir.Value) -> tuple[ir.Value, ir.Value]:  # Veltkamp: x = hi + lo, 26 bits each
        big = op.Mul(x, n(_SPLIT))
        hi = op.Sub(big, op.Sub(big, x))
        return hi, op.Sub(x, hi)

    p = op.Mul(a, b)
    (ah, al), (bh, bl) = split(a), split(b)
    e = op.Add(op.Add(op.Add(op.Sub(op.Mul(ah, bh), p), op.Mul(ah, bl)), op.Mul(al, bh)), op.Mul(al, bl))
    s, t = _two_sum(p, c)
    u, v = _two_sum(t, e)
    h, low = _two_sum(s, u)
    step = op.Add(low, low)
    other = op.Add(h, step)
    tie = op.Equal(op.Sub(other, h), step)  # h + 2l exact: h + l is a tie (or l = 0)
    exact = op.Where(op.And(tie, _same_signs(low, v, n)), other, h)
    plain = op.Add(p, c)
    return op.Where(op.Or(op.IsInf(plain), op.IsNaN(plain)), plain, exact)


def _fma(a: ir.Value, b: ir.Value, c: ir.Value, n: _Constants) -> ir.Value:
    """``a * b + c`` rounded once in the compute type (float32 or float64), as C's ``fma``."""
    return _fma_float(a, b, c, n) if n.t == _FLOAT else _fma_double(a, b, c, n)


# ---- shared: crops, taps, the four corners and the planes -------------------------------


class _Crop:
    """Where each plane is computed along one image side: ``[K, n]`` pixel positions, the
    same number ``n`` for every box (the widest of the boxes' ranges, at most the side),
    starting where the box's range ``[lo, hi)`` does (``[K]`` int64, within ``[0, size]``) or
    earlier, so that the crop stays in the image. The rest of the plane is not computed:
    the kernels write it with the value a pixel there has (0, or True for a threshold <= 0)."""

    def __init__(self, lo: ir.Value, hi: ir.Value, size: int, n: _Constants) -> None:
        widest = op.Unsqueeze(_largest_or_one(op.Sub(hi, lo)), n.i64(0))  # one pixel for no boxes
        self.size = op.Min(widest, n.i64(size))                                         # [1]
        start = op.Min(lo, op.Sub(n.i64(size), self.size))
        self.at = op.Add(op.Unsqueeze(start, n.i64(1)),
                         op.Unsqueeze(n.range(op.Squeeze(self.size, n.i64(0))), n.i64(0)))


def _plane(values: ir.Value, rows: _Crop, cols: _Crop, height: int, width: int, fill: ir.Value, n: _Constants
           ) -> ir.Value:
    """The ``[K, height, width]`` planes: ``fill`` (a 0-d constant of their type) but the crops'
    ``values`` (``[K, rows, cols]``), put in place by ScatterElements along the flattened plane."""
    k = op.Shape(values, start=0, end=1)
    where = op.Add(op.Unsqueeze(op.Mul(rows.at, n.i64(width)), n.i64(2)), op.Unsqueeze(cols.at, n.i64(1)))
    # Explicit sizes, no -1 (not inferable when K = 0); allowzero: a 0 is a size, not "keep".
    flat = op.Concat(k, op.Mul(rows.size, cols.size), axis=0)
    planes = op.Expand(fill, op.Concat(k, n.i64(height * width), axis=0))
    out = op.ScatterElements(planes, op.Reshape(where, flat, allowzero=1), op.Reshape(values, flat, allowzero=1),
                             axis=1)
    return op.Reshape(out, op.Concat(k, n.i64(height, width), axis=0), allowzero=1)


def _tap_index(i: ir.Value, m: ir.Value, n: _Constants) -> ir.Value:
    """Tap ``i`` (int64, any value) of a mask side of ``m`` cells as an index into the side
    bordered by one zero cell: a tap off the mask reads 0, so none needs a mask of its own."""
    return op.Add(op.Min(op.Max(i, n.i64(-1)), m), n.i64(1))


def _outer(a: ir.Value, b: ir.Value, n: _Constants) -> ir.Value:
    """``a[k, y] * b[k, x]`` as ``[K, H, W]``."""
    return op.Mul(op.Unsqueeze(a, n.i64(2)), op.Unsqueeze(b, n.i64(1)))


def _both(a: ir.Value, b: ir.Value, n: _Constants) -> ir.Value:
    """``a[k, y] and b[k, x]`` as ``[K, H, W]``."""
    return op.And(op.Unsqueeze(a, n.i64(2)), op.Unsqueeze(b, n.i64(1)))


class _Corners:
    """The bilinear corners of every pixel, ``[K, H, W]`` each, of the masks ``x``
    (``[K, Mh, Mw]``) bordered by one zero cell, from taps indexing the bordered sides:
    ``corner(a, b)`` at the y tap ``a`` (0 low, 1 high, ``[K, H]``) and the x tap ``b``
    (``[K, W]``). Each is gathered where it is used, so that few are held at once."""

    def __init__(self, x: ir.Value, y: tuple[ir.Value, ir.Value], xs: tuple[ir.Value, ir.Value], n: _Constants
                 ) -> None:
        # Concat, not Pad: the ONNX version converter cannot take Pad below opset 18.
        k = op.Shape(x, start=0, end=1)
        zero = n(0)
        column = op.Expand(zero, op.Concat(k, op.Shape(x, start=1, end=2), n.i64(1), axis=0))
        x = op.Concat(column, x, column, axis=2)
        row = op.Expand(zero, op.Concat(k, n.i64(1), op.Shape(x, start=2, end=3), axis=0))
        x = op.Concat(row, x, row, axis=1)
        self.flat = op.Reshape(x, n.i64(-1))
        side, plane = n.size(x, 2), op.Mul(n.size(x, 1), n.size(x, 2))
        base = op.Unsqueeze(op.Mul(n.range(n.size(y[0], 0)), plane), n.i64(1, 2))
        self.rows = [op.Add(base, op.Unsqueeze(op.Mul(r, side), n.i64(2))) for r in y]    # [K, H, 1]
        self.cols = [op.Unsqueeze(c, n.i64(1)) for c in xs]                                 # [K, 1, W]

    def __call__(self, a: int, b: int) -> ir.Value:
        return op.Gather(self.flat, op.Add(self.rows[a], self.cols[b]), axis=0)


# ---- paste_masks: the continuous rule (detectron2) -----------------------------------------


def _reach(a: ir.Value, b: ir.Value, m: ir.Value, size: int, n: _Constants) -> tuple[ir.Value, ir.Value]:
    """The pixels ``[lo, hi)`` (``[K]`` int64) of one side whose sample can reach the mask,
    with two pixels of margin, clipped to the side: the kernels' span, in float64. Empty for
    a box of zero size."""
    d = _DOUBLE
    a, b, m = op.Cast(a, to=d), op.Cast(b, to=d), op.Cast(m, to=d)
    side = op.Sub(b, a)
    half = n(0.5, d)
    u = op.Sub(op.Add(a, op.Mul(side, op.Div(n(-0.5, d), m))), half)
    v = op.Sub(op.Add(a, op.Mul(side, op.Div(op.Add(m, half), m))), half)
    lo = op.Sub(op.Floor(op.Min(u, v)), n(2, d))
    hi = op.Add(op.Ceil(op.Max(u, v)), n(3, d))
    flat = op.Or(op.Equal(side, n(0, d)), op.Or(op.IsInf(side), op.IsNaN(side)))

    def clip(x: ir.Value) -> ir.Value:
        return _to_int(op.Where(flat, n(0, d), op.Min(op.Max(x, n(0, d)), n(size, d))))

    return clip(lo), clip(hi)


def _window(a: ir.Value, b: ir.Value, size: int, n: _Constants) -> tuple[ir.Value, ir.Value]:
    """detectron2's CPU window of one side, ``[floor(a) - 1, ceil(b) + 1)``, clipped to it."""
    lo = op.Sub(_to_int(op.Floor(a)), n.i64(1))
    hi = op.Add(_to_int(op.Ceil(b)), n.i64(1))
    return op.Min(op.Max(lo, n.i64(0)), n.i64(size)), op.Min(op.Max(hi, n.i64(0)), n.i64(size))


def _continuous_taps(a: ir.Value, b: ir.Value, p: ir.Value, m: ir.Value, n: _Constants
                     ) -> tuple[ir.Value, ir.Value, ir.Value, ir.Value, ir.Value]:
    """The taps of pixels ``p`` (``[K, n]`` int64) of boxes ``[a, b)`` (``[K]``) over a mask side
    of ``m`` cells: detectron2's grid coordinate ``((p + 0.5 - a) / (b - a)) * 2 - 1``, each
    step rounded, then grid_sample's ``fma(g + 1, m / 2, -0.5)``. Returns the low and high
    tap (bordered indices), their weights, and whether the coordinate is finite (a box of
    zero size makes it infinite or NaN, and the pixel 0)."""
    t = n.t
    a2 = op.Unsqueeze(a, n.i64(1))
    side = op.Unsqueeze(op.Sub(b, a), n.i64(1))
    g = op.Sub(op.Mul(op.Div(op.Sub(op.Add(op.Cast(p, to=t), n(0.5)), a2), side), n(2)), n(1))
    m_t = op.Cast(m, to=t)
    x = _fma(op.Add(g, n(1)), op.Div(m_t, n(2)), n(-0.5), n)
    finite = op.Not(op.Or(op.IsInf(x), op.IsNaN(x)))
    x = op.Where(finite, x, n(-4))  # any point off the mask: the pixel is set to 0
    f = op.Floor(x)
    wh = op.Sub(x, f)
    lo = _to_int(op.Min(op.Max(f, n(-2)), m_t))  # a tap far off the mask: any tap off it
    return _tap_index(lo, m, n), _tap_index(op.Add(lo, n.i64(1)), m, n), op.Sub(n(1), wh), wh, finite


def _inside(p: ir.Value, lo: ir.Value, hi: ir.Value, n: _Constants) -> ir.Value:
    """``lo[k] <= p[k, i] < hi[k]``."""
    return op.And(op.GreaterOrEqual(p, op.Unsqueeze(lo, n.i64(1))), op.Less(p, op.Unsqueeze(hi, n.i64(1))))


def _paste_masks(masks: _In, boxes: _In, height: int, width: int, threshold: float, binary: bool,
                 box_window: bool) -> _In:
    """Each plane's pixels that its mask can reach (or, for a threshold <= 0, which passes
    the zeros, its window), ``[K, Hc, Wc]`` for the largest reach: grid_sample's bilinear
    value, the first product rounded and the others fused, in the kernels' order (zeros
    outside the mask); the rest of the plane is 0, as the kernels write it, or True for a
    threshold <= 0 without the window."""
    x, t = _compute_type(masks)
    n = _Constants(t)
    x1, y1, x2, y2 = _columns(boxes, t, 4)
    mh, mw = n.size(x, 1), n.size(x, 2)
    zero_passes = binary and bool(t.numpy().type(threshold) <= 0)
    (ry0, ry1), (rx0, rx1) = _reach(y1, y2, mh, height, n), _reach(x1, x2, mw, width, n)
    if box_window:
        (wy0, wy1), (wx0, wx1) = _window(y1, y2, height, n), _window(x1, x2, width, n)
        if zero_passes:  # every pixel of the window passes
            ry0, ry1, rx0, rx1 = wy0, wy1, wx0, wx1
        else:
            ry0, ry1, rx0, rx1 = op.Max(ry0, wy0), op.Min(ry1, wy1), op.Max(rx0, wx0), op.Min(rx1, wx1)
    rows, cols = _Crop(ry0, ry1, height, n), _Crop(rx0, rx1, width, n)
    ylo, yhi, wyl, wyh, fy = _continuous_taps(y1, y2, rows.at, mh, n)
    xlo, xhi, wxl, wxh, fx = _continuous_taps(x1, x2, cols.at, mw, n)
    v = _Corners(x, (ylo, yhi), (xlo, xhi), n)
    val = op.Mul(v(0, 0), _outer(wyl, wxl, n))
    val = _fma(v(0, 1), _outer(wyl, wxh, n), val, n)
    val = _fma(v(1, 0), _outer(wyh, wxl, n), val, n)
    val = _fma(v(1, 1), _outer(wyh, wxh, n), val, n)
    val = op.Where(_both(fy, fx, n), val, n(0))
    window = _both(_inside(rows.at, wy0, wy1, n), _inside(cols.at, wx0, wx1, n), n) if box_window else None
    if binary:
        out = op.GreaterOrEqual(val, n(threshold))
        out = out if window is None else op.And(out, window)
        fill = n(zero_passes and not box_window, ir.DataType.BOOL)
    else:
        out = _restore(val if window is None else op.Where(window, val, n(0)), masks)
        fill = n(0, masks.dtype)
    return _plane(out, rows, cols, height, width, fill, n)


# ---- paste_masks_torchvision: torchvision's rule -------------------------------------------


def _resize_taps(a: ir.Value, b: ir.Value, p: ir.Value, m: ir.Value, padding: int, fused: bool, n: _Constants
                 ) -> tuple[ir.Value, ir.Value, ir.Value, ir.Value, ir.Value]:
    """The taps of pixels ``p`` (``[K, n]`` int64) for integer boxes ``[a, b]`` (``[K]``): the
    side padded to ``m + 2 * padding`` cells and resized to ``max(b - a + 1, 1)`` by ATen's
    ``upsample_bilinear2d`` arithmetic, cell ``p - a`` at pixel ``p``. Returns the low and
    high tap (bordered indices into the unpadded side), their weights and the resized side
    ``[K]``."""
    t = n.t
    out = op.Max(op.Add(op.Sub(b, a), n.i64(1)), n.i64(1))
    cells = op.Add(m, n.i64(2 * padding))
    scale = op.Unsqueeze(op.Div(op.Cast(cells, to=t), op.Cast(out, to=t)), n.i64(1))
    d = op.Sub(p, op.Unsqueeze(a, n.i64(1)))
    at = op.Add(op.Cast(d, to=t), n(0.5))
    s = _fma(scale, at, n(-0.5), n) if fused else op.Sub(op.Mul(scale, at), n(0.5))
    s = op.Where(op.Less(s, n(0)), n(0), s)
    last = op.Sub(cells, n.i64(1))
    lo = op.Min(_to_int(op.Floor(op.Cast(s, to=_FLOAT))), last)  # ATen floors in float
    l1 = op.Min(op.Max(op.Sub(s, op.Cast(lo, to=t)), n(0)), n(1))
    hi = op.Add(lo, op.Cast(op.Less(lo, last), to=_INT64))
    copy = op.Unsqueeze(op.Equal(cells, out), n.i64(1))  # the same size: a copy
    lo, hi, l1 = op.Where(copy, d, lo), op.Where(copy, d, hi), op.Where(copy, n(0), l1)
    pad = n.i64(padding)
    return _tap_index(op.Sub(lo, pad), m, n), _tap_index(op.Sub(hi, pad), m, n), op.Sub(n(1), l1), l1, out


def _paste_masks_torchvision(masks: _In, boxes: _In, height: int, width: int, padding: int, fused: bool) -> _In:
    """Each plane's pixels in its box, ``[K, Hc, Wc]`` for the largest box in the image: the
    resized padded mask's cell there; the rest of the plane is 0. ATen sums a small output
    (height + width <= 128) in one pass of four products and a larger one by rows then
    columns; the boxes choose at run time, so both sums are computed."""
    x, t = _compute_type(masks)
    n = _Constants(t)
    x1, y1, x2, y2 = _columns(boxes, _INT64, 4)
    mh, mw = n.size(x, 1), n.size(x, 2)

    def box_range(a: ir.Value, b: ir.Value, size: int) -> tuple[ir.Value, ir.Value]:
        lo = op.Min(op.Max(a, n.i64(0)), n.i64(size))
        return lo, op.Max(op.Min(op.Add(b, n.i64(1)), n.i64(size)), lo)

    (y0, y1e), (x0, x1e) = box_range(y1, y2, height), box_range(x1, x2, width)
    rows, cols = _Crop(y0, y1e, height, n), _Crop(x0, x1e, width, n)
    ylo, yhi, wyl, wyh, h = _resize_taps(y1, y2, rows.at, mh, padding, fused, n)
    xlo, xhi, wxl, wxh, w = _resize_taps(x1, x2, cols.at, mw, padding, fused, n)
    v = _Corners(x, (ylo, yhi), (xlo, xhi), n)

    def fma(a: ir.Value, b: ir.Value, c: ir.Value) -> ir.Value:
        return _fma(a, b, c, n) if fused else op.Add(op.Mul(a, b), c)

    def weight(a: int, b: int) -> ir.Value:
        return _outer((wyl, wyh)[a], (wxl, wxh)[b], n)

    if fused:
        one_pass = fma(v(1, 1), weight(1, 1), fma(v(1, 0), weight(1, 0), fma(v(0, 0), weight(0, 0),
                                                                           op.Mul(v(0, 1), weight(0, 1)))))
    else:
        one_pass = op.Add(op.Add(op.Add(op.Mul(v(0, 0), weight(0, 0)), op.Mul(v(0, 1), weight(0, 1))),
                                 op.Mul(v(1, 0), weight(1, 0))), op.Mul(v(1, 1), weight(1, 1)))
    gx, hx = op.Unsqueeze(wxl, n.i64(1)), op.Unsqueeze(wxh, n.i64(1))
    gy, hy = op.Unsqueeze(wyl, n.i64(2)), op.Unsqueeze(wyh, n.i64(2))
    two_rows = [fma(v(a, 0), gx, op.Mul(v(a, 1), hx)) for a in (0, 1)]
    two_pass = fma(two_rows[0], gy, op.Mul(two_rows[1], hy))
    separable = op.Unsqueeze(op.Greater(op.Add(h, w), n.i64(128)), n.i64(1, 2))
    val = op.Where(separable, two_pass, one_pass)
    covered = _both(_inside(rows.at, y0, y1e, n), _inside(cols.at, x0, x1e, n), n)
    out = _restore(op.Where(covered, val, n(0)), masks)
    return _plane(out, rows, cols, height, width, n(0, masks.dtype), n)


# ---- mask_targets --------------------------------------------------------------------------


def _mask_targets(roi_align: Callable[..., Any]) -> Callable[..., Any]:
    """The translation of ``mask_targets``: ``roi_align``'s translation (spatial scale 1) of
    the masks as one-channel maps, read as float32 (float64 for float64 masks); a threshold
    compares the values in that type, soft targets of half types are rounded to them."""
    def mask_targets(masks: _In, rois: _In, pooled_height: int, pooled_width: int, sampling_ratio: int,
                     aligned: bool, threshold: float, binary: bool) -> _In:
        x, t = _compute_type(masks)
        if masks.shape is not None and 0 in (masks.shape[1], masks.shape[2]):  # no cell to sample: zeros
            dtype = ir.DataType.BOOL if binary else t if masks.dtype in (ir.DataType.BOOL, ir.DataType.UINT8) \
                else masks.dtype
            shape = op.Concat(op.Shape(rois, start=0, end=1), _i64(pooled_height, pooled_width), axis=0)
            return op.Expand(_const(0, dtype), shape)
        maps = op.Unsqueeze(x, _i64(1))
        maps.dtype = t  # the tracer leaves it unset; roi_align's translation reads it
        out = op.Squeeze(roi_align(maps, rois, 1.0, pooled_height, pooled_width, sampling_ratio, aligned), _i64(1))
        if binary:
            return op.GreaterOrEqual(out, _const(threshold, t))
        return out if masks.dtype in (ir.DataType.BOOL, ir.DataType.UINT8) else _restore(out, masks)

    return mask_targets


def translations(roi_align: Callable[..., Any]) -> dict[str, Callable[..., Any]]:
    """Each op's translation by op name, mask targets built on ``roi_align``'s translation."""
    return {"mask_targets": _mask_targets(roi_align), "paste_masks": _paste_masks,
            "paste_masks_torchvision": _paste_masks_torchvision}
