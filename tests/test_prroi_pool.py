"""Precise RoI Pooling: every kernel set against a brute-force numerical integral of the
interpolated map, hand-computed windows, central finite differences of the box gradient,
boxes fitted by gradient descent; the C++ and Triton kernels' own checks and paths. What
every op must do (dtypes, layouts, gradcheck, compile, Module, validation) is in
test_generic.py."""

from __future__ import annotations

import pytest
import torch

import roiops
from cases import BF16, C, F16, F32, F64, H, N, SCALE, W, backend_used, device_for, tol
from cases import boxes_for as _boxes_for
from cases import feature as _feature
from cases import run as _run
from roiops import reference as ref

# The option sets the generic tests (tests/cases.py) run the operator with.
OPTIONS = {"prroi_pool": (dict(),)}

BACKENDS = ["reference", "cpu", "triton"]


def feature(dtype=F64, channels_last=False, seed=0, c=C):
    return _feature(dtype, channels_last, seed, channels=c)


def boxes_for(dtype=F64, seed=0, count=6):
    tiny = torch.tensor([[1, 3.1, 2.2, 3.13, 2.21]], dtype=dtype)  # 0.015 x 0.005 cells at (1.55, 1.1)
    return torch.cat([_boxes_for(dtype=dtype, seed=seed, count=count), tiny])


def pool(backend, x, b, size, scale):
    """roiops.prroi_pool with `backend`'s kernels where they run (cases.device_for): the map
    and boxes go there and the output comes back, differentiably, so that a test's tensors
    and their gradients stay on the CPU."""
    dev = device_for(backend)
    b = [t.to(dev) for t in b] if isinstance(b, list) else b.to(dev)
    with backend_used(backend):
        return roiops.prroi_pool(x.to(dev), b, size, scale).cpu()


def run(x, b, size=(2, 3), backend=None, seed=1):
    """Output, input gradient and box gradient for a fixed random upstream gradient."""
    return _run(lambda t, c: roiops.prroi_pool(t, c, size, SCALE), x, b, backend, seed)


def integral_oracle(x, rois, size, scale, n=4000):
    """Each bin's mean of f(x, y) = sum F[h, w] * hat(x - w) * hat(y - h) over the n x n
    midpoint grid of its window, in float64 (the grid's mean
    of a product of a function of x and one of y is the product of the two axes' means,
    so each axis is summed alone)."""
    ph, pw = size
    x = x.double()
    out = torch.zeros(len(rois), x.shape[1], ph, pw, dtype=F64)

    def mean_weights(lo, hi, pooled, cells):
        step = max(hi - lo, 0.0) * scale / pooled
        mid = (torch.arange(n, dtype=F64) + 0.5) / n
        pos = lo * scale + (torch.arange(pooled, dtype=F64)[:, None] + mid) * step  # [pooled, n]
        return (1 - (pos[..., None] - torch.arange(cells, dtype=F64)).abs()).clamp(min=0).mean(1), step

    for k, (b, x1, y1, x2, y2) in enumerate(rois.double().tolist()):
        wx, dw = mean_weights(x1, x2, pw, x.shape[3])
        wy, dh = mean_weights(y1, y2, ph, x.shape[2])
        if dw * dh > 0:
            out[k] = torch.einsum("ih,chw,jw->cij", wy, x[int(b)], wx)
    return out


# ----------------------------------------------------------------------------- the definition


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("size", [1, (2, 3), (4, 4)])
def test_forward_is_the_integral_of_the_interpolated_map(backend, size):
    """Windows inside, partly and wholly outside the map, larger than it, sub-cell and
    tiny, of zero size and inverted (these two give 0)."""
    size = (size, size) if isinstance(size, int) else size
    x, b = feature(), boxes_for()
    out = pool(backend, x, b, size, SCALE)
    # The midpoint rule errs only at the hats' kinks, by at most (window / n)^2 / 4 of the
    # window's mean per kink, with either sign. Measured: under 2e-7 (the box larger than the map).
    torch.testing.assert_close(out, integral_oracle(x, b, size, SCALE), rtol=0, atol=1e-6)
    empty = (b[:, 3] <= b[:, 1]) | (b[:, 4] <= b[:, 2])
    assert empty.sum() == 2 and torch.equal(out[empty], torch.zeros_like(out[empty]))
    assert out[~empty].abs().amin(dim=(1, 2, 3)).gt(0).sum() >= 10  # the boxes on the map give values


