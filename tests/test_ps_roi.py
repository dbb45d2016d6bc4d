"""Position-sensitive RoIAlign and RoIPool (R-FCN): the CPU kernels against the float64
reference over sampling ratios and output sizes, torchvision bit for bit where the
semantics agree (the kernels' tiles and bands included), hand-computed bins, the Triton
kernels against the CPU ones. What every op must do (dtypes, layouts, gradcheck, compile,
export, Module, validation, threads) is in test_generic.py."""

from __future__ import annotations

import pytest
import torch
import torchvision

import roiops
from cases import boxes_for as _boxes_for
from cases import close, device_for, num_threads
from cases import feature as _feature
from cases import run as _run
from roiops._boxes import AXIS_ALIGNED

# The option sets the generic tests (tests/cases.py) run the operator with.
OPTIONS = {"ps_roi_align": (dict(sampling_ratio=2), dict(sampling_ratio=-1)), "ps_roi_pool": (dict(),)}

N, H, W = 2, 11, 13
SCALE = 0.5  # boxes are in image pixels of a 26 x 22 image
OPS = {
    "align": lambda x, b, size, scale, sr: roiops.ps_roi_align(x, b, size, scale, sr),
    "pool": lambda x, b, size, scale, sr: roiops.ps_roi_pool(x, b, size, scale),
}
TV = {
    "align": lambda x, b, size, scale, sr: torchvision.ops.ps_roi_align(x, b, size, scale, sr),
    "pool": lambda x, b, size, scale, sr: torchvision.ops.ps_roi_pool(x, b, size, scale),
}


def pairs(size):
    return (size, size) if isinstance(size, int) else size


def feature(size, c_out=3, dtype=torch.float32, channels_last=False, seed=0):
    ph, pw = pairs(size)
    return _feature(dtype, channels_last, seed, shape=(N, c_out * ph * pw, H, W))


def boxes_for(dtype=torch.float32, seed=0):
    return _boxes_for(dtype=dtype, seed=seed, count=8, n=N, width=W / SCALE, height=H / SCALE)


def run(fn, x, boxes, size, sr=2, backend=None, seed=1):
    """Output and input gradient for a fixed random upstream gradient, on ``backend``'s
    kernels where they run (cases.device_for)."""
    out, grad, _ = _run(lambda t, b: fn(t, b, size, SCALE, sr), x, boxes, backend, seed)
    return out, grad


# (op, sampling_ratio): RoIPool takes none.
VARIANTS = [("align", -1), ("align", 1), ("align", 2), ("align", 3), ("pool", 2)]


