"""Border align: mmcv's published values (pool_size 1 and 2), a brute force written sample
by sample from the definition (repeated-addition positions, first maximum) as the oracle of
every backend in every dtype and layout, forward and backward; ties and NaN alike on every
backend; boxes far outside the map, inverted or huge; gradcheck; opcheck, compile and
export; the kernels' argument checks, the same on every backend; the mmcv drop-ins.

The RoI-shaped generic tests (test_generic.py, test_contract.py) leave this op out: its
boxes come per image and its output is [N, C, K, 4]; what they check is here."""

from __future__ import annotations

import importlib
import math

import pytest
import torch
import torch.fx

import roiops
from cases import DTYPES, F16, F32, F64, config_set, device_for, sample_taps, tol
from roiops.compat import mmcv

# The option sets the generic tests (tests/cases.py) run the operator with.
OPTIONS = {"border_align": (dict(pool_size=10),)}

BACKENDS = ["reference", "cpu", "triton"]
KERNELS = {"reference": "roiops.reference", "cpu": "roiops.cpu", "triton": "roiops.triton"}

# mmcv's test of BorderAlign (tests/test_ops/test_border_align.py): one image, C = 1.
MMCV_INPUT = [[[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]],
              [[6, 7, 5, 8], [2, 1, 3, 4], [12, 9, 11, 10]],
              [[-2, -3, 2, 0], [-4, -5, 1, -1], [-1, -1, -1, -1]],
              [[0, -1, 2, 1], [-4, -3, -2, -1], [-1, -2, -3, -4]]]
MMCV_BOXES = [[0, 0, 2, 1], [1, 0, 3, 1], [1, 0, 2, 1], [0, 0, 3, 1], [0, 0, 1, 2], [0, 0, 2, 2], [1, 0, 2, 1],
              [1, 0, 3, 1], [0, 1, 1, 2], [0, 0, 3, 2], [1, 0, 3, 2], [2, 0, 3, 2]]
MMCV_OUTPUT = {
    1: [[3, 6, 1, 2], [4, 7, -1, 1], [3, 7, 1, 2], [4, 6, -1, 1], [2, 12, -1, -1], [3, 12, -1, 2], [3, 7, 1, 2],
        [4, 7, -1, 1], [6, 12, -1, -2], [4, 12, -1, 1], [4, 9, -1, 1], [4, 11, -1, 1]],
    2: [[3, 6, 1, 2], [4, 7, 1, 1], [3, 7, 1, 2], [4, 6, -1, 1], [2, 12, -1, -1], [3, 12, -1, 2], [3, 7, 1, 2],
        [4, 7, 1, 1], [6, 12, -1, -2], [4, 12, -1, 1], [4, 9, -1, 1], [4, 11, -1, 1]],
}
MMCV_GRAD = {  # of the input, for a grad of ones
    1: [[[0, 1, 4, 6], [0, 1, 0, 0], [0, 0, 0, 0]], [[2, 4, 0, 0], [0, 0, 0, 0], [4, 1, 1, 0]],
        [[0, 0, 0, 0], [0, 0, 3, 3], [0, 2, 1, 3]], [[0, 1, 4, 6], [0, 0, 0, 0], [0, 1, 0, 0]]],
    2: [[[0, 1, 4, 6], [0, 1, 0, 0], [0, 0, 0, 0]], [[2, 4, 0, 0], [0, 0, 0, 0], [4, 1, 1, 0]],
        [[0, 0, 0, 0], [0, 0, 5, 1], [0, 2, 1, 3]], [[0, 1, 4, 6], [0, 0, 0, 0], [0, 1, 0, 0]]],
}

N, C, H, W, K = 2, 3, 7, 9, 10


def feature(dtype=F64, channels_last=False, seed=0, n=N, c=C, h=H, w=W):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4 * c, h, w, generator=g, dtype=F64).to(dtype)
    return x.contiguous(memory_format=torch.channels_last) if channels_last else x


