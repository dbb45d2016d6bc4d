"""Property-based fuzzing of the public API (hypothesis, derandomized: the same cases on
every run) over every op of roiops.ops.SPECS, with every option its spec's option sets
vary drawn anew. Every case of the ops on axis-aligned boxes runs on the C++ kernels and
on the reference, forward and backward, and is also checked against torchvision where it
has the op and the case is in its domain. Invalid boxes must raise ValueError naming the
row. The position-sensitive ops are checked against the reference alone, on maps that
include size-1 dimensions with odd strides and with up to 30 more boxes, some upside
down, so that their tiles and bands run; 1 and 2 threads must give the same bits. So are
the ops on rotated boxes, with up to 24 oriented boxes at any angle (exact quarter turns
among them), given in either unit and direction, and in both box forms. A dozen cases of
each also run the Triton kernels, each on one of their two backward paths (atomic adds
or the deterministic gather).

Cases with huge or extreme values run in a child interpreter (`_risky_cases`), so that a
crash or a hang fails a test instead of ending the run.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import typing

import pytest
import torch
import torchvision.ops as tv
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import roiops
from cases import (OPTIONS, Case, config_set, contract_args, device_for, num_threads, odd_unit_strides,
                   per_bin_tensors, takes_max, tol)
from roiops._boxes import AXIS_ALIGNED, BEZIER, ROTATED
from roiops.ops import SPECS

SETTINGS = dict(derandomize=True, database=None, deadline=None, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
SCALES = [1.0, 0.5, 0.25, 1 / 16, 2.0, 0.3]
RATIOS = [-1, 0, 1, 2, 3, 5]

# The ops on axis-aligned boxes that read any channel count; the position-sensitive ones
# and those on rotated boxes have strategies of their own below.
PLAIN = [s for s in SPECS if s.boxes is AXIS_ALIGNED and not s.position_sensitive]
POSITION_SENSITIVE = [s for s in SPECS if s.position_sensitive]
ON_ROTATED = [s for s in SPECS if s.boxes is ROTATED]
ON_BEZIER = [s for s in SPECS if s.boxes is BEZIER]
BY_NAME = {s.name: s for s in SPECS}


@st.composite
def op_cases(draw, specs, ratios=RATIOS):
    """A spec and the options its option sets vary, each drawn by its type: a flag either
    way, a choice among its Literal's, a sampling ratio among ``ratios``, the channels per
    field of an op with channel fields among 1, 2, 3 and 8."""
    spec = draw(st.sampled_from(specs))
    hints = typing.get_type_hints(spec.function)
    options = {}
    for name in sorted({name for options in OPTIONS[spec.name] for name in options}):
        hint = hints[name]
        if name in per_bin_tensors(spec):  # given (drawn by the case) or None
            if draw(st.booleans()):
                options[name] = None
        elif name == spec.kernels[0].channel_groups:
            options[name] = draw(st.sampled_from([1, 2, 3, 8]))
        elif hint is bool:
            options[name] = draw(st.booleans())
        elif typing.get_origin(hint) is typing.Literal:
            options[name] = draw(st.sampled_from(typing.get_args(hint)))
        elif hint is float:
            options[name] = draw(st.sampled_from([0.0, 0.1, 1.0, -2.5]))
        else:
            assert hint is int, (spec.name, name, hint)
            options[name] = draw(st.sampled_from(ratios))
    return Case(spec.name, spec, options)


@st.composite
def feature_maps(draw):
    n, c = draw(st.integers(1, 2)), draw(st.integers(1, 3))
    h, w = draw(st.integers(1, 9)), draw(st.integers(1, 9))
    dtype = draw(st.sampled_from(DTYPES))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    values = draw(st.sampled_from(["normal", "ties", "specials"]))
    x = torch.randn(n, c, h, w, generator=g, dtype=torch.float64)
    if values == "ties":  # many equal values and exact zeros: argmax tie-breaking
        x = x.round()
    elif values == "specials":
        flat = x.view(-1)
        for v in draw(st.lists(st.sampled_from([math.nan, math.inf, -math.inf]), min_size=1, max_size=3)):
            flat[draw(st.integers(0, flat.numel() - 1))] = v
    x = x.to(dtype)
    layout = draw(st.sampled_from(["nchw", "channels_last", "strided"]))
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    elif layout == "strided":  # every other column of a wider tensor
        wide = torch.zeros(n, c, h, 2 * w, dtype=dtype)
        wide[..., ::2] = x
        x = wide[..., ::2]
    return x, values


@st.composite
def box_rows(draw, n, h, w, scale, allow_invalid):
    """Rows (batch, x1, y1, x2, y2) in image pixels, and which of them are invalid."""
    kinds = ["inside", "inside", "outside", "inverted", "huge", "tiny", "point"]
    if allow_invalid:
        kinds += ["invalid"]
    rows, invalid = [], False
    for _ in range(draw(st.integers(0, 4))):
        kind = draw(st.sampled_from(kinds))
        if kind == "invalid":
            kind = draw(st.sampled_from(["nan", "beyond", "bad_index"]))
        b = float(draw(st.integers(0, n - 1)))
        cell = st.floats(-2.0, max(h, w) + 2.0, allow_nan=False, width=32)
        x1, y1, x2, y2 = (draw(cell) for _ in range(4))
        if kind == "inside":
            x1, x2, y1, y2 = min(x1, x2), max(x1, x2), min(y1, y2), max(y1, y2)
        elif kind == "outside":
            off = draw(st.sampled_from([-30.0, 40.0]))
            x1, x2 = x1 + off, x2 + off
        elif kind == "inverted":
            x1, x2, y1, y2 = max(x1, x2) + 0.5, min(x1, x2), max(y1, y2) + 0.5, min(y1, y2)
        elif kind == "huge":
            big = draw(st.sampled_from([1e4, 1e6]))
            x1, y1, x2, y2 = -big, -draw(st.sampled_from([1.0, big])), big, big
        elif kind == "tiny":
            x2, y2 = x1 + 1e-3, y1 + 1e-3
        elif kind == "point":
            x2, y2 = x1, y1
        elif kind == "nan":
            x1 = math.nan
        elif kind == "beyond":
            y2 = 2.0**25
        elif kind == "bad_index":
            b = draw(st.sampled_from([-1.0, float(n), 0.5]))
        invalid |= kind in ("nan", "bad_index", "beyond")  # "beyond": 2^25 cells after scale
        rows.append([b, x1 / scale, y1 / scale, x2 / scale, y2 / scale])
    return torch.tensor(rows, dtype=torch.float64).reshape(-1, 5), invalid


@st.composite
def cases(draw):
    x, values = draw(feature_maps())
    n, _, h, w = x.shape
    scale = draw(st.sampled_from(SCALES))
    rois, invalid = draw(box_rows(n, h, w, scale, allow_invalid=True))
    op = draw(op_cases(PLAIN))
    args = dict(output_size=(draw(st.integers(1, 4)), draw(st.integers(1, 4))), spatial_scale=scale)
    as_list = draw(st.booleans())  # torchvision's other box form: a list of [L, 4] per image
    # Boxes in the input's dtype, unless that overflows (float16 holds at most 65504).
    cast = rois.to(x.dtype) if bool(torch.isfinite(rois.to(x.dtype)[:, 1:]).all()) else rois.to(torch.float32)
    boxes = [rois[rois[:, 0] == i, 1:] for i in range(n)] if as_list and not invalid else cast
    if as_list and not invalid:
        rois = torch.cat([torch.cat([torch.full((len(b), 1), float(i), dtype=b.dtype), b], 1)
                          for i, b in enumerate(boxes)])  # the row order the list gives
    return x, values, rois, boxes, op, args, invalid


def run(x, boxes, op, args):
    return op(x, boxes, args["output_size"], args["spatial_scale"])


def reference_tol(op, rois, args, dtype) -> dict[str, float]:
    """The tolerance against the reference. Where the reference integrates over a bin as a
    difference of antiderivatives (OpSpec.reference_bin_error), which loses eps / (bin side
    in cells) of relative precision (the C++ kernels sum the pieces over the side itself),
    it widens by that for tiny bins."""
    t = tol(dtype)["atol"]
    if not op.spec.reference_bin_error:
        return dict(rtol=t, atol=t)
    s, (ph, pw) = args["spatial_scale"], args["output_size"]
    sides = (rois[:, 3:5] - rois[:, 1:3]).double().clamp(min=0) * s / torch.tensor([pw, ph], dtype=torch.float64)
    sides = sides[(sides > 0).all(1)]
    if sides.numel():
        eps = torch.finfo(torch.float64 if dtype == torch.float64 else torch.float32).eps
        t = max(t, 4 * eps / float(sides.min()))
    return dict(rtol=t, atol=t)


def grid_product(rois, op, args) -> float:
    """Samples per bin of an adaptive grid, in float64 (an independent estimate)."""
    s, (ph, pw) = args["spatial_scale"], args["output_size"]
    best = 0.0
    for _, x1, y1, x2, y2 in rois.tolist():
        rw, rh = (x2 - x1) * s, (y2 - y1) * s
        if not op.options["aligned"]:
            rw, rh = max(rw, 1), max(rh, 1)
        gw, gh = math.ceil(rw / pw), math.ceil(rh / ph)
        if gw > 0 and gh > 0:
            best = max(best, gw * gh)
    return best


@settings(max_examples=1500, **SETTINGS)
@given(cases())
def test_cpu_and_reference_agree(case):
    x, values, rois, boxes, op, args, invalid = case
    if invalid:
        event("invalid boxes")
        for backend in ("cpu", "reference"):
            with roiops.use_backend(backend), pytest.raises(ValueError, match=r"row \d+"):
                run(x, boxes, op, args)
        return
    x = x.detach().requires_grad_(True)
    results = {}
    for backend in ("cpu", "reference"):
        try:
            with roiops.use_backend(backend):
                out = run(x, boxes, op, args)
                g_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out.dtype)
                (g_in,) = torch.autograd.grad(out, x, g_out) if out.numel() else (torch.zeros_like(x),)
        except ValueError as e:
            # Only a maximum over an adaptive grid of more than 2^31 - 1 samples may refuse.
            assert takes_max(op) and op.options.get("sampling_ratio", 1) <= 0 and "int32 argmax" in str(e), str(e)
            assert grid_product(rois, op, args) > 2**30
            results[backend] = None
            event("refused: max grid beyond int32")
            continue
        assert out.shape == (rois.shape[0], x.shape[1], *args["output_size"]) and out.dtype == x.dtype
        assert g_in.shape == x.shape
        results[backend] = (out, g_in)
    if results["cpu"] is None or results["reference"] is None:
        assert results["cpu"] is None and results["reference"] is None
        return
    (out, g_in), (rout, rg_in) = results["cpu"], results["reference"]
    t = reference_tol(op, rois, args, x.dtype)
    if t["atol"] > 1:
        event("bin below the reference's resolution: values not compared")
        return
    if op.spec.reference_bin_error and values == "specials":
        # A cell at a window's edge that the kernels weigh by a few ulps can weigh exactly 0
        # in the reference (a difference of antiderivatives): an inf there gives inf in one
        # and NaN (0 * inf) in the other. Which values are finite must agree, and those values.
        for a, b in ((out, rout), (g_in, rg_in)):
            assert torch.equal(a.isfinite(), b.isfinite())
        finite, g_finite = out.isfinite(), g_in.isfinite()
        out, rout, g_in, rg_in = out[finite], rout[finite], g_in[g_finite], rg_in[g_finite]
        event("closed-form windows with non-finite values: finite values compared")
        return _agree(op, out, rout, g_in, rg_in, t)
    _agree(op, out, rout, g_in, rg_in, t)
    check_torchvision(x.detach(), values, rois, boxes, op, args, out.detach(), g_in)


def _agree(op, out, rout, g_in, rg_in, t) -> None:
    """The kernels' and the reference's results within tolerance ``t``."""
    if takes_max(op):  # a maximum is one sample's value: the same bits
        torch.testing.assert_close(out, rout, rtol=0, atol=0, equal_nan=True)
    else:  # sums, in an order of the kernel's choosing
        torch.testing.assert_close(out, rout, **t, equal_nan=True)
    torch.testing.assert_close(g_in, rg_in, **t, equal_nan=True)


def torchvision_peer(op):
    """torchvision's function of the op and options, where it has them: RoIAlign "avg" and
    RoIPool "caffe"; None elsewhere."""
    o = op.options
    if op.spec.name == "roi_align" and o["mode"] == "avg":
        return lambda x, r, size, s: tv.roi_align(x, r, size, s, o["sampling_ratio"], o["aligned"])
    if op.spec.name == "roi_pool" and o["convention"] == "caffe":
        return tv.roi_pool
    return None


def check_torchvision(x, values, rois, boxes, op, args, out, g_in):
    """torchvision where it has the op and the case is in its domain: float32/float64,
    finite maps (its RoIPool never picks NaN or a bin of -inf), and for RoIAlign no huge
    boxes (it visits every sample of the grid) nor empty aligned adaptive grids."""
    fn = torchvision_peer(op)
    if fn is None or x.dtype not in (torch.float32, torch.float64) or values == "specials":
        return
    size, s = args["output_size"], args["spatial_scale"]
    r = rois.to(x.dtype)
    if "sampling_ratio" in op.options:
        span = (r[:, 3:] - r[:, 1:3]).abs().max() * s if r.numel() else 0
        adaptive, aligned = op.options["sampling_ratio"] <= 0, op.options["aligned"]
        if span > 100 or (adaptive and aligned and bool(((r[:, 3:] - r[:, 1:3]) <= 0).any())):
            return
    theirs = fn(x, r, size, s)
    event(f"torchvision {op.spec.name}")
    torch.testing.assert_close(out, theirs, rtol=0, atol=0)
    xg = x.clone().requires_grad_(True)
    o = fn(xg, r, size, s)
    g_out = torch.randn(o.shape, generator=torch.Generator().manual_seed(1)).to(o.dtype)
    (tg,) = torch.autograd.grad(o, xg, g_out) if o.numel() else (torch.zeros_like(x),)
    torch.testing.assert_close(g_in, tg, rtol=0, atol=0)


# ---- position-sensitive ops: enough boxes for their tiles and bands ------------------------


@st.composite
def laid_out(draw, x):
    """x's values in NCHW, channels_last, with contiguous columns, or with odd strides on
    its size-1 dimensions (in either format)."""
    layout = draw(st.sampled_from(["nchw", "channels_last", "strided", "odd unit strides"]))
    if layout == "channels_last":
        return x.contiguous(memory_format=torch.channels_last)
    if layout == "strided":
        return x.transpose(2, 3).contiguous().transpose(2, 3)  # columns contiguous
    if layout == "odd unit strides":
        fmt = draw(st.sampled_from([torch.contiguous_format, torch.channels_last]))
        return odd_unit_strides(x.contiguous(memory_format=fmt))
    return x


@st.composite
def ps_cases(draw):
    ph, pw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    n, c_out = draw(st.integers(1, 2)), draw(st.sampled_from([1, 2, 9]))  # 9: past one vector of lanes
    h, w = draw(st.integers(1, 14)), draw(st.integers(1, 14))
    dtype = draw(st.sampled_from([torch.float32, torch.float64]))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    x = draw(laid_out(torch.randn(n, c_out * ph * pw, h, w, generator=g, dtype=torch.float64).to(dtype)))
    scale = draw(st.sampled_from(SCALES))
    few, _ = draw(box_rows(n, h, w, scale, allow_invalid=False))
    # Many boxes over the whole map (some upside down) make the kernels rearrange it: per
    # bin for NCHW, by bands of rows for channels_last.
    many = draw(st.integers(0, 30))
    corners = (torch.rand(many, 4, generator=g, dtype=torch.float64) * 1.2 - 0.1) * torch.tensor([w, h, w, h])
    upright = torch.rand(many, generator=g) < 0.8
    x1, x2 = corners[:, [0, 2]].sort(dim=1).values.unbind(1)
    y1, y2 = corners[:, [1, 3]].sort(dim=1).values.unbind(1)
    y1, y2 = torch.where(upright, y1, y2), torch.where(upright, y2, y1)
    index = torch.randint(0, n, (many,), generator=g, dtype=torch.float64)
    packed = torch.stack([index, x1 / scale, y1 / scale, x2 / scale, y2 / scale], 1)
    rois = torch.cat([few, packed]).to(dtype)
    op = draw(op_cases(POSITION_SENSITIVE, ratios=[-1, 0, 1, 2, 5]))
    return x, rois, op, (ph, pw), scale


def forward_backward(fn, x, backend):
    """(fn(x), the gradient of x for a fixed random output gradient) on `backend`, x moved
    to where that backend runs."""
    xg = x.detach().to(device_for(backend)).requires_grad_(True)
    with roiops.use_backend(backend):
        out = fn(xg)
        g_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out.device, out.dtype)
        (g_in,) = torch.autograd.grad(out, xg, g_out) if out.numel() else (torch.zeros_like(xg),)
    return out.detach().cpu(), g_in.cpu()


def ps_call(case):
    x, rois, op, size, scale = case
    return lambda t: op(t, rois.to(t.device), size, scale)


@settings(max_examples=300, **SETTINGS)
@given(ps_cases())
def test_ps_cpu_agrees_with_the_reference_at_any_thread_count(case):
    x, rois, op = case[:3]
    event(f"{op.spec.name}, {'many' if rois.shape[0] > 8 else 'few'} boxes")
    with num_threads(1):
        out, g_in = forward_backward(ps_call(case), x, "cpu")
    with num_threads(2):
        out2, g_in2 = forward_backward(ps_call(case), x, "cpu")
    assert torch.equal(out, out2) and torch.equal(g_in, g_in2)  # deterministic: the same bits
    rout, rg_in = forward_backward(ps_call(case), x, "reference")
    torch.testing.assert_close(out, rout, **tol(x.dtype))
    torch.testing.assert_close(g_in, rg_in, **tol(x.dtype))


# The Triton kernels on fewer cases, with both backward paths: the atomic adds' and the
# deterministic gather's. Without a GPU the interpreter runs them, at about 10 s a case (the
# kernels' arithmetic is also fuzzed against the CPU kernels' by test_ptx's rules and the
# Triton tests of each op's file).
TRITON_EXAMPLES = 12 if torch.cuda.is_available() else 3
@pytest.mark.parametrize("backend", ["triton"])
@settings(max_examples=TRITON_EXAMPLES, **SETTINGS)
@given(case=ps_cases(), deterministic=st.booleans())
def test_ps_triton_agrees_with_the_reference(backend, case, deterministic):
    x = case[0]
    with config_set(deterministic_backward=deterministic):
        out, g_in = forward_backward(ps_call(case), x, backend)
    rout, rg_in = forward_backward(ps_call(case), x, "reference")
    torch.testing.assert_close(out, rout, **tol(x.dtype))
    torch.testing.assert_close(g_in, rg_in, **tol(x.dtype))


# ---- rotated boxes: many at any angle ------------------------------------------------------


def _small_map(draw, op):
    """A small map for a case of ``op`` (whole channel fields), in a drawn dtype and layout:
    (n, h, w, the generator its boxes come from, the map, a scale, a box count)."""
    n, c = draw(st.integers(1, 2)), draw(st.sampled_from([1, 3, 8, 19]))  # 8, 19: one vector of lanes, past it
    c *= op.options.get(op.spec.kernels[0].channel_groups, 1)  # whole fields
    h, w = draw(st.integers(1, 12)), draw(st.integers(1, 12))
    dtype = draw(st.sampled_from(DTYPES))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    x = draw(laid_out(torch.randn(n, c, h, w, generator=g, dtype=torch.float64).to(dtype)))
    return n, h, w, g, x, draw(st.sampled_from(SCALES)), draw(st.integers(0, 24))


@st.composite
def rotated_cases(draw):
    op = draw(op_cases(ON_ROTATED, ratios=[-1, 0, 1, 2, 5]))
    n, h, w, g, x, scale, k = _small_map(draw, op)
    u = torch.rand(k, 5, generator=g, dtype=torch.float64)
    centres = (u[:, :2] * 1.4 - 0.2) * torch.tensor([w, h])
    sides = u[:, 2:4] * 1.2 * max(h, w)
    kind = torch.randint(0, 10, (k,), generator=g)
    sides[kind == 0] = 0.0  # points and segments: empty adaptive grids
    sides[kind == 1] *= 1e-3
    sides[kind == 2] = 1e4  # far beyond the map: the samples outside it cost nothing
    # Any angle past a full turn either way; a third of them exact quarter turns, where the
    # sines and cosines put samples exactly on cell edges.
    degrees = torch.where(torch.rand(k, generator=g) < 0.33, torch.randint(-4, 5, (k,), generator=g) * 90.0,
                          u[:, 4] * 800 - 400)
    index = torch.randint(0, n, (k, 1), generator=g, dtype=torch.float64)
    turn = degrees * math.pi / 180 if op.options.get("angle") == "radians" else degrees
    rois = torch.cat([index, centres / scale, sides / scale, turn[:, None]], 1)
    args = dict(output_size=(draw(st.integers(1, 4)), draw(st.integers(1, 4))), spatial_scale=scale)
    return x, rois, op, args


def rotated_call(rois, op, args):
    return lambda t: op(t, rois.to(t.device), args["output_size"], args["spatial_scale"])


def assert_rotated_close(x, rois, op, args, out, g_in):
    """out and g_in against the reference's. A cell under many boxes sums thousands of
    terms that cancel: two sums in their own orders may differ by a few roundings of the
    magnitudes they add (the reference's gradient of |grad| in float64)."""
    rout, rg_in = forward_backward(rotated_call(rois, op, args), x, "reference")
    torch.testing.assert_close(out, rout, **tol(x.dtype))
    xg = x.detach().double().requires_grad_(True)
    with roiops.use_backend("reference"):
        o = rotated_call(rois, op, args)(xg)
        g_abs = torch.randn(o.shape, generator=torch.Generator().manual_seed(1)).to(x.dtype).double().abs()
        (terms,) = torch.autograd.grad(o, xg, g_abs) if o.numel() else (torch.zeros_like(xg),)
    off = (g_in.double() - rg_in.double()).abs()
    assert (off <= tol(x.dtype)["atol"] * (1 + terms)).all(), f"gradient off by up to {off.max():.3g}"


@settings(max_examples=300, **SETTINGS)
@given(rotated_cases())
def test_rotated_cpu_agrees_with_the_reference_at_any_thread_count(case):
    cpu_agrees_with_the_reference_at_any_thread_count(case)


def cpu_agrees_with_the_reference_at_any_thread_count(case):
    """The CPU kernels of a case of rows ``(batch_index, ...)``: the same bits at 1 and 2
    threads and from the per-image list form, and the reference's results."""
    x, rois, op, args = case
    event(f"{op.spec.name}, {'many' if rois.shape[0] > 8 else 'few'} boxes")
    with num_threads(1):
        out, g_in = forward_backward(rotated_call(rois, op, args), x, "cpu")
    with num_threads(2):
        out2, g_in2 = forward_backward(rotated_call(rois, op, args), x, "cpu")
    assert torch.equal(out, out2) and torch.equal(g_in, g_in2)  # deterministic: the same bits
    # The other box form, a list per image of the rows without their index, in the order they come.
    per_image = [rois[rois[:, 0] == i, 1:] for i in range(x.shape[0])]
    order = torch.cat([torch.nonzero(rois[:, 0] == i).flatten() for i in range(x.shape[0])])
    with roiops.use_backend("cpu"):
        assert torch.equal(op(x, per_image, args["output_size"], args["spatial_scale"]), out[order])
    assert_rotated_close(x, rois, op, args, out, g_in)


@pytest.mark.parametrize("backend", ["triton"])
@settings(max_examples=TRITON_EXAMPLES, **SETTINGS)
@given(case=rotated_cases(), deterministic=st.booleans())
def test_rotated_triton_agrees_with_the_reference(backend, case, deterministic):
    triton_agrees_with_the_reference(backend, case, deterministic)


def triton_agrees_with_the_reference(backend, case, deterministic):
    """A case of rows ``(batch_index, ...)`` on Triton's kernels, either backward path,
    against the reference."""
    x, rois, op, args = case
    with config_set(deterministic_backward=deterministic):
        out, g_in = forward_backward(rotated_call(rois, op, args), x, backend)
    assert_rotated_close(x, rois, op, args, out, g_in)


# ---- bezier boxes: curves anywhere, degenerate ones among them ------------------------------


@st.composite
def bezier_cases(draw):
    op = draw(op_cases(ON_BEZIER, ratios=[-1, 0, 1, 2, 5]))
    n, h, w, g, x, scale, k = _small_map(draw, op)
    points = (torch.rand(k, 8, 2, generator=g, dtype=torch.float64) * 1.4 - 0.2) * torch.tensor([w, h])
    kind = torch.randint(0, 10, (k,), generator=g)
    points[kind == 0] = points[kind == 0][:, :1]  # a single point: empty adaptive grids
    points[kind == 1, :4, 1] = points[kind == 1, :1, 1]  # horizontal curves: bins of height 0
    points[kind == 1, 4:, 1] = points[kind == 1, 4:5, 1]
    points[kind == 2] *= 1e4  # far beyond the map: the samples outside it cost nothing
    index = torch.randint(0, n, (k, 1), generator=g, dtype=torch.float64)
    rois = torch.cat([index, points.reshape(k, 16) / scale], 1)
    args = dict(output_size=(draw(st.integers(1, 4)), draw(st.integers(1, 4))), spatial_scale=scale)
    return x, rois, op, args


@settings(max_examples=150, **SETTINGS)
@given(bezier_cases())
def test_bezier_cpu_agrees_with_the_reference_at_any_thread_count(case):
    cpu_agrees_with_the_reference_at_any_thread_count(case)


@pytest.mark.parametrize("backend", ["triton"])
@settings(max_examples=TRITON_EXAMPLES, **SETTINGS)
@given(case=bezier_cases(), deterministic=st.booleans())
def test_bezier_triton_agrees_with_the_reference(backend, case, deterministic):
    triton_agrees_with_the_reference(backend, case, deterministic)


# ---- extreme values, in a child interpreter -----------------------------------------------

# At most one argument is out of its limits, so that many cases reach the kernels (with
# extreme but valid values: 2^24 coordinates, 2^64 scales, 1024 samples per axis).
COORDS_OK = [2.0**24, -(2.0**24), 2.0**24 - 1, 1e6, -1e6, 0.0, 3.0, -0.5]
COORDS_BAD = [2.0**24 + 2, 1e30, -3e38, math.inf, -math.inf, math.nan]
SCALES_OK = [1.0, 1 / 16, 2.0**64, 2.0**-64]
SCALES_BAD = [1e39, 2.0**65, 2.0**-70, 1e-45, 3e38, -1.0, 0.0, math.nan, math.inf]
RATIOS_OK = [0, -1, 2, 1024, -(2**40)]
RATIOS_BAD = [1025, 10**6, 2**31, 2**40]


@st.composite
def risky(draw):
    bad = draw(st.sampled_from([None, None, None, "rows", "scale", "ratio", "size"]))

    def pick(name, ok, wrong):
        return draw(st.sampled_from(wrong if bad == name else ok))

    shape = (1, draw(st.integers(1, 2)), draw(st.integers(1, 4)), draw(st.integers(1, 4)))
    dtype = draw(st.sampled_from(DTYPES))
    channels_last = draw(st.booleans())
    rows = []
    for _ in range(draw(st.integers(1, 2))):
        rows.append([float(pick("rows", [0], [0, 1, -1, 0.5]))] + [draw(st.sampled_from(COORDS_OK)) for _ in range(4)])
    if bad == "rows":
        rows[0][draw(st.integers(1, 4))] = draw(st.sampled_from(COORDS_BAD))
    scale = pick("scale", SCALES_OK, SCALES_BAD)
    ratio = pick("ratio", RATIOS_OK, RATIOS_BAD)
    # A fixed ratio costs output * ratio^2 samples: large outputs only with small ratios.
    size = pick("size", [1, 2, (1, 2)] if ratio > 8 else [1, 3, (1, 2**16), (2**16, 2)],
                [2**16 + 1, 10**20, 0, -1, (2, 0)])
    kind = draw(st.sampled_from([*(spec.name for spec in PLAIN), "direct"]))
    options = draw(op_cases([BY_NAME[kind]], ratios=[ratio])).options if kind != "direct" else {}
    return dict(shape=shape, dtype=str(dtype).split(".")[1], channels_last=channels_last, rows=rows, scale=scale,
                ratio=ratio, size=size, aligned=draw(st.booleans()), kind=kind, options=options)


def direct_op() -> str:
    """A registered forward that keeps an int32 argmax over a sampling grid: called
    directly, its kernels check that grid themselves."""
    return next(k.name for spec in PLAIN for k in spec.kernels
                if k.saved and "sampling_ratio" in (name for _, name in k.args))


def _run_risky(case):
    """Runs one extreme case; exceptions are fine, crashes and hangs are not. When both
    succeed, the C++ result must equal the reference's."""
    dtype = getattr(torch, case["dtype"])
    x = torch.randn(case["shape"], generator=torch.Generator().manual_seed(0)).to(dtype)
    if case["channels_last"]:
        x = x.contiguous(memory_format=torch.channels_last)
    rois = torch.tensor(case["rows"], dtype=torch.float64)
    kind, s, ratio, size, aligned = case["kind"], case["scale"], case["ratio"], case["size"], case["aligned"]

    def call():
        if kind == "direct":  # the registered op with raw arguments: the kernels' own checks
            ph, pw = (size, size) if isinstance(size, int) else size
            r = rois.to(torch.float64 if dtype == torch.float64 else torch.float32)
            op = direct_op()
            args = contract_args(op, input=x, rois=r, spatial_scale=s, pooled_height=ph, pooled_width=pw,
                                 sampling_ratio=ratio, aligned=aligned)
            return getattr(torch.ops.roiops, op)(*args.values())[0]
        return Case(kind, BY_NAME[kind], case["options"])(x.requires_grad_(True), rois, size, s)

    results = []
    for backend in ("cpu", "reference"):
        try:
            with roiops.use_backend(backend):
                out = call()
                if out.requires_grad:
                    out.sum().backward()
            results.append(out.detach())
        except (ValueError, TypeError, RuntimeError) as e:
            # Public API errors name the argument or the row.
            if kind != "direct":
                assert isinstance(e, ValueError) and any(
                    w in str(e) for w in ("output_size", "spatial_scale", "sampling_ratio", "row")), repr(e)
            results.append(None)
    if kind != "direct" and results[0] is not None and results[1] is not None:
        pair = (size, size) if isinstance(size, int) else size
        t = reference_tol(Case(kind, BY_NAME[kind]), rois, dict(output_size=pair, spatial_scale=s), dtype)
        if t["atol"] <= 1:  # else a bin below the reference's resolution: values not compared
            torch.testing.assert_close(results[0], results[1], **t, equal_nan=True)
    if kind != "direct":
        assert (results[0] is None) == (results[1] is None), (case, results)


@settings(max_examples=250, **SETTINGS)
@given(risky())
def _risky_cases(case):
    print(case, flush=True)  # the last line printed names the case, should the process die
    _run_risky(case)


def test_risky_cases_in_a_child_process():
    here = os.path.dirname(os.path.abspath(__file__))
    code = f"import sys; sys.path.insert(0, {here!r}); import test_fuzz; test_fuzz._risky_cases(); print('ok')"
    try:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=150)
    except subprocess.TimeoutExpired as e:
        last = (e.stdout or b"").decode(errors="replace").strip().splitlines()[-1:] if e.stdout else []
        pytest.fail(f"hang: risky cases ran past 150 s, last case {last}")
    tail = proc.stdout.strip().splitlines()[-3:]
    assert proc.returncode == 0 and tail and tail[-1] == "ok", \
        f"exit {proc.returncode}; last cases {tail}\n{proc.stderr[-4000:]}"
