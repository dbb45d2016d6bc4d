"""The point-cloud ops (points_in_boxes, RoIAwarePool3d, RoIPointPool3d): every backend
against a brute force written here from docs/semantics.md (Python loops over numpy scalars,
each rounding step of the definition in the coordinates' type), mmcv's published test
values through the drop-ins, gradients (gradcheck in float64), errors, compile and export."""

from __future__ import annotations

import importlib.util
import io
import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import roiops
import roiops.reference as reference
from roiops._boxes import LIDAR
from roiops.compat import mmcv

BACKENDS = ["cpu", "reference", "triton"]


def _device(backend: str) -> str:
    return "cuda" if backend == "triton" and torch.cuda.is_available() else "cpu"


def _skip_without(backend: str) -> None:
    if backend == "triton" and importlib.util.find_spec("roiops.triton.roiaware_pool3d") is None:
        pytest.skip("no Triton kernels for the point-cloud ops")


# ---- the brute force: one point and one box at a time


def _np(dtype: torch.dtype) -> type:
    return np.float64 if dtype == torch.float64 else np.float32


def bf_local(p, b, T) -> tuple[bool, object, object]:
    """(inside, lx, ly) of point p in box b, in numpy type T."""
    x, y, z, dx, dy, dz, yaw = (T(v) for v in b)
    zc = T(np.float64(z) + np.float64(dz) / 2)
    px, py, pz = (T(v) for v in p)
    if abs(pz - zc) > dz / T(2):
        return False, T(0), T(0)
    c, s = T(np.cos(-np.float64(yaw))), T(np.sin(-np.float64(yaw)))
    sx, sy = px - x, py - y
    lx, ly = sx * c + sy * -s, sx * s + sy * c
    return bool(-dx / T(2) < lx < dx / T(2) and -dy / T(2) < ly < dy / T(2)), lx, ly


def bf_voxel(p, b, lx, ly, grid, T) -> int:
    def cell(q, n):
        q = float(q)
        return 0 if math.isnan(q) else int(min(max(math.trunc(q), 0), n - 1))

    (ox, oy, oz), dx, dy, dz = grid, T(b[3]), T(b[4]), T(b[5])
    ix = cell((lx + dx / T(2)) / (dx / T(ox)), ox)
    iy = cell((ly + dy / T(2)) / (dy / T(oy)), oy)
    iz = cell((T(p[2]) - T(b[2])) / (dz / T(oz)), oz)
    return (ix * oy + iy) * oz + iz