def boxes(dtype=F64, seed=0, n=N, k=K, nasty=True):
    """Random boxes over and around the map (some inverted), and with ``nasty`` boxes
    outside it, degenerate, huge, on its last cells and with non-dyadic sides."""
    g = torch.Generator().manual_seed(seed)
    corners = torch.rand(n, k, 4, generator=g, dtype=F64) * torch.tensor([W + 3.0, H + 3.0] * 2) - 1.5
    if nasty:
        extra = torch.tensor([[-5.0, -5.0, -2.0, -3.0], [2.0, 3.0, 2.0, 3.0], [-1e6, -2e6, 1e6, 3e6],
                              [W - 1.0, H - 1.0, W - 1.0, H - 1.0], [0.1, 0.7, 8.3, 5.9], [W, H, -1.0, -1.0],
                              [W + 0.5, 0.2, W + 3.0, 6.0], [3.0, 2.0, 1.0, 0.5]], dtype=F64)
        corners = torch.cat([corners, extra.expand(n, -1, -1)], dim=1)
    return corners.to(dtype)


# ----------------------------------------------------------------------------- the definition


def walk(box, e, pool_size, dtype=F64):
    """The (x, y) points of border e's samples, placed by repeated addition in ``dtype``
    (the opmath type) as the definition says: numpy-free, one rounding per addition."""
    t = lambda v: torch.tensor(v, dtype=dtype)  # noqa: E731 - one rounding to the type
    x1, y1, x2, y2 = (t(v) for v in box)
    x, y = (x1, y1) if e < 2 else (x2, y2)
    side = ((x2 - x1) if e % 2 == 0 else (y2 - y1)) / t(float(pool_size))
    step = side if e < 2 else -side
    points = []
    for _ in range(pool_size + 1):
        points.append((float(x), float(y)))
        if e % 2 == 0:
            x = x + step
        else:
            y = y + step
    return points


def brute_force(x, rois, pool_size):
    """(out, argmax, the winning (y, x) per output) by plain loops in float64 over every
    sample; the first largest sample wins, a NaN sample the first NaN."""
    n, c4, h, w = x.shape
    c, k = c4 // 4, rois.shape[1]
    opmath = F64 if x.dtype == F64 else F32
    xs = x.to(F64)
    out = torch.zeros(n, c, k, 4, dtype=F64)
    arg = torch.zeros(n, c, k, 4, dtype=torch.int64)
    points = {}
    for b in range(n):
        for j in range(k):
            for e in range(4):
                pts = walk(rois[b, j].tolist(), e, pool_size, opmath)
                points[b, j, e] = pts
                for ch in range(c):
                    plane = xs[b, e * c + ch]
                    best, at = None, 0
                    for i, (px, py) in enumerate(pts):
                        v = 0.0
                        for yy, xx, wt in sample_taps(py, px, h, w):
                            v += wt * float(plane[yy, xx])
                        if best is None or v > best or (math.isnan(v) and not math.isnan(best)):
                            best, at = v, i
                    out[b, ch, j, e], arg[b, ch, j, e] = best, at
    return out, arg, points


def brute_grad(x, rois, pool_size, grad, arg, points):
    """The input's gradient: each output's grad times the weights of its winning sample's taps."""
    n, c4, h, w = x.shape
    c = c4 // 4
    gi = torch.zeros(n, c4, h, w, dtype=F64)
    for (b, j, e), pts in points.items():
        for ch in range(c):
            px, py = pts[int(arg[b, ch, j, e])]
            for yy, xx, wt in sample_taps(py, px, h, w):
                gi[b, e * c + ch, yy, xx] += float(grad[b, ch, j, e]) * wt
    return gi


def run(x, b, pool_size, backend, grad_seed=1):
    dev = device_for(backend)
    xg = x.detach().to(dev, copy=True).requires_grad_()
    with roiops.use_backend(backend):
        out = roiops.border_align(xg, b.to(dev), pool_size)
        g = torch.randn(out.shape, generator=torch.Generator().manual_seed(grad_seed), dtype=F64).to(dev, out.dtype)
        out.backward(g)
    return out.detach().cpu(), xg.grad.cpu(), g.cpu()


