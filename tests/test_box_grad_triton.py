"""The Triton RoIAlign box gradient (roi_align_rois_backward, roi_align_max_rois_backward)
against the float64 reference and against finite differences of the forward, on CUDA when
there is a GPU, else on CPU tensors through Triton's interpreter (tiny shapes)."""

# tests/conftest.py sets TRITON_INTERPRET=1 without a GPU, before triton is imported.

import pytest
import torch

import roiops
from roiops._boxes import AXIS_ALIGNED
from roiops._requirements import triton_too_old

if triton_too_old():
    pytest.skip(triton_too_old(), allow_module_level=True)
import roiops.reference as REF
import roiops.triton as rt
from cases import BF16, F16, F32, F64, device_for, tol

DEVICE = device_for("triton")
N, C, H, W = 2, 3, 7, 9
SCALE = 0.5  # the image is 18 x 14 pixels
IMG_W, IMG_H = W / SCALE, H / SCALE

KERNELS = {"avg": (rt.roi_align_rois_backward, REF.roi_align_rois_backward),
           "max": (rt.roi_align_max_rois_backward, REF.roi_align_max_rois_backward)}
FORWARD = {"avg": REF.roi_align_forward, "max": lambda *a: REF.roi_align_max_forward(*a)[0]}


def make_input(dtype, channels_last, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N, C, H, W, generator=g, dtype=F64).to(dtype)
    return (x.contiguous(memory_format=torch.channels_last) if channels_last else x).to(DEVICE)


def make_rois(dtype, seed=0, k=4, nasty=()):
    """k random boxes (partly outside the map too) plus the nasty rows listed, in opmath."""
    g = torch.Generator().manual_seed(seed)
    rows = [AXIS_ALIGNED.random(N, k, IMG_W, IMG_H, g, dtype=F64)]
    if nasty:
        rows.append(AXIS_ALIGNED.nasty(N, IMG_W, IMG_H, dtype=F64)[list(nasty)])
    return torch.cat(rows).to(F64 if dtype == F64 else F32).to(DEVICE)


def grad_for(rois, dtype, ph, pw, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rois.shape[0], C, ph, pw, generator=g, dtype=F64).to(dtype).to(DEVICE)


def cpu(t):
    return t.detach().cpu()


# Covering set over dtype x layout x mode x aligned x sampling ratio x output size, each
# with its own nasty boxes (tests/boxes.py: outside, straddling the border, zero-size,
# sub-pixel (widened to a cell), larger than the map, inverted, on the last row).
CASES = [
    (F64, False, "avg", False, 2, (2, 3), (0, 5)),
    (F64, True, "avg", True, 3, (3, 2), (3, 9)),
    (F64, True, "max", False, 2, (2, 2), (0, 5)),
    (F64, False, "max", True, 1, (1, 3), (6, 9)),
    (F32, True, "avg", False, 1, (2, 2), (1, 4)),
    (F32, False, "avg", True, 2, (1, 1), (6, 7)),
    (F32, False, "max", False, 3, (2, 3), (3, 8)),
    (F32, True, "max", True, 2, (3, 2), (2, 5)),
    (F16, True, "avg", True, 2, (2, 3), (0, 9)),
    (BF16, False, "max", False, 2, (2, 2), (5, 6)),
    (F64, False, "avg", False, -1, (2, 2), (0, 5)),  # adaptive: the grid held at the box's size
    (F64, True, "max", True, 0, (2, 3), (3, 9)),
]
IDS = [f"{str(d)[6:]}-{'cl' if cl else 'nchw'}-{m}-al{int(a)}-s{s}-{o[0]}x{o[1]}" for d, cl, m, a, s, o, _ in CASES]


@pytest.mark.parametrize("dtype,cl,mode,aligned,sr,out_hw,nasty", CASES, ids=IDS)
def test_matches_reference(dtype, cl, mode, aligned, sr, out_hw, nasty):
    x = make_input(dtype, cl)
    rois = make_rois(dtype, nasty=nasty)
    ph, pw = out_hw
    g = grad_for(rois, dtype, ph, pw)
    kernel, reference = KERNELS[mode]
    got = kernel(g, x, rois, SCALE, ph, pw, sr, aligned)
    want = reference(cpu(g), cpu(x), cpu(rois), SCALE, ph, pw, sr, aligned)
    assert got.shape == (rois.shape[0], 5) and got.dtype == rois.dtype
    assert torch.all(cpu(got)[:, 0] == 0)
    assert cpu(want)[:, 1:].abs().sum() > 0  # a case with something to differentiate
    # Both sides sum the same products in another order (half types: in float32).
    torch.testing.assert_close(cpu(got), want, **tol(F32 if dtype in (F16, BF16) else dtype))


