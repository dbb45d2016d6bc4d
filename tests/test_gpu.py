"""The Triton kernels on a real GPU at realistic sizes, against independent CPU oracles.

C = 256 maps of 200x304 (scale 1/4) and 100x150 (scales 1/16 and 1/32), two images, and
the boxes that break quantisation: corners and bin sizes that land exactly on cells after
scaling, larger than the map, outside it, inverted, zero-size, sub-cell. Forward results
of avg RoIAlign and Caffe RoIPool must equal torchvision's CPU kernels bit for bit (bin
edges, grid sizes and sample positions are the CPU's; the per-bin sum runs in the same
order). Backward sums contributions of many boxes in an order that differs on the GPU,
so it is compared within float32 rounding, for the atomic and the deterministic path,
and the deterministic one must repeat bit for bit. Max-mode RoIAlign and the mmdetection
convention are compared with roiops' reference (float32 and float64), half types with
the reference on upcast inputs. Every RoI-shaped operator (cases.ROI_SPECS, with each of its option
sets) runs without a host sync, and in a captured CUDA graph. The GPU checks particular
to one of the other operators are in its own test file (tests/test_<op>.py, tests/
test_ps_roi.py), on the helpers of tests/gpu_cases.py.

The interpreter runs the same kernels in tests/test_triton.py; it divides, rounds and
converts with numpy, so only a GPU shows what the compiled kernels do.
"""

from __future__ import annotations

import importlib

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs a CUDA GPU (the compiled Triton kernels; without one, "
                                       "tests/test_triton.py runs them through Triton's interpreter "
                                       "and tests/test_ptx.py checks their compiled code)")

import roiops
import roiops.reference as REF
from cases import OPTIONS, ROI_SPECS, Case, config_set
from gpu_cases import (BF16, C, F16, F32, F64, LEVEL_IDS, LEVELS, N, both_backwards, close, in_format,
                       close_sums, cuda, exact, feature_map, gpu_boxes, random_grad)
# Skipped, with the reason, where Triton is older than roiops supports (torch < 2.11).
from roiops._requirements import triton_too_old

if triton_too_old():
    pytest.skip(triton_too_old(), allow_module_level=True)
import roiops.triton as rt

torchvision = pytest.importorskip("torchvision")


@pytest.mark.parametrize("cl", [False, True], ids=["nchw", "cl"])
@pytest.mark.parametrize("scale,H,W", LEVELS, ids=LEVEL_IDS)
@pytest.mark.parametrize("dtype", [F32, F64])
def test_align_avg_equals_torchvision_cpu(scale, H, W, cl, dtype):
    x = feature_map(H, W, dtype, cl, seed=1)
    xg = cuda(x)
    for aligned, sr, (ph, pw) in ((True, 0, (7, 7)), (False, 2, (7, 7)), (True, 2, (14, 14)), (False, 0, (5, 3))):
        rois = gpu_boxes(scale, H, W, ph, pw, seed=ph * 10 + sr).to(dtype)
        rg = cuda(rois)
        xr = x.clone().requires_grad_()
        ref = torchvision.ops.roi_align(xr, rois, (ph, pw), scale, sr, aligned)
        out = rt.roi_align_forward(xg, rg, scale, ph, pw, sr, aligned)
        assert out.is_contiguous(memory_format=torch.channels_last if cl else torch.contiguous_format)
        exact(out, ref.detach().contiguous(), f"forward aligned={aligned} sampling={sr} {ph}x{pw}")
        g = random_grad(ref.shape, dtype, seed=2)
        ref.backward(g)
        # Each cell's sum of |terms|: the weights are non-negative, so the backward of |g|.
        xa = x.clone().requires_grad_()
        torchvision.ops.roi_align(xa, rois, (ph, pw), scale, sr, aligned).backward(g.abs())
        fast, det = both_backwards(lambda d: rt.roi_align_backward(cuda(g), rg, scale, ph, pw, N, C, H, W, sr,
                                                                     aligned, cl, deterministic=d))
        close_sums(fast, xr.grad, xa.grad, dtype)
        close_sums(det, xr.grad, xa.grad, dtype)