# ----------------------------------------------------------------------------- mmcv's values


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("pool_size", [1, 2])
def test_mmcv_published_values(pool_size, dtype, backend):
    x = torch.tensor([MMCV_INPUT], dtype=dtype)
    b = torch.tensor([MMCV_BOXES], dtype=dtype if dtype != F16 and dtype != torch.bfloat16 else F32)
    out, gi, _ = run(x, b, pool_size, backend)
    dev = device_for(backend)
    xg = x.to(dev).requires_grad_()
    with roiops.use_backend(backend):
        o = roiops.border_align(xg, b.to(dev), pool_size)
        o.backward(torch.ones_like(o))
    assert torch.equal(o.detach().cpu().double(), torch.tensor(MMCV_OUTPUT[pool_size], dtype=F64)[None, None])
    assert torch.equal(xg.grad.cpu().double(), torch.tensor([MMCV_GRAD[pool_size]], dtype=F64))
    assert out.shape == (1, 1, 12, 4) and gi.shape == x.shape


# ----------------------------------------------------------------------------- the brute force


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels_last"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_every_backend_matches_the_brute_force(dtype, channels_last, backend):
    pool_size = 3
    x = feature(dtype, channels_last)
    b = boxes(F64 if dtype == F64 else F32)
    out, gi, g = run(x, b, pool_size, backend)
    want, arg, points = brute_force(x, b, pool_size)
    t = tol(dtype)
    torch.testing.assert_close(out.double(), want, **t)
    assert out.dtype == dtype
    assert out.is_contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
    assert gi.is_contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
    if dtype in (F32, F64):  # half types may pick another winner among near ties
        with roiops.use_backend(backend):
            _, got_arg = getattr(importlib.import_module(KERNELS[backend]), "border_align_forward")(
                x.to(device_for(backend)), b.to(device_for(backend), F64 if dtype == F64 else F32), pool_size)
        assert torch.equal(got_arg.cpu().long(), arg)
        torch.testing.assert_close(gi.double(), brute_grad(x, b, pool_size, g, arg, points), **t)


@pytest.mark.parametrize("pool_size", [1, 7, 10])
def test_backends_agree_bit_for_bit_in_float32(pool_size):
    """Same positions (repeated addition, correctly rounded division) and the same sums:
    the same bits, forward; backward within summation order."""
    x, b = feature(F32, seed=2), boxes(F32, seed=2)
    ref = run(x, b, pool_size, "reference")
    for backend in ("cpu", "triton"):
        got = run(x, b, pool_size, backend)
        assert torch.equal(got[0], ref[0]), backend
        torch.testing.assert_close(got[1], ref[1], **tol(F32))


def test_positions_are_repeated_additions_not_multiplications():
    """A box whose step, 0.1 cells, puts sample 7 of the walk by repeated addition on
    another float32 point than x1 + 7 * step: the value read there, on a map that is a
    ramp along x, tells which point was sampled, and the gradient lands on the same."""
    x1, pool_size = 0.3, 10
    side = torch.tensor(1.0, dtype=F32)
    step = side / pool_size
    p = torch.tensor(x1, dtype=F32)
    added = [p.clone()]
    for _ in range(pool_size):
        p = p + step
        added.append(p.clone())
    multiplied = [torch.tensor(x1, dtype=F32) + step * i for i in range(pool_size + 1)]
    differ = [i for i in range(pool_size + 1) if added[i] != multiplied[i]]
    assert differ, "the case must tell the two apart"
    i = differ[-1]
    # A top border on row 0 of a map that increases along x until column i's point, then
    # falls: the maximum is sample i.
    w = 4
    ramp = torch.zeros(1, 4, 1, w, dtype=F32)
    ramp[0, 0, 0] = torch.tensor([0.0, 1.0, 0.0, 0.0])
    b = torch.tensor([[[x1, 0.0, x1 + 1.0, 0.0]]], dtype=F32)
    for backend in BACKENDS:
        out, gi, _ = run(ramp, b, pool_size, backend)
        kernels = importlib.import_module(KERNELS[backend])
        _, arg = kernels.border_align_forward(ramp.to(device_for(backend)), b.to(device_for(backend)), pool_size)
        a = int(arg[0, 0, 0, 0])
        want = 1.0 - abs(float(added[a]) - 1.0)  # the ramp's value at the sampled point
        assert float(out[0, 0, 0, 0]) == pytest.approx(want, abs=0), backend
    assert a == int(torch.stack(added).sub(1.0).abs().argmin())


