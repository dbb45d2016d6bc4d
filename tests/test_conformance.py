"""The peers' published test vectors (../shared/conformance/peer_vectors.json: mmcv,
detectron2, ONNX, onnxruntime), run through roiops' public functions on every kernel set.

An entry names the peer's op: the roiops operator of that name (roiops.ops.SPECS; ONNX's
RoiAlign and mmcv's DeformRoIPoolPack with zero offsets are roi_align) runs it, with the
peer's parameters as its options (sampling ratio, offset, pool mode, the rotated boxes'
angle unit and direction, mmcv's RoIPool convention). Entries whose semantics are not ours
(other ops, ONNX's max-mode rule, SUSPECT ones) are skipped with the reason; the whole
file skips when ../shared is absent.
"""

import inspect
import json
from pathlib import Path

import pytest
import torch

import roiops
from cases import Case
from roiops._boxes import AXIS_ALIGNED, ROTATED
from roiops.ops import SPECS

F64 = torch.float64
OPS = {spec.name: spec for spec in SPECS}
# Peers' ops that are one of ours: (our op, options the peer's parameters do not give).
ALIASES = {
    # mmcv's Pack layer, its offset head zero at first: the pooling without an offset.
    "deform_roi_pool_pack": ("deform_roi_pool", {"offset": None}),
    "onnx_RoiAlign": ("roi_align", {}),
}


def t(values, dtype=F64):
    return torch.tensor(values, dtype=dtype)

PEER_PATH = Path(__file__).resolve().parents[2] / "shared" / "conformance" / "peer_vectors.json"


def _peer_params():
    if not PEER_PATH.exists():
        return [pytest.param(None, None, id="peer-vectors-missing")]
    entries = json.loads(PEER_PATH.read_text())
    return [pytest.param(i, e, id=f"{i}-{e['op']}-{e['case_index']}") for i, e in enumerate(entries)]


def _options(spec, e, fixed):
    """The option sets (keyword arguments of spec.function) to run an entry with: the
    peer's parameters as far as the function takes them."""
    p, options = e["params"], dict(fixed)
    if "sampling_ratio" in p:
        options["sampling_ratio"] = p["sampling_ratio"]
    if "num_samples" in p:  # mmcv's RiRoIAlignRotated
        options["sampling_ratio"] = p["num_samples"]
    if "num_orientations" in p:
        options["num_orientations"] = p["num_orientations"]
    if isinstance(p.get("aligned"), bool):  # detectron2's rotated boxes: "always" (our default)
        options["aligned"] = p["aligned"]
    if "pool_mode" in p:
        options["mode"] = p["pool_mode"]
    if "opset" in p:  # ONNX: half_pixel = aligned=True; output_half_pixel (and opset 10, no attribute) = False
        options["aligned"] = p.get("coordinate_transformation_mode") == "half_pixel"
    if "clockwise" in p:
        options["clockwise"] = bool(p["clockwise"])
    taken = inspect.signature(spec.function).parameters
    if "angle" in taken and "roi_format" in p:  # mmcv: radians; detectron2: degrees
        options["angle"] = "degrees" if "DEGREES" in p["roi_format"] else "radians"
    if p.get("rois_requires_grad"):
        options |= spec.box_grad
    unknown = set(options) - set(taken)
    assert not unknown, f"{spec.name} takes no {unknown}"
    if "mmcv" in p.get("semantics", ""):
        # mmcv's RoIPool convention is mmdetection's continuous one; on these integer boxes
        # the Caffe convention gives the same numbers (the entry's crosscheck), so check both.
        return [options | {"convention": "mmdet"}, options]
    return [options]


def _peer_plan(e):
    """How to run an entry with our ops: (kind, specs, option sets), or ("skip", reason)."""
    op, p, notes = e["op"], e["params"], e["notes"]
    if "SUSPECT" in notes:
        return "skip", "marked SUSPECT in its notes"
    if op.endswith("_grad") and "_vs_" in op:  # two ops that must agree, forward and backward
        names = op[:-len("_grad")].split("_vs_")
        if all(name in OPS for name in names):
            return "versus", [OPS[name] for name in names], None
    name, fixed = ALIASES.get(op, (op, {}))
    if name not in OPS:
        return "skip", f"{op} is not an roiops op"
    spec = OPS[name]
    if op == "onnx_RoiAlign" and p["mode"] != "avg":
        return "skip", f"ONNX max-mode rule ({p.get('max_mode_semantics') or 'max of weighted corners'}), not roiops' max mode"
    numeric = isinstance(e["input"], list) and isinstance(e["expected_output"], list)
    if not numeric:
        for kind in ("empty_box", "empty_batch"):
            if f"test_{kind}" in notes:
                return kind, [spec], _options(spec, e, fixed)
        return "skip", "no hard-coded input/expected output"
    return "values", [spec], _options(spec, e, fixed)