@pytest.mark.parametrize("cl", [False, True], ids=["nchw", "cl"])
@pytest.mark.parametrize("scale,H,W", LEVELS, ids=LEVEL_IDS)
def test_pool_caffe_equals_torchvision_cpu(scale, H, W, cl):
    x = feature_map(H, W, F32, cl, seed=3)
    for ph, pw in ((7, 7), (6, 4)):
        rois = gpu_boxes(scale, H, W, ph, pw, seed=ph)
        xr = x.clone().requires_grad_()
        ref = torchvision.ops.roi_pool(xr, rois, (ph, pw), scale)
        out, am = rt.roi_pool_forward(cuda(x), cuda(rois), scale, ph, pw, False)
        exact(out, ref.detach().contiguous(), f"roi_pool {ph}x{pw}")
        _, ref_am = REF.roi_pool_forward(x, rois, scale, ph, pw, False)
        exact(am, ref_am, "roi_pool argmax")
        g = random_grad(ref.shape, F32, seed=4)
        ref.backward(g)
        fast, det = both_backwards(lambda d: rt.roi_pool_backward(cuda(g), am, cuda(rois), N, C, H, W, cl,
                                                                    deterministic=d))
        close(fast, xr.grad, F32)
        close(det, xr.grad, F32)


@pytest.mark.parametrize("cl", [False, True], ids=["nchw", "cl"])
@pytest.mark.parametrize("scale,H,W", LEVELS[:2], ids=LEVEL_IDS[:2])
@pytest.mark.parametrize("dtype", [F32, F64])
def test_pool_mmdet_and_align_max_equal_reference(scale, H, W, cl, dtype):
    """Maxima are input values: forward and argmax equal the reference exactly."""
    x = feature_map(H, W, dtype, cl, seed=5)
    rois = gpu_boxes(scale, H, W, 7, 7, seed=6, k_random=24).to(dtype)
    out, am = rt.roi_pool_forward(cuda(x), cuda(rois), scale, 7, 7, True)
    ref, ref_am = REF.roi_pool_forward(x, rois, scale, 7, 7, True)
    exact(out, ref, "mmdet roi_pool")
    exact(am, ref_am, "mmdet roi_pool argmax")
    g = random_grad(ref.shape, dtype, seed=7)
    ref_gi = REF.roi_pool_backward(g, ref_am, rois, N, C, H, W, cl)
    for gi in both_backwards(lambda d: rt.roi_pool_backward(cuda(g), am, cuda(rois), N, C, H, W, cl,
                                                            deterministic=d)):
        close(gi, ref_gi, dtype)

    for aligned, sr in ((True, 2), (False, 0)):
        out, am = rt.roi_align_max_forward(cuda(x), cuda(rois), scale, 7, 7, sr, aligned)
        ref, ref_am = REF.roi_align_max_forward(x, rois, scale, 7, 7, sr, aligned)
        exact(am, ref_am, f"max-mode argmax aligned={aligned} sampling={sr}")
        close(out.cpu(), ref, dtype)
        ref_gi = REF.roi_align_max_backward(g, ref_am, rois, scale, 7, 7, N, C, H, W, sr, aligned, cl)
        for gi in both_backwards(lambda d: rt.roi_align_max_backward(cuda(g), am, cuda(rois), scale, 7, 7, N, C, H,
                                                                     W, sr, aligned, cl, deterministic=d)):
            close(gi, ref_gi, dtype)