@pytest.mark.parametrize("backend", BACKENDS)
def test_ties_keep_the_first_sample_and_nan_wins(backend):
    """A constant border: every sample ties, sample 0 wins. A NaN on the walk: it wins (the
    first one), unlike mmcv, which keeps its running maximum past a NaN sample. A sample
    reads a NaN through a tap of weight 0 too (0 * NaN), as RoIAlign's samples do: sample
    2, at x = 2, has the NaN at x = 3 as its right tap."""
    x = torch.full((1, 4, 4, 6), 2.0, dtype=F32)
    x[0, 0, 0, 3] = float("nan")  # top border of box 1 (row 0) meets it at x = 3 (sample 3 of 0..5)
    x[0, 0, 0, 5] = float("nan")
    b = torch.tensor([[[0.0, 2.0, 5.0, 3.0], [0.0, 0.0, 5.0, 3.0]]], dtype=F32)
    dev = device_for(backend)
    out, arg = importlib.import_module(KERNELS[backend]).border_align_forward(x.to(dev), b.to(dev), 5)
    assert arg[0, 0, 0].tolist() == [0, 0, 0, 0] and out[0, 0, 0].tolist() == [2.0] * 4
    assert math.isnan(float(out[0, 0, 1, 0])) and int(arg[0, 0, 1, 0]) == 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_outside_samples_are_zero_and_scatter_nothing(backend):
    """Samples outside [-1, H] x [-1, W] are 0 and take part in the maximum; a box wholly
    outside gives 0 at sample 0 and no gradient, even over a map of infinities."""
    x = torch.full((1, 4, 5, 5), -5.0, dtype=F64)
    x[0, :, 4, 4] = float("inf")  # no sample's taps reach it
    b = torch.tensor([[[-10.0, -10.0, -4.0, -3.0], [-3.0, 1.0, 1.0, 1.0], [1e6, 1e6, 2e6, 2e6]]], dtype=F64)
    out, gi, _ = run(x, b, 4, backend)
    assert out[0, 0, 0].tolist() == [0.0] * 4 and out[0, 0, 2].tolist() == [0.0] * 4
    assert out[0, 0, 1, 0] == 0.0  # the top border starts at x = -3: outside, 0 beats -5
    assert torch.isfinite(gi).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_no_boxes_and_no_images(backend):
    dev = device_for(backend)
    for n, k in ((N, 0), (0, 3), (0, 0)):
        x = feature(F32, n=n).to(dev).requires_grad_()
        b = torch.zeros(n, k, 4, device=dev)
        with roiops.use_backend(backend):
            out = roiops.border_align(x, b, 10)
            out.sum().backward()
        assert out.shape == (n, C, k, 4)
        assert torch.equal(x.grad.cpu(), torch.zeros(x.shape))


@pytest.mark.parametrize("backend", BACKENDS)
def test_odd_strides_equal_the_contiguous_copy(backend):
    dev = device_for(backend)
    big = feature(F32, w=2 * W, c=C + 1).to(dev)
    x = big[:, 4:, :, ::2]  # channel offset, every other column
    b = boxes(F32, nasty=False).to(dev)
    wide = torch.zeros(N, K, 8, device=dev)
    wide[..., ::2] = b
    with roiops.use_backend(backend):
        got = roiops.border_align(x, wide[..., ::2], 4)
        want = roiops.border_align(x.contiguous(), b, 4)
    assert torch.equal(got, want)


