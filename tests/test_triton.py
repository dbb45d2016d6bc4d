"""roiops.triton kernels against the oracle (roiops.reference; torchvision where it has the
op), on CUDA when there is a GPU, else on CPU tensors through Triton's interpreter.

The interpreter is slow (each tile op is a numpy call), so shapes are tiny and the
parameter grid is a covering set rather than a full product.
"""

# tests/conftest.py sets TRITON_INTERPRET=1 without a GPU, before triton is imported.

import pytest
import torch
import triton
import triton.language as tl

import roiops
# Skipped, with the reason, where Triton is older than roiops supports (torch < 2.11).
from roiops._requirements import triton_too_old

if triton_too_old():
    pytest.skip(triton_too_old(), allow_module_level=True)
import roiops.triton as rt
import roiops.triton._common as rt_common
from cases import BF16, BOX_FORMAT, F16, F32, F64, config_set, contract_args, device_for, kernel_name, tol
from roiops._boxes import AXIS_ALIGNED, ROTATED

DEVICE = device_for("triton")

import roiops.reference as REF
import torchvision

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
    """k random boxes plus the nasty rows listed in `nasty`, in opmath."""
    g = torch.Generator().manual_seed(seed)
    opm = F64 if dtype == F64 else F32
    rows = [AXIS_ALIGNED.random(N, k, IMG_W, IMG_H, g, dtype=F64)]
    if nasty:
        rows.append(AXIS_ALIGNED.nasty(N, IMG_W, IMG_H, dtype=F64)[list(nasty)])
    return torch.cat(rows).to(opm).to(DEVICE)


def cpu(t):
    return t.detach().cpu()


def assert_layout(t, channels_last):
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    assert t.is_contiguous(memory_format=fmt), (t.shape, t.stride())


def assert_close(actual, expected, dtype):
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    torch.testing.assert_close(cpu(actual), cpu(expected), **tol(dtype), equal_nan=True)