def test_non_contiguous_grad():
    """grad is read through its strides (autograd may hand over any layout)."""
    x = make_input(F64, False)
    rois = make_rois(F64, nasty=(0, 9))
    g = grad_for(rois, F64, 3, 2).transpose(2, 3).contiguous().transpose(2, 3)
    for mode, (kernel, reference) in KERNELS.items():
        torch.testing.assert_close(cpu(kernel(g, x, rois, SCALE, 3, 2, 2, False)),
                                   reference(cpu(g), cpu(x), cpu(rois), SCALE, 3, 2, 2, False), **tol(F64))


def _off_grid_boxes(count=4):
    """Random boxes (some partly outside the map) whose samples (sampling_ratio 2, 2 x 2
    bins, scale SCALE, either `aligned`) stay at least 0.05 cell from every integer (cell
    edges, the map's borders) and whose size stays 0.05 cell from the 1-cell minimum: the
    gradient is smooth there, so finite differences are an oracle."""
    g = torch.Generator().manual_seed(11)
    margin = 0.05

    def smooth(c1, c2):
        size = (c2 - c1) * SCALE
        if abs(size - 1) < margin:
            return False
        for off, widen in ((0.0, True), (0.5, False)):
            start, extent = c1 * SCALE - off, max(size, 1.0) if widen else size
            for t in ((i + (s + 0.5) / 2) / 2 for i in range(2) for s in range(2)):
                v = start + t * extent
                if abs(v - round(v)) < margin:
                    return False
        return True

    rows = []
    while len(rows) < count:
        u = torch.rand(4, generator=g, dtype=F64).tolist()
        x1, y1 = -6 + u[0] * (IMG_W + 2), -6 + u[1] * (IMG_H + 2)
        x2, y2 = x1 + 1 + u[2] * 12, y1 + 1 + u[3] * 12
        if smooth(x1, x2) and smooth(y1, y2):
            rows.append([len(rows) % N, x1, y1, x2, y2])
    return torch.tensor(rows, dtype=F64, device=DEVICE)


