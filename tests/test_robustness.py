"""Inputs that once crashed, hung or gave silently wrong results, and the limits of
docs/semantics.md ("Limits"): each gives a clear exception naming the argument and the
limit, or the right answer (checked against torchvision or the reference)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest
import torch
import torchvision.ops as tv

import roiops
import roiops.reference as ref
from roiops import _backend
from roiops.compat import torchvision as ctv
from cases import config_set, tol

OPS = torch.ops.roiops


def run_isolated(code: str, timeout: float = 120) -> dict:
    """Runs `code` in a fresh interpreter, so that a crash fails the test instead of
    ending the run; the code prints one JSON object as its last line."""
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


ERRORS = """
import json, torch, roiops
O = torch.ops.roiops
def err(f):
    try:
        f()
    except Exception as e:
        return [type(e).__name__, str(e).splitlines()[0]]
    return None
"""


def test_crash_repros_raise_clear_errors():
    # Each once crashed the process (huge scale, 2^31 sampling) or ran for minutes.
    got = run_isolated(ERRORS + """
x = torch.randn(1, 1, 4, 4)
cl = x.contiguous(memory_format=torch.channels_last)
huge = torch.tensor([[0, -1e6, -1e6, 1e6, 1e6]])
r = {
  "scale": err(lambda: roiops.roi_align(x, torch.zeros(1, 5), 2, spatial_scale=1e39, sampling_ratio=2)),
  "scale_cl": err(lambda: roiops.roi_align(cl, torch.zeros(1, 5), 2, spatial_scale=1e39, sampling_ratio=2)),
  "scale_op": err(lambda: O.roi_align(x, torch.zeros(1, 5), 1e39, 2, 2, 2, False)),
  "scale_op_cl": err(lambda: O.roi_align(cl, torch.zeros(1, 5), 1e39, 2, 2, 2, False)),
  "pool_scale_op": err(lambda: O.roi_pool(x, torch.zeros(1, 5), 1e39, 2, 2, False)),
  # in range, but x * scale overflows float32: refused as a coordinate
  "product_op": err(lambda: O.roi_align(x, torch.tensor([[0, 0, 0, 3e38, 1]]), 2.0**64, 2, 2, 2, False)),
  "ratio": err(lambda: roiops.roi_align(x, huge, 2, sampling_ratio=2**31, aligned=True, mode="max")),
  "ratio_op": err(lambda: O.roi_align_max(x, huge, 1.0, 2, 2, 2**31, True)),
  "ratio_hang": err(lambda: roiops.roi_align(torch.randn(1, 1, 50, 50), torch.tensor([[0, 0, 0, 49.0, 49]]), 1,
                                             sampling_ratio=10**6)),
  "ratio_hang_op": err(lambda: O.roi_align(torch.randn(1, 1, 50, 50), torch.tensor([[0, 0, 0, 49.0, 49]]),
                                           1.0, 1, 1, 10**6, False)),
}
print(json.dumps(r))
""")
    for key in ("scale", "scale_cl"):
        assert got[key][0] == "ValueError" and "spatial_scale" in got[key][1] and "2^64" in got[key][1], got[key]
    for key in ("scale_op", "scale_op_cl", "pool_scale_op"):
        assert got[key][0] == "ValueError" and "spatial_scale" in got[key][1], got[key]
    assert got["product_op"][0] == "ValueError" and "2^24" in got["product_op"][1]
    for key in ("ratio", "ratio_op", "ratio_hang", "ratio_hang_op"):
        assert got[key][0] == "ValueError" and "sampling_ratio" in got[key][1] and "1024" in got[key][1], got[key]


def test_largest_sampling_ratio_matches_torchvision():
    x = torch.randn(1, 3, 50, 50)
    boxes = torch.tensor([[0, 0, 0, 49.0, 49], [0, -1e6, -1e6, 1e6, 1e6]])
    ours = roiops.roi_align(x, boxes, 1, sampling_ratio=1024)
    torch.testing.assert_close(ours, tv.roi_align(x, boxes, 1, sampling_ratio=1024), rtol=1e-5, atol=1e-6)
    # "max" on a huge box: 1024^2 samples per bin (the small-grid table is not built)
    out, am = OPS.roi_align_max(x, boxes, 1.0, 2, 2, 1024, True)
    rout, ram = ref.roi_align_max_forward(x, boxes, 1.0, 2, 2, 1024, True)
    torch.testing.assert_close(out, rout)
    assert torch.equal(am, ram)


def test_max_mode_adaptive_grid_beyond_int32_is_refused():
    # The bin of 60002 x 60002 samples once overflowed the int32 argmax: gradient all 0.
    x = torch.zeros(1, 1, 2, 2)
    x[0, 0, 1, 1] = 1
    box = torch.tensor([[0, -60000.0, -60000, 2, 2]])
    with pytest.raises(ValueError, match=r"row 0 .*int32 argmax.*2\^31 - 1.*output_size"):
        roiops.roi_align(x, box, 1, mode="max")
    with pytest.raises(ValueError, match="row 0.*2\\^31 - 1"):
        OPS.roi_align_max(x, box, 1.0, 1, 1, 0, False)  # the kernel checks too
    with pytest.raises(ValueError, match="row 0.*int32 argmax"):
        ref.roi_align_max_forward(x, box, 1.0, 1, 1, 0, False)
    with config_set(check_box_values=False), pytest.raises(ValueError, match="2\\^31 - 1"):
        roiops.roi_align(x, box, 1, mode="max")


@pytest.mark.parametrize("backend", ["cpu", "reference"])
def test_max_mode_largest_adaptive_grid_has_the_right_gradient(backend):
    # 46002 x 46002 = 2116184004 samples per bin, just under 2^31 - 1: the winner is
    # sample (46001, 46001), which lands on cell (1, 1), index 46001 * 46002 + 46001.
    x = torch.zeros(1, 1, 2, 2)
    x[0, 0, 1, 1] = 1
    x.requires_grad_(True)
    box = torch.tensor([[0, -46000.0, -46000, 2, 2]])
    with roiops.use_backend(backend):
        out, am = OPS.roi_align_max(x, box, 1.0, 1, 1, 0, False)
        (g,) = torch.autograd.grad(roiops.roi_align(x, box, 1, mode="max").sum(), x)
    assert out.item() == 1.0 and am.item() == 46001 * 46002 + 46001
    assert torch.equal(g, torch.tensor([[[[0.0, 0], [0, 1]]]]))


def test_roi_pool_backward_of_a_box_valid_after_scale():
    # 3e7 is beyond 2^24 unscaled, 1.9e6 cells after spatial_scale: valid.
    x = torch.randn(1, 2, 6, 7, dtype=torch.float64, requires_grad=True)
    boxes = torch.tensor([[0, 0, 0, 3e7, 3e7], [0, 16, 16, 64, 80]], dtype=torch.float64)
    ours = roiops.roi_pool(x, boxes, 2, spatial_scale=1 / 16)
    theirs = tv.roi_pool(x, boxes, 2, spatial_scale=1 / 16)
    assert torch.equal(ours, theirs)
    g = torch.randn_like(ours)
    assert torch.equal(torch.autograd.grad(ours, x, g)[0], torch.autograd.grad(theirs, x, g)[0])


def test_use_backend_is_per_thread():
    inside, release = threading.Event(), threading.Event()
    seen: dict[str, object] = {}

    def holder():
        with roiops.use_backend("reference"):
            seen["holder"] = _backend.current()
            inside.set()
            release.wait(10)
            seen["holder_after"] = _backend.current()

    def other():
        seen["other"] = _backend.current()
        seen["other_select"] = _backend.select(torch.device("cpu"))
        with roiops.use_backend("cpu"):
            seen["other_inner"] = _backend.current()
        seen["other_after"] = _backend.current()

    t1 = threading.Thread(target=holder)
    t1.start()
    assert inside.wait(10)
    t2 = threading.Thread(target=other)
    t2.start()
    t2.join(10)
    release.set()
    t1.join(10)
    assert seen == {"holder": "reference", "other": None, "other_select": "cpu", "other_inner": "cpu",
                    "other_after": None, "holder_after": "reference"}
    assert _backend.current() is None


def test_use_backend_out_of_order_exits():
    a, b = roiops.use_backend("reference"), roiops.use_backend("cpu")
    a.__enter__()
    b.__enter__()
    assert _backend.current() == "cpu"
    a.__exit__(None, None, None)  # the outer block ends first: the inner one stays in force
    assert _backend.current() == "cpu"
    b.__exit__(None, None, None)
    assert _backend.current() is None


def test_use_backend_threads_compute_with_their_backend():
    # Many threads, each in its own block, each checking the kernels it gets and the result.
    x, boxes = torch.randn(1, 2, 9, 9), torch.tensor([[0, 1.0, 1, 7, 8]])
    expected = tv.roi_align(x, boxes, 3, sampling_ratio=2)
    errors: list[str] = []

    def work(name: str):
        for _ in range(20):
            with roiops.use_backend(name):
                module = _backend.kernels(torch.device("cpu")).__name__
                out = roiops.roi_align(x, boxes, 3, sampling_ratio=2)
            if module != {"cpu": "roiops.cpu", "reference": "roiops.reference"}[name]:
                errors.append(f"{name} got {module}")
            if not torch.allclose(out, expected, atol=1e-6):
                errors.append(f"{name}: wrong values")

    threads = [threading.Thread(target=work, args=(n,)) for n in ["cpu", "reference"] * 4]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []


def test_reference_cost_follows_the_map_not_the_box():
    # Once 21 s and 7.8 GB: every one of the box's 10^4 x 10^4 samples was evaluated.
    got = run_isolated("""
