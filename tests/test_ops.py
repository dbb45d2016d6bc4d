"""The registered ops on the default CPU kernels, checked against the reference oracle,
torchvision, gradcheck and opcheck."""

from __future__ import annotations

import contextlib
import itertools
import sys

import pytest
import torch
import torchvision

import roiops
from boxes import nasty_boxes, nasty_rotated_boxes, random_boxes, rotated_boxes
from cases import (ALIGN, API, POOL, ROTATED_OPS, VARIANTS, RecordOps, contract_args, num_threads, odd_unit_strides,
                   schema, tol)

N, C, H, W = 2, 5, 11, 13
SCALE = 0.5  # boxes are in image pixels of a 26 x 22 image


def boxes_for(dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.cat([random_boxes(N, 6, W / SCALE, H / SCALE, g, dtype), nasty_boxes(N, W / SCALE, H / SCALE, dtype)])


def feature(dtype=torch.float32, channels_last=False, seed=0, channels=C):
    x = torch.randn(N, channels, H, W, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(dtype)
    return x.contiguous(memory_format=torch.channels_last) if channels_last else x


def rotated_rois_for(dtype=torch.float32, seed=0):
    """Rotated boxes as the registered op takes them: angles in radians."""
    g = torch.Generator().manual_seed(seed)
    b = torch.cat([rotated_boxes(N, 6, W / SCALE, H / SCALE, g, torch.float64),
                   nasty_rotated_boxes(N, W / SCALE, H / SCALE, torch.float64)])
    b[:, 5] = torch.deg2rad(b[:, 5])
    return b.to(dtype)


def run(op, x, boxes, size, sr=2, aligned=False, backend=None, seed=1):
    """Output and input gradient for a fixed random upstream gradient."""
    x = x.detach().clone().requires_grad_()
    with roiops.use_backend(backend) if backend else contextlib.nullcontext():
        out = API[op](x, boxes, size, SCALE, sr, aligned)
        g = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(out.dtype)
        out.backward(g)
    return out.detach(), x.grad


def close(a, b, dtype):
    torch.testing.assert_close(a.double(), b.double(), **tol(dtype))


CASES = [(op, al, sr, size) for op in ALIGN for al in (False, True) for sr in (-1, 0, 1, 2, 3)
         for size in (1, (2, 3), (7, 7))]
CASES += [(op, False, 2, size) for op in POOL for size in (1, (2, 3), (7, 7))]


@pytest.mark.parametrize("op, aligned, sr, size", CASES)
def test_matches_reference(op, aligned, sr, size):
    for dtype, channels_last in itertools.product([torch.float32, torch.float64], [False, True]):
        x, boxes = feature(dtype, channels_last), boxes_for(dtype)
        out, grad = run(op, x, boxes, size, sr, aligned)
        ref_out, ref_grad = run(op, x, boxes, size, sr, aligned, backend="reference")
        if op in POOL:
            assert torch.equal(out, ref_out) and torch.equal(grad, ref_grad)
        else:
            close(out, ref_out, dtype)
            close(grad, ref_grad, dtype)
        fmt = torch.channels_last if channels_last else torch.contiguous_format
        assert out.is_contiguous(memory_format=fmt) and grad.is_contiguous(memory_format=fmt)
        assert out.dtype == grad.dtype == dtype


@pytest.mark.parametrize("op", list(API))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("channels_last", [False, True])
def test_half_types_native(op, dtype, channels_last):
    x, boxes = feature(dtype, channels_last), boxes_for()
    out, grad = run(op, x, boxes, (3, 4), 2, True)
    ref_out, ref_grad = run(op, x, boxes, (3, 4), 2, True, backend="reference")
    assert out.dtype == grad.dtype == dtype
    close(out, ref_out, dtype)
    close(grad, ref_grad, dtype)


def _tv_boxes(dtype):
    # torchvision crashes or differs on inverted boxes with aligned=True and adaptive sampling.
    b = boxes_for(dtype)
    return b[(b[:, 3] >= b[:, 1]) & (b[:, 4] >= b[:, 2])]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("aligned", [False, True])
@pytest.mark.parametrize("sr", [-1, 0, 2, 3])
@pytest.mark.parametrize("channels_last", [False, True])
def test_roi_align_matches_torchvision(dtype, aligned, sr, channels_last):
    x, boxes = feature(dtype, channels_last), _tv_boxes(dtype)
    out, grad = run("avg", x, boxes, (3, 5), sr, aligned)
    xt = x.detach().clone().requires_grad_()
    ref = torchvision.ops.roi_align(xt, boxes, (3, 5), SCALE, sr, aligned)
    ref.backward(torch.randn(ref.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64).to(dtype))
    assert torch.equal(out, ref) and torch.equal(grad, xt.grad)  # same arithmetic, same order


@pytest.mark.parametrize("channels_last", [False, True])
def test_adaptive_backward_divisions_bit_exact_with_torchvision(channels_last):
    """Adaptive sampling divides every term by a count that is rarely a power of two; the
    C++ kernel replaces that division by an FMA sequence where it is exact. Sample counts
    from 1 to several hundred and gradients over the whole float32 range (subnormals, zeros,
    infinities and NaN included) must still give torchvision's bits."""
    g = torch.Generator().manual_seed(3)
    x = torch.zeros(1, 19, 80, 80, dtype=torch.float32)  # 19 channels: vector and tail lanes
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    lo = torch.rand(60, 2, generator=g) * 20
    size = torch.rand(60, 2, generator=g) * 59 + 0.5
    boxes = torch.cat([torch.zeros(60, 1), lo, lo + size], dim=1)
    grad = torch.randn(60, 19, 2, 3, generator=g) * torch.exp2(torch.randint(-150, 128, (60, 19, 2, 3), generator=g))
    grad[grad.abs() < 2.0**-149] = 0.0
    grad[5, :4] = float("inf")
    grad[7, 2] = float("nan")
    grads = []
    for fn in (roiops.roi_align, torchvision.ops.roi_align):
        xi = x.detach().requires_grad_()
        fn(xi, boxes, (2, 3), 1.0, 0, True).backward(grad)
        grads.append(xi.grad)
    subnormal = (grads[0] != 0) & (grads[0].abs() < 2.0**-126)
    assert grads[0].isinf().any() and grads[0].isnan().any() and subnormal.any()
    torch.testing.assert_close(grads[0], grads[1], rtol=0, atol=0, equal_nan=True)


def _non_finite(channels_last):
    """A map with NaN, inf and -inf inside and on the last row and column, where a sample
    clamped to the border puts weight 0 on a tap (0 * inf is NaN in the per-sample formula)."""
    x = feature(torch.float32)
    x[0, 0, 3, 4], x[0, 1, H - 1, 5], x[1, 2, 6, W - 1] = float("inf"), float("inf"), float("-inf")
    x[0, 3, 2:5, 7:10], x[1, 4, 8, 2] = float("-inf"), float("nan")
    return x.contiguous(memory_format=torch.channels_last) if channels_last else x


@pytest.mark.parametrize("op", list(API))
@pytest.mark.parametrize("channels_last", [False, True])
def test_non_finite_values_match_reference(op, channels_last):
    x, boxes = _non_finite(channels_last), boxes_for()
    for sr, aligned in ((2, False), (0, True)):
        out, grad = run(op, x, boxes, (3, 4), sr, aligned)
        ref_out, ref_grad = run(op, x, boxes, (3, 4), sr, aligned, backend="reference")
        assert out.isnan().any() and out.isinf().any()
        torch.testing.assert_close(out, ref_out, equal_nan=True)
        torch.testing.assert_close(grad, ref_grad, equal_nan=True)
        if op == "avg" and not aligned:
            tv_out = torchvision.ops.roi_align(x, boxes, (3, 4), SCALE, sr, aligned)
            torch.testing.assert_close(out, tv_out, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("size", [1, (2, 3), (7, 7)])
@pytest.mark.parametrize("channels_last", [False, True])
def test_roi_pool_bit_exact_with_torchvision(dtype, size, channels_last):
    x, boxes = feature(dtype, channels_last), boxes_for(dtype)
    out, grad = run("caffe", x, boxes, size)
    xt = x.detach().clone().requires_grad_()
    ref = torchvision.ops.roi_pool(xt, boxes, size, SCALE)
    ref.backward(torch.randn(ref.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64).to(dtype))
    assert torch.equal(out, ref) and torch.equal(grad, xt.grad)


@pytest.mark.parametrize("op", list(API))
def test_gradcheck(op):
    x = torch.randn(N, 1, 6, 7, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    g = torch.Generator().manual_seed(4)
    boxes = torch.cat([random_boxes(N, 3, 14, 12, g, torch.float64), nasty_boxes(N, 14, 12, torch.float64)[:6]])
    fn = lambda t: API[op](t, boxes, (2, 3), SCALE, 2, op == "max")  # noqa: E731
    assert torch.autograd.gradcheck(fn, (x.clone().requires_grad_(),), atol=1e-8)
    xcl = x.expand(N, 2, 6, 7).contiguous(memory_format=torch.channels_last)  # C=2: truly channels_last
    assert torch.autograd.gradcheck(fn, (xcl.requires_grad_(),), atol=1e-8)


def _op_sample(op, variant):
    """The op's arguments: the variant over these defaults, and for a backward that takes
    an argmax, its forward's."""
    x = feature(channels=variant.get("channels", C))
    rois = rotated_rois_for() if op in ROTATED_OPS else boxes_for()
    grad = torch.randn(len(rois), variant.get("out_channels", C), 2, 3)
    values = dict(input=x, rois=rois, grad=grad, spatial_scale=SCALE, pooled_height=2, pooled_width=3,
                  sampling_ratio=2, aligned=True, continuous=False, batch_size=N, channels=C, height=H, width=W,
                  channels_last=False)
    values.update(variant)
    if any(a.name == "argmax" for a in schema(op).arguments):
        forward = op[1:-len("_backward")]
        values["argmax"] = getattr(torch.ops.roiops, forward)(*contract_args(forward, **values).values())[1]
    # A forward's differentiable arguments require grad; the box-gradient op, which also
    # takes the input, has no gradient of its own.
    if not schema(op).name.endswith("_backward"):
        values["input"] = x.requires_grad_()
        if variant.get("rois_grad"):
            values["rois"] = values["rois"].requires_grad_()
    return contract_args(op, **values)


OPCHECK = [(op, v) for op, vs in VARIANTS.items() for v in vs]


@pytest.mark.parametrize("op, variant", OPCHECK,
                         ids=[op + "".join(f"-{k}={v}" for k, v in v.items()) for op, v in OPCHECK])
def test_opcheck(op, variant):
    torch.library.opcheck(getattr(torch.ops.roiops, op).default, tuple(_op_sample(op, variant).values()))


@pytest.mark.parametrize("op", list(API))
@pytest.mark.parametrize("shape, dim", [((1, C, H, 1), 3), ((1, C, 1, W), 2), ((1, C, H, W), 0), ((N, 1, H, W), 1)])
def test_size_one_dimensions_with_any_stride(op, shape, dim):
    """A contiguous map may carry any stride on a dimension of size 1 (a transposed
    [N, C, 1, H] map is a contiguous [N, C, H, 1] with stride(3) = H); the kernels must not
    take it for a layout: the usual strides give the same bits, forward and backward."""
    g = torch.Generator().manual_seed(8)
    x = torch.randn(shape, generator=g)
    odd = odd_unit_strides(x, [dim])
    assert odd.is_contiguous() and odd.stride() != x.stride()
    boxes = random_boxes(shape[0], 40, 2 * shape[3] / SCALE, 2 * shape[2] / SCALE, g)  # many reach past the map
    out, grad = run(op, odd, boxes, 3)
    ref, ref_grad = run(op, x, boxes, 3)
    assert torch.equal(out, ref) and torch.equal(grad, ref_grad)


@pytest.mark.parametrize("op", list(API))
def test_empty_boxes(op):
    x = feature().requires_grad_()
    out = API[op](x, torch.zeros(0, 5), (3, 4), SCALE, 2, True)
    assert out.shape == (0, C, 3, 4)
    out.sum().backward()
    assert torch.equal(x.grad, torch.zeros_like(x))


@pytest.mark.parametrize("op", list(API))
def test_list_of_boxes_equals_tensor(op):
    x, boxes = feature(), boxes_for()
    per_image = [boxes[boxes[:, 0] == i, 1:] for i in range(N)]
    ordered = torch.cat([boxes[boxes[:, 0] == i] for i in range(N)])
    assert torch.equal(API[op](x, per_image, 3, SCALE, 2, True), API[op](x, ordered, 3, SCALE, 2, True))


def test_inverted_box_aligned_adaptive_gives_zero():
    x = feature().requires_grad_()
    box = torch.tensor([[0, 10.0, 12.0, 4.0, 6.0]])
    for mode in ("avg", "max"):
        out = roiops.roi_align(x, box, 3, SCALE, 0, aligned=True, mode=mode)
        assert torch.equal(out, torch.zeros_like(out))
        out.sum().backward()
        assert torch.equal(x.grad, torch.zeros_like(x))


def test_hand_computed_align():
    # One 2x2 bin over a 3x3 ramp: sample (0.5, 0.5) of a bilinear ramp is its mean.
    x = torch.arange(9.0).reshape(1, 1, 3, 3)
    out = roiops.roi_align(x, torch.tensor([[0, 0.0, 0.0, 1.0, 1.0]]), 1, 1.0, 1, aligned=False)
    assert out.item() == pytest.approx(2.0)  # value at (y, x) = (0.5, 0.5): 3*0.5 + 0.5
    out = roiops.roi_align(x, torch.tensor([[0, 0.0, 0.0, 2.0, 2.0]]), 1, 1.0, 2, aligned=True, mode="max")
    # aligned: samples at -0.5+{0.5,1.5} -> (0,0),(0,1),(1,0),(1,1) -> max is 4.
    assert out.item() == pytest.approx(4.0)


def test_hand_computed_pool_conventions():
    x = torch.arange(16.0).reshape(1, 1, 4, 4)
    box = torch.tensor([[0, 0.4, 0.4, 1.6, 1.6]])
    # Caffe: rounds to cells 0..2 (inclusive), one bin -> max of x[0:3, 0:3] = 10.
    assert roiops.roi_pool(x, box, 1).item() == 10.0
    # mmdet: [0.4, 2.6) -> floor/ceil to cells 0..2 as well -> 10; with scale 0.5: [0.2, 1.3) -> cells 0..1 -> 5.
    assert roiops.roi_pool(x, box, 1, convention="mmdet").item() == 10.0
    assert roiops.roi_pool(x, box, 1, 0.5, convention="mmdet").item() == 5.0
    # mmdet: a box whose width (x2 + 1 - x1) * s <= 0 gives 0.
    assert roiops.roi_pool(x, torch.tensor([[0, 3.0, 0.0, 1.0, 2.0]]), 1, convention="mmdet").item() == 0.0


def test_backward_deterministic_across_threads():
    x, boxes = feature(channels_last=True), boxes_for()
    results = []
    for threads in (1, 2, 2):
        with num_threads(threads):
            for op in API:
                results.append((op, threads, run(op, x, boxes, (3, 4), 2, True)[1]))
    for op in API:
        grads = [g for o, _, g in results if o == op]
        assert all(torch.equal(grads[0], g) for g in grads[1:])


@pytest.mark.parametrize("op, sr", [("avg", 2), ("avg", 0), ("max", 2), ("max", 0), ("caffe", 2)])
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_backward_split_into_bands_and_channel_blocks(op, sr, channels_last, dtype):
    """A map large enough that backward splits it into several bands of rows and blocks of
    channels (one of 8 channels, not a multiple of 16), with tall boxes crossing bands; 2
    threads against 1 (other splits, the same sums) and against the reference."""
    x = torch.randn(2, 40, 180, 160, generator=torch.Generator().manual_seed(3)).to(dtype)
    x = x.contiguous(memory_format=torch.channels_last) if channels_last else x
    g = torch.Generator().manual_seed(4)
    boxes = torch.cat([random_boxes(2, 12, 320, 360, g), nasty_boxes(2, 320, 360),
                       torch.tensor([[0, 10.0, 2.0, 300.0, 355.0], [1, 40.0, 100.0, 60.0, 350.0]])])
    with num_threads(1):
        _, grad1 = run(op, x, boxes, 7, sr, True)
    with num_threads(2):
        _, grad2 = run(op, x, boxes, 7, sr, True)
    _, ref = run(op, x, boxes, 7, sr, True, backend="reference")
    assert torch.equal(grad1, grad2)
    assert grad2.is_contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
    close(grad2, ref, dtype)


def test_direct_op_call_rejects_bad_rows():
    x = feature()
    for bad in ([2.0, 0, 0, 4, 4], [-1.0, 0, 0, 4, 4], [0.5, 0, 0, 4, 4], [0.0, float("nan"), 0, 4, 4],
                [0.0, 0, 0, float("inf"), 4]):
        rois = torch.tensor([bad])
        with pytest.raises(ValueError, match="row 0"):
            torch.ops.roiops.roi_align(x, rois, 1.0, 2, 2, 2, False)
        with pytest.raises(ValueError, match="row 0"):
            torch.ops.roiops.roi_align_max(x, rois, 1.0, 2, 2, 2, False)
        with pytest.raises(ValueError, match="row 0"):
            torch.ops.roiops.roi_pool(x, rois, 1.0, 2, 2, False)
        with pytest.raises(ValueError, match="row 0"):
            torch.ops.roiops._roi_align_backward(torch.ones(1, C, 2, 2), rois, 1.0, 2, 2, N, C, H, W, 2, False, False)
    with pytest.raises(ValueError, match="argmax"):
        torch.ops.roiops._roi_pool_backward(torch.ones(1, C, 2, 2), torch.full((1, C, 2, 2), H * W, dtype=torch.int32),
                                            torch.tensor([[0.0, 0, 0, 4, 4]]), N, C, H, W, False)


def test_more_than_2_31_elements():
    # Image 2 of a 3 x 1 x 32768 x 32768 float16 map starts at element 2^31: every offset the
    # box reads overflows int32. torch.empty: only the corner the box reads is ever touched.
    x = torch.empty(3, 1, 32768, 32768, dtype=torch.float16)
    corner = torch.randn(1, 1, 16, 16, generator=torch.Generator().manual_seed(0)).half()
    x[2:, :, :16, :16] = corner
    box = torch.tensor([[2, 1.5, 2.25, 9.0, 12.0]])
    crop_box = torch.tensor([[0, 1.5, 2.25, 9.0, 12.0]])
    for fn in (lambda t, b: roiops.roi_align(t, b, 3, 1.0, 2, True), lambda t, b: roiops.roi_pool(t, b, 3),
               lambda t, b: roiops.roi_align(t, b, 3, 1.0, 2, False, mode="max")):
        assert torch.equal(fn(x, box), fn(corner, crop_box))


# Every public function built on a registered op, with the op it calls and the
# channels its map needs (position-sensitive ops read 3 x 3 input channels per output).
EAGER = {
    "avg": (lambda x, b: roiops.roi_align(x, b, 3, SCALE, 2, True, box_grad=True), "roi_align", C, False),
    "max": (lambda x, b: roiops.roi_align(x, b, 3, SCALE, 2, True, mode="max"), "roi_align_max", C, False),
    "caffe": (lambda x, b: roiops.roi_pool(x, b, 3, SCALE), "roi_pool", C, False),
    "prroi": (lambda x, b: roiops.prroi_pool(x, b, 3, SCALE), "prroi_pool", C, False),
    "ps_align": (lambda x, b: roiops.ps_roi_align(x, b, 3, SCALE, 0), "ps_roi_align", 18, False),
    "ps_pool": (lambda x, b: roiops.ps_roi_pool(x, b, 3, SCALE), "ps_roi_pool", 18, False),
    "rotated": (lambda x, b: roiops.roi_align_rotated(x, b, 3, SCALE, 2), "roi_align_rotated", C, True),
}


@pytest.mark.parametrize("name", list(EAGER))
def test_eager_calls_run_the_kernels_as_the_registered_ops_do(name):
    """A plain eager call runs its kernel without the dispatcher; under a dispatch mode (as
    FakeTensor, export and compile install) it calls the registered op. Both give the same
    bits, forward and backward, input and box gradients."""
    fn, op, channels, rotated = EAGER[name]
    x = feature(torch.float64, channels=channels)
    g = torch.Generator().manual_seed(3)
    b = (rotated_boxes(N, 7, W / SCALE, H / SCALE, g, torch.float64) if rotated
         else boxes_for(torch.float64))
    results = []
    for recorded in (False, True):
        xi, bi = x.clone().requires_grad_(), b.clone().requires_grad_()
        recorder = RecordOps()
        with recorder if recorded else contextlib.nullcontext():
            assert roiops.ops._declare.direct(xi, bi) is not recorded
            out = fn(xi, bi)
            out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=out.dtype))
        if recorded:
            assert f"roiops.{op}.default" in recorder.ops
            assert f"roiops._{op}_backward.default" in recorder.ops
        results.append((out, xi.grad, bi.grad))
    (out, gx, gb), (out_op, gx_op, gb_op) = results
    assert torch.equal(out, out_op) and torch.equal(gx, gx_op)
    if name in ("avg", "prroi"):  # the ops with a box gradient
        assert torch.equal(gb, gb_op)
    else:
        assert gb is None and gb_op is None
    assert gx.abs().sum() > 0


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")  # the checks' shape tests, traced as constants
def test_traced_and_profiled_calls_see_the_registered_op():
    x, b = feature(), boxes_for()
    fn = lambda x: roiops.roi_align(x, b, 3, SCALE, 2, True)  # noqa: E731
    assert "roiops::roi_align" in str(torch.jit.trace(fn, (x,), check_trace=False).graph)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn(x)
    assert "roiops::roi_align" in {e.name for e in prof.events()}

    class PassThrough(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    direct = roiops.ops._declare.direct
    assert direct(x, b)
    with PassThrough():
        assert not direct(x, b)
    with torch._subclasses.FakeTensorMode() as mode:
        assert not direct(mode.from_tensor(x), mode.from_tensor(b))
    assert not direct(torch.nn.Parameter(x), b)
    assert not direct(x.to("meta"), b.to("meta"))
    assert torch.func.vmap(lambda t: t.sum() * 0 + direct(t, b))(x).eq(0).all()


# Outputs of 4 MiB or more come from blocks the C++ kernels keep when freed (memory.h,
# OutputCache): each must still be written in full, whatever a freed block held.
def _big_map(channels, channels_last=False, requires_grad=False):
    x = torch.randn(2, channels, 64, 64, generator=torch.Generator().manual_seed(5))
    x = x.contiguous(memory_format=torch.channels_last) if channels_last else x
    return x.requires_grad_(requires_grad)


def _big_boxes(count):
    return torch.cat([random_boxes(2, count, 128.0, 128.0, torch.Generator().manual_seed(6)),
                      nasty_boxes(2, 128.0, 128.0)])


BIG = {  # name: (function of (map, boxes), channels, boxes giving a forward output of >= 4 MiB)
    "avg": (lambda x, b: roiops.roi_align(x, b, 7, 0.5, 2, True), 256, 96),
    "max": (lambda x, b: roiops.roi_align(x, b, 7, 0.5, 0, False, mode="max"), 256, 96),
    "caffe": (lambda x, b: roiops.roi_pool(x, b, 7, 0.5), 256, 96),
    "prroi": (lambda x, b: roiops.prroi_pool(x, b, 7, 0.5), 256, 96),
    "ps_align": (lambda x, b: roiops.ps_roi_align(x, b, 7, 0.5, 2), 294, 4000),
    "ps_pool": (lambda x, b: roiops.ps_roi_pool(x, b, 7, 0.5), 294, 4000),
    "rotated": (lambda x, b: roiops.roi_align_rotated(x, torch.cat([b[:, :1], (b[:, 1:3] + b[:, 3:5]) / 2,
                                                                   (b[:, 3:5] - b[:, 1:3]).abs(),
                                                                   b[:, 1:2] * 7.0], 1), 7, 0.5, 2),
                256, 96),
}


linux_only = pytest.mark.skipif(sys.platform != "linux", reason="the kernels keep freed output blocks on Linux only")


@linux_only
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "cl"])
@pytest.mark.parametrize("name", list(BIG))
def test_large_outputs_are_written_in_full_in_reused_blocks(name, channels_last):
    fn, channels, count = BIG[name]
    boxes = _big_boxes(count)
    x = _big_map(channels, channels_last, requires_grad=True)
    out = fn(x, boxes)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(7)).contiguous(
        memory_format=torch.channels_last if channels_last else torch.contiguous_format)
    makers = {"forward": lambda: fn(x.detach(), boxes),
              "backward": lambda: torch.autograd.grad(out, x, grad, retain_graph=True)[0]}
    for direction, make in makers.items():
        first = make()
        assert first.nbytes >= 4 << 20, (direction, first.nbytes)
        expected, where = first.clone(), first.data_ptr()
        first.fill_(float("nan"))
        del first
        second = make()
        assert second.data_ptr() == where, direction  # the block freed last came back
        assert torch.equal(second, expected), direction