@pytest.mark.parametrize("mode,aligned", [("avg", False), ("avg", True), ("max", False), ("max", True)])
def test_matches_finite_differences(mode, aligned):
    """An oracle independent of the reference's gradient: central differences of the
    reference forward."""
    x = make_input(F64, mode == "max", seed=3)
    rois = _off_grid_boxes()
    g = grad_for(rois, F64, 2, 2, seed=4)
    got = KERNELS[mode][0](g, x, rois, SCALE, 2, 2, 2, aligned)

    def loss(r):
        return (FORWARD[mode](cpu(x), r, SCALE, 2, 2, 2, aligned) * cpu(g)).sum()

    want = torch.zeros(rois.shape, dtype=F64)
    eps = 1e-6
    for k in range(rois.shape[0]):
        for q in range(1, 5):
            step = torch.zeros(rois.shape, dtype=F64)
            step[k, q] = eps
            want[k, q] = (loss(cpu(rois) + step) - loss(cpu(rois) - step)) / (2 * eps)
    assert want.abs().max() > 0.1
    torch.testing.assert_close(cpu(got), want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("mode", ["avg", "max"])
def test_bad_rows_give_zero(mode):
    """Rows the C++ and reference kernels refuse (batch index outside [0, N) or not an
    integer, a non-finite coordinate) cannot be reported without a host sync: 0, and the
    other rows are unaffected."""
    x = make_input(F32, mode == "max")
    good = make_rois(F32, seed=5)
    nan, inf = float("nan"), float("inf")
    bad = torch.tensor([[N, 1.0, 1.0, 6.0, 6.0], [-1, 1.0, 1.0, 6.0, 6.0], [0.5, 1.0, 1.0, 6.0, 6.0],
                        [0, nan, 1.0, 6.0, 6.0], [1, 1.0, 1.0, inf, 6.0], [0, 1.0, -inf, 6.0, 6.0]],
                       dtype=F32, device=DEVICE)
    rois = torch.cat([good[:2], bad, good[2:]])
    g = grad_for(rois, F32, 2, 2)
    kernel = KERNELS[mode][0]
    got = cpu(kernel(g, x, rois, SCALE, 2, 2, 2, False))
    assert torch.equal(got[2:2 + len(bad)], torch.zeros(len(bad), 5))
    keep = torch.cat([torch.arange(2), torch.arange(2 + len(bad), rois.shape[0])]).to(DEVICE)
    alone = cpu(kernel(g[keep], x, rois[keep], SCALE, 2, 2, 2, False))
    assert torch.equal(got[keep.cpu()], alone)


def test_max_nan_bin_gives_zero():
    """A bin whose chosen sample is NaN adds nothing (the reference's rule)."""
    x = make_input(F64, False)
    x[0, 1, 2, 3] = float("nan")
    rois = torch.tensor([[0, 3.1, 2.3, 9.7, 8.9], [1, 3.1, 2.3, 9.7, 8.9]], dtype=F64, device=DEVICE)
    g = grad_for(rois, F64, 2, 2)
    got = rt.roi_align_max_rois_backward(g, x, rois, SCALE, 2, 2, 2, False)
    want = REF.roi_align_max_rois_backward(cpu(g), cpu(x), cpu(rois), SCALE, 2, 2, 2, False)
    assert torch.isfinite(want).all()
    torch.testing.assert_close(cpu(got), want, **tol(F64))


@pytest.mark.parametrize("mode", ["avg", "max"])
def test_no_boxes(mode):
    x = make_input(F32, False)
    rois = torch.zeros(0, 5, device=DEVICE)
    out = KERNELS[mode][0](torch.zeros(0, C, 2, 2, device=DEVICE), x, rois, SCALE, 2, 2, 2, True)
    assert out.shape == (0, 5) and out.dtype == F32


def test_refuses_bad_arguments():
    """What shapes, dtypes and devices show is refused, naming the argument."""
    x = make_input(F32, False)
    rois = make_rois(F32)
    g = grad_for(rois, F32, 2, 2)
    with pytest.raises(ValueError, match="grad must be"):
        rt.roi_align_rois_backward(g[:, :, :1], x, rois, SCALE, 2, 2, 2, False)
    with pytest.raises(ValueError, match="rois must be"):
        rt.roi_align_max_rois_backward(g, x, rois[:, :4], SCALE, 2, 2, 2, False)
    with pytest.raises(ValueError, match="grad must be floating"):
        rt.roi_align_rois_backward(g.to(torch.int32), x, rois, SCALE, 2, 2, 2, False)
    with pytest.raises(ValueError, match="sampling_ratio"):
        rt.roi_align_rois_backward(g, x, rois, SCALE, 2, 2, 2**40, False)


# ----------------------------------------------------------------------------- autograd


@pytest.mark.parametrize("mode,aligned", [("avg", False), ("max", True)])
def test_gradcheck_through_the_api(mode, aligned):
    """roiops.roi_align(..., box_grad=True) on the Triton backend: autograd reaches the
    box coordinates (gradcheck, float64), and the batch-index column gets 0."""
    x = make_input(F64, False, seed=5)
    rois = _off_grid_boxes()[:2]
    coords = rois[:, 1:].clone().requires_grad_()

    def f(c):
        return roiops.roi_align(x, torch.cat([rois[:, :1], c], dim=1), 2, SCALE, 2, aligned, mode, box_grad=True)

    with roiops.use_backend("triton"):
        assert torch.autograd.gradcheck(f, (coords,), eps=1e-6, atol=1e-6, fast_mode=True)
        boxes = rois.clone().requires_grad_()
        roiops.roi_align(x, boxes, 2, SCALE, 2, aligned, mode, box_grad=True).sum().backward()
    assert torch.all(boxes.grad[:, 0] == 0) and boxes.grad[:, 1:].abs().sum() > 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="host-device synchronisation exists only with a GPU")
@pytest.mark.parametrize("mode", ["avg", "max"])
def test_no_host_sync_on_cuda(mode):
    x = make_input(F32, True)
    rois = make_rois(F32, nasty=(0, 9))
    g = grad_for(rois, F32, 2, 2)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        KERNELS[mode][0](g, x, rois, SCALE, 2, 2, 2, True)
    finally:
        torch.cuda.set_sync_debug_mode(0)