def _peer_tolerance(e):
    p = e["params"]
    if "atol" in p:
        return {"rtol": 0.0, "atol": p["atol"]}
    if "rtol" in p:  # np.allclose(out, expected, rtol): default atol 1e-8
        return {"rtol": p["rtol"], "atol": 1e-8}
    if "allclose" in str(p.get("comparison", "")):  # np/torch.allclose defaults
        return {"rtol": 1e-5, "atol": 1e-8}
    # ONNX / onnxruntime: expected values are printed to 4 decimals (notes: "atol ~1e-4").
    return {"rtol": 0.0, "atol": 1e-4}


@pytest.mark.parametrize("backend", ["reference", "cpu", "triton"])
@pytest.mark.parametrize("index,entry", _peer_params())
def test_peer_vectors(index, entry, backend):
    """Every kernel set, through the public functions, against the peers' published numbers."""
    if entry is None:
        pytest.skip(f"{PEER_PATH} not found (shared conformance vectors are not checked out)")
    kind, *plan = _peer_plan(entry)
    if kind == "skip":
        pytest.skip(f"peer vector {index}: {plan[0]}")
    specs, option_sets = plan
    p = entry["params"]
    ph, pw = p["output_size"] if "output_size" in p else (p["output_height"], p["output_width"])
    scale = p["spatial_scale"]
    if kind in ("empty_box", "empty_batch"):
        # Property tests: a zero-size box gives zeros and a zero gradient; an empty batch
        # gives an empty result.
        (spec,) = specs
        if kind == "empty_box":
            x, rois = torch.rand(1, 1, 5, 5, generator=torch.Generator().manual_seed(7), dtype=F64), t(entry["rois"])
        else:
            x = torch.zeros(0, 3, 10, 10, dtype=F64)
            rois = torch.zeros(0, spec.boxes.width, dtype=F64)
        for options in option_sets:
            xg = x.clone().requires_grad_()
            with roiops.use_backend(backend):
                out = Case(spec.name, spec, options)(xg, rois, (ph, pw), scale)
                grad = torch.autograd.grad(out.sum(), xg)[0]
            assert out.shape == (len(rois), x.shape[1], ph, pw) and not out.any()
            assert grad.shape == x.shape and not grad.any()
        return
    if kind == "versus":
        # detectron2: rotated boxes at angle 0 have roi_align(aligned=True)'s output and
        # gradient on the axis-aligned boxes, at its test's scale/sampling and its gradcheck's.
        x = torch.rand(1, 1, 10, 10, generator=torch.Generator().manual_seed(7), dtype=F64)
        rois = {ROTATED: t(entry["rois"]["rotated"]), AXIS_ALIGNED: t(entry["rois"]["axis_aligned"])}
        for scale, sr in ((p["spatial_scale"], p["sampling_ratio"]), (0.5, 1)):
            results = []
            for spec in specs:
                xs = x.clone().requires_grad_()
                with roiops.use_backend(backend):
                    out = spec.function(xs, rois[spec.boxes], (ph, pw), scale, sampling_ratio=sr, aligned=True)
                    (out * out).sum().backward()
                results.append((out, xs.grad))
            (out_a, grad_a), (out_b, grad_b) = results
            torch.testing.assert_close(out_a, out_b, rtol=1e-12, atol=1e-12)
            torch.testing.assert_close(grad_a, grad_b, rtol=1e-12, atol=1e-12)
        return

    (spec,) = specs
    tol = _peer_tolerance(entry)
    for dtype in (torch.float32, F64):
        x = t(entry["input"], dtype)
        expected = t(entry["expected_output"], dtype)
        expected_grad = t(entry["expected_grad"], dtype) if isinstance(entry["expected_grad"], list) else None
        rois_grad = bool(p.get("rois_requires_grad"))  # mmcv's test also differentiates with respect to the boxes
        for options in option_sets:
            xg = x.clone().requires_grad_()
            rois = t(entry["rois"], dtype).requires_grad_(rois_grad)
            with roiops.use_backend(backend):
                out = Case(spec.name, spec, options)(xg, rois, (ph, pw), scale)
                grads = torch.autograd.grad(out.sum(), (xg, rois) if rois_grad else (xg,))
            torch.testing.assert_close(out, expected, **tol)
            if expected_grad is not None:
                torch.testing.assert_close(grads[0], expected_grad, **tol)
            if rois_grad:
                torch.testing.assert_close(grads[1], t(entry["expected_rois_grad"], dtype), **tol)