import json, resource, time, torch, roiops.reference as ref
torch.manual_seed(0)
x = torch.randn(1, 4, 8, 8)
rois = torch.tensor([[0, -5000.0, -5000, 5000, 5000]])
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t0 = time.perf_counter()
out = ref.roi_align_forward(x, rois, 1.0, 7, 7, 0, False)
mx, am = ref.roi_align_max_forward(x, rois, 1.0, 7, 7, 0, True)
g = ref.roi_align_backward(torch.ones(1, 4, 7, 7), rois, 1.0, 7, 7, 1, 4, 8, 8, 0, False, False)
gm = ref.roi_align_max_backward(torch.ones(1, 4, 7, 7), am, rois, 1.0, 7, 7, 1, 4, 8, 8, 0, True, False)
t = time.perf_counter() - t0
grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base
print(json.dumps({"t": t, "kb": grown, "out": out.tolist(), "mx": mx.tolist(), "am": am.tolist(),
                  "g": g.tolist(), "gm": gm.tolist()}))
""")
    assert got["t"] < 10 and got["kb"] < 200_000, got["t"]
    torch.manual_seed(0)
    x = torch.randn(1, 4, 8, 8)
    rois = torch.tensor([[0, -5000.0, -5000, 5000, 5000]])
    # The C++ kernels (and torchvision, for "avg") are the independent oracles here.
    torch.testing.assert_close(torch.tensor(got["out"]), tv.roi_align(x, rois, 7, 1.0, 0, False))
    torch.testing.assert_close(torch.tensor(got["out"]), OPS.roi_align(x, rois, 1.0, 7, 7, 0, False))
    mx, am = OPS.roi_align_max(x, rois, 1.0, 7, 7, 0, True)
    torch.testing.assert_close(torch.tensor(got["mx"]), mx)
    assert torch.equal(torch.tensor(got["am"], dtype=torch.int32), am)
    g = torch.ones(1, 4, 7, 7)
    torch.testing.assert_close(torch.tensor(got["g"]),
                               OPS._roi_align_backward(g, rois, 1.0, 7, 7, 1, 4, 8, 8, 0, False, False))
    torch.testing.assert_close(torch.tensor(got["gm"]),
                               OPS._roi_align_max_backward(g, am, rois, 1.0, 7, 7, 1, 4, 8, 8, 0, True, False))


@pytest.mark.parametrize("call, error, pattern", [
    (lambda x, b: roiops.roi_align(x, b, 10**20), ValueError, r"output_size.*\[1, 65536\]"),
    (lambda x, b: roiops.roi_align(x, b, (7, 65537)), ValueError, r"output_size.*65536"),
    (lambda x, b: roiops.roi_pool(x, b, 10**20), ValueError, r"output_size.*65536"),
    (lambda x, b: roiops.RoIAlign(10**20, 1.0), ValueError, r"output_size.*65536"),
    (lambda x, b: roiops.roi_align(x.to_sparse(), b, 2), ValueError, r"input must be a dense.*sparse"),
    (lambda x, b: roiops.roi_pool(x, b.to_sparse(), 2), ValueError, r"boxes must be a dense.*sparse"),
    (lambda x, b: roiops.roi_align(x.to(torch.float8_e4m3fn), b, 2), ValueError,
     r"input must be floating point \(float16, bfloat16, float32 or float64\), got torch.float8_e4m3fn"),
    (lambda x, b: roiops.roi_align(x, b, 2, sampling_ratio=1025), ValueError, r"sampling_ratio.*1024"),
    (lambda x, b: roiops.roi_align(x, b, 2, spatial_scale=2.0**-65), ValueError, r"spatial_scale.*2\^-64"),
    (lambda x, b: roiops.roi_align(x[:, :, :1].expand(1, 2, 2**24 + 1, 5), b, 2), ValueError, r"height and width.*2\^24"),
    (lambda x, b: OPS.roi_align(x, b, 1.0, 2**16 + 1, 2, 0, False), ValueError, r"output size.*65536"),
    (lambda x, b: OPS._roi_pool_backward(torch.ones(1, 2, 2, 2), torch.zeros(1, 2, 2, 2, dtype=torch.int32),
                                         torch.tensor(0.0), 1, 2, 5, 5, False), ValueError, r"rois must be \[K, 5\]"),
    (lambda x, b: OPS._roi_align_backward(torch.ones(1, 2, 2, 2), torch.tensor(0.0), 1.0, 2, 2, 1, 2, 5, 5, 0,
                                          False, False), ValueError, r"rois must be \[K, 5\]"),
])
def test_clear_messages(call, error, pattern):
    x, b = torch.randn(1, 2, 5, 5), torch.tensor([[0, 0, 0, 3.0, 3]])
    with pytest.raises(error, match=pattern):
        call(x, b)


@pytest.mark.parametrize("backend", ["cpu", "reference"])
def test_direct_backward_with_0d_rois(backend):
    with roiops.use_backend(backend), pytest.raises(ValueError, match=r"rois must .*\[K, 5\]"):
        OPS._roi_pool_backward(torch.ones(1, 2, 2, 2), torch.zeros(1, 2, 2, 2, dtype=torch.int32),
                               torch.tensor(0.0), 1, 2, 5, 5, False)


@pytest.mark.parametrize("fn", [
    lambda x, b: roiops.roi_align(x, b, 2, sampling_ratio=2),
    lambda x, b: roiops.roi_align(x, b, 2, sampling_ratio=2, mode="max"),
    lambda x, b: roiops.roi_pool(x, b, 2),
])
def test_double_backward_is_a_clear_error(fn):
    x = torch.randn(1, 2, 5, 5, dtype=torch.float64, requires_grad=True)
    b = torch.tensor([[0, 0, 0, 3.0, 3]], dtype=torch.float64)
    # A nonlinear loss: the first gradient depends on x through grad_output.
    (g,) = torch.autograd.grad((fn(x, b) ** 2).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="has no double backward"):
        g.sum().backward()


def test_numpy_and_0d_tensor_arguments():
    x, b = torch.randn(2, 3, 12, 14), [torch.tensor([[1.0, 2, 9, 10]]), torch.tensor([[0.0, 0, 20, 22]])]
    expected = tv.roi_align(x, b, 2, 0.5, 2)
    for size, scale, ratio in [(np.int64(2), np.float32(0.5), np.int32(2)),
                               (torch.tensor(2), torch.tensor(0.5), torch.tensor(2)),
                               ((np.int64(2), torch.tensor(2)), np.float64(0.5), 2)]:
        assert torch.equal(ctv.roi_align(x, b, size, scale, ratio), expected)
        assert torch.equal(roiops.roi_align(x, b, size, scale, ratio, aligned=np.bool_(False)), expected)
        assert torch.equal(ctv.RoIAlign(size, scale, ratio)(x, b), expected)
        assert torch.equal(roiops.RoIAlign(size, scale, ratio)(x, b), expected)
    assert torch.equal(roiops.roi_align(x, b, 2, 0.5, 2, aligned=torch.tensor(True)),
                       tv.roi_align(x, b, 2, 0.5, 2, aligned=True))
    assert torch.equal(ctv.roi_pool(x, b, np.int64(3), np.float32(0.5)), tv.roi_pool(x, b, 3, 0.5))
    assert torch.equal(roiops.roi_pool(x, b, torch.tensor(3), torch.tensor(0.5)), tv.roi_pool(x, b, 3, 0.5))
    for bad in (True, np.bool_(True), 2.0, np.float32(2), torch.tensor(2.0), torch.tensor([2])):
        with pytest.raises(ValueError, match="output_size"):
            roiops.roi_align(x, b, bad)
    for bad in (True, torch.tensor(True), "1", 1j):
        with pytest.raises(ValueError, match="spatial_scale"):
            roiops.roi_align(x, b, 2, bad)


@pytest.mark.skipif(not (shutil.which("readelf") and shutil.which("nm")), reason="needs binutils")
def test_extension_links_libstdcxx_dynamically(tmp_path):
    import roiops._C as ext

    def problems(path):
        dynamic = subprocess.run(["readelf", "-d", path], capture_output=True, text=True, check=True).stdout
        found = [] if "libstdc++.so" in dynamic else ["no NEEDED libstdc++"]
        for cmd in (["nm", "-D", "--defined-only"], ["nm", "--defined-only"]):
            out = subprocess.run([*cmd, path], capture_output=True, text=True).stdout
            names = {line.split()[-1] for line in out.splitlines() if line.strip()}
            found += [s for s in ("__cxa_throw", "__gxx_personality_v0", "_ZSt9terminatev") if s in names]
        return found

    assert problems(ext.__file__) == []
    # The check itself tells a static libstdc++ apart.
    if shutil.which("g++"):
        src = tmp_path / "t.cpp"
        src.write_text('#include <stdexcept>\nextern "C" void f() { throw std::runtime_error("x"); }\n')
        for flags, bad in (([], False), (["-static-libstdc++"], True)):
            so = tmp_path / f"t{len(flags)}.so"
            subprocess.run(["g++", "-shared", "-fPIC", *flags, str(src), "-o", str(so)], check=True)
            assert bool(problems(str(so))) == bad


def test_many_boxes_run_in_chunks_with_the_same_results():
    """More boxes than one chunk of plans (2^14): avg equals torchvision bit for bit, max
    equals the same boxes run in two calls below the chunk size, and an error names the
    row in the whole tensor."""
    g = torch.Generator().manual_seed(7)
    x = torch.randn(2, 3, 24, 30, generator=g)
    K = (1 << 14) + 300
    xy = torch.rand(K, 2, generator=g) * torch.tensor([30.0, 24.0])
    rois = torch.cat([torch.randint(0, 2, (K, 1), generator=g).float(), xy,
                      xy + torch.rand(K, 2, generator=g) * 12], 1)
    assert torch.equal(roiops.roi_align(x, rois, 3, 1.0, 0, True), tv.roi_align(x, rois, 3, 1.0, 0, True))
    out = roiops.roi_align(x, rois, 3, 1.0, 0, True, mode="max")
    half = K // 2
    assert torch.equal(out, torch.cat([roiops.roi_align(x, rois[:half], 3, 1.0, 0, True, mode="max"),
                                       roiops.roi_align(x, rois[half:], 3, 1.0, 0, True, mode="max")]))
    bad = rois.clone()
    bad[(1 << 14) + 5] = torch.tensor([0, -46341.0, -46341.0, 2.0, 2.0])
    with config_set(check_box_values=False), pytest.raises(ValueError, match=f"row {(1 << 14) + 5}:"):
        roiops.roi_align(x, bad, 1, mode="max")


def _chunk_boxes(g: torch.Generator, K: int, dtype=torch.float32) -> torch.Tensor:
    xy = torch.rand(K, 2, generator=g, dtype=dtype) * torch.tensor([30.0, 24.0], dtype=dtype)
    return torch.cat([torch.randint(0, 2, (K, 1), generator=g).to(dtype), xy,
                      xy + torch.rand(K, 2, generator=g, dtype=dtype) * 12], 1)


def _input_grad(x: torch.Tensor, rois: torch.Tensor, grad: torch.Tensor, **kw) -> torch.Tensor:
    x = x.detach().clone().requires_grad_(True)
    roiops.roi_align(x, rois, 3, 1.0, 0, True, **kw).backward(grad)
    return x.grad


@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "cl"])
def test_many_boxes_backward_runs_in_chunks_with_the_same_results(channels_last):
    """Backward over more boxes than one chunk of plans carries each cell's sum on from
    chunk to chunk in box order: avg equals torchvision bit for bit, float16 equals the
    float32 gradient rounded once (its sums run on in float32 across chunks), and max
    equals the sum of single-chunk calls on thirds of the boxes."""
    g = torch.Generator().manual_seed(9)
    K = (1 << 14) * 2 + 300  # three chunks
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    x = torch.randn(2, 3, 24, 30, generator=g).contiguous(memory_format=fmt)
    rois = _chunk_boxes(g, K)
    grad = torch.randn(K, 3, 3, 3, generator=g)
    xt = x.detach().clone().requires_grad_(True)
    tv.roi_align(xt, rois, 3, 1.0, 0, True).backward(grad)
    got = _input_grad(x, rois, grad)
    assert got.is_contiguous(memory_format=fmt)
    assert torch.equal(got, xt.grad)
    half = _input_grad(x.half(), rois.half().float(), grad.half())
    assert half.dtype == torch.float16 and half.is_contiguous(memory_format=fmt)
    assert torch.equal(half, _input_grad(x.half().float(), rois.half().float(), grad.half().float()).half())
    x64, rois64 = x.double(), _chunk_boxes(g, K, torch.float64)
    out, am = OPS.roi_align_max(x64, rois64, 1.0, 3, 3, 2, True)
    grad64 = torch.randn(out.shape, generator=g, dtype=torch.float64)
    got = OPS._roi_align_max_backward(grad64, am, rois64, 1.0, 3, 3, 2, 3, 24, 30, 2, True, channels_last)
    parts = [OPS._roi_align_max_backward(grad64[s], am[s], rois64[s], 1.0, 3, 3, 2, 3, 24, 30, 2, True,
                                         channels_last)
             for s in (slice(0, K // 3), slice(K // 3, 2 * K // 3), slice(2 * K // 3, K))]
    torch.testing.assert_close(got, sum(parts), **tol(torch.float64))


def test_max_backward_beyond_the_sample_table_budget():
    """Max-mode backward whose per-sample tables would pass their budget (2^22 entries):
    the boxes past it look their taps up in the axis plans, with the same result."""
    g = torch.Generator().manual_seed(8)
    x = torch.randn(1, 2, 20, 20, generator=g, dtype=torch.float64)  # float64: sums of thousands of terms
    K = 1500  # 1500 boxes x 196 bins x 16 samples = 4.7M entries
    xy = torch.rand(K, 2, generator=g, dtype=torch.float64) * 16
    rois = torch.cat([torch.zeros(K, 1, dtype=torch.float64), xy,
                      xy + 1 + torch.rand(K, 2, generator=g, dtype=torch.float64) * 6], 1)
    out, am = OPS.roi_align_max(x, rois, 1.0, 14, 14, 4, True)
    grad = torch.randn(out.shape, generator=g, dtype=torch.float64)
    got = OPS._roi_align_max_backward(grad, am, rois, 1.0, 14, 14, 1, 2, 20, 20, 4, True, False)
    want = ref.roi_align_max_backward(grad, am, rois, 1.0, 14, 14, 1, 2, 20, 20, 4, True, False)
    torch.testing.assert_close(got, want, **tol(torch.float64))


# Rows (batch_index, x1, y1, x2, y2[, angle]) for 2 images at spatial_scale 1/16, with the
# first invalid (row, column): a batch index that is not an integer in [0, 2), a coordinate
# that is not finite or beyond 2^24 cells after the scale, an angle that is not finite.
BAD_ROWS = [
    ([[0, 1, 1, 9, 9], [1, 2, 2, 8, 8]], (-1, -1)),
    ([[0, 1, 1, 9, 9], [2, 2, 2, 8, 8]], (1, 0)),
    ([[0, 1, 1, 9, 9], [-1, 2, 2, 8, 8]], (1, 0)),
    ([[0.5, 1, 1, 9, 9]], (0, 0)),
    ([[float("nan"), 1, 1, 9, 9]], (0, 0)),
    ([[0, 1, 1, 9, 9], [1, 2, float("inf"), 8, 8], [7, 0, 0, 1, 1]], (1, 2)),
    ([[1, 2, 2, 8, float("nan")]], (0, 4)),
    ([[0, 1, 1, 2.0**28, 9]], (-1, -1)),  # 2^24 cells after 1/16: allowed
    ([[0, 1, 1, 2.0**28 + 2**5, 9]], (0, 3)),
    ([[0, 1, 1, 9, 9, 0.5], [1, 1, 1, 9, 9, float("-inf")]], (1, 5)),
    ([[0, 1, 1, 9, 9, float("nan")], [1, 1, 1, 1e30, 9, 0]], (0, 5)),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("rows, want", BAD_ROWS)
def test_row_scan_and_tensor_check_agree(rows, want, dtype):
    """The validation layer scans CPU boxes with the C++ kernels' own check; on other
    devices it runs the same rule in tensor ops. Both find the same first invalid value."""
    from roiops import _library, _validation as v
    rois = torch.tensor(rows, dtype=torch.float64).to(dtype)
    assert tuple(_library.first_invalid(rois, 2, 1 / 16)) == want
    assert v._first_invalid(rois, 2, 1 / 16) == want
    first5 = rois[:, :5].t().contiguous().t()  # strided rows
    assert tuple(_library.first_invalid(first5, 2, 1 / 16)) == v._first_invalid(first5, 2, 1 / 16)


def test_row_check_computes_in_the_boxes_type():
    """x * scale in float32 for float32 boxes, as the kernels compute it: 167772160 * 0.1f
    rounds to 2^24 (allowed), though 0.1f is a little more than 0.1; the next float32
    coordinate gives 16777218 (refused)."""
    from roiops import _library, _validation as v
    for x1, want in ((167772160.0, (-1, -1)), (167772176.0, (0, 1))):
        rois = torch.tensor([[0, x1, 1, 2, 2]], dtype=torch.float32)
        assert tuple(_library.first_invalid(rois, 1, 0.1)) == want
        assert v._first_invalid(rois, 1, 0.1) == want


def test_direct_rotated_call_names_the_angle():
    rois = torch.tensor([[0, 4.0, 4, 2, 2, 0], [0, 4.0, 4, 2, 2, float("inf")]])
    with pytest.raises(ValueError, match="rois row 1 has angle inf, which is not finite"):
        OPS.roi_align_rotated(torch.randn(1, 2, 8, 8), rois, 1.0, 2, 2, 0, True)


def test_box_check_under_functorch_transforms():
    """Boxes without readable storage (torch.func) are checked with tensor ops."""
    x = torch.randn(1, 2, 8, 8)
    grad = torch.func.grad(lambda b: roiops.roi_align(x, b, 2, 1.0).sum())(torch.tensor([[0, 1.0, 1, 5, 5]]))
    assert grad.shape == (1, 5)
    with pytest.raises(ValueError, match=r"boxes row 0\b.*batch index( 3.0)? is not an integer"):
        torch.func.grad(lambda b: roiops.roi_align(x, b, 2, 1.0).sum())(torch.tensor([[3, 1.0, 1, 5, 5]]))


@pytest.mark.parametrize("rows, want", [r for r in BAD_ROWS if r[1][0] >= 0])
def test_box_errors_are_the_same_without_the_row_scan(rows, want, monkeypatch):
    from roiops import _validation as v
    assert v._row_scan() is not None, "the C++ row check did not load"
    x = torch.randn(2, 4, 8, 8)
    rois = torch.tensor(rows, dtype=torch.float32)
    call = ((lambda: roiops.roi_align_rotated(x, rois, 2, 1 / 16, angle="radians")) if rois.shape[1] == 6 else
            (lambda: roiops.roi_align(x, rois, 2, 1 / 16)))
    with pytest.raises(ValueError, match=rf"boxes row {want[0]} ") as scanned:
        call()
    monkeypatch.setattr(v, "_row_scan", lambda: None)
    with pytest.raises(ValueError) as in_tensor_ops:
        call()
    assert str(scanned.value) == str(in_tensor_ops.value)
