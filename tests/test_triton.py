"""roiops.triton kernels against the oracle (roiops.reference; torchvision where it has the
op), on CUDA when there is a GPU, else on CPU tensors through Triton's interpreter.

The interpreter is slow (each tile op is a numpy call), so shapes are tiny and the
parameter grid is a covering set rather than a full product.
"""

# tests/conftest.py sets TRITON_INTERPRET=1 without a GPU, before triton is imported.

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import roiops
import roiops.triton as rt
from boxes import nasty_boxes, random_boxes

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

import roiops.reference as REF
import torchvision

F16, BF16, F32, F64 = torch.float16, torch.bfloat16, torch.float32, torch.float64
TOL = {F32: dict(rtol=1e-5, atol=1e-5), F64: dict(rtol=1e-10, atol=1e-10),
       F16: dict(rtol=1e-2, atol=1e-2), BF16: dict(rtol=1e-2, atol=1e-2)}
N, C, H, W = 2, 3, 7, 9          # feature map; C = 3 leaves lanes of every channel block idle
SCALE = 0.5                      # so the image is 18 x 14 pixels
IMG_W, IMG_H = W / SCALE, H / SCALE


# ----------------------------------------------------------------------------- helpers

def make_input(dtype, channels_last, seed=0, n=N, c=C, h=H, w=W):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, c, h, w, generator=g, dtype=torch.float64).to(dtype)
    x = x.contiguous(memory_format=torch.channels_last) if channels_last else x
    return x.to(DEVICE)


def make_rois(dtype, seed=0, k=4, nasty=()):
    """k random boxes plus the nasty_boxes rows listed in `nasty`, in opmath."""
    g = torch.Generator().manual_seed(seed)
    opm = F64 if dtype == F64 else F32
    rows = [random_boxes(N, k, IMG_W, IMG_H, g, dtype=F64)]
    if nasty:
        rows.append(nasty_boxes(N, IMG_W, IMG_H, dtype=F64)[list(nasty)])
    return torch.cat(rows).to(opm).to(DEVICE)


def cpu(t):
    return t.detach().cpu()


def assert_layout(t, channels_last):
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    assert t.is_contiguous(memory_format=fmt), (t.shape, t.stride())


def assert_close(actual, expected, dtype):
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    torch.testing.assert_close(cpu(actual), cpu(expected), **TOL[dtype], equal_nan=True)