@pytest.mark.parametrize("op, sr", VARIANTS)
@pytest.mark.parametrize("size", [1, (2, 3), (7, 7)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("channels_last", [False, True])
def test_matches_reference(op, sr, size, dtype, channels_last):
    x, boxes = feature(size, dtype=dtype, channels_last=channels_last), boxes_for(dtype)
    out, grad = run(OPS[op], x, boxes, size, sr)
    ref_out, ref_grad = run(OPS[op], x, boxes, size, sr, backend="reference")
    close(out, ref_out, dtype)
    close(grad, ref_grad, dtype)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    assert out.is_contiguous(memory_format=fmt) and grad.is_contiguous(memory_format=fmt)
    assert out.dtype == grad.dtype == dtype
    assert out.shape == (len(boxes), 3, *pairs(size))


def _tv_align_boxes(dtype):
    """Boxes whose adaptive grids are not empty: torchvision divides an empty grid's sum by
    a zero count (NaN), roiops gives 0."""
    b = boxes_for(dtype)
    return b[(b[:, 3] > b[:, 1]) & (b[:, 4] > b[:, 2])]


def _tv_pool_boxes(dtype):
    """Boxes whose bins stay off the last row and column: torchvision's forward clips bins
    to H - 1 and W - 1 (its backward to H and W), roiops clips both to H and W."""
    g = torch.Generator().manual_seed(5)
    b = AXIS_ALIGNED.random(N, 24, (W - 2) / SCALE, (H - 2) / SCALE, g, dtype)
    return torch.cat([b, torch.tensor([[0, -9.0, -7.0, 6.0, 5.0], [1, 5.0, 6.0, 1.0, 2.0], [1, 3.0, 3.0, 3.0, 3.0]],
                                      dtype=dtype)])


@pytest.mark.parametrize("op, sr", VARIANTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("size", [1, (2, 3), (7, 7)])
@pytest.mark.parametrize("channels_last", [False, True])
def test_bit_exact_with_torchvision(op, sr, dtype, size, channels_last):
    x = feature(size, dtype=dtype, channels_last=channels_last)
    boxes = _tv_align_boxes(dtype) if op == "align" else _tv_pool_boxes(dtype)
    out, grad = run(OPS[op], x, boxes, size, sr)
    ref, ref_grad = run(TV[op], x, boxes, size, sr)
    assert torch.equal(out, ref) and torch.equal(grad, ref_grad)  # same arithmetic, same order


@pytest.mark.parametrize("op, sr", [("align", 2), ("align", -1), ("pool", 2)])
@pytest.mark.parametrize("channels_last", [False, True])
def test_bit_exact_with_torchvision_dense_and_sparse_boxes(op, sr, channels_last):
    """Image 0: many overlapping boxes (the kernels copy each bin's cells into a tile of
    channels first); image 1: two small boxes far apart (they read the map where it lies).
    11 output channels: more than one vector, not a multiple of its width. The boxes keep
    off the last row and column (torchvision's PSRoIPool forward clips there)."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 11 * 9, 24, 40, generator=g)
    x = x.contiguous(memory_format=torch.channels_last) if channels_last else x
    dense = AXIS_ALIGNED.random(1, 120, 76.0, 44.0, g)  # image pixels, SCALE 0.5
    sparse = torch.tensor([[1, 1.0, 1.0, 7.0, 6.0], [1, 66.0, 36.0, 74.0, 43.0]])
    boxes = torch.cat([dense, sparse])
    out, grad = run(OPS[op], x, boxes, 3, sr)
    ref, ref_grad = run(TV[op], x, boxes, 3, sr)
    assert torch.equal(out, ref) and torch.equal(grad, ref_grad)


@pytest.mark.parametrize("op, sr", [("align", 2), ("align", -1), ("pool", 2)])
@pytest.mark.parametrize("c_out, dtype", [(11, torch.float32), (70, torch.float32), (11, torch.float64)])
@pytest.mark.parametrize("channels_last", [False, True])
def test_bit_exact_with_torchvision_packed_boxes(op, sr, c_out, dtype, channels_last):
    """Boxes that read every cell of every bin several times: the kernels then work on the
    map rearranged so that a bin's output channels are contiguous (per task for NCHW, per
    band of rows for channels_last, whose forward bands sum whole bin rows that may reach
    into the next band). 70 output channels: several channel blocks, the last one short of
    a whole vector. One box lies off the map (its bins are empty)."""
    g = torch.Generator().manual_seed(4)
    x = torch.randn(1, c_out * 9, 20, 30, generator=g, dtype=dtype)
    x = x.contiguous(memory_format=torch.channels_last) if channels_last else x
    boxes = AXIS_ALIGNED.random(1, 600, 56.0, 36.0, g, dtype)  # image pixels, SCALE 0.5; off the last row and column
    boxes = torch.cat([boxes, torch.tensor([[0, -30.0, -24.0, -10.0, -6.0]], dtype=dtype)])
    out, grad = run(OPS[op], x, boxes, 3, sr)
    ref, ref_grad = run(TV[op], x, boxes, 3, sr)
    assert torch.equal(out, ref) and torch.equal(grad, ref_grad)


@pytest.mark.parametrize("op, sr", [("align", 2), ("pool", 2)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("channels_last", [False, True])
def test_packed_boxes_half_precision(op, sr, dtype, channels_last):
    """float16/bfloat16 on packed boxes (the rearranged map, converted to float32) give the
    forward of each box computed alone (which reads the map where it lies), bit for bit,
    and the reference's gradient."""
    g = torch.Generator().manual_seed(6)
    x = torch.randn(1, 11 * 9, 20, 30, generator=g).to(dtype)
    x = x.contiguous(memory_format=torch.channels_last) if channels_last else x
    boxes = AXIS_ALIGNED.random(1, 600, 56.0, 36.0, g)
    out, grad = run(OPS[op], x, boxes, 3, sr)
    alone = torch.cat([OPS[op](x, boxes[k : k + 1], 3, SCALE, sr) for k in range(len(boxes))])
    assert torch.equal(out, alone)
    _, ref_grad = run(OPS[op], x.double(), boxes.double(), 3, sr, backend="reference")
    close(grad, ref_grad, dtype)


def test_empty_adaptive_grid_gives_zero():
    """A box of size 0 with adaptive sampling has grids of 0 samples: 0 (torchvision: NaN)."""
    x = feature(2)
    box = torch.tensor([[0, 3.0, 3.0, 3.0, 3.0]])
    assert torch.equal(roiops.ps_roi_align(x, box, 2, 1.0, -1), torch.zeros(1, 3, 2, 2))
    assert torchvision.ops.ps_roi_align(x, box, 2, 1.0, -1).isnan().all()


def test_hand_computed_align():
    # One output channel, 1 x 2 bins: channel 0 feeds bin (0, 0), channel 1 bin (0, 1).
    x = torch.zeros(1, 2, 4, 6, dtype=torch.float64)
    x[0, 0] = torch.arange(24.0).view(4, 6)
    x[0, 1] = 100 + torch.arange(24.0).view(4, 6)
    # Box (1, 1)-(5, 3) shifted by -0.5: x in [0.5, 4.5], y in [0.5, 2.5]; bins 2 x 2 cells,
    # sampling_ratio 1: samples at (x, y) = (1.5, 1.5) and (3.5, 1.5).
    out = roiops.ps_roi_align(x, torch.tensor([[0, 1.0, 1.0, 5.0, 3.0]], dtype=torch.float64), (1, 2), 1.0, 1)
    assert out.tolist() == [[[[1.5 * 6 + 1.5, 100 + 1.5 * 6 + 3.5]]]]


def test_hand_computed_pool_on_the_last_row_and_column():
    """Bins reaching the last row and column average it (torchvision's forward stops one
    cell short there)."""
    x = torch.arange(2 * 3 * 4, dtype=torch.float64).view(1, 2, 3, 4)
    x = x.requires_grad_()
    # Corners round to (2, 1) and (4, 3): a 2 x 2 box split into 1 x 2 bins of 2 x 1 cells.
    out = roiops.ps_roi_pool(x, torch.tensor([[0, 2.2, 0.6, 3.5, 2.6]], dtype=torch.float64), (1, 2), 1.0)
    # bin (0, 0): channel 0, rows 1-2, column 2; bin (0, 1): channel 1, rows 1-2, column 3.
    assert out.tolist() == [[[[(6 + 10) / 2, (19 + 23) / 2]]]]
    out.sum().backward()
    want = torch.zeros(1, 2, 3, 4, dtype=torch.float64)
    want[0, 0, 1:3, 2] = 0.5
    want[0, 1, 1:3, 3] = 0.5
    assert torch.equal(x.grad, want)
    tv = torchvision.ops.ps_roi_pool(x.detach(), torch.tensor([[0, 2.2, 0.6, 3.5, 2.6]], dtype=torch.float64),
                                     (1, 2), 1.0)
    assert tv[0, 0, 0, 1] == 0  # its bin (0, 1) lies on the last column, which it clips away


@pytest.mark.parametrize("op, sr", [("align", 2), ("align", -1), ("pool", 2)])
def test_channels_last_forward_bands_agree_for_any_thread_count(op, sr):
    """A channels_last forward sums boxes by bands of rows, more of them with more threads;
    a bin row that crosses bands is summed in each in turn. Whatever the split, the output
    is the NCHW kernels' (tiles per bin, no bands) bit for bit."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(1, 11 * 9, 20, 30, generator=g)
    boxes = AXIS_ALIGNED.random(1, 600, 56.0, 36.0, g)  # image pixels, SCALE 0.5: bins cross band edges
    want = OPS[op](x, boxes, 3, SCALE, sr)
    xcl = x.contiguous(memory_format=torch.channels_last)
    for n in (1, 2, 3, 5):
        with num_threads(n):
            assert torch.equal(OPS[op](xcl, boxes, 3, SCALE, sr), want), n


@pytest.mark.parametrize("threads", [1, 2])
def test_upside_down_boxes_with_channels_last_bands(threads):
    """Boxes with y2 < y1 and a fixed sampling ratio place their samples bottom to top.
    Twenty full-map boxes send the channels_last forward through bands of rows, which sum a
    bin row top band first; such a box's bin rows span several bands, so the call must sum
    them in the samples' order all the same: torchvision's bits, forward and backward."""
    g = torch.Generator().manual_seed(6)
    x = torch.randn(1, 8, 71, 35, generator=g, dtype=torch.float64).contiguous(memory_format=torch.channels_last)
    rows = [[0, -0.5, -0.5, 34.5, 70.5]] * 20 + [[0, 45.2, 76.5, 3.2, -29.4], [0, 3.2, 60.0, 30.0, 2.0]]
    boxes = torch.tensor(rows, dtype=torch.float64) * torch.tensor([1, 2, 2, 2, 2])  # image pixels, SCALE 0.5
    with num_threads(threads):
        out, grad = run(OPS["align"], x, boxes, 2, 5)
    ref, ref_grad = run(TV["align"], x, boxes, 2, 5)
    assert torch.equal(out, ref) and torch.equal(grad, ref_grad)


@pytest.mark.parametrize("fn", [roiops.compat.torchvision.ps_roi_align, roiops.compat.torchvision.ps_roi_pool])
def test_channels_must_be_a_multiple_of_the_bins_in_the_drop_ins(fn):
    with pytest.raises(ValueError, match=r"input has 10 channels, not a multiple of output_size's h \* w = 2 \* 2"):
        fn(torch.randn(1, 10, 5, 5), torch.tensor([[0, 1.0, 1, 3, 3]]), 2)


@pytest.mark.parametrize("op", ["ps_roi_align", "ps_roi_pool"])
def test_kernels_refuse_a_channel_count_that_is_not_a_multiple(op):
    args = (torch.randn(1, 10, 5, 5), torch.tensor([[0, 1.0, 1, 3, 3]]), 1.0, 2, 2) + ((2,) if op == "ps_roi_align"
                                                                                         else ())
    for backend in ("cpu", "reference"):
        with roiops.use_backend(backend), pytest.raises(ValueError, match="multiple of pooled_height"):
            getattr(torch.ops.roiops, op)(*args)


# ---- Triton kernels (on CUDA when there is a GPU, else through Triton's interpreter)

def _triton():
    from roiops._requirements import triton_too_old

    if triton_too_old():
        pytest.skip(triton_too_old())
    import roiops.triton as rt

    return rt


TRITON_DEVICE = device_for("triton")


@pytest.mark.parametrize("op, sr, size, dtype, channels_last", [
    ("align", 0, (2, 3), torch.float32, False), ("align", 2, (3, 2), torch.float64, True),
    ("align", -1, 1, torch.float16, True), ("align", 3, (2, 2), torch.bfloat16, False),
    ("pool", 2, (2, 3), torch.float32, True), ("pool", 2, (3, 3), torch.float64, False),
    ("pool", 2, (2, 1), torch.float16, False),
])
def test_triton_matches_the_cpu_kernels(op, sr, size, dtype, channels_last, monkeypatch):
    """Same arithmetic in the same order: bit for bit in float32 and float64, forward and
    the deterministic backward (its gather adds each cell's terms in the CPU kernels'
    order); the atomic backward adds them in another order: within rounding."""
    _triton()
    x, boxes = feature(size, c_out=2, dtype=dtype, channels_last=channels_last), boxes_for()
    out, grad = run(OPS[op], x, boxes, size, sr)
    ref_out, ref_grad = run(OPS[op], x, boxes, size, sr, backend="reference")
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    for deterministic in (True, False):
        monkeypatch.setattr(roiops.config, "deterministic_backward", deterministic)
        t_out, t_grad = run(OPS[op], x.to(TRITON_DEVICE), boxes.to(TRITON_DEVICE), size, sr, backend="triton")
        assert t_out.is_contiguous(memory_format=fmt) and t_grad.is_contiguous(memory_format=fmt)
        t_out, t_grad = t_out.cpu(), t_grad.cpu()
        if dtype in (torch.float32, torch.float64):
            assert torch.equal(t_out, out)
            if deterministic:
                assert torch.equal(t_grad, grad)
            else:
                close(t_grad, grad, dtype)
        else:
            close(t_out, ref_out, dtype)
            close(t_grad, ref_grad, dtype)


@pytest.mark.parametrize("name", ["ps_roi_align", "ps_roi_pool"])
def test_triton_masks_invalid_rows(name):
    """A row the launcher cannot check without a sync (bad batch index, NaN) gives 0 and no gradient."""
    rt = _triton()
    x = feature(2, c_out=2).to(TRITON_DEVICE)
    rois = torch.tensor([[0, 1.0, 1, 9, 9], [5, 1.0, 1, 9, 9], [1, float("nan"), 1, 9, 9]], device=TRITON_DEVICE)
    extra = (2,) if name == "ps_roi_align" else ()
    out = getattr(rt, f"{name}_forward")(x, rois, 0.5, 2, 2, *extra)
    assert out[0].abs().sum() > 0 and torch.equal(out[1:].cpu(), torch.zeros(2, 2, 2, 2))
    g = torch.ones(3, 2, 2, 2, device=TRITON_DEVICE)
    g[0] = 0
    for deterministic in (True, False):
        gi = getattr(rt, f"{name}_backward")(g, rois, 0.5, 2, 2, N, 8, H, W, *extra, False,
                                             deterministic=deterministic)
        assert torch.equal(gi.cpu(), torch.zeros(N, 8, H, W))


@pytest.mark.parametrize("name", ["ps_roi_align", "ps_roi_pool"])
def test_triton_refuses_a_channel_count_that_is_not_a_multiple(name):
    rt = _triton()
    extra = (2,) if name == "ps_roi_align" else ()
    x, rois = torch.randn(1, 10, 5, 5, device=TRITON_DEVICE), torch.tensor([[0, 1.0, 1, 3, 3]], device=TRITON_DEVICE)
    with pytest.raises(ValueError, match="multiple of pooled_height"):
        getattr(rt, f"{name}_forward")(x, rois, 1.0, 2, 2, *extra)
    with pytest.raises(ValueError, match="multiple of pooled_height"):
        getattr(rt, f"{name}_backward")(torch.zeros(1, 2, 2, 2, device=TRITON_DEVICE), rois, 1.0, 2, 2, 1, 10, 5, 5,
                                        *extra, False)


def test_triton_huge_boxes_visit_only_samples_near_the_map(monkeypatch):
    """Adaptive grids of 10^6 samples per bin side: every kernel visits only the samples
    that can touch the map (forward, atomic backward) or a tile (deterministic backward),
    and agrees with the CPU."""
    _triton()
    x = feature(2, c_out=2)
    boxes = torch.tensor([[0, -1e6, -1e6, 1e6, 1e6], [1, -5e5, 2.0, 3e5, 9.0]])
    out, grad = run(OPS["align"], x, boxes, 2, 0)
    for deterministic in (True, False):
        monkeypatch.setattr(roiops.config, "deterministic_backward", deterministic)
        t_out, t_grad = run(OPS["align"], x.to(TRITON_DEVICE), boxes.to(TRITON_DEVICE), 2, 0, backend="triton")
        assert torch.equal(t_out.cpu(), out)
        if deterministic:
            assert torch.equal(t_grad.cpu(), grad)
        else:
            close(t_grad.cpu(), grad, torch.float32)



# ----------------------------------------------------------------------------- on a GPU
# The compiled Triton kernels at realistic sizes (moved from tests/test_gpu.py; the helpers
# are tests/gpu_cases.py). Skipped without a CUDA GPU.

import gpu_cases as gpu  # noqa: E402

# R-FCN's head on the stride-16 map of a 600x800 image: 7x7 bins of 21 classes.
R_FCN = (1 / 16, 38, 50)
R_FCN_C = 21 * 49
PS_ON_GPU = {"align-adaptive": lambda t, b, s: roiops.ps_roi_align(t, b, 7, s, 0),
             "align-2": lambda t, b, s: roiops.ps_roi_align(t, b, 7, s, 2),
             "pool": lambda t, b, s: roiops.ps_roi_pool(t, b, 7, s)}


@gpu.on_gpu
@pytest.mark.parametrize("cl", [False, True], ids=["nchw", "cl"])
@pytest.mark.parametrize("dtype", [gpu.F32, gpu.F64])
@pytest.mark.parametrize("op", list(PS_ON_GPU))
def test_position_sensitive_on_cuda_equal_cpu_kernels(op, dtype, cl, monkeypatch):
    """The R-FCN head: forward and the deterministic backward equal the C++ kernels bit for
    bit (the same arithmetic in the same order; the tests above hold those to
    torchvision), the atomic backward within rounding; and the PSRoIAlign forward with a
    fixed grid equals torchvision's CPU kernel itself."""
    scale, H, W = R_FCN
    g = torch.Generator().manual_seed(20)
    x = torch.randn(gpu.N, R_FCN_C, H, W, generator=g).to(dtype)
    x = x.contiguous(memory_format=torch.channels_last) if cl else x
    rois = gpu.gpu_boxes(scale, H, W, 7, 7, seed=21).to(dtype)
    grad = gpu.random_grad((rois.shape[0], R_FCN_C // 49, 7, 7), dtype, seed=22)
    fn = lambda t, b: PS_ON_GPU[op](t, b, scale)  # noqa: E731
    ref_out, ref_grad = gpu.api_forward_backward(fn, x, rois, grad)
    for deterministic in (False, True):
        monkeypatch.setattr(roiops.config, "deterministic_backward", deterministic)
        out, gi = gpu.api_forward_backward(fn, gpu.cuda(x), gpu.cuda(rois), grad)
        gpu.exact(out, ref_out, f"ps {op} forward")
        if deterministic:
            gpu.exact(gi, ref_grad, f"ps {op} deterministic backward")
        else:
            gpu.close(gi, ref_grad, dtype)
    if op == "align-2":
        import torchvision

        gpu.exact(out, torchvision.ops.ps_roi_align(x, rois, 7, scale, 2).contiguous(), "ps align vs torchvision")
