"""The peers' published test vectors (../shared/conformance/peer_vectors.json: mmcv,
detectron2, ONNX, onnxruntime), run through the registered ops on every kernel set.

Rotated boxes run through roi_align_rotated with each peer's angle unit and offset.
Entries whose semantics are not ours (other ops, ONNX's max-mode rule, SUSPECT ones) are
skipped with the reason; the whole file skips when ../shared is absent.
"""

import json
import math
from pathlib import Path

import pytest
import torch

import roiops

F64 = torch.float64


def t(values, dtype=F64):
    return torch.tensor(values, dtype=dtype)

PEER_PATH = Path(__file__).resolve().parents[2] / "shared" / "conformance" / "peer_vectors.json"


def _peer_params():
    if not PEER_PATH.exists():
        return [pytest.param(None, None, id="peer-vectors-missing")]
    entries = json.loads(PEER_PATH.read_text())
    return [pytest.param(i, e, id=f"{i}-{e['op']}-{e['case_index']}") for i, e in enumerate(entries)]


def _peer_plan(e):
    """How to run an entry with our ops: (kind, settings), or ("skip", reason)."""
    op, p, notes = e["op"], e["params"], e["notes"]
    if "SUSPECT" in notes:
        return "skip", "marked SUSPECT in its notes"
    numeric = isinstance(e["input"], list) and isinstance(e["expected_output"], list)
    if op == "roi_align" and "test_empty_box" in notes:
        return "empty_box", {}
    if op == "roi_align" and "test_empty_batch" in notes:
        return "empty_batch", {}
    if op == "roi_align_rotated" and "test_empty_box" in notes:
        return "rotated_empty_box", {}
    if op == "roi_align_rotated_vs_roi_align_grad":
        return "rotated_vs_align", {}
    if not numeric:
        return "skip", "no hard-coded input/expected output"
    if op == "roi_align" and p.get("pool_mode", "avg") == "avg":
        return "align", {"aligned": bool(p["aligned"]), "sampling_ratio": p["sampling_ratio"]}
    if op == "deform_roi_pool_pack":
        # Notes: zero offsets, "this equals roi_align(aligned=True, sampling_ratio=2)".
        return "align", {"aligned": True, "sampling_ratio": p["sampling_ratio"]}
    if op == "roi_align_rotated":
        # mmcv: radians, its aligned and clockwise flags; detectron2: degrees, counter-clockwise,
        # the 0.5 offset always ("aligned": "always ...").
        return "rotated", {"degrees": "DEGREES" in p["roi_format"], "clockwise": bool(p.get("clockwise", False)),
                           "aligned": p["aligned"] if isinstance(p["aligned"], bool) else True,
                           "sampling_ratio": p["sampling_ratio"]}
    if op == "roi_pool":
        if "mmcv" in p.get("semantics", ""):
            # mmcv's convention is our continuous mode; on these integer boxes the Caffe
            # convention gives the same numbers (the entry's crosscheck), so check both.
            return "pool", {"conventions": (True, False)}
        return "pool", {"conventions": (False,)}
    if op == "prroi_pool":
        return "prroi", {"rois_grad": bool(p.get("rois_requires_grad"))}
    if op == "onnx_RoiAlign":
        if p["mode"] != "avg":
            return "skip", f"ONNX max-mode rule ({p.get('max_mode_semantics') or 'max of weighted corners'}), not roiops' max mode"
        # half_pixel = aligned=True; output_half_pixel (and opset 10, no attribute) = False.
        return "align", {"aligned": p.get("coordinate_transformation_mode") == "half_pixel",
                         "sampling_ratio": p["sampling_ratio"]}
    return "skip", f"{op} is not an roiops op"


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
    """Every kernel set, through the registered ops, against the peers' published numbers."""
    if entry is None:
        pytest.skip(f"{PEER_PATH} not found (shared conformance vectors are not checked out)")
    kind, settings = _peer_plan(entry)
    if kind == "skip":
        pytest.skip(f"peer vector {index}: {settings}")
    p = entry["params"]
    ph, pw = p["output_size"] if "output_size" in p else (p["output_height"], p["output_width"])
    if kind in ("empty_box", "empty_batch"):
        # Property tests: a zero-height box (aligned, adaptive) gives zeros and a zero
        # gradient; an empty batch gives an empty result.
        if kind == "empty_box":
            x, rois = torch.rand(1, 1, 5, 5, generator=torch.Generator().manual_seed(7), dtype=F64), t(entry["rois"])
        else:
            x, rois = torch.zeros(0, 3, 10, 10, dtype=F64), torch.zeros(0, 5, dtype=F64)
        xg = x.clone().requires_grad_()
        with roiops.use_backend(backend):
            out = torch.ops.roiops.roi_align(xg, rois, p["spatial_scale"], ph, pw, p["sampling_ratio"], p["aligned"])
            grad = torch.autograd.grad(out.sum(), xg, allow_unused=True)[0]
        assert out.shape == (len(rois), x.shape[1], ph, pw) and not out.any()
        assert grad is None or not grad.any()
        return
    if kind == "rotated_empty_box":  # a zero-size rotated box (detectron2, degrees) gives zeros
        x = torch.rand(1, 1, 5, 5, generator=torch.Generator().manual_seed(7), dtype=F64).requires_grad_()
        with roiops.use_backend(backend):
            out = torch.ops.roiops.roi_align_rotated(x, t(entry["rois"]), p["spatial_scale"], ph, pw,
                                                     p["sampling_ratio"], True)
            grad = torch.autograd.grad(out.sum(), x)[0]
        assert out.shape == (1, 1, ph, pw) and not out.any() and not grad.any()
        return
    if kind == "rotated_vs_align":
        # detectron2: rotated boxes at angle 0 have roi_align(aligned=True)'s output and
        # gradient on the axis-aligned boxes, at its test's scale/sampling and its gradcheck's.
        x = torch.rand(1, 1, 10, 10, generator=torch.Generator().manual_seed(7), dtype=F64)
        rotated, upright = t(entry["rois"]["rotated"]), t(entry["rois"]["axis_aligned"])
        for scale, sr in ((p["spatial_scale"], p["sampling_ratio"]), (0.5, 1)):
            with roiops.use_backend(backend):
                xr, xa = x.clone().requires_grad_(), x.clone().requires_grad_()
                out_r = torch.ops.roiops.roi_align_rotated(xr, rotated, scale, ph, pw, sr, True)
                out_a = torch.ops.roiops.roi_align(xa, upright, scale, ph, pw, sr, True)
                (out_r * out_r).sum().backward()
                (out_a * out_a).sum().backward()
            torch.testing.assert_close(out_r, out_a, rtol=1e-12, atol=1e-12)
            torch.testing.assert_close(xr.grad, xa.grad, rtol=1e-12, atol=1e-12)
        return

    tol = _peer_tolerance(entry)
    scale = p["spatial_scale"]
    for dtype in (torch.float32, F64):
        x = t(entry["input"], dtype)
        rois = t(entry["rois"], dtype)
        expected = t(entry["expected_output"], dtype)
        expected_grad = t(entry["expected_grad"], dtype) if isinstance(entry["expected_grad"], list) else None
        if kind == "rotated":  # the registered op takes counter-clockwise radians
            angle = t(entry["rois"])[:, 5]
            angle = angle * math.pi / 180.0 if settings["degrees"] else angle
            rois[:, 5] = -angle if settings["clockwise"] else angle
        xg = x.clone().requires_grad_()
        with roiops.use_backend(backend):
            if kind == "rotated":
                outs = [torch.ops.roiops.roi_align_rotated(xg, rois, scale, ph, pw, settings["sampling_ratio"],
                                                           settings["aligned"])]
            elif kind == "align":
                sr, aligned = settings["sampling_ratio"], settings["aligned"]
                outs = [torch.ops.roiops.roi_align(xg, rois, scale, ph, pw, sr, aligned)]
            elif kind == "pool":
                outs = [torch.ops.roiops.roi_pool(xg, rois, scale, ph, pw, continuous)[0]
                        for continuous in settings["conventions"]]
            if kind == "prroi":  # mmcv's test also differentiates with respect to the boxes
                rg = rois.clone().requires_grad_(settings["rois_grad"])
                out = torch.ops.roiops.prroi_pool(xg, rg, scale, ph, pw)
                grads = torch.autograd.grad(out.sum(), (xg, rg) if settings["rois_grad"] else (xg,))
                if settings["rois_grad"]:
                    torch.testing.assert_close(grads[1], t(entry["expected_rois_grad"], dtype), **tol)
                results = [(out, grads[0])]
            else:
                results = [(out, torch.autograd.grad(out.sum(), xg)[0]) for out in outs]
        for out, grad in results:
            torch.testing.assert_close(out, expected, **tol)
            if expected_grad is not None:
                torch.testing.assert_close(grad, expected_grad, **tol)