def bf_points_in_boxes(points: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
    T = _np(points.dtype)
    out = torch.zeros(points.shape[0], points.shape[1], boxes.shape[1], dtype=torch.bool)
    for b in range(points.shape[0]):
        for n, p in enumerate(points[b].tolist()):
            for m, box in enumerate(boxes[b].tolist()):
                out[b, n, m] = bf_local(p, box, T)[0]
    return out


def bf_roiaware(points, features, boxes, grid, cap, max_mode) -> tuple[torch.Tensor, torch.Tensor]:
    T, A = _np(points.dtype), _np(features.dtype)
    K, C, V = boxes.shape[0], features.shape[1], grid[0] * grid[1] * grid[2]
    out = torch.zeros(K, V, C, dtype=torch.float64)
    arg = torch.full((K, V, C), -1, dtype=torch.int32)
    feats = features.double().tolist()
    for k, box in enumerate(boxes.tolist()):
        members: dict[int, list[int]] = {}
        for n, p in enumerate(points.tolist()):
            inside, lx, ly = bf_local(p, box, T)
            if inside:
                kept = members.setdefault(bf_voxel(p, box, lx, ly, grid, T), [])
                if len(kept) < cap:
                    kept.append(n)
        for v, kept in members.items():
            for c in range(C):
                if max_mode:
                    best, who = -math.inf, -1
                    for n in kept:
                        if A(feats[n][c]) > best:
                            best, who = A(feats[n][c]), n
                    out[k, v, c], arg[k, v, c] = (float(best), who) if who >= 0 else (0.0, -1)
                else:
                    total = A(0)
                    for n in kept:
                        total = total + A(feats[n][c])
                    out[k, v, c] = float(total / A(len(kept)))
    return out.reshape(K, *grid, C).to(features.dtype), arg.reshape(K, *grid, C)


def bf_roipoint(points, features, boxes, S) -> tuple[torch.Tensor, torch.Tensor]:
    inside = bf_points_in_boxes(points, boxes)
    B, N, _ = points.shape
    pooled = torch.zeros(B, boxes.shape[1], S, 3 + features.shape[-1], dtype=points.dtype)
    empty = torch.zeros(B, boxes.shape[1], dtype=torch.bool)
    for b in range(B):
        for m in range(boxes.shape[1]):
            first = [n for n in range(N) if inside[b, n, m]][:S]
            empty[b, m] = not first
            for j in range(S if first else 0):
                n = first[j % len(first)]
                pooled[b, m, j] = torch.cat([points[b, n], features[b, n]])
    return pooled, empty


def scene(points: int, boxes: int, seed: int, dtype: torch.dtype = torch.float32,
          batch: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """A street scene (LIDAR.scene) plus points exactly on faces of an unrotated box and a
    box of zero size."""
    pts, bxs = LIDAR.scene(batch, points, boxes, torch.Generator().manual_seed(seed))
    pts, bxs = pts.to(dtype), bxs.to(dtype)
    bxs[:, 0] = torch.tensor([10.0, 5.0, -1.0, 4.0, 2.0, 2.0, 0.0], dtype=dtype)
    if boxes > 1:
        bxs[:, 1] = torch.tensor([10.0, 5.0, -1.0, 0.0, 2.0, 2.0, 0.3], dtype=dtype)
    faces = torch.tensor([[12.0, 5.0, 0.0], [8.0, 5.0, 0.0], [10.0, 6.0, 0.0], [10.0, 4.0, 0.0], [10.0, 5.0, -1.0],
                          [10.0, 5.0, 1.0], [11.999, 5.0, 0.999], [10.0, 5.0, 0.0], [9.5, 5.5, 0.5],
                          [10.0, 5.0, 1.001]], dtype=dtype)
    pts[:, :faces.shape[0]] = faces
    return pts, bxs


# ---- mmcv's published values (mmcv's tests/test_ops), through the drop-ins

MMCV_POINTS = [[1, 2, 3.3], [1.2, 2.5, 3.0], [0.8, 2.1, 3.5], [1.6, 2.6, 3.6], [0.8, 1.2, 3.9], [-9.2, 21.0, 18.2],
               [3.8, 7.9, 6.3], [4.7, 3.5, -12.2], [3.8, 7.6, -2], [-10.6, -12.9, -20], [-16, -18, 9],
               [-21.3, -52, -5], [0, 0, 0], [6, 7, 8], [-2, -3, -4]]
MMCV_BOXES = [[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 0.3], [-10.0, 23.0, 16.0, 10, 20, 20, 0.5]]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64])
def test_mmcv_roiaware_and_roipoint_values(backend: str, dtype: torch.dtype) -> None:
    _skip_without(backend)
    dev = _device(backend)
    pts = torch.tensor(MMCV_POINTS, dtype=dtype, device=dev)
    rois = torch.tensor([[1.0, 2.0, 3.0, 5.0, 4.0, 6.0, -0.3 - np.pi / 2],
                         [-10.0, 23.0, 16.0, 20.0, 10.0, 20.0, -0.5 - np.pi / 2]], dtype=dtype, device=dev)
    with roiops.use_backend(backend):
        for mode, total in (("max", 51.100), ("avg", 49.750)):
            out = mmcv.RoIAwarePool3d(out_size=4, max_pts_per_voxel=128, mode=mode)(rois, pts, pts.clone())
            assert out.shape == (2, 4, 4, 4, 3) and out.dtype == dtype
            assert torch.allclose(out.sum().cpu(), torch.tensor(total, dtype=dtype), 1e-3)
        boxes = torch.tensor([MMCV_BOXES], dtype=dtype, device=dev)
        feat, empty = mmcv.RoIPointPool3d(num_sampled_points=4)(pts[None], pts[None].clone(), boxes)
    rows = [MMCV_POINTS[n] * 2 for n in (0, 1, 2, 3)] + [MMCV_POINTS[5] * 2] * 4
    assert torch.allclose(feat.cpu(), torch.tensor(rows, dtype=dtype).reshape(1, 2, 4, 6))
    assert empty.dtype == torch.int32 and empty.tolist() == [[0, 0]]