def test_results_do_not_depend_on_the_thread_count():
    x, b = feature(F32, channels_last=True), boxes(F32)
    results = []
    for threads in (1, 3):
        old = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            results.append(run(x, b, 10, "cpu"))
        finally:
            torch.set_num_threads(old)
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])


@pytest.mark.parametrize("dtype", [F32, F64, torch.bfloat16])
@pytest.mark.parametrize("c", [11, 520])
def test_channels_last_backward_over_many_channels(c, dtype):
    """The CPU channels_last backward adds 8 channels at a time, passes of 512: channel
    counts with a remainder of 3, and with two passes, against the reference."""
    x, b = feature(dtype, channels_last=True, c=c, seed=5), boxes(F64 if dtype == F64 else F32, seed=5)
    got, want = run(x, b, 10, "cpu"), run(x, b, 10, "reference")
    assert torch.equal(got[0], want[0])
    torch.testing.assert_close(got[1], want[1], **tol(dtype))


@pytest.mark.parametrize("deterministic", [True, False])
def test_triton_backward_paths(deterministic):
    x, b = feature(F64, seed=4), boxes(F64, seed=4)
    with config_set(deterministic_backward=deterministic):
        got = run(x, b, 6, "triton")
    want = run(x, b, 6, "reference")
    torch.testing.assert_close(got[1], want[1], **tol(F64))


# ----------------------------------------------------------------------------- gradients, registration


@pytest.mark.parametrize("backend", BACKENDS)
def test_gradcheck_input(backend):
    dev = device_for(backend)
    # Boxes whose samples avoid integer coordinates and near ties (the max is piecewise).
    x = feature(F64, n=1, c=1, h=5, w=6).to(dev).requires_grad_()
    b = torch.tensor([[[0.3, 0.45, 4.1, 3.35], [-0.6, 1.2, 2.7, 4.6], [5.3, 3.9, 1.15, 0.2]]], dtype=F64, device=dev)
    with roiops.use_backend(backend), config_set(deterministic_backward=True):
        # Triton's interpreter takes minutes for the full Jacobian: a random projection of it.
        assert torch.autograd.gradcheck(lambda t: roiops.border_align(t, b, 3), (x,),
                                        fast_mode=backend == "triton" and not torch.cuda.is_available())


def test_boxes_get_no_gradient_and_double_backward_is_refused():
    x = feature(F64).requires_grad_()
    b = boxes(F64).requires_grad_()
    out = roiops.border_align(x, b, 2)
    (gx,) = torch.autograd.grad(out.square().sum(), x, create_graph=True)
    assert b.grad is None
    with pytest.raises(RuntimeError, match="border_align has no double backward"):
        torch.autograd.grad(gx.sum(), x)


@pytest.mark.parametrize("pool_size,channels_last", [(1, False), (10, True)])
def test_opcheck(pool_size, channels_last):
    x = feature(F32, channels_last)
    b = boxes(F32)
    torch.library.opcheck(torch.ops.roiops.border_align.default, (x, b, pool_size))
    out, arg = torch.ops.roiops.border_align(x, b, pool_size)
    g = torch.randn(out.shape).contiguous(memory_format=torch.channels_last if channels_last else
                                          torch.contiguous_format)
    torch.library.opcheck(torch.ops.roiops._border_align_backward.default,
                          (g, arg, b, pool_size, N, 4 * C, H, W, channels_last))


def test_compile_fullgraph_dynamic_boxes(fresh_dynamo):
    from torch._dynamo.testing import CompileCounterWithBackend

    counter = CompileCounterWithBackend("aot_eager")
    op = torch.compile(lambda x, b: roiops.border_align(x, b, 5), backend=counter, fullgraph=True, dynamic=True)
    for k in (5, 6):  # no other size of the call: dynamo would specialise K with it
        x = feature(F32).requires_grad_()
        b = boxes(F32, seed=k, k=k, nasty=False)
        got = op(x, b)
        got.backward(torch.ones_like(got))
        xe = x.detach().clone().requires_grad_()
        want = roiops.border_align(xe, b, 5)
        want.backward(torch.ones_like(want))
        assert torch.equal(got, want) and torch.equal(x.grad, xe.grad)
    assert counter.frame_count == 1