@pytest.mark.parametrize("cl", [False, True], ids=["nchw", "cl"])
@pytest.mark.parametrize("dtype", [F16, BF16])
def test_half_types_against_upcast_reference(dtype, cl):
    scale, H, W = LEVELS[1]
    x = feature_map(H, W, dtype, cl, seed=8)
    rois = gpu_boxes(scale, H, W, 7, 7, seed=9, k_random=24)
    g = random_grad((rois.shape[0], C, 7, 7), dtype, seed=10)
    xf, gf = x.float(), g.float()
    out = rt.roi_align_forward(cuda(x), cuda(rois), scale, 7, 7, 0, True)
    assert out.dtype == dtype
    close(out.cpu(), REF.roi_align_forward(xf, rois, scale, 7, 7, 0, True).to(dtype), dtype)
    ref_gi = REF.roi_align_backward(gf, rois, scale, 7, 7, N, C, H, W, 0, True, cl)
    for gi in both_backwards(lambda d: rt.roi_align_backward(cuda(g), cuda(rois), scale, 7, 7, N, C, H, W, 0, True,
                                                             cl, deterministic=d)):
        assert gi.dtype == dtype
        close(gi.float(), ref_gi, dtype)

    out, am = rt.roi_align_max_forward(cuda(x), cuda(rois), scale, 7, 7, 2, False)
    ref, ref_am = REF.roi_align_max_forward(xf, rois, scale, 7, 7, 2, False)
    close(out.cpu(), ref.to(dtype), dtype)
    for gi in both_backwards(lambda d: rt.roi_align_max_backward(cuda(g), am, cuda(rois), scale, 7, 7, N, C, H, W, 2,
                                                                 False, cl, deterministic=d)):
        close(gi.float(), REF.roi_align_max_backward(gf, am.cpu(), rois, scale, 7, 7, N, C, H, W, 2, False, cl),
              dtype)

    for continuous in (False, True):
        out, am = rt.roi_pool_forward(cuda(x), cuda(rois), scale, 7, 7, continuous)
        ref, ref_am = REF.roi_pool_forward(x, rois, scale, 7, 7, continuous)
        exact(out, ref, "half roi_pool")
        exact(am, ref_am, "half roi_pool argmax")
        for gi in both_backwards(lambda d: rt.roi_pool_backward(cuda(g), am, cuda(rois), N, C, H, W, cl,
                                                                deterministic=d)):
            close(gi.float(), REF.roi_pool_backward(gf, ref_am, rois, N, C, H, W, cl), dtype)


def test_public_api_on_cuda_equals_cpu():
    """The public functions with autograd on CUDA tensors against the same calls on CPU
    (the C++ kernels, bit-exact with torchvision)."""
    scale, H, W = LEVELS[0]
    x = feature_map(H, W, F32, True, seed=11)
    rois = gpu_boxes(scale, H, W, 7, 7, seed=12)
    for fn in (lambda t, b: roiops.roi_align(t, b, 7, scale, 2, True),
               lambda t, b: roiops.roi_align(t, b, 7, scale, 0, False, mode="max"),
               lambda t, b: roiops.roi_pool(t, b, 7, scale),
               lambda t, b: roiops.roi_pool(t, b, 7, scale, convention="mmdet")):
        xc = x.clone().requires_grad_()
        xg = cuda(x).requires_grad_()
        ref = fn(xc, rois)
        out = fn(xg, cuda(rois))
        exact(out.detach(), ref.detach(), "public API forward")
        g = random_grad(ref.shape, F32, seed=13)
        ref.backward(g)
        out.backward(cuda(g))
        assert xg.grad.device.type == "cuda"
        close(xg.grad.cpu(), xc.grad, F32)


def spec_call(spec, options: dict, size: int = 7):
    """``call(map, boxes, scale)``: the operator's function with ``options``, given the
    axis-aligned boxes (a tensor or a per-image list) in its spec's box format."""
    case = Case(spec.name, spec, options)

    def call(t, b, s):
        return case(t, in_format(spec.boxes, b), size, s)
    return call


def _name(spec, options: dict) -> str:
    return spec.name + "".join(f"-{k}={v}" for k, v in options.items())


# Every operator with each of its option sets; a position-sensitive one with 4 x 4 bins
# (256 = 16 channels x 4 x 4 bins).
OPS = {_name(spec, options): spec_call(spec, options, 4 if spec.position_sensitive else 7)
       for spec in ROI_SPECS for options in OPTIONS[spec.name]}