def grad_like(out, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(out.shape, generator=g, dtype=torch.float64).to(out.dtype).to(DEVICE)


# Covering set over dtype x layout x aligned x sampling x output size, each row with a
# different pair of nasty boxes (nasty_boxes rows, see tests/boxes.py).
ALIGN_CASES = [
    (F32, False, False, 2, (2, 3), (0, 5)),
    (F32, True, True, 0, (3, 2), (3, 7)),
    (F32, False, True, -1, (1, 1), (4, 9)),
    (F32, True, False, 1, (2, 2), (1, 8)),
    (F32, False, False, 3, (1, 3), (2, 6)),
    (F64, False, True, 2, (2, 3), (0, 7)),
    (F64, True, False, 0, (1, 1), (5, 9)),
    (F16, False, True, 1, (3, 2), (4, 8)),
    (F16, True, False, 2, (2, 3), (3, 5)),
    (BF16, False, False, 0, (2, 2), (0, 4)),
    (BF16, True, True, 3, (1, 1), (6, 9)),
]
ALIGN_IDS = [f"{str(d)[6:]}-{'cl' if cl else 'nchw'}-al{int(a)}-s{s}-{o[0]}x{o[1]}"
             for d, cl, a, s, o, _ in ALIGN_CASES]


# ----------------------------------------------------------------------------- roi_align avg

@pytest.mark.parametrize("dtype,cl,aligned,sr,out_hw,nasty", ALIGN_CASES, ids=ALIGN_IDS)
def test_align_avg(dtype, cl, aligned, sr, out_hw, nasty):
    x = make_input(dtype, cl)
    rois = make_rois(dtype, nasty=nasty)
    ph, pw = out_hw
    out = rt.roi_align_forward(x, rois, SCALE, ph, pw, sr, aligned)
    ref = REF.roi_align_forward(cpu(x), cpu(rois), SCALE, ph, pw, sr, aligned)
    assert out.shape == (rois.shape[0], C, ph, pw)
    assert_layout(out, cl)
    assert_close(out, ref, dtype)

    g = grad_like(out)
    ref_gi = REF.roi_align_backward(cpu(g), cpu(rois), SCALE, ph, pw, N, C, H, W, sr, aligned, cl)
    for det in (False, True):
        gi = rt.roi_align_backward(g, rois, SCALE, ph, pw, N, C, H, W, sr, aligned, cl, deterministic=det)
        assert gi.shape == (N, C, H, W)
        assert_layout(gi, cl)
        assert_close(gi, ref_gi, dtype)


# ----------------------------------------------------------------------------- roi_align max

@pytest.mark.parametrize("dtype,cl,aligned,sr,out_hw,nasty", ALIGN_CASES, ids=ALIGN_IDS)
def test_align_max(dtype, cl, aligned, sr, out_hw, nasty):
    x = make_input(dtype, cl, seed=2)
    rois = make_rois(dtype, seed=3, nasty=nasty)
    ph, pw = out_hw
    out, am = rt.roi_align_max_forward(x, rois, SCALE, ph, pw, sr, aligned)
    ref, ref_am = REF.roi_align_max_forward(cpu(x), cpu(rois), SCALE, ph, pw, sr, aligned)
    assert am.dtype == torch.int32 and am.shape == out.shape
    assert_layout(out, cl)
    assert_layout(am, cl)
    assert_close(out, ref, dtype)
    assert torch.equal(cpu(am), ref_am)

    g = grad_like(out)
    ref_gi = REF.roi_align_max_backward(cpu(g), ref_am, cpu(rois), SCALE, ph, pw, N, C, H, W, sr, aligned, cl)
    for det in (False, True):
        gi = rt.roi_align_max_backward(g, am, rois, SCALE, ph, pw, N, C, H, W, sr, aligned, cl,
                                       deterministic=det)
        assert_layout(gi, cl)
        assert_close(gi, ref_gi, dtype)


# ----------------------------------------------------------------------------- roi_pool

POOL_CASES = [
    (F32, False, False, (2, 3), (0, 5)),
    (F32, True, True, (3, 2), (3, 7)),
    (F32, False, True, (1, 1), (4, 9)),
    (F32, True, False, (1, 1), (1, 8)),
    (F64, False, False, (2, 2), (2, 6)),
    (F64, True, True, (1, 3), (0, 7)),
    (F16, False, True, (2, 3), (5, 9)),
    (F16, True, False, (3, 2), (4, 8)),
    (BF16, False, False, (2, 2), (3, 5)),
    (BF16, True, True, (2, 3), (0, 4)),
]
POOL_IDS = [f"{str(d)[6:]}-{'cl' if cl else 'nchw'}-{'cont' if co else 'caffe'}-{o[0]}x{o[1]}"
            for d, cl, co, o, _ in POOL_CASES]


@pytest.mark.parametrize("dtype,cl,continuous,out_hw,nasty", POOL_CASES, ids=POOL_IDS)
def test_pool(dtype, cl, continuous, out_hw, nasty):
    x = make_input(dtype, cl, seed=4)
    rois = make_rois(dtype, seed=5, nasty=nasty)
    ph, pw = out_hw
    out, am = rt.roi_pool_forward(x, rois, SCALE, ph, pw, continuous)
    ref, ref_am = REF.roi_pool_forward(cpu(x), cpu(rois), SCALE, ph, pw, continuous)
    assert am.dtype == torch.int32
    assert_layout(out, cl)
    assert_layout(am, cl)
    assert_close(out, ref, dtype)
    assert torch.equal(cpu(am), ref_am)

    g = grad_like(out)
    ref_gi = REF.roi_pool_backward(cpu(g), ref_am, cpu(rois), N, C, H, W, cl)
    for det in (False, True):
        gi = rt.roi_pool_backward(g, am, rois, N, C, H, W, cl, deterministic=det)
        assert_layout(gi, cl)
        assert_close(gi, ref_gi, dtype)


# ----------------------------------------------------------------------------- torchvision

@pytest.mark.parametrize("aligned,sr", [(False, 2), (True, 0)])
def test_matches_torchvision(aligned, sr):
    """Our avg RoIAlign and Caffe RoIPool are torchvision's (CPU), bit for bit in float32
    on the interpreter; on a GPU within float32 tolerance (ftz, libdevice)."""
    exact = dict(rtol=0, atol=0) if DEVICE == "cpu" else TOL[F32]
    x = make_input(F32, False, seed=6)
    rois = make_rois(F32, seed=7, k=5)
    xr = cpu(x).requires_grad_()
    ref = torchvision.ops.roi_align(xr, cpu(rois), (2, 3), SCALE, sr, aligned)
    out = rt.roi_align_forward(x, rois, SCALE, 2, 3, sr, aligned)
    torch.testing.assert_close(cpu(out), ref.detach(), **exact)
    g = grad_like(out)
    ref.backward(cpu(g))
    gi = rt.roi_align_backward(g, rois, SCALE, 2, 3, N, C, H, W, sr, aligned, False)
    torch.testing.assert_close(cpu(gi), xr.grad, **TOL[F32])

    if not aligned:
        xr.grad = None
        ref = torchvision.ops.roi_pool(xr, cpu(rois), (2, 3), SCALE)
        out, am = rt.roi_pool_forward(x, rois, SCALE, 2, 3, False)
        torch.testing.assert_close(cpu(out), ref.detach(), **exact)
        ref.backward(cpu(g))
        gi = rt.roi_pool_backward(g, am, rois, N, C, H, W, False)
        torch.testing.assert_close(cpu(gi), xr.grad, **TOL[F32])


# ----------------------------------------------------------------------------- nasty boxes

@pytest.mark.parametrize("sr", [2, 0])
def test_all_nasty_boxes(sr):
    """Every nasty box at once, both align modes and both pool conventions (float32)."""
    x = make_input(F32, False, seed=8)
    rois = nasty_boxes(N, IMG_W, IMG_H, dtype=F32).to(DEVICE)
    for aligned in (False, True):
        out = rt.roi_align_forward(x, rois, SCALE, 2, 2, sr, aligned)
        assert_close(out, REF.roi_align_forward(cpu(x), cpu(rois), SCALE, 2, 2, sr, aligned), F32)
    out, am = rt.roi_align_max_forward(x, rois, SCALE, 2, 2, sr, True)
    ref, ref_am = REF.roi_align_max_forward(cpu(x), cpu(rois), SCALE, 2, 2, sr, True)
    assert_close(out, ref, F32)
    assert torch.equal(cpu(am), ref_am)
    g = grad_like(out)
    ref_gi = REF.roi_align_max_backward(cpu(g), ref_am, cpu(rois), SCALE, 2, 2, N, C, H, W, sr, True, False)
    assert_close(rt.roi_align_max_backward(g, am, rois, SCALE, 2, 2, N, C, H, W, sr, True, False), ref_gi, F32)
    if sr == 2:
        for continuous in (False, True):
            out, am = rt.roi_pool_forward(x, rois, SCALE, 2, 2, continuous)
            ref, ref_am = REF.roi_pool_forward(cpu(x), cpu(rois), SCALE, 2, 2, continuous)
            assert_close(out, ref, F32)
            assert torch.equal(cpu(am), ref_am)


# ----------------------------------------------------------------------------- edge cases

@pytest.mark.parametrize("cl", [False, True])
def test_empty_rois(cl):
    x = make_input(F32, cl)
    rois = torch.zeros(0, 5, device=DEVICE)
    out = rt.roi_align_forward(x, rois, SCALE, 2, 3, 2, True)
    assert out.shape == (0, C, 2, 3)
    out, am = rt.roi_align_max_forward(x, rois, SCALE, 2, 3, 2, True)
    assert out.shape == am.shape == (0, C, 2, 3)
    out, am = rt.roi_pool_forward(x, rois, SCALE, 2, 3, False)
    assert out.shape == am.shape == (0, C, 2, 3)
    g = torch.zeros(0, C, 2, 3, device=DEVICE)
    ai = torch.zeros(0, C, 2, 3, dtype=torch.int32, device=DEVICE)
    for det in (False, True):
        for gi in (rt.roi_align_backward(g, rois, SCALE, 2, 3, N, C, H, W, 2, True, cl, deterministic=det),
                   rt.roi_align_max_backward(g, ai, rois, SCALE, 2, 3, N, C, H, W, 2, True, cl, deterministic=det),
                   rt.roi_pool_backward(g, ai, rois, N, C, H, W, cl, deterministic=det)):
            assert gi.shape == (N, C, H, W) and not cpu(gi).any()
            assert_layout(gi, cl)


def test_invalid_rows_are_masked():
    """Bad rows (NaN/inf coordinate, batch index out of range or not an integer) give zeros
    and argmax -1, scatter nothing, and leave the good rows untouched."""
    x = make_input(F32, True, seed=9)
    rois = make_rois(F32, seed=10, k=4)
    bad = torch.tensor([[0, float("nan"), 1, 5, 6], [1, 1, 1, float("inf"), 6], [2, 1, 1, 5, 6],
                        [-1, 1, 1, 5, 6], [0.5, 1, 1, 5, 6], [float("nan"), 1, 1, 5, 6],
                        [0, -float("inf"), 1, 5, 6]], device=DEVICE)
    allr = torch.cat([rois[:2], bad, rois[2:]])
    good = torch.tensor([True] * 2 + [False] * len(bad) + [True] * 2)

    out = rt.roi_align_forward(x, allr, SCALE, 2, 2, 0, True)
    assert not cpu(out)[~good].any()
    assert_close(out[good.to(DEVICE)], REF.roi_align_forward(cpu(x), cpu(rois), SCALE, 2, 2, 0, True), F32)
    g = grad_like(out)
    g_good = g[good.to(DEVICE)]
    ref_gi = REF.roi_align_backward(cpu(g_good), cpu(rois), SCALE, 2, 2, N, C, H, W, 0, True, True)
    for det in (False, True):
        gi = rt.roi_align_backward(g, allr, SCALE, 2, 2, N, C, H, W, 0, True, True, deterministic=det)
        assert_close(gi, ref_gi, F32)

    out, am = rt.roi_align_max_forward(x, allr, SCALE, 2, 2, 2, False)
    assert not cpu(out)[~good].any() and (cpu(am)[~good] == -1).all()
    ref, ref_am = REF.roi_align_max_forward(cpu(x), cpu(rois), SCALE, 2, 2, 2, False)
    assert torch.equal(cpu(am)[good], ref_am)
    # Even a forged argmax on a bad row must not scatter.
    am_forged = am.clone()
    am_forged[~good.to(DEVICE)] = 0
    ref_gi = REF.roi_align_max_backward(cpu(g_good), ref_am, cpu(rois), SCALE, 2, 2, N, C, H, W, 2, False, True)
    for det in (False, True):
        gi = rt.roi_align_max_backward(g, am_forged, allr, SCALE, 2, 2, N, C, H, W, 2, False, True,
                                       deterministic=det)
        assert_close(gi, ref_gi, F32)

    out, am = rt.roi_pool_forward(x, allr, SCALE, 2, 2, False)
    assert not cpu(out)[~good].any() and (cpu(am)[~good] == -1).all()
    ref, ref_am = REF.roi_pool_forward(cpu(x), cpu(rois), SCALE, 2, 2, False)
    assert torch.equal(cpu(am)[good], ref_am)
    ref_gi = REF.roi_pool_backward(cpu(g_good), ref_am, cpu(rois), N, C, H, W, True)
    am_forged = am.clone()
    am_forged[~good.to(DEVICE)] = 0
    for det in (False, True):
        gi = rt.roi_pool_backward(g, am_forged, allr, N, C, H, W, True, deterministic=det)
        assert_close(gi, ref_gi, F32)


def test_huge_coordinates_are_masked():
    """Finite coordinates beyond 2^24 feature cells (refused by the C++ kernels) are
    masked like bad rows instead of sizing a sampling loop that would never end."""
    x = make_input(F32, False)
    rois = torch.tensor([[0, 1.0, 1.0, 1e30, 6.0], [1, -1e9, 0.0, 3.0, 3.0]], device=DEVICE)
    assert not cpu(rt.roi_align_forward(x, rois, SCALE, 2, 2, 0, True)).any()
    out, am = rt.roi_align_max_forward(x, rois, SCALE, 2, 2, 0, False)
    assert not cpu(out).any() and (cpu(am) == -1).all()
    out, am = rt.roi_pool_forward(x, rois, SCALE, 2, 2, True)
    assert not cpu(out).any() and (cpu(am) == -1).all()


def test_nan_and_ties_in_max():
    """First maximum wins ties; the first NaN wins over numbers (contract, sec. argmax)."""
    x = torch.zeros(1, 2, 4, 4)
    x[0, 1, 1, 2] = float("nan")
    x[0, 1, 2, 1] = float("nan")
    x = x.to(DEVICE)
    rois = torch.tensor([[0, 0.0, 0.0, 3.0, 3.0], [0, 0.5, 0.5, 2.5, 2.5]], device=DEVICE)
    for continuous in (False, True):
        out, am = rt.roi_pool_forward(x, rois, 1.0, 2, 2, continuous)
        ref, ref_am = REF.roi_pool_forward(cpu(x), cpu(rois), 1.0, 2, 2, continuous)
        torch.testing.assert_close(cpu(out), ref, equal_nan=True)
        assert torch.equal(cpu(am), ref_am)
    out, am = rt.roi_align_max_forward(x, rois, 1.0, 2, 2, 2, False)
    ref, ref_am = REF.roi_align_max_forward(cpu(x), cpu(rois), 1.0, 2, 2, 2, False)
    torch.testing.assert_close(cpu(out), ref, equal_nan=True)
    assert torch.equal(cpu(am), ref_am)


def test_arbitrary_strides():
    """Neither NCHW nor channels_last input (a permuted view): output is contiguous."""
    base = make_input(F32, False, seed=11, n=C, c=N)           # [C, N, H, W]
    x = base.transpose(0, 1)                                   # [N, C, H, W], odd strides
    rois = make_rois(F32, seed=12, k=3)
    out = rt.roi_align_forward(x, rois, SCALE, 2, 2, 2, False)
    assert out.is_contiguous()
    assert_close(out, REF.roi_align_forward(cpu(x).contiguous(), cpu(rois), SCALE, 2, 2, 2, False), F32)
    out, am = rt.roi_pool_forward(x, rois, SCALE, 2, 2, False)
    ref, ref_am = REF.roi_pool_forward(cpu(x).contiguous(), cpu(rois), SCALE, 2, 2, False)
    assert_close(out, ref, F32)
    # grad with stride-0 dims, as autograd hands out for out.sum().backward()
    g = torch.ones(1, device=DEVICE).expand(am.shape)
    ref_gi = REF.roi_pool_backward(cpu(g).contiguous(), ref_am, cpu(rois), N, C, H, W, False)
    for det in (False, True):
        assert_close(rt.roi_pool_backward(g, am, rois, N, C, H, W, False, deterministic=det), ref_gi, F32)


def test_64bit_offsets():
    """An image starting past element 2^31 of a (lazily allocated, untouched) storage."""
    if DEVICE == "cuda" and torch.cuda.get_device_properties(0).total_memory < 16 * 2 ** 30:
        pytest.skip("needs a 6.5 GB allocation")
    stride = 2 ** 30 + 64
    storage = torch.empty(3 * stride, dtype=F16, device=DEVICE)
    x = storage.as_strided((3, 2, 4, 5), (stride, 20, 5, 1))
    x.copy_(torch.randn(3, 2, 4, 5, generator=torch.Generator().manual_seed(13)).to(F16))
    rois = torch.tensor([[2, 0.5, 0.5, 3.5, 2.5], [1, 0.0, 0.0, 4.0, 3.0], [2, 1.0, 0.0, 2.0, 3.0]],
                        device=DEVICE)
    xc = cpu(x).contiguous()
    out = rt.roi_align_forward(x, rois, 1.0, 2, 2, 2, False)
    assert_close(out, REF.roi_align_forward(xc, cpu(rois), 1.0, 2, 2, 2, False), F16)
    out, am = rt.roi_pool_forward(x, rois, 1.0, 2, 2, False)
    ref, ref_am = REF.roi_pool_forward(xc, cpu(rois), 1.0, 2, 2, False)
    assert_close(out, ref, F16)
    assert torch.equal(cpu(am), ref_am)


# ----------------------------------------------------------------------------- determinism

@pytest.mark.parametrize("cl", [False, True])
def test_deterministic_path(cl):
    """Deterministic backward: bit-identical across runs, equal to the atomic path within
    tolerance; chosen by torch's flag and by the module switch."""
    x = make_input(F32, cl, seed=14)
    # Many overlapping boxes on one image: lots of contributions per grad cell.
    g_ = torch.Generator().manual_seed(15)
    rois = random_boxes(1, 8, IMG_W, IMG_H, g_, dtype=F32).to(DEVICE)
    out = rt.roi_align_forward(x, rois, SCALE, 2, 2, 2, True)
    g = grad_like(out)
    args = (g, rois, SCALE, 2, 2, N, C, H, W, 2, True, cl)
    a = rt.roi_align_backward(*args, deterministic=True)
    b = rt.roi_align_backward(*args, deterministic=True)
    fast = rt.roi_align_backward(*args, deterministic=False)
    assert torch.equal(a, b)
    assert_close(a, fast, F32)

    _, am = rt.roi_pool_forward(x, rois, SCALE, 2, 2, False)
    a = rt.roi_pool_backward(g, am, rois, N, C, H, W, cl, deterministic=True)
    assert torch.equal(a, rt.roi_pool_backward(g, am, rois, N, C, H, W, cl, deterministic=True))
    assert_close(a, rt.roi_pool_backward(g, am, rois, N, C, H, W, cl, deterministic=False), F32)

    # Path selection: explicit argument > roiops.config > torch's flag.
    from roiops.triton import _common

    assert _common.use_deterministic(None) is torch.are_deterministic_algorithms_enabled()
    previous = torch.are_deterministic_algorithms_enabled()
    try:
        torch.use_deterministic_algorithms(True)
        assert _common.use_deterministic(None) is True
        assert _common.use_deterministic(False) is False
        roiops.config.deterministic_backward = False
        assert _common.use_deterministic(None) is False
    finally:
        roiops.config.deterministic_backward = None
        torch.use_deterministic_algorithms(previous)
    roiops.config.deterministic_backward = True
    try:
        assert _common.use_deterministic(None) is True
    finally:
        roiops.config.deterministic_backward = None


# ----------------------------------------------------------------------------- GPU build

_COMPILE_SCRIPT = textwrap.dedent("""
    import torch, triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.compiler.compiler import make_backend
    from triton.runtime import jit as J

    target = GPUTarget("cuda", 90, 32)
    backend = make_backend(target)
    done = set()

    def compile_only(self, *args, grid, warmup, **kwargs):
        # Bind and specialize exactly as a launch would, then compile to a cubin.
        kwargs["debug"] = False
        bound, spec, opts = J.create_function_from_signature(self.signature, self.params, backend)(*args, **kwargs)
        options, signature, constexprs, attrs = self._pack_args(backend, kwargs, bound, spec, opts)
        key = (self.fn.__name__, str(signature), str(constexprs))
        if key not in done:
            triton.compile(ASTSource(self, signature, constexprs, attrs), target=target, options=options.__dict__)
            done.add(key)

    J.JITFunction.run = compile_only
    import roiops.triton as rt

    for dtype, cl in ((torch.float32, False), (torch.bfloat16, True)):
        x = torch.empty(2, 64, 20, 30, dtype=dtype, device="meta")
        x = x.contiguous(memory_format=torch.channels_last) if cl else x
        rois = torch.empty(16, 5, device="meta")
        for det in (False, True):
            out = rt.roi_align_forward(x, rois, 0.25, 7, 7, 2, True)
            rt.roi_align_backward(out, rois, 0.25, 7, 7, 2, 64, 20, 30, 2, True, cl, deterministic=det)
            out, am = rt.roi_align_max_forward(x, rois, 0.25, 7, 7, 0, False)
            rt.roi_align_max_backward(out, am, rois, 0.25, 7, 7, 2, 64, 20, 30, 0, False, cl, deterministic=det)
            out, am = rt.roi_pool_forward(x, rois, 0.25, 7, 7, not cl)
            rt.roi_pool_backward(out, am, rois, 2, 64, 20, 30, cl, deterministic=det)
    print("compiled", len(done), "variants")
""")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU tests above compile the kernels")
def test_kernels_compile_for_cuda():
    """Without a GPU, still compile every kernel (fp32 NCHW and bf16 channels_last) to an
    sm_90 cubin: the interpreter accepts code the Triton compiler rejects."""
    pytest.importorskip("triton.backends.nvidia")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = Path(__file__).resolve().parents[1]
    env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, "-c", _COMPILE_SCRIPT], env=env, capture_output=True, text=True,
                       timeout=300, cwd=root)
    if r.returncode != 0 and ("ptxas" in r.stderr and "not found" in r.stderr.lower()):
        pytest.skip("no ptxas in this Triton install")
    assert r.returncode == 0, r.stderr[-4000:]
    assert "compiled 20 variants" in r.stdout, r.stdout


# ----------------------------------------------------------------------------- op layer

@pytest.mark.parametrize("mode", ["avg", "max", "caffe", "mmdet"])
def test_public_api_routes_through_triton(mode):
    """use_backend("triton") sends the public functions and their backward to these kernels."""
    x = make_input(F32, True, seed=9)
    boxes = torch.cat([random_boxes(N, 3, IMG_W, IMG_H, torch.Generator().manual_seed(9)),
                       nasty_boxes(N, IMG_W, IMG_H)]).to(DEVICE)

    def run():
        xi = x.detach().clone().requires_grad_()
        if mode in ("avg", "max"):
            out = roiops.roi_align(xi, boxes, (2, 3), SCALE, 2, True, mode=mode)
        else:
            out = roiops.roi_pool(xi, boxes, (2, 3), SCALE, convention=mode)
        out.backward(torch.arange(out.numel(), dtype=out.dtype).reshape(out.shape).sin())
        return out.detach(), xi.grad

    with roiops.use_backend("triton"):
        out, grad = run()
    with roiops.use_backend("reference"):
        ref_out, ref_grad = run()
    assert_close(out, ref_out, F32)
    assert_close(grad, ref_grad, F32)