@pytest.mark.parametrize("backend", BACKENDS)
def test_mmcv_points_in_boxes_values(backend: str) -> None:
    _skip_without(backend)
    dev = _device(backend)
    pts = torch.tensor([MMCV_POINTS], device=dev)
    boxes = torch.tensor([MMCV_BOXES], device=dev)
    expected_all = [[1, 0]] * 5 + [[0, 1]] + [[0, 0]] * 9
    turned = torch.tensor([[[0.0, 0.0, 0.0, 1.0, 20.0, 1.0, 0.523598]]], device=dev)  # 30 degrees
    ring = torch.tensor([[[4, 6.928, 0], [6.928, 4, 0], [4, -6.928, 0], [6.928, -4, 0], [-4, 6.928, 0],
                          [-6.928, 4, 0], [-4, -6.928, 0], [-6.928, -4, 0]]], device=dev)
    with roiops.use_backend(backend):
        for fn in (mmcv.points_in_boxes_all, mmcv.points_in_boxes_cpu):
            got = fn(pts, boxes)
            assert got.dtype == torch.int32 and got.tolist() == [expected_all]
            assert fn(ring, turned).tolist() == [[[0], [0], [1], [0], [1], [0], [0], [0]]]
        pairs = torch.tensor([[MMCV_BOXES[0]], [MMCV_BOXES[1]]], device=dev)
        halves = torch.stack([pts[0, :8], torch.cat([pts[0, 8:], torch.tensor([[6.0, 4, 9]], device=dev)])])
        part = mmcv.points_in_boxes_part(halves, pairs)
        assert part.dtype == torch.int32
        assert part.tolist() == [[0, 0, 0, 0, 0, -1, -1, -1], [-1] * 8]
        assert mmcv.points_in_boxes_part(ring, turned).tolist() == [[-1, -1, 0, -1, 0, -1, -1, -1]]


# ---- every backend against the brute force


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_points_in_boxes_equal_brute_force(backend: str, dtype: torch.dtype) -> None:
    _skip_without(backend)
    pts, bxs = scene(160, 7, 1, dtype, batch=2)
    expected = bf_points_in_boxes(pts, bxs)
    dev = _device(backend)
    with roiops.use_backend(backend):
        every = roiops.points_in_boxes(pts.to(dev), bxs.to(dev), "all").cpu()
        first = roiops.points_in_boxes(pts.to(dev), bxs.to(dev)).cpu()
        single = roiops.points_in_boxes(pts[1].to(dev), bxs[1].to(dev)).cpu()
    assert torch.equal(every, expected)
    assert expected[0, :10, 0].tolist() == [False] * 4 + [True] * 5 + [False]  # strict in x and y, not in z
    assert expected.any() and not expected.all(-1).any()
    first_expected = torch.where(expected.any(-1), expected.byte().argmax(-1), -1)
    assert first.dtype == torch.int64 and torch.equal(first, first_expected)
    assert torch.equal(single, first_expected[1])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", ["max", "avg"])