def test_export_dynamic_boxes():
    class Head(torch.nn.Module):
        def forward(self, x, b):
            return roiops.border_align(x, b, 4)

    x = feature(F32)
    k = torch.export.Dim("k", min=2, max=1000)
    program = torch.export.export(Head(), (x, boxes(F32, k=5, nasty=False)), dynamic_shapes=({}, {1: k}))
    assert "roiops.border_align.default" in str(program.graph)
    more = boxes(F32, seed=1, k=9, nasty=False)
    assert torch.equal(program.module()(x, more), roiops.border_align(x, more, 4))


@pytest.mark.parametrize("dtype", [F32, F64, torch.float16])
def test_onnx_export_runs_in_onnxruntime_bit_for_bit(dtype):
    """The exported graph (standard ONNX operators, a dynamic box count) equals the kernels,
    argmax included, on nasty boxes and on maps with NaN and infinities (a zero maximum may
    differ in its sign: ReduceMax may pick either zero)."""
    ort = pytest.importorskip("onnxruntime")
    from roiops import onnx as roiops_onnx

    class Head(torch.nn.Module):
        def forward(self, x, b):
            return (roiops.border_align(x, b, 4), *torch.ops.roiops.border_align(x, b, 10))

    coords = F64 if dtype == F64 else F32
    k = torch.export.Dim("k")
    program = roiops_onnx.export(Head().eval(), (feature(dtype), boxes(coords, k=3, nasty=False)),
                                 dynamic_shapes={"x": None, "b": {1: k}})
    assert {n.domain for n in program.model_proto.graph.node} == {""}  # standard ONNX operators only
    session = ort.InferenceSession(program.model_proto.SerializeToString(), providers=["CPUExecutionProvider"])
    x = feature(dtype, seed=2)
    x[0, 1, 2:4, 3:6] = float("nan")
    x[1, 5, :, 4] = float("inf")
    x[1, 9, 3, :] = -float("inf")
    for b in (boxes(coords, seed=3), boxes(coords, k=0, nasty=False)):
        got = session.run(None, {"x": x.numpy(), "b": b.numpy()})
        for i, (a, e) in enumerate(zip(got, Head()(x, b))):  # assert_close: -0.0 equals 0.0
            torch.testing.assert_close(torch.from_numpy(a), e, rtol=0, atol=0, equal_nan=True,
                                       msg=f"output {i}, K={b.shape[1]}")


# ----------------------------------------------------------------------------- arguments


def test_module_and_drop_ins():
    x, b = feature(F32), boxes(F32)
    want = roiops.border_align(x, b, 10)
    module = roiops.BorderAlign(10)
    assert repr(module) == "BorderAlign(pool_size=10)"
    assert torch.equal(module(x, b), want)
    assert torch.equal(mmcv.border_align(x, b, 10), want)
    layer = mmcv.BorderAlign(pool_size=10)
    assert repr(layer) == "BorderAlign(pool_size=10)" and torch.equal(layer(x, b), want)
    with pytest.raises(AssertionError, match=r"boxes must have shape \[N, K, 4\]"):
        mmcv.border_align(x, b[..., :3], 10)


@pytest.mark.parametrize("fn", [roiops.border_align, mmcv.border_align], ids=["roiops", "mmcv"])
def test_functions_are_one_fx_node(fn):
    """torch.fx records the call whole, as the RoI functions (tests/test_script_fx.py)."""
    class Call(torch.nn.Module):
        def forward(self, x, b):
            return fn(x, b, 3)

    traced = torch.fx.symbolic_trace(Call())
    calls = [n for n in traced.graph.nodes if n.op not in ("placeholder", "output")]
    assert [(n.op, n.target) for n in calls] == [("call_function", fn)]
    x, b = feature(F32), boxes(F32)
    assert torch.equal(traced(x, b), roiops.border_align(x, b, 3))