@pytest.mark.parametrize("backend", BACKENDS)
def test_hand_computed(backend):
    """On a 2 x 2 map F[h, w] = 1 + w + 2h, f(x, y) = 1 + x + 2y on [0, 1]^2 (bilinear
    interpolation of a linear function is exact), so a bin's value is f at its centre."""
    x = torch.tensor([[[[1.0, 2.0], [3.0, 4.0]]]], dtype=F64, requires_grad=True)
    box = torch.tensor([[0, 0.0, 0.0, 1.0, 1.0]], dtype=F64, requires_grad=True)
    out = pool(backend, x, box, 2, 1.0)
    assert out.tolist() == [[[[1.75, 2.25], [2.75, 3.25]]]]
    one = pool(backend, x, box, 1, 1.0)
    one.backward()
    # Cell weights over [0, 1]: the integral of each hat is 1/2 per axis.
    assert x.grad.tolist() == [[[[0.25, 0.25], [0.25, 0.25]]]]
    # out = 1 + (x1 + x2) / 2 + (y1 + y2): also at edges on cell centres, where f has a
    # kink (its integral's derivative is f at the edge, continuous there).
    assert box.grad.tolist() == [[0.0, 0.5, 1.0, 0.5, 1.0]]
    # Window [-1, 1] x [0, 1]: the left half weighs column 0 (mean 2) by the hat's
    # tail 1 + x, integral 1/2; the right half is 1 + x + 2y's integral 2.5; area 2.
    assert pool(backend, x, torch.tensor([[0, -1.0, 0.0, 1.0, 1.0]], dtype=F64), 1, 1.0).item() == 1.75
    # Entirely beyond the hats of the last cells (x >= 2): 0.
    assert pool(backend, x, torch.tensor([[0, 2.0, 0.0, 5.0, 1.0]], dtype=F64), 1, 1.0).item() == 0.0