def grad_like(out, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(out.shape, generator=g, dtype=torch.float64).to(out.dtype).to(DEVICE)


# Covering set over dtype x layout x aligned x sampling x output size, each row with a
# different pair of nasty boxes (AXIS_ALIGNED.nasty rows).
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
    exact = dict(rtol=0, atol=0) if DEVICE == "cpu" else tol(F32)
    x = make_input(F32, False, seed=6)
    rois = make_rois(F32, seed=7, k=5)
    xr = cpu(x).requires_grad_()
    ref = torchvision.ops.roi_align(xr, cpu(rois), (2, 3), SCALE, sr, aligned)
    out = rt.roi_align_forward(x, rois, SCALE, 2, 3, sr, aligned)
    torch.testing.assert_close(cpu(out), ref.detach(), **exact)
    g = grad_like(out)
    ref.backward(cpu(g))
    gi = rt.roi_align_backward(g, rois, SCALE, 2, 3, N, C, H, W, sr, aligned, False)
    torch.testing.assert_close(cpu(gi), xr.grad, **tol(F32))

    if not aligned:
        xr.grad = None
        ref = torchvision.ops.roi_pool(xr, cpu(rois), (2, 3), SCALE)
        out, am = rt.roi_pool_forward(x, rois, SCALE, 2, 3, False)
        torch.testing.assert_close(cpu(out), ref.detach(), **exact)
        ref.backward(cpu(g))
        gi = rt.roi_pool_backward(g, am, rois, N, C, H, W, False)
        torch.testing.assert_close(cpu(gi), xr.grad, **tol(F32))


# ----------------------------------------------------------------------------- nasty boxes

@pytest.mark.parametrize("sr", [2, 0])
def test_all_nasty_boxes(sr):
    """Every nasty box at once, both align modes and both pool conventions (float32)."""
    x = make_input(F32, False, seed=8)
    rois = AXIS_ALIGNED.nasty(N, IMG_W, IMG_H, dtype=F32).to(DEVICE)
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


def test_huge_boxes_visit_only_samples_near_the_map():
    """Adaptive grids of 2^30 samples per bin: the kernels visit only the samples that can
    touch the map (or, in the deterministic backward, the tile) and give the C++ kernels'
    results, argmax included (where a left-out outside sample, value 0, wins the max)."""
    import signal

    def too_slow(*_):
        raise TimeoutError("a sampling loop ran over samples far outside the map")

    x = make_input(F32, False, seed=16)
    neg = -x.abs() - 0.5  # every map value negative: outside samples (0) win the max
    s = 2.0 ** 14
    rois = torch.tensor([[0, -s, -s, s, s], [1, 0.0, 0.0, s, s / 2], [0, -s / 2, 3.0, 5.0, s],
                         [1, 2.0, -s, 6.0, 4.0], [0, 1.0, 1.0, 6.0, 5.0]], device=DEVICE)
    previous = signal.signal(signal.SIGALRM, too_slow)
    signal.alarm(300)
    try:
        for feat in (x, neg):
            xc = cpu(feat)
            with roiops.use_backend("cpu"):
                ref = torch.ops.roiops.roi_align(xc, cpu(rois), 1.0, 1, 2, 0, True)
                ref_max, ref_am = torch.ops.roiops.roi_align_max(xc, cpu(rois), 1.0, 1, 2, 0, True)
                g = grad_like(ref, seed=17)
                ref_gi = torch.ops.roiops._roi_align_backward(cpu(g), cpu(rois), 1.0, 1, 2, N, C, H, W, 0, True,
                                                              False)
                ref_gim = torch.ops.roiops._roi_align_max_backward(cpu(g), ref_am, cpu(rois), 1.0, 1, 2, N, C, H, W,
                                                                   0, True, False)
            assert_close(rt.roi_align_forward(feat, rois, 1.0, 1, 2, 0, True), ref, F32)
            out, am = rt.roi_align_max_forward(feat, rois, 1.0, 1, 2, 0, True)
            assert torch.equal(cpu(am), ref_am)
            assert_close(out, ref_max, F32)
            for det in (False, True):
                assert_close(rt.roi_align_backward(g, rois, 1.0, 1, 2, N, C, H, W, 0, True, False, deterministic=det),
                             ref_gi, F32)
                assert_close(rt.roi_align_max_backward(g, am, rois, 1.0, 1, 2, N, C, H, W, 0, True, False,
                                                       deterministic=det), ref_gim, F32)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


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


# ----------------------------------------------------------------------------- flat NCHW tiles

# The kernels that take flat tiles for NCHW input (tile_blocks(flat=True)), at 7x7 bins
# and 6 channels: a box has 294 outputs, so tiles of 64 (forced on the interpreter) or of
# 128 (float64 on a GPU) start in the middle of a channel and mix channels.
FLAT_OPS = ["roi_align", "roi_align_max", "roi_align_rotated"]


@pytest.mark.parametrize("op", FLAT_OPS)
def test_flat_nchw_tiles_split_channels(op, monkeypatch):
    """NCHW forwards on tiles that cut channels mid-way, against the C++ kernels."""
    monkeypatch.setattr(rt_common, "INTERP_TILE", 64)
    assert rt_common.tile_blocks(49, 6, False, True, flat=True) == (64, 1, 5, 1, 2)
    g = torch.Generator().manual_seed(21)
    x = torch.randn(N, 6, H, W, generator=g, dtype=F64)
    form = BOX_FORMAT[op]
    rois = torch.cat([form.random(N, 5, IMG_W, IMG_H, g, F64), form.nasty(N, IMG_W, IMG_H, F64)])
    if form is ROTATED:
        rois[:, 5] = torch.deg2rad(rois[:, 5])
    grad = torch.randn(len(rois), 6, 7, 7, generator=g, dtype=F64)
    values = dict(input=x, rois=rois, grad=grad, spatial_scale=SCALE, pooled_height=7, pooled_width=7,
                  sampling_ratio=2, aligned=True, batch_size=N, channels=6, height=H, width=W, channels_last=False)
    args = contract_args(op, **values)
    expected = getattr(torch.ops.roiops, op)(*args.values())  # CPU tensors: the C++ kernel
    actual = getattr(rt, kernel_name(op))(*[v.to(DEVICE) if isinstance(v, torch.Tensor) else v
                                            for v in args.values()])
    for a, e in zip(*((r,) if isinstance(r, torch.Tensor) else r for r in (actual, expected))):
        if a.dtype == torch.int32:
            assert torch.equal(cpu(a), e)
        else:
            assert_close(a, e, F64)


# ----------------------------------------------------------------------------- deform_roi_pool

def make_offset(k, ph, pw, dtype, seed, scale=0.3):
    g = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(k, 2, ph, pw, generator=g, dtype=torch.float64)).to(dtype).to(DEVICE)