@pytest.mark.parametrize("dtype,features_dtype", [(torch.float32, torch.float32), (torch.float64, torch.float64),
                                                  (torch.float32, torch.float16)])
def test_roiaware_equals_brute_force(backend: str, mode: str, dtype: torch.dtype,
                                     features_dtype: torch.dtype) -> None:
    """Including voxels over the cap (3 points), equal maxima and NaN features."""
    _skip_without(backend)
    pts, bxs = scene(240, 5, 2, dtype)
    pts, bxs = pts[0], bxs[0]
    g = torch.Generator().manual_seed(3)
    feats = torch.randint(-4, 5, (240, 4), generator=g).to(features_dtype)  # ties
    feats[::7, 1] = float("nan")
    grid = (3, 2, 4)
    expected, argmax = bf_roiaware(pts, feats, bxs, grid, 3, mode == "max")
    dev = _device(backend)
    with roiops.use_backend(backend):
        out, saved = torch.ops.roiops.roiaware_pool3d(pts.to(dev), feats.to(dev), bxs.to(dev), *grid, 3, mode == "max")
    assert out.dtype == features_dtype
    torch.testing.assert_close(out.cpu(), expected, atol=0, rtol=0 if mode == "max" else 1e-6, equal_nan=True)
    if mode == "max":
        assert torch.equal(saved.cpu(), argmax)
    assert (expected != 0).any()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_roipoint_equals_brute_force(backend: str, dtype: torch.dtype) -> None:
    _skip_without(backend)
    pts, bxs = scene(150, 6, 4, dtype, batch=2)
    bxs[1, 3] = torch.tensor([50.0, 50.0, 0.0, 1.0, 1.0, 1.0, 0.0])  # empty
    feats = torch.randn(2, 150, 5, dtype=dtype, generator=torch.Generator().manual_seed(5))
    expected, empty = bf_roipoint(pts, feats, bxs, 24)
    dev = _device(backend)
    with roiops.use_backend(backend):
        pooled, got_empty = roiops.roipoint_pool3d(pts.to(dev), feats.to(dev), bxs.to(dev), 24)
    assert torch.equal(pooled.cpu(), expected) and torch.equal(got_empty.cpu(), empty)
    assert empty[1, 3] and not empty.all()


@pytest.mark.parametrize("mode", ["max", "avg"])
def test_cpu_equals_reference_on_a_street(mode: str) -> None:
    """At bench-like sizes: the C++ kernels equal the reference (the mean's sums in point
    order in both) forward and backward."""
    pts, bxs = LIDAR.scene(1, 4000, 40, torch.Generator().manual_seed(6))
    feats = torch.randn(4000, 16, generator=torch.Generator().manual_seed(7))
    args = (pts[0], feats, bxs[0], 6, 5, 4, 5, mode == "max")
    out, saved = torch.ops.roiops.roiaware_pool3d(*args)
    with roiops.use_backend("reference"):
        expected, expected_saved = torch.ops.roiops.roiaware_pool3d(*args)
    assert torch.equal(out, expected) and torch.equal(saved, expected_saved)
    grad = torch.randn_like(out)
    got = torch.ops.roiops._roiaware_pool3d_backward(grad, saved, pts[0], bxs[0], 4000, mode == "max")
    expected_grad = reference.roiaware_pool3d_backward(grad, saved, pts[0], bxs[0], 4000, mode == "max")
    torch.testing.assert_close(got, expected_grad, atol=1e-6, rtol=1e-6)