@pytest.mark.parametrize("backend", BACKENDS)
def test_empty_and_tiny_windows(backend):
    """x2 < x1 or x2 == x1 gives 0 and no gradient to the map or the box; a tiny window
    gives f at its position (the limit of the average)."""
    x = feature().requires_grad_()
    rows = torch.tensor([[0, 6.0, 4.0, 2.0, 8.0], [1, 3.0, 2.0, 3.0, 9.0], [0, 2.0, 5.0, 8.0, 5.0]], dtype=F64)
    b = rows.clone().requires_grad_()
    out = pool(backend, x, b, (2, 3), SCALE)
    out.backward(torch.ones_like(out))
    assert torch.equal(out, torch.zeros_like(out))
    assert torch.equal(x.grad, torch.zeros_like(x)) and torch.equal(b.grad, torch.zeros_like(b))
    tiny = torch.tensor([[1, 5.0, 3.0, 5.0 + 1e-7, 3.0 + 1e-7]], dtype=F64)
    point = pool(backend, x.detach(), tiny, 1, SCALE)
    # f at (2.5, 1.5) cells: the mean of the four cells around it.
    torch.testing.assert_close(point[0, :, 0, 0], x.detach()[1, :, 1:3, 2:4].mean((1, 2)), rtol=0, atol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_non_finite_values_reach_only_the_bins_that_weigh_them(backend):
    """An infinite cell takes part in a bin only if its hat overlaps the bin's window
    (cells floor(start) to ceil(end)); the other bins of the box stay finite."""
    x = torch.zeros(1, 1, 4, 12, dtype=F64)
    x[0, 0, 1, 10] = float("inf")
    box = torch.tensor([[0, 0.5, 0.5, 11.5, 2.5]], dtype=F64)  # bins of 11/4 cells: [0.5, 3.25], ..., [8.75, 11.5]
    out = pool(backend, x, box, (1, 4), 1.0)
    assert out[0, 0, 0, :3].tolist() == [0.0, 0.0, 0.0] and out[0, 0, 0, 3].item() == float("inf")


@pytest.mark.parametrize("backend", BACKENDS)
def test_non_finite_gradient_reaches_only_its_bins_cells(backend):
    """An infinite upstream gradient of one bin goes to that bin's cells only."""
    x = torch.zeros(1, 1, 4, 12, dtype=F64, requires_grad=True)
    box = torch.tensor([[0, 0.5, 0.5, 11.5, 2.5]], dtype=F64)
    g = torch.ones(1, 1, 1, 4, dtype=F64)
    g[0, 0, 0, 3] = float("inf")
    pool(backend, x, box, (1, 4), 1.0).backward(g)
    # Bin 3's window [8.75, 11.5] weighs columns 8 to 11, rows 0 to 3 (window [0.5, 2.5]).
    assert not x.grad.isnan().any()
    want = torch.zeros(1, 1, 4, 12, dtype=torch.bool)
    want[..., 8:] = True
    assert torch.equal(x.grad.isinf(), want)


# ----------------------------------------------------------------------------- gradients


def _no_empty(b):
    return b[(b[:, 3] > b[:, 1] + 0.5) & (b[:, 4] > b[:, 2] + 0.5)]


@pytest.mark.parametrize("backend", BACKENDS)
def test_box_gradient_is_the_finite_difference_of_the_reference(backend):
    """Central differences of the reference forward, per coordinate, against the backend's
    box gradient for a random upstream gradient."""
    x = feature()
    b = _no_empty(boxes_for(seed=2))
    _, _, grad_b = run(x, b, (3, 2), backend)
    g = torch.randn(len(b), C, 3, 2, generator=torch.Generator().manual_seed(1), dtype=F64)
    eps = 1e-6
    want = torch.zeros_like(b)
    for k in range(len(b)):
        for col in range(1, 5):
            hi, lo = b.clone(), b.clone()
            hi[k, col] += eps
            lo[k, col] -= eps
            diff = ref.prroi_pool_forward(x, hi, SCALE, 3, 2) - ref.prroi_pool_forward(x, lo, SCALE, 3, 2)
            want[k, col] = (diff * g).sum() / (2 * eps)
    assert grad_b.abs().gt(1e-3).sum() >= 2 * len(b)
    torch.testing.assert_close(grad_b, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_input_gradient_is_autograd_of_the_reference_forward(backend):
    x, b = feature(), boxes_for()
    _, grad, _ = run(x, b, (3, 4), backend)
    xr = x.clone().requires_grad_()
    out = ref.prroi_pool_forward(xr, b, SCALE, 3, 4)
    out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=F64))
    torch.testing.assert_close(grad, xr.grad, **tol(F64))


def fit_box(backend, steps=100):
    """Fits a box by gradient descent to a target crop of a smooth map (the example in
    docs/api.md): returns the fitted box and the target box."""
    yy, xx = torch.meshgrid(torch.arange(24.0, dtype=F64), torch.arange(24.0, dtype=F64), indexing="ij")
    blobs = sum(torch.exp(-((xx - cx) ** 2 + (yy - cy) ** 2) / (2 * s * s))
                for cx, cy, s in [(6, 8, 3), (15, 12, 4), (10, 17, 2.5)])
    features = torch.stack([blobs, blobs * xx / 24])[None]  # [1, 2, 24, 24]
    target = torch.tensor([[5.0, 6.0, 17.0, 15.0]], dtype=F64)
    crop = pool(backend, features, [target], 7, 1.0)
    box = torch.tensor([[6.5, 4.8, 19.0, 16.0]], dtype=F64, requires_grad=True)
    optimizer = torch.optim.Adam([box], lr=0.1)
    for _ in range(steps):
        optimizer.zero_grad()
        loss = (pool(backend, features, [box], 7, 1.0) - crop).pow(2).mean()
        loss.backward()
        optimizer.step()
    return box.detach(), target


@pytest.mark.parametrize("backend", BACKENDS)
def test_gradient_descent_moves_a_box_onto_its_target(backend):
    box, target = fit_box(backend)
    assert (box - target).abs().max() < 0.05  # from 2 pixels off