@pytest.mark.parametrize("dtype,cl,sr", [(F32, False, 2), (F32, True, 0), (F64, False, 0), (F16, True, 2),
                                         (BF16, False, 0)])
def test_deform_roi_pool_without_offset_is_roi_align(dtype, cl, sr):
    """No offset, or a zero one: roi_align(aligned=True)'s forward bit for bit (same
    kernels' arithmetic), and its input gradient on both backward paths."""
    x = make_input(dtype, cl, seed=30)
    rois = make_rois(dtype, seed=31, nasty=(0, 5))
    expected = rt.roi_align_forward(x, rois, SCALE, 3, 2, sr, True)
    for offset in (None, torch.zeros(len(rois), 2, 3, 2, dtype=rois.dtype, device=DEVICE)):
        assert torch.equal(rt.deform_roi_pool_forward(x, rois, offset, SCALE, 3, 2, sr, 0.1), expected)
    g = grad_like(expected, seed=32)
    ref_gi = rt.roi_align_backward(g, rois, SCALE, 3, 2, N, C, H, W, sr, True, cl, deterministic=False)
    for det in (False, True):
        gi = rt.deform_roi_pool_backward(g, rois, None, SCALE, 3, 2, N, C, H, W, sr, 0.1, cl, deterministic=det)
        assert_layout(gi, cl)
        assert_close(gi, ref_gi, dtype)


@pytest.mark.parametrize("cl", [False, True])
def test_deform_roi_pool_offsets_anywhere(cl, monkeypatch):
    """Bins moved any finite distance (1e30 cells), to a non-finite place, or by a huge
    box's offsets: only samples near the map (or the gather's tile) are visited, a bin off
    the map or not finite is 0 and gets no gradient, and everything matches the
    reference; on small tiles that split a box's bins and channels. The deterministic
    gradients are bit-identical from run to run."""
    import signal

    def too_slow(*_):
        raise TimeoutError("a sampling loop ran over samples far outside the map")

    monkeypatch.setattr(rt_common, "INTERP_TILE", 8)
    x = make_input(F32, cl, seed=33)
    s = 2.0 ** 14
    rois = torch.cat([make_rois(F32, seed=34, k=4), torch.tensor([[0, -s, -s, s, s], [1, 0.0, 0.0, s, s / 2]],
                                                                  device=DEVICE)])
    offset = make_offset(len(rois), 3, 2, F32, seed=35)
    offset[0, 0, 0, 0] = float("nan")
    offset[1, 1, 1, 1] = float("inf")
    offset[2, :, 2, 1] = 1e30
    offset[3, 0, 0, 1] = -1e20
    xc, rc, oc = cpu(x), cpu(rois), cpu(offset)
    previous = signal.signal(signal.SIGALRM, too_slow)
    signal.alarm(300)
    try:
        out = rt.deform_roi_pool_forward(x, rois, offset, SCALE, 3, 2, 0, 0.1)
        ref = REF.deform_roi_pool_forward(xc, rc, oc, SCALE, 3, 2, 0, 0.1)
        assert_layout(out, cl)
        assert_close(out, ref, F32)
        assert not cpu(out)[[0, 1, 2, 3], :, [0, 1, 2, 0], [0, 1, 1, 1]].any()
        g = grad_like(out, seed=36)
        ref_gi = REF.deform_roi_pool_backward(cpu(g), rc, oc, SCALE, 3, 2, N, C, H, W, 0, 0.1, cl)
        for det in (False, True):
            gi = rt.deform_roi_pool_backward(g, rois, offset, SCALE, 3, 2, N, C, H, W, 0, 0.1, cl, deterministic=det)
            assert_layout(gi, cl)
            assert_close(gi, ref_gi, F32)
        det_gi = rt.deform_roi_pool_backward(g, rois, offset, SCALE, 3, 2, N, C, H, W, 0, 0.1, cl, deterministic=True)
        assert torch.equal(det_gi, gi)
        go = rt.deform_roi_pool_offset_backward(g, x, rois, offset, SCALE, 3, 2, 0, 0.1)
        assert go.is_contiguous() and go.dtype == F32
        assert_close(go, REF.deform_roi_pool_offset_backward(cpu(g), xc, rc, oc, SCALE, 3, 2, 0, 0.1), F32)
        assert not cpu(go)[[0, 1, 2, 3], :, [0, 1, 2, 0], [0, 1, 1, 1]].any()
        assert torch.equal(go, rt.deform_roi_pool_offset_backward(g, x, rois, offset, SCALE, 3, 2, 0, 0.1))
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