# ---- gradients


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", ["max", "avg"])
def test_roiaware_gradcheck(backend: str, mode: str) -> None:
    _skip_without(backend)
    dev = _device(backend)
    pts, bxs = scene(200, 4, 8, torch.float64)
    feats = torch.randn(200, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(9), device="cpu")
    feats = feats.to(dev).requires_grad_()
    with roiops.use_backend(backend):
        assert torch.autograd.gradcheck(
            lambda f: roiops.roiaware_pool3d(pts[0].to(dev), f, bxs[0].to(dev), (3, 2, 2), 2, mode), (feats,),
            fast_mode=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_roipoint_gradcheck(backend: str) -> None:
    _skip_without(backend)
    dev = _device(backend)
    pts, bxs = LIDAR.scene(1, 120, 5, torch.Generator().manual_seed(10))  # no point on a face: no jump
    pts, bxs = pts.double().to(dev).requires_grad_(), bxs.double()
    feats = torch.randn(1, 120, 2, dtype=torch.float64, device=dev, requires_grad=True)
    with roiops.use_backend(backend):
        assert torch.autograd.gradcheck(lambda p, f: roiops.roipoint_pool3d(p, f, bxs.to(dev), 40)[0], (pts, feats),
                                         fast_mode=True)


# ---- edges and errors


@pytest.mark.parametrize("backend", BACKENDS)
def test_empty_inputs(backend: str) -> None:
    _skip_without(backend)
    dev = _device(backend)
    none3, none7 = torch.zeros(0, 3, device=dev), torch.zeros(0, 7, device=dev)
    pts, bxs = (t.to(dev) for t in scene(50, 3, 11))
    far = torch.tensor([[900.0, 900.0, 0.0, 1.0, 1.0, 1.0, 0.0]], device=dev)
    with roiops.use_backend(backend):
        assert roiops.points_in_boxes(none3, none7).shape == (0,)
        assert roiops.points_in_boxes(pts, bxs[:, :0], "all").shape == (1, 50, 0)
        assert roiops.roiaware_pool3d(none3, torch.zeros(0, 4, device=dev), bxs[0], 2).abs().sum() == 0
        assert roiops.roiaware_pool3d(pts[0], torch.ones(50, 4, device=dev), none7, 2).shape == (0, 2, 2, 2, 4)
        assert roiops.roiaware_pool3d(pts[0], torch.ones(50, 4, device=dev), far, 2, mode="avg").abs().sum() == 0
        pooled, empty = roiops.roipoint_pool3d(pts, torch.ones(1, 50, 0, device=dev), far[None], 3)
        assert pooled.shape == (1, 1, 3, 3) and pooled.abs().sum() == 0 and empty.tolist() == [[True]]
        pooled, empty = roiops.roipoint_pool3d(none3[None], torch.zeros(1, 0, 2, device=dev), bxs, 3)
        assert pooled.shape == (1, 3, 3, 5) and pooled.abs().sum() == 0 and empty.all()
        f = torch.ones(50, 2, device=dev, requires_grad=True)
        roiops.roiaware_pool3d(pts[0], f, far, 2).sum().backward()
        assert f.grad is not None and f.grad.abs().sum() == 0


def test_errors() -> None:
    pts, bxs = scene(20, 2, 12)
    feats = torch.randn(20, 4)
    cases = [
        (lambda: roiops.points_in_boxes(pts, bxs[0]), ValueError, "boxes must have shape \\[B, M, 7\\]"),
        (lambda: roiops.points_in_boxes(pts, torch.cat([bxs, bxs])), ValueError, "batch size 2 but points has 1"),
        (lambda: roiops.points_in_boxes(pts[..., :2], bxs), ValueError, "points must have shape"),
        (lambda: roiops.points_in_boxes(pts.int(), bxs), ValueError, "points must be floating point \\(float16"),
        (lambda: roiops.points_in_boxes(pts, bxs, "some"), ValueError, "mode"),
        (lambda: roiops.roiaware_pool3d(pts[0], feats, bxs[0], 0), ValueError, "out_size must be"),
        (lambda: roiops.roiaware_pool3d(pts[0], feats, bxs[0], (2, 2)), ValueError, "out_size must be"),
        (lambda: roiops.roiaware_pool3d(pts[0], feats, bxs[0], 2000), ValueError, "out_size must be"),
        (lambda: roiops.roiaware_pool3d(pts[0], feats, bxs[0], 2, max_points=0), ValueError, "max_points"),
        (lambda: roiops.roiaware_pool3d(pts[0], feats[:5], bxs[0], 2), ValueError, "features must have shape"),
        (lambda: roiops.roipoint_pool3d(pts, feats[None], bxs, 0), ValueError, "num_samples"),
        (lambda: mmcv.RoIAwarePool3d(4, max_pts_per_voxel=1), ValueError, "at least 2"),
        (lambda: mmcv.RoIAwarePool3d(300), ValueError, "at most 256"),
    ]
    nan_points = pts.clone()
    nan_points[0, 3, 1] = float("nan")
    cases.append((lambda: roiops.points_in_boxes(nan_points, bxs), ValueError, "points\\[0\\] row 3 .* finite"))
    bad_boxes = bxs.clone()
    bad_boxes[0, 1, 4] = -1.0
    cases.append((lambda: roiops.roipoint_pool3d(pts, feats[None], bad_boxes), ValueError,
                  "boxes\\[0\\] row 1 .* sizes"))
    inf_boxes = bxs[0].clone()
    inf_boxes[0, 6] = float("inf")
    cases.append((lambda: roiops.roiaware_pool3d(pts[0], feats, inf_boxes, 2), ValueError, "boxes row 0 .* finite"))
    for call, error, message in cases:
        with pytest.raises(error, match=message):
            call()


@pytest.mark.parametrize("backend", ["cpu", "reference"])
def test_kernel_checks_agree(backend: str) -> None:
    """A direct op call with bad arguments: the same ValueError from every backend."""
    pts, bxs = scene(20, 2, 13)
    feats = torch.randn(20, 4)
    calls = [
        (lambda: torch.ops.roiops.points_in_boxes(pts[0], bxs, False), "points must be \\[B, N, 3\\]"),
        (lambda: torch.ops.roiops.points_in_boxes(pts, bxs.double(), False), "boxes must have the points' dtype"),
        (lambda: torch.ops.roiops.roiaware_pool3d(pts[0], feats, bxs[0], 2, 0, 2, 4, True), "out_y must be in"),
        (lambda: torch.ops.roiops.roiaware_pool3d(pts[0], feats, bxs[0], 2, 2, 2, 0, True), "max_points must be in"),
        (lambda: torch.ops.roiops.roipoint_pool3d(pts, feats[None].double(), bxs, 4), "features must have the points'"),
        (lambda: torch.ops.roiops.roipoint_pool3d(pts, feats[None], bxs, 0), "num_samples must be in"),
    ]
    with roiops.use_backend(backend):
        for call, message in calls:
            with pytest.raises(ValueError, match="roiops: " + message):
                call()


def test_compile_export_and_opcheck() -> None:
    class Head(torch.nn.Module):
        def forward(self, points: torch.Tensor, features: torch.Tensor, boxes: torch.Tensor) -> tuple:
            voxels = roiops.roiaware_pool3d(points[0], features[0], boxes[0], 3, 4, "avg")
            pooled, empty = roiops.roipoint_pool3d(points, features, boxes, 8)
            return voxels, pooled, empty, roiops.points_in_boxes(points, boxes)

    pts, bxs = scene(60, 4, 14)
    feats = torch.randn(1, 60, 3)
    expected = Head()(pts, feats, bxs)
    compiled = torch.compile(Head(), fullgraph=True, backend="eager")(pts, feats, bxs)
    exported = torch.export.export(Head(), (pts, feats, bxs)).module()(pts, feats, bxs)
    for got in (compiled, exported):
        assert all(torch.equal(a, b) for a, b in zip(got, expected))
    f = feats[0].double().requires_grad_()
    for args in [(pts[0].double(), f, bxs[0].double(), 2, 3, 2, 4, True),
                 (pts[0].double(), f, bxs[0].double(), 2, 3, 2, 4, False)]:
        torch.library.opcheck(torch.ops.roiops.roiaware_pool3d.default, args)
    torch.library.opcheck(torch.ops.roiops.roipoint_pool3d.default,
                          (pts.double().requires_grad_(), feats.double().requires_grad_(), bxs.double(), 5))
    torch.library.opcheck(torch.ops.roiops.points_in_boxes.default, (pts, bxs, True))


def test_modules() -> None:
    pts, bxs = scene(80, 3, 15)
    feats = torch.randn(80, 2)
    pool = roiops.RoIAwarePool3d((2, 3, 4), max_points=5, mode="avg")
    assert repr(pool) == "RoIAwarePool3d(out_size=(2, 3, 4), max_points=5, mode='avg')"
    assert torch.equal(pool(pts[0], feats, bxs[0]), roiops.roiaware_pool3d(pts[0], feats, bxs[0], (2, 3, 4), 5, "avg"))
    sample = roiops.RoIPointPool3d(6)
    assert all(torch.equal(a, b) for a, b in zip(sample(pts, feats[None], bxs),
                                                 roiops.roipoint_pool3d(pts, feats[None], bxs, 6)))
    assert torch.equal(roiops.PointsInBoxes("all")(pts, bxs), roiops.points_in_boxes(pts, bxs, "all"))


_FUZZ = dict(derandomize=True, database=None, deadline=None, max_examples=40,
             suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@settings(**_FUZZ)
@given(n=st.integers(0, 60), k=st.integers(0, 5), grid=st.tuples(*[st.integers(1, 4)] * 3), cap=st.integers(1, 4),
       seed=st.integers(0, 2**16), size=st.floats(0.0, 3.0), max_mode=st.booleans(), double=st.booleans())
def test_fuzz_cpu_against_reference(n, k, grid, cap, seed, size, max_mode, double) -> None:
    """Small clouds packed into few boxes (crowded voxels, points on faces) on a 0.25 lattice."""
    g = torch.Generator().manual_seed(seed)
    dtype = torch.float64 if double else torch.float32
    pts = (torch.randint(-8, 9, (n, 3), generator=g) / 4).to(dtype)
    bxs = torch.cat([torch.randint(-4, 5, (k, 3), generator=g) / 4, size * torch.rand(k, 3, generator=g) + 0.25,
                     torch.randint(-4, 5, (k, 1), generator=g) * (math.pi / 4)], 1).to(dtype)
    feats = torch.randint(-3, 4, (n, 2), generator=g).to(dtype)
    args = (pts, feats, bxs, *grid, cap, max_mode)
    with roiops.use_backend("reference"):
        expected = torch.ops.roiops.roiaware_pool3d(*args)
        expected_first = torch.ops.roiops.points_in_boxes(pts[None], bxs[None], False)
        expected_rows = torch.ops.roiops.roipoint_pool3d(pts[None], feats[None], bxs[None], cap + 1)
    assert all(torch.equal(a, b) for a, b in zip(torch.ops.roiops.roiaware_pool3d(*args), expected))
    assert torch.equal(torch.ops.roiops.points_in_boxes(pts[None], bxs[None], False), expected_first)
    got_rows = torch.ops.roiops.roipoint_pool3d(pts[None], feats[None], bxs[None], cap + 1)
    assert all(torch.equal(a, b) for a, b in zip(got_rows, expected_rows))


@pytest.mark.parametrize("fn, args", [(roiops.points_in_boxes, ()), (mmcv.points_in_boxes_part, ()),
                                      (mmcv.points_in_boxes_all, ()), (mmcv.points_in_boxes_cpu, ())])
def test_functions_are_one_fx_node(fn, args) -> None:
    """torch.fx records each point-cloud function whole, as the RoI functions (a leaf)."""
    class Call(torch.nn.Module):
        def forward(self, points: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
            return fn(points, boxes, *args)

    traced = torch.fx.symbolic_trace(Call())
    assert [n.target for n in traced.graph.nodes if n.op == "call_function"] == [fn]
    pts, bxs = scene(40, 3, 16)
    assert torch.equal(traced(pts, bxs), Call()(pts, bxs))


@pytest.mark.parametrize("make", [lambda: roiops.RoIAwarePool3d(3, 4, "avg"), lambda: roiops.RoIPointPool3d(5),
                                  lambda: mmcv.RoIAwarePool3d(3, 5, "max"), lambda: mmcv.RoIPointPool3d(5),
                                  lambda: roiops.PointsInBoxes("all")])
def test_modules_save_load_and_compile(make) -> None:
    module = make()
    pts, bxs = scene(50, 3, 17)
    feats = torch.randn(1, 50, 2)
    if isinstance(module, mmcv.RoIAwarePool3d):
        args = (bxs[0], pts[0], feats[0])
    elif isinstance(module, roiops.RoIAwarePool3d):
        args = (pts[0], feats[0], bxs[0])
    elif isinstance(module, roiops.PointsInBoxes):
        args = (pts, bxs)
    else:
        args = (pts, feats, bxs)
    expected = module(*args)
    buffer = io.BytesIO()
    torch.save(module, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    assert repr(loaded) == repr(module)
    for got in (loaded(*args), torch.compile(module, fullgraph=True, backend="eager")(*args)):
        got, want = (got, expected) if isinstance(got, tuple) else ((got,), (expected,))
        assert all(torch.equal(a, b) for a, b in zip(got, want))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the compiled Triton kernels need a GPU (the interpreter "
                    "runs them above at small sizes)")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_triton_equals_cpu_at_bench_sizes(dtype: torch.dtype) -> None:
    """PartA2's and PointRCNN's sizes: the compiled kernels give the C++ kernels' bits, forward
    and backward (the float64 trig can differ from libm's in the last bit, which moves no point
    of these scenes)."""
    pts, bxs = (t.to(dtype) for t in LIDAR.scene(1, 16384, 128, torch.Generator().manual_seed(18)))
    feats = torch.randn(16384, 16, generator=torch.Generator().manual_seed(19), dtype=dtype)
    for max_mode in (True, False):
        args = (pts[0], feats, bxs[0], 14, 14, 14, 128, max_mode)
        out, saved = torch.ops.roiops.roiaware_pool3d(*args)
        grad = torch.randn_like(out)
        gf = torch.ops.roiops._roiaware_pool3d_backward(grad, saved, pts[0], bxs[0], 16384, max_mode)
        with roiops.use_backend("triton"):
            t_out, t_saved = torch.ops.roiops.roiaware_pool3d(*(a.cuda() if isinstance(a, torch.Tensor) else a
                                                                for a in args))
            t_gf = torch.ops.roiops._roiaware_pool3d_backward(grad.cuda(), t_saved, pts[0].cuda(), bxs[0].cuda(),
                                                             16384, max_mode)
        assert torch.equal(t_out.cpu(), out) and torch.equal(t_saved.cpu(), saved) and torch.equal(t_gf.cpu(), gf)
    rows, empty, index = torch.ops.roiops.roipoint_pool3d(pts, feats[None], bxs, 512)
    with roiops.use_backend("triton"):
        t_rows, t_empty, t_index = torch.ops.roiops.roipoint_pool3d(pts.cuda(), feats[None].cuda(), bxs.cuda(), 512)
        t_first = torch.ops.roiops.points_in_boxes(pts.cuda(), bxs.cuda(), False)
    assert torch.equal(t_rows.cpu(), rows) and torch.equal(t_empty.cpu(), empty) and torch.equal(t_index.cpu(), index)
    assert torch.equal(t_first.cpu(), torch.ops.roiops.points_in_boxes(pts, bxs, False))