@pytest.mark.parametrize("bad", [[2.0, 0, 0, 4, 4], [0.5, 0, 0, 4, 4], [0.0, float("inf"), 0, 4, 4]])
def test_reference_kernels_reject_bad_rows(bad):
    x, rois = feature(), torch.tensor([bad], dtype=F64)
    g = torch.ones(1, C, 2, 2, dtype=F64)
    with pytest.raises(ValueError, match="row 0"):
        ref.prroi_pool_forward(x, rois, 1.0, 2, 2)
    with pytest.raises(ValueError, match="row 0"):
        ref.prroi_pool_backward(g, rois, 1.0, 2, 2, N, C, H, W, False)
    with pytest.raises(ValueError, match="row 0"):
        ref.prroi_pool_rois_backward(g, x, rois, 1.0, 2, 2)
    with pytest.raises(ValueError, match="not finite after spatial_scale"):
        ref.prroi_pool_forward(x.float(), torch.tensor([[0, 1e38, 0, 3e38, 4]]), 1e10, 2, 2)


# ----------------------------------------------------------------------------- C++ kernels
# The C++ CPU kernels (roiops/csrc/prroi_pool.cpp) beyond the backend-parametrised tests
# above and test_generic.py: the box gradient of 7 x 7 bins against the reference at the
# dtype's own tolerance, and the kernels' own argument checks (a direct op call reaches
# them unvalidated).


def cpu_and_reference(x, b, size):
    """(output, input gradient, box gradient) from the C++ kernels and from the reference."""
    return run(x, b, size, "cpu"), run(x, b, size, "reference")


@pytest.mark.parametrize("dtype", [F64, F32])
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("size", [7])  # (2, 3): test_generic.py
def test_cpp_box_gradient_matches_reference(dtype, channels_last, size):
    x = feature(dtype, channels_last, c=5)
    # Not the tiny box: the reference's window weights are differences of the hat's
    # antiderivative, which lose digits in proportion to 1 / window width (the C++ kernels
    # sum the hat's pieces instead); the tests above cover it at their tolerances.
    b = boxes_for(dtype, count=10)[:-1]
    (out, grad, grad_b), (ref_out, ref_grad, ref_b) = cpu_and_reference(x, b, size)
    torch.testing.assert_close(out, ref_out, **tol(dtype))
    torch.testing.assert_close(grad, ref_grad, **tol(dtype))
    # A sum over channels and bins of differences of window averages: the tolerance
    # scales with the size of its terms.
    scale = float(ref_b.abs().max()) + 1
    torch.testing.assert_close(grad_b, ref_b, rtol=tol(dtype)["rtol"], atol=tol(dtype)["atol"] * scale)
    assert torch.all(grad_b[:, 0] == 0)


@pytest.mark.parametrize("column,value,match", [(0, 2.0, "batch index"), (0, 0.5, "batch index"),
                                                (1, float("nan"), "coordinate"), (4, float("inf"), "coordinate")])
def test_cpp_kernels_reject_bad_rows(column, value, match):
    x, b = feature(F32), boxes_for(F32)
    b[3, column] = value
    g = torch.ones(b.shape[0], C, 2, 2)
    with pytest.raises(ValueError, match=match):
        roiops.cpu.prroi_pool_forward(x, b, SCALE, 2, 2)
    with pytest.raises(ValueError, match=match):
        roiops.cpu.prroi_pool_backward(g, b, SCALE, 2, 2, N, C, H, W, False)
    with pytest.raises(ValueError, match=match):
        roiops.cpu.prroi_pool_rois_backward(g, x, b, SCALE, 2, 2)


def test_cpp_kernels_check_shapes():
    x, b = feature(F32), boxes_for(F32)
    with pytest.raises(ValueError, match="grad must be"):
        roiops.cpu.prroi_pool_backward(torch.ones(b.shape[0], C, 2, 3), b, SCALE, 2, 2, N, C, H, W, False)
    with pytest.raises(ValueError, match="grad must be"):
        roiops.cpu.prroi_pool_rois_backward(torch.ones(b.shape[0], C + 1, 2, 2), x, b, SCALE, 2, 2)
    with pytest.raises(ValueError, match="rois must be float64"):
        roiops.cpu.prroi_pool_forward(x.double(), b, SCALE, 2, 2)


# ----------------------------------------------------------------------------- Triton kernels
#
# roiops.triton's kernel functions called directly: both input-backward paths, what only
# they do (rows they cannot refuse without a sync give 0) and their cost bound. On CUDA
# when there is a GPU, else on CPU tensors through Triton's interpreter (tests/conftest.py).

TRITON_DEVICE = device_for("triton")