OPS["multi-level"] = lambda t, b, s: roiops.multi_scale_roi_align([t, t[:, :, ::2, ::2]], b, 7, [s, s / 2], 2)


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("op", list(OPS))
def test_no_host_sync_by_default(op, deterministic):
    """Forward and backward never wait for the GPU by default: the box value check is
    skipped on CUDA tensors (invalid rows give 0 and no gradient)."""
    scale, H, W = LEVELS[1]
    x = cuda(feature_map(H, W, F32, True, seed=14)).requires_grad_()
    cpu_rois = gpu_boxes(scale, H, W, 7, 7, seed=15, k_random=8)
    rois = cuda(cpu_rois)
    boxes = [cuda(cpu_rois[cpu_rois[:, 0] == i, 1:]) for i in range(N)]  # the list form too
    g = torch.ones(1, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with config_set(deterministic_backward=deterministic):
            for b in (rois, boxes):
                out = OPS[op](x, b, scale)
                out.backward(g.expand_as(out))
    finally:
        torch.cuda.set_sync_debug_mode(0)


def test_invalid_rows_on_cuda_give_zeros_or_raise_in_strict_mode():
    scale, H, W = LEVELS[1]
    x = cuda(feature_map(H, W, F32, False, seed=16))
    rois = cuda(torch.tensor([[0, 8.0, 8.0, 200.0, 160.0], [5, 8.0, 8.0, 200.0, 160.0],
                              [1, float("nan"), 8.0, 200.0, 160.0]]))
    out = roiops.roi_align(x, rois, 7, scale, 2, True)
    assert out[0].abs().sum() > 0 and not out[1:].any()
    with config_set(check_box_values=True), pytest.raises(ValueError, match="boxes row 1"):
        roiops.roi_align(x, rois, 7, scale, 2, True)


def test_repeated_launches_run_the_kernel_of_their_own_specialization(monkeypatch):
    """A launch whose arguments key it as an earlier one's calls that launch's compiled
    kernel directly (_common._Kernel). Launches that Triton specializes differently, one
    after another and then again in reverse: maps and boxes 4 or 8 bytes past 16-byte
    alignment, rows of W + 1 cells, channels_last, float32 and float64. Each must equal
    torchvision's CPU kernel bit for bit, and the second round must take no other path."""
    scale, H, W = LEVELS[1]
    cases = []
    for dtype in (F32, F64):
        wide = cuda(feature_map(H, W + 1, dtype, False, seed=21))
        rows = cuda(torch.cat([torch.zeros(1, 5), gpu_boxes(scale, H, W, 7, 7, seed=22)]).to(dtype))
        for x, rois in ((wide[..., :W], rows[1:].clone()),         # aligned map, rows of W + 1 cells
                        (wide[..., 1:], rows[1:]),                 # both misaligned
                        (cuda(feature_map(H, W, dtype, True, seed=23)), rows[1:].clone())):
            expected = torchvision.ops.roi_align(x.cpu(), rois.cpu(), 7, scale, 2, True)
            cases.append((x, rois, expected))
    assert cases[1][0].data_ptr() % 16 and cases[1][1].data_ptr() % 16
    for x, rois, expected in cases:
        exact(rt.roi_align_forward(x, rois, scale, 7, 7, 2, True), expected, f"first round {x.dtype} {x.stride()}")
    slow = []
    kernel = importlib.import_module("roiops.triton.roi_align")._align_fwd_kernel
    full_path = kernel.run
    monkeypatch.setattr(kernel, "run", lambda *a, **k: slow.append(1) or full_path(*a, **k))
    for x, rois, expected in reversed(cases):
        exact(rt.roi_align_forward(x, rois, scale, 7, 7, 2, True), expected, f"second round {x.dtype} {x.stride()}")
    assert not slow, "a repeated launch went through JITFunction.run"


@pytest.mark.parametrize("spec", ROI_SPECS, ids=lambda spec: spec.name)
def test_cuda_graph_capture_and_replay(spec):
    """A step captured in a CUDA graph and replayed after new values were copied into its
    inputs (the pattern of docs/ecosystem.md) gives what an eager call gives on them: every
    operator, with its first option set (a position-sensitive one on 4 x 7 x 7 channels)."""
    scale, H, W = LEVELS[0]
    c, c_out = (4 * 49, 4) if spec.position_sensitive else (C, C)
    function = spec_call(spec, OPTIONS[spec.name][0])

    def call(x, rois):
        return function(x, rois, scale)

    static_x = cuda(feature_map(H, W, F32, True, seed=17, channels=c)).requires_grad_()
    static_rois = cuda(gpu_boxes(scale, H, W, 7, 7, seed=18))
    static_g = torch.randn(static_rois.shape[0], c_out, 7, 7, device="cuda")

    def step():
        static_x.grad = None
        out = call(static_x, static_rois)
        out.backward(static_g)
        return out

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = step()
    new_x = cuda(feature_map(H, W, F32, True, seed=19, channels=c))
    with torch.no_grad():
        static_x.copy_(new_x)
        static_rois[:, 1:] *= 0.5
    graph.replay()
    xe = new_x.clone().requires_grad_()
    expected = call(xe, static_rois.clone())
    expected.backward(static_g)
    exact(static_out, expected.detach().cpu(), "replayed forward")
    close(static_x.grad.cpu(), xe.grad.cpu(), F32)