@linux_only
def test_freed_output_blocks_kept_are_bounded():
    from roiops import _C
    no_boxes = torch.zeros(0, 5)
    grads = []
    for h in range(200, 272, 12):  # six gradients of 52-68 MiB, each its own size
        x = torch.randn(1, 256, h, 256).requires_grad_()
        out = roiops.roi_align(x, no_boxes, 7, 1.0, 2, True)
        grads.append(torch.autograd.grad(out, x, torch.zeros(out.shape))[0])
        assert torch.equal(grads[-1], torch.zeros_like(x))
    del grads
    assert 0 < _C.output_cache_bytes() <= 256 << 20


@linux_only
def test_freed_output_blocks_kept_are_none_with_the_cache_off():
    """ROIOPS_CPU_CACHE_MIB=0: a 16 MiB gradient comes from torch's allocator, and nothing is kept."""
    import os
    import subprocess
    code = "\n".join([
        "import torch, roiops",
        "x = torch.randn(1, 256, 64, 256).requires_grad_()",
        "out = roiops.roi_align(x, torch.zeros(0, 5), 7, 1.0, 2, True)",
        "g = torch.autograd.grad(out, x, torch.zeros(out.shape))[0]",
        "assert g.nbytes >= 4 << 20 and torch.equal(g, torch.zeros_like(x))",
        "del g",
        "assert roiops._C.output_cache_bytes() == 0, roiops._C.output_cache_bytes()",
    ])
    env = dict(os.environ, ROIOPS_CPU_CACHE_MIB="0")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120, env=env)


def test_large_outputs_after_fork():
    """A child forked while the parent keeps freed blocks allocates and frees its own."""
    import multiprocessing

    fn, channels, count = BIG["avg"]
    boxes = _big_boxes(count)
    x = _big_map(channels)
    freed = fn(x, boxes)
    del freed  # its block is kept, and the child inherits the cache
    expected = fn(x, boxes)
    ctx = multiprocessing.get_context("fork")
    result = ctx.Queue()

    def child():
        torch.set_num_threads(1)  # the parent's OpenMP threads do not survive a fork
        result.put([torch.equal(fn(x, boxes), expected) for _ in range(3)])

    p = ctx.Process(target=child)
    p.start()
    got = result.get(timeout=120)
    p.join(60)
    assert p.exitcode == 0 and got == [True] * 3