# ----------------------------------------------------------------------------- determinism

@pytest.mark.parametrize("cl", [False, True])
def test_deterministic_path(cl):
    """Deterministic backward: bit-identical across runs, equal to the atomic path within
    tolerance; chosen by torch's flag and by the module switch."""
    x = make_input(F32, cl, seed=14)
    # Many overlapping boxes on one image: lots of contributions per grad cell.
    g_ = torch.Generator().manual_seed(15)
    rois = AXIS_ALIGNED.random(1, 8, IMG_W, IMG_H, g_, dtype=F32).to(DEVICE)
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
        with config_set(deterministic_backward=False):
            assert _common.use_deterministic(None) is False
    finally:
        torch.use_deterministic_algorithms(previous)
    with config_set(deterministic_backward=True):
        assert _common.use_deterministic(None) is True


# ----------------------------------------------------------------------------- float min/max
# (Compiling every kernel for the GPU, and what its PTX may hold: tests/test_ptx.py.)

@triton.jit
def _min_max_kernel(a_ptr, b_ptr, out_ptr, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    a = tl.load(a_ptr + i)
    b = tl.load(b_ptr + i)
    tl.store(out_ptr + i, tl.minimum(a, b))
    tl.store(out_ptr + BLOCK + i, tl.maximum(a, b))


# The interpreters of Triton 3.6 and 3.7 (torch 2.11's and 2.12's) propagate the NaN;
# their compiled kernels do not.
OLD_INTERPRETER = DEVICE == "cpu" and tuple(int(v) for v in triton.__version__.split(".")[:2]) < (3, 8)


@pytest.mark.skipif(OLD_INTERPRETER, reason="Triton's interpreter before 3.8 propagates NaN through "
                                            "tl.minimum/maximum, unlike the compiled kernels that tests/test_ptx.py checks")
@pytest.mark.parametrize("dtype", [F32, F64])
def test_float_min_max_return_the_number(dtype):
    """tl.minimum / tl.maximum as the kernels call them (PropagateNan.NONE) return the
    number when one operand is NaN, as the compiled min/max.f32/.f64 do (the only form
    tests/test_ptx.py allows): interpreted and compiled kernels agree where a NaN reaches
    the geometry."""
    nan = float("nan")
    a = torch.tensor([nan, 1.0, nan, -2.0], dtype=dtype, device=DEVICE)
    b = torch.tensor([3.0, nan, nan, 5.0], dtype=dtype, device=DEVICE)
    out = torch.empty(8, dtype=dtype, device=DEVICE)
    _min_max_kernel[(1,)](a, b, out, BLOCK=4)
    expected = torch.tensor([3.0, 1.0, nan, -2.0, 3.0, 1.0, nan, 5.0], dtype=dtype)
    torch.testing.assert_close(cpu(out), expected, equal_nan=True)


# ----------------------------------------------------------------------------- direct-call checks

# What a direct torch.ops.roiops call with bad arguments raises, on every backend alike:
# tests/test_contract.py.


def test_max_mode_grid_beyond_int32_argmax_is_masked():
    """A max-mode adaptive grid of more than 2^31 - 1 samples per bin (its argmax would
    overflow int32; the CPU kernels refuse it) pools to 0, argmax -1, no gradient; the
    largest grid that fits keeps its exact argmax."""
    x = torch.zeros(1, 1, 2, 2)
    x[0, 0, 1, 1] = 1.0
    x = x.to(DEVICE)
    big, fits = 46341.0, 46001.0  # grid sides (box + 2, aligned=False): 46343^2 > 2^31 - 1 >= 46003^2
    rois = torch.tensor([[0, -big, -big, 2.0, 2.0], [0, -fits, -fits, 2.0, 2.0]], device=DEVICE)
    out, am = rt.roi_align_max_forward(x, rois, 1.0, 1, 1, 0, False)
    assert cpu(out)[0].item() == 0.0 and cpu(am)[0].item() == -1
    assert cpu(out)[1].item() == 1.0 and cpu(am)[1].item() == 46003 * 46003 - 1  # the last sample, at (1, 1)
    g = torch.ones(2, 1, 1, 1, device=DEVICE)
    for det in (False, True):
        gi = rt.roi_align_max_backward(g, am, rois, 1.0, 1, 1, 1, 1, 2, 2, 0, False, False, deterministic=det)
        assert cpu(gi).flatten().tolist() == [0.0, 0.0, 0.0, 1.0]


# ----------------------------------------------------------------------------- compiled launches

def _probe(x_ptr, n, stride, K, BLOCK: tl.constexpr, EXTRA: tl.constexpr = 0):
    pass


def test_compiled_launch_reuses_a_kernel_only_for_what_triton_specializes_alike(monkeypatch):
    """The compiled kernels' launches (_common._Kernel; the interpreter does not use it): a
    launch takes JITFunction.run, which compiles and launches, unless an earlier one had
    the same key: tensors' dtypes and 16-byte alignment, the values of the integers Triton
    specializes (n and stride here), whether each other integer (K) fits in int32, the
    constexprs and the options. Then it calls the kernel that run returned, with every
    argument in the kernel's order."""
    k = rt_common._Kernel(_probe, do_not_specialize=["K"])
    full, direct = [], []

    class Compiled:
        function, packed_metadata = "function", "metadata"

        def run(self, *args):
            direct.append(args)

    def run(self, *args, grid, warmup, **kwargs):
        full.append(args)
        return Compiled()

    class Driver:
        def get_current_device(self):
            return 0

        def get_current_stream(self, device):
            return "stream"

    monkeypatch.setattr(rt_common.JITFunction, "run", run)
    monkeypatch.setattr(triton.runtime.driver, "_active", Driver())
    x = torch.zeros(64)

    def path(*args, warps=4, **constexprs):
        before = len(full), len(direct)
        k[(3, 2)](*args, **{"BLOCK": 16, "EXTRA": 0, **constexprs}, num_warps=warps)
        return "full" if len(full) > before[0] else "direct" if len(direct) > before[1] else "none"

    assert path(x, 5, 7, 3) == "full"
    assert path(x, 5, 7, 3) == "direct"
    assert direct[-1] == (3, 2, 1, "stream", "function", "metadata", None, None, None, x, 5, 7, 3, 16, 0)
    assert path(x, 5, 7, 1) == path(x, 5, 7, 32) == "direct"  # K is not specialized
    assert path(x, 5, 7, 2**31) == "full"            # but its int64 type is
    assert path(x, 5, 7, -(2**40)) == "direct"
    assert path(x, 5, 7, 2**63) == path(x, 5, 7, 2**63) == "full"  # uint64: never kept
    assert path(x[1:], 5, 7, 3) == "full"            # 4 bytes past 16-byte alignment
    assert path(x[4:], 5, 7, 3) == "direct"          # 16 bytes past: aligned
    assert path(x.double(), 5, 7, 3) == "full"
    for n in (6, 1, 32, 2**40):                      # specialized: each value its own key
        assert path(x, n, 7, 3) == "full"
        assert path(x, n, 7, 3) == "direct"
    assert path(x, 5, 8, 3) == "full"
    assert path(x, 5, 7, 3, BLOCK=32) == "full"
    assert path(x, 5, 7, 3, warps=8) == "full"
    assert path(x, 5, 7, 3, warps=8) == "direct"
    # A bool or a float where the first launch had an int, a parameter left to its
    # default, or a launch hook: Triton's path every time.
    assert path(x, True, 7, 3) == path(x, True, 7, 3) == "full"
    assert path(x, 5, 7, 3.0) == path(x, 5, 7, 3.0) == "full"
    for _ in range(2):
        before = len(full)
        k[(3,)](x, 5, 7, 3, BLOCK=16, num_warps=4)
        assert len(full) == before + 1
    assert path(x, 5, 7, 3) == "direct"
    monkeypatch.setattr(triton.knobs.runtime, "launch_enter_hook", lambda metadata: None)
    assert path(x, 5, 7, 3) == "full"