@pytest.mark.parametrize("call,error,message", [
    (lambda x, b: roiops.border_align(x, b, 0), ValueError, r"pool_size must be an int in \[1, 1024\], got 0"),
    (lambda x, b: roiops.border_align(x, b, 1025), ValueError, r"pool_size must be an int in \[1, 1024\], got 1025"),
    (lambda x, b: roiops.border_align(x, b, 2.0), ValueError, r"pool_size must be an int"),
    (lambda x, b: roiops.BorderAlign(-1), ValueError, r"pool_size must be an int in \[1, 1024\], got -1"),
    (lambda x, b: roiops.border_align(x[:, 1:], b, 2), ValueError,
     r"input channels \(11\) must be a multiple of 4 \(top, left, bottom, right\)"),
    (lambda x, b: roiops.border_align(x, b[0], 2), ValueError, r"boxes must have shape \[N, K, 4\]"),
    (lambda x, b: roiops.border_align(x, b[..., :3], 2), ValueError, r"boxes must have shape \[N, K, 4\]"),
    (lambda x, b: roiops.border_align(x, b[:1], 2), ValueError,
     r"boxes holds boxes for 1 images but the input has batch size 2"),
    (lambda x, b: roiops.border_align(x, b.long(), 2), ValueError, r"boxes must be floating point"),
    (lambda x, b: roiops.border_align(x, b.tolist(), 2), TypeError, r"boxes must be a Tensor\[N, K, 4\]"),
    (lambda x, b: roiops.border_align(x.long(), b, 2), ValueError, r"input must be floating point"),
    (lambda x, b: roiops.border_align(x, torch.where(b == b[1, 3, 2], float("nan"), b), 2), ValueError,
     r"boxes\[1, 3\] .*: coordinates must be finite and within 2\^24 feature-map cells"),
    (lambda x, b: roiops.border_align(x, torch.where(b == b[0, 2, 0], 2.0**25, b), 2), ValueError,
     r"boxes\[0, 2\] .*: coordinates must be finite and within 2\^24"),
    (lambda x, b: roiops.border_align(x.double(), b.float(), 2), ValueError, None),
])
def test_bad_arguments(call, error, message):
    x, b = feature(F32), boxes(F32, nasty=False)
    if message is None:  # float32 boxes for a float64 map are converted, as the other ops' boxes
        assert call(x, b).dtype == F64
        return
    with pytest.raises(error, match=message):
        call(x, b)


def _good(role):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(N, 4 * C, H, W, generator=g)
    b = torch.tensor([[[1.0, 1.0, 5.0, 5.0]], [[0.0, 0.5, 3.0, 4.0]]])
    if role == "forward":
        return dict(input=x, rois=b, pool_size=3)
    return dict(grad=torch.randn(N, C, 1, 4, generator=g), argmax=torch.zeros(N, C, 1, 4, dtype=torch.int32), rois=b,
                pool_size=3, batch_size=N, channels=4 * C, height=H, width=W, channels_last=False)