def _triton():
    from roiops._requirements import triton_too_old

    if triton_too_old():
        pytest.skip(triton_too_old())
    import roiops.triton as rt

    return rt


def _on_device(t, channels_last=False):
    t = t.contiguous(memory_format=torch.channels_last) if channels_last else t
    return t.to(TRITON_DEVICE)


def _layout(t, channels_last):
    assert t.is_contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)


# dtype x layout x output size (the boxes: random, nasty_boxes' rows, no tiny window).
TRITON_CASES = [(F64, False, (2, 3)), (F64, True, (3, 2)), (F32, False, (1, 1)), (F32, True, (2, 3)),
                (F16, False, (2, 2)), (BF16, True, (1, 2))]


@pytest.mark.parametrize("dtype, channels_last, size", TRITON_CASES,
                         ids=[f"{str(d)[6:]}-{'cl' if c else 'nchw'}-{s[0]}x{s[1]}" for d, c, s in TRITON_CASES])
def test_triton_kernels_match_the_reference(dtype, channels_last, size):
    rt = _triton()
    ph, pw = size
    x = feature(dtype, channels_last)
    rois = boxes_for(F64 if dtype == F64 else F32)[:-1]
    xd, rd = _on_device(x, channels_last), _on_device(rois)
    out = rt.prroi_pool_forward(xd, rd, SCALE, ph, pw)
    assert out.shape == (len(rois), C, ph, pw) and out.dtype == dtype
    _layout(out, channels_last)
    torch.testing.assert_close(out.cpu(), ref.prroi_pool_forward(x, rois, SCALE, ph, pw), **tol(dtype))

    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=F64).to(dtype)
    g = g.contiguous(memory_format=torch.channels_last) if channels_last else g
    ref_gi = ref.prroi_pool_backward(g, rois, SCALE, ph, pw, N, C, H, W, channels_last)
    for det in (False, True):
        gi = rt.prroi_pool_backward(_on_device(g, channels_last), rd, SCALE, ph, pw, N, C, H, W, channels_last,
                                    deterministic=det)
        assert gi.dtype == dtype
        _layout(gi, channels_last)
        torch.testing.assert_close(gi.cpu(), ref_gi, **tol(dtype))
    gr = rt.prroi_pool_rois_backward(_on_device(g, channels_last), xd, rd, SCALE, ph, pw)
    assert gr.shape == (len(rois), 5) and gr.dtype == rois.dtype and not gr[:, 0].any()
    # In float32 the box gradient is good to about 2^-24 / (a window's side): the
    # reference's window weights are differences of the hat's antiderivative.
    box_tol = tol(F64) if dtype == F64 else dict(rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(gr.cpu(), ref.prroi_pool_rois_backward(g, x, rois, SCALE, ph, pw), **box_tol)


def test_triton_rows_it_cannot_check_give_zero_and_scatter_nothing():
    """A batch index outside [0, N) or not an integer, or a non-finite coordinate: the
    launchers cannot see it without a sync, so that row pools to 0, scatters nothing into
    the input's gradient and gets no box gradient (the reference raises instead)."""
    rt = _triton()
    x = _on_device(feature(F32))
    nan, inf = float("nan"), float("inf")
    rois = _on_device(torch.tensor([[0, 1.0, 1, 9, 9], [N, 1, 1, 9, 9], [-1, 1, 1, 9, 9], [0.5, 1, 1, 9, 9],
                                    [1, nan, 1, 9, 9], [1, 1, inf, 9, 9], [0, 1, 1, -inf, 9], [1, 1, 1, 9, 1e30]]))
    out = rt.prroi_pool_forward(x, rois, SCALE, 2, 2)
    assert out[0].abs().sum() > 0 and not out[1:].any()
    g = torch.ones(len(rois), C, 2, 2, device=TRITON_DEVICE)
    g[0] = 0
    for det in (False, True):
        assert not rt.prroi_pool_backward(g, rois, SCALE, 2, 2, N, C, H, W, False, deterministic=det).any()
    gr = rt.prroi_pool_rois_backward(torch.ones_like(g), x, rois, SCALE, 2, 2)
    assert gr[0].abs().sum() > 0 and not gr[1:].any()


@pytest.mark.parametrize("channels_last", [False, True])
def test_triton_no_boxes(channels_last):
    rt = _triton()
    x, rois = _on_device(feature(F32), channels_last), torch.zeros(0, 5, device=TRITON_DEVICE)
    assert rt.prroi_pool_forward(x, rois, SCALE, 2, 3).shape == (0, C, 2, 3)
    g = torch.zeros(0, C, 2, 3, device=TRITON_DEVICE)
    for det in (False, True):
        gi = rt.prroi_pool_backward(g, rois, SCALE, 2, 3, N, C, H, W, channels_last, deterministic=det)
        _layout(gi, channels_last)
        assert gi.shape == (N, C, H, W) and not gi.any()
    assert rt.prroi_pool_rois_backward(g, x, rois, SCALE, 2, 3).shape == (0, 5)


@pytest.mark.parametrize("channels_last", [False, True])
def test_triton_deterministic_backward_repeats_bit_for_bit(channels_last):
    rt = _triton()
    rois = _on_device(boxes_for(F32, seed=4))
    g = torch.randn(len(rois), C, 3, 2, generator=torch.Generator().manual_seed(2))
    args = (_on_device(g, channels_last), rois, SCALE, 3, 2, N, C, H, W, channels_last)
    a = rt.prroi_pool_backward(*args, deterministic=True)
    assert torch.equal(a, rt.prroi_pool_backward(*args, deterministic=True))
    torch.testing.assert_close(a, rt.prroi_pool_backward(*args, deterministic=False), **tol(F32))
    x = _on_device(feature(F32), channels_last)
    assert torch.equal(rt.prroi_pool_rois_backward(args[0], x, rois, SCALE, 3, 2),
                       rt.prroi_pool_rois_backward(args[0], x, rois, SCALE, 3, 2))


def test_triton_huge_boxes_cost_what_they_cover():
    """Bins of 10^5 to 10^6 cells: the kernels visit only the cells of the map they cover
    (under the interpreter a loop over a bin's cells would not end)."""
    rt = _triton()
    x = feature()
    rois = torch.tensor([[0, -1e6, -1e6, 1e6, 1e6], [1, -5e5, 2.0, 3e5, 9.0]], dtype=F64)
    xd, rd = _on_device(x), _on_device(rois)
    close = tol(F64)
    torch.testing.assert_close(rt.prroi_pool_forward(xd, rd, SCALE, 2, 2).cpu(),
                               ref.prroi_pool_forward(x, rois, SCALE, 2, 2), **close)
    g = torch.randn(2, C, 2, 2, generator=torch.Generator().manual_seed(3), dtype=F64)
    ref_gi = ref.prroi_pool_backward(g, rois, SCALE, 2, 2, N, C, H, W, False)
    for det in (False, True):
        gi = rt.prroi_pool_backward(_on_device(g), rd, SCALE, 2, 2, N, C, H, W, False, deterministic=det)
        torch.testing.assert_close(gi.cpu(), ref_gi, **close)
    torch.testing.assert_close(rt.prroi_pool_rois_backward(_on_device(g), xd, rd, SCALE, 2, 2).cpu(),
                               ref.prroi_pool_rois_backward(g, x, rois, SCALE, 2, 2), **close)



# ----------------------------------------------------------------------------- on a GPU
# The compiled Triton kernels at realistic sizes (moved from tests/test_gpu.py; the helpers
# are tests/gpu_cases.py). Skipped without a CUDA GPU.

import gpu_cases as gpu  # noqa: E402


@gpu.on_gpu
@pytest.mark.parametrize("cl", [False, True], ids=["nchw", "cl"])
@pytest.mark.parametrize("dtype", [gpu.F32, gpu.F64])
def test_prroi_pool_on_cuda_against_cpu_kernels_and_reference(dtype, cl):
    """Precise RoI Pooling on C = 256 maps: forward, both input-gradient paths and the box
    gradient. float64 against the reference; float32 against the C++ kernels, which
    compute the windows' weights with the same arithmetic (the float32 reference takes
    differences of the hat's antiderivative, which lose digits on short windows far from
    the origin: docs/semantics.md)."""
    from roiops import reference as REF

    rt = gpu.triton_kernels()
    N, C, cuda, close = gpu.N, gpu.C, gpu.cuda, gpu.close
    scale, H, W = gpu.LEVELS[1]
    x = gpu.feature_map(H, W, dtype, cl, seed=28)
    rois = gpu.gpu_boxes(scale, H, W, 7, 7, seed=29, k_random=24).to(dtype)
    g = gpu.random_grad((rois.shape[0], C, 7, 7), dtype, seed=30)
    if dtype == gpu.F64:
        want = (REF.prroi_pool_forward(x, rois, scale, 7, 7),
                REF.prroi_pool_backward(g, rois, scale, 7, 7, N, C, H, W, cl),
                REF.prroi_pool_rois_backward(g, x, rois, scale, 7, 7))
    else:
        import roiops.cpu as cpp

        want = (cpp.prroi_pool_forward(x, rois, scale, 7, 7),
                cpp.prroi_pool_backward(g, rois, scale, 7, 7, N, C, H, W, cl),
                cpp.prroi_pool_rois_backward(g, x, rois, scale, 7, 7))
    out = rt.prroi_pool_forward(cuda(x), cuda(rois), scale, 7, 7)
    close(out.cpu(), want[0], dtype)
    for gi in gpu.both_backwards(lambda d: rt.prroi_pool_backward(cuda(g), cuda(rois), scale, 7, 7, N, C, H, W, cl,
                                                                  deterministic=d)):
        close(gi, want[1], dtype)
    gr = rt.prroi_pool_rois_backward(cuda(g), cuda(x), cuda(rois), scale, 7, 7).cpu()
    # A box's four derivatives each sum C x 49 terms, in another order on each side.
    scale_row = want[2].abs().amax(dim=1, keepdim=True)
    torch.testing.assert_close(gr / scale_row.clamp(min=1e-30), want[2] / scale_row.clamp(min=1e-30), **gpu.tol(dtype))


# ----------------------------------------------------------------------------- mmcv drop-in
# roiops.compat.mmcv's PrRoIPool and prroi_pool (moved from tests/test_compat.py).

def test_mmcv_prroi_pool_signatures_and_repr():
    import inspect

    from roiops.compat import mmcv

    params = lambda fn: [(p.name, p.default) for p in inspect.signature(fn).parameters.values()]  # noqa: E731
    empty = inspect.Parameter.empty
    assert params(mmcv.prroi_pool) == [("input", empty), ("rois", empty), ("output_size", empty),
                                       ("spatial_scale", 1.0)]
    assert params(mmcv.PrRoIPool.__init__) == [("self", empty), ("output_size", empty), ("spatial_scale", 1.0)]
    assert repr(mmcv.PrRoIPool(7, 1 / 16)) == "PrRoIPool(output_size=(7, 7), spatial_scale=0.0625)"
    with pytest.raises(ValueError, match="spatial_scale"):
        mmcv.PrRoIPool(7, -1.0)
    with pytest.raises(ValueError, match="output_size"):
        mmcv.prroi_pool(torch.zeros(1, 1, 4, 4), torch.zeros(1, 5), (2, 0))


@pytest.mark.parametrize("backend", ["reference", "cpu", "triton"])
def test_mmcv_prroi_pool_published_case_with_rois_gradient(backend):
    """mmcv's own test: a 2 x 2 map, rois (0, 0, 0, 1, 1), 2 x 2 bins, upstream gradient of
    ones. On [0, 1]^2 the map interpolates to 1 + x + 2y, so a bin's value is its centre's
    and the sum of the four is 4 + 2 (x1 + x2) + 4 (y1 + y2)."""
    from roiops.compat import mmcv

    x = torch.tensor([[[[1.0, 2.0], [3.0, 4.0]]]], requires_grad=True)
    rois = torch.tensor([[0.0, 0.0, 0.0, 1.0, 1.0]], requires_grad=True)
    with roiops.use_backend(backend):
        for layer in (lambda a, b: mmcv.prroi_pool(a, b, 2), mmcv.PrRoIPool((2, 2))):
            x.grad = rois.grad = None
            out = layer(x, rois)
            assert out.tolist() == [[[[1.75, 2.25], [2.75, 3.25]]]]
            out.sum().backward()
            assert x.grad.tolist() == [[[[1.0, 1.0], [1.0, 1.0]]]]
            assert rois.grad.tolist() == [[0.0, 2.0, 4.0, 2.0, 4.0]]