# (role, change, message): each call one argument away from a good one.
BAD_CALLS = [
    ("forward", lambda a: {"input": a["input"][0]}, r"input must be 4-D \[N, 4C, H, W\], got 3-D"),
    ("backward", lambda a: {"grad": a["grad"][0]}, r"grad must be 4-D \[N, C, K, 4\], got 3-D"),
    ("forward", lambda a: {"input": a["input"].long()}, r"input must be floating point, got torch.int64"),
    ("forward", lambda a: {"input": a["input"].to(torch.float8_e4m3fn)},
     r"input dtype torch.float8_e4m3fn is not implemented"),
    ("forward", lambda a: {"rois": a["rois"][0]},
     r"rois must be \[N, K, 4\] \(rows \(x1, y1, x2, y2\)\), got \[1, 4\]"),
    ("backward", lambda a: {"rois": a["rois"][..., :3]}, r"rois must be \[N, K, 4\] .*got \[2, 1, 3\]"),
    ("forward", lambda a: {"rois": a["rois"].long()}, r"rois must be floating point, got torch.int64"),
    ("forward", lambda a: {"input": a["input"].double()},
     r"rois must be float64 for a float64 input, got torch.float32"),
    ("forward", lambda a: {"rois": a["rois"].to("meta")}, r"rois is on meta but input is on cpu"),
    ("backward", lambda a: {"batch_size": -1}, r"batch size and channels must be non-negative, got batch_size=-1"),
    ("forward", lambda a: {"input": a["input"][:, :, :0]}, r"input height and width must be positive, got height=0"),
    ("backward", lambda a: {"width": 2**24 + 1}, r"input height and width must be at most 2\^24, got 7 x 16777217"),
    ("forward", lambda a: {"rois": a["rois"][:1]},
     r"rois must hold boxes for each of the 2 images \(\[N, K, 4\]\), got \[1, 1, 4\]"),
    ("backward", lambda a: {"batch_size": 3}, r"rois must hold boxes for each of the 3 images"),
    ("forward", lambda a: {"pool_size": 0}, r"pool_size must be in \[1, 1024\], got 0$"),
    ("backward", lambda a: {"pool_size": 1025}, r"pool_size must be in \[1, 1024\], got 1025$"),
    ("forward", lambda a: {"input": a["input"][:, 1:]},
     r"input channels \(11\) must be a multiple of 4 \(top, left, bottom, right\)"),
    ("backward", lambda a: {"channels": 16},
     r"grad must be \[N, C / 4, K, 4\] = \[2, 4, 1, 4\] \(the forward output's shape\), got \[2, 3, 1, 4\]"),
    ("backward", lambda a: {"argmax": a["argmax"][:1]}, r"argmax must have the shape of grad \[2, 3, 1, 4\]"),
    ("backward", lambda a: {"argmax": a["argmax"].long()}, r"argmax must be int32, got torch.int64"),
]


@pytest.mark.parametrize("role,change,message", BAD_CALLS, ids=[f"{r}-{i}" for i, (r, _, _) in enumerate(BAD_CALLS)])
def test_every_backend_refuses_a_bad_kernel_call_alike(role, change, message):
    seen = set()
    for backend in BACKENDS:
        a = _good(role)
        a |= change(a)
        fn = getattr(importlib.import_module(KERNELS[backend]), f"border_align_{role}")
        with pytest.raises(ValueError, match=message) as info:
            fn(*a.values())
        seen.add(str(info.value))
    assert len(seen) == 1, seen


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_kernels_refuse_bad_box_values_and_argmax(backend):
    kernels = importlib.import_module(KERNELS[backend])
    a = _good("forward")
    a["rois"] = a["rois"].clone()
    a["rois"][1, 0, 2] = float("inf")
    with pytest.raises(ValueError, match=r"rois\[1, 0\] has a coordinate that is not finite or beyond 2\^24"):
        kernels.border_align_forward(*a.values())
    a = _good("backward")
    a["argmax"] = torch.full_like(a["argmax"], 4)  # pool_size 3: samples 0..3
    with pytest.raises(ValueError, match=r"argmax"):
        kernels.border_align_backward(*a.values())


def test_triton_masks_bad_box_values():
    kernels = importlib.import_module("roiops.triton")
    a = _good("forward")
    a["rois"] = a["rois"].clone()
    a["rois"][1, 0, 2] = float("nan")
    out, arg = kernels.border_align_forward(*a.values())
    assert torch.equal(out[1, :, 0], torch.zeros(C, 4)) and torch.equal(arg[1], torch.zeros_like(arg[1]))
    assert torch.equal(out[0], kernels.border_align_forward(*_good("forward").values())[0][0])
