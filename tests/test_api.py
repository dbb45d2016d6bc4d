"""The public API layer: argument normalisation, validation messages, modules, backends."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading

import pytest
import torch

import roiops
from cases import config_set

X = torch.randn(2, 3, 8, 9)
BOX = torch.tensor([[0, 1.0, 1.0, 6.0, 5.0]])


@pytest.mark.parametrize("fn", [
    lambda x, b, **kw: roiops.roi_align(x, b, **{"output_size": 2, **kw}),
    lambda x, b, **kw: roiops.roi_pool(x, b, **{"output_size": 2, **kw}),
    lambda x, b, **kw: roiops.prroi_pool(x, b, **{"output_size": 2, **kw}),
])
@pytest.mark.parametrize("input, boxes, kwargs, error, match", [
    (X[0], BOX, {}, ValueError, r"4-D"),
    (X.long(), BOX, {}, ValueError, r"floating point"),
    (X.numpy(), BOX, {}, TypeError, r"input must be a Tensor"),
    (X[:, :, :0], BOX, {}, ValueError, r"height and width"),
    (X, BOX[:, 1:], {}, ValueError, r"\[K, 5\]"),
    (X, BOX.long(), {}, ValueError, r"boxes must be floating point"),
    (X, BOX.to("meta"), {}, ValueError, r"is on meta but the input is on cpu"),
    (X, [BOX[:, 1:]], {}, ValueError, r"list of 1 tensors but the input has batch size 2"),
    (X, [BOX[:, 1:], BOX], {}, ValueError, r"boxes\[1\] must have shape \[K, 4\]"),
    (X, "boxes", {}, TypeError, r"boxes must be a Tensor"),
    (X, torch.tensor([[0, 1.0, 1, 2, 2], [2, 1.0, 1, 2, 2]]), {}, ValueError, r"row 1 .*batch index 2.0 is not an integer in \[0, 2\)"),
    (X, torch.tensor([[0.5, 1.0, 1, 2, 2]]), {}, ValueError, r"row 0 .*not an integer"),
    (X, torch.tensor([[-1, 1.0, 1, 2, 2]]), {}, ValueError, r"row 0 .*not an integer"),
    (X, torch.tensor([[0, float("nan"), 1, 2, 2]]), {}, ValueError, r"row 0 .*finite"),
    (X, torch.tensor([[0, 1.0, float("-inf"), 2, 2]]), {}, ValueError, r"row 0 .*finite"),
    (X, torch.tensor([[0, 1.0, 1, 2, 1e9]]), {}, ValueError, r"row 0 .*2\^24"),
    (X, BOX, {"output_size": 0}, ValueError, r"output_size"),
    (X, BOX, {"output_size": (2, -1)}, ValueError, r"output_size"),
    (X, BOX, {"output_size": (2.0, 2)}, ValueError, r"output_size"),
    (X, BOX, {"output_size": (1, 2, 3)}, ValueError, r"output_size"),
    (X, BOX, {"spatial_scale": 0.0}, ValueError, r"spatial_scale"),
    (X, BOX, {"spatial_scale": -0.25}, ValueError, r"spatial_scale"),
    (X, BOX, {"spatial_scale": float("inf")}, ValueError, r"spatial_scale"),
])
def test_validation_errors(fn, input, boxes, kwargs, error, match):
    with pytest.raises(error, match=match):
        fn(input, boxes, **kwargs)


def test_align_specific_errors():
    with pytest.raises(ValueError, match="mode must be one of 'avg', 'max'"):
        roiops.roi_align(X, BOX, 2, mode="mean")
    with pytest.raises(ValueError, match="sampling_ratio"):
        roiops.roi_align(X, BOX, 2, sampling_ratio=1.5)
    with pytest.raises(ValueError, match="aligned must be a bool"):
        roiops.roi_align(X, BOX, 2, aligned=1)
    with pytest.raises(ValueError, match="convention must be one of 'caffe', 'mmdet'"):
        roiops.roi_pool(X, BOX, 2, convention="detectron")


def test_value_checks_can_be_skipped_and_kernels_still_refuse():
    bad = torch.tensor([[5, 1.0, 1, 2, 2]])
    assert roiops.config.check_box_values is None  # default: checked on CPU tensors
    with pytest.raises(ValueError, match="boxes row 0"):
        roiops.roi_align(X, bad, 2)
    with config_set(check_box_values=False), pytest.raises(ValueError, match="batch index"):
        roiops.roi_align(X, bad, 2)  # now raised by the C++ kernel


def test_output_size_forms_agree():
    a = roiops.roi_align(X, BOX, 3)
    assert torch.equal(a, roiops.roi_align(X, BOX, (3, 3)))
    assert torch.equal(a, roiops.roi_align(X, BOX, [3, 3]))


def test_boxes_any_float_dtype():
    ref = roiops.roi_align(X, BOX, 2, 0.5)
    assert torch.equal(ref, roiops.roi_align(X, BOX.double(), 2, 0.5))
    assert torch.equal(roiops.roi_align(X.half(), BOX, 2), roiops.roi_align(X.half(), BOX.half(), 2))


def test_modules_repr_and_forward():
    m = roiops.RoIAlign((7, 5), 1 / 16, 2, aligned=True, mode="max")
    assert repr(m) == ("RoIAlign(output_size=(7, 5), spatial_scale=0.0625, sampling_ratio=2, aligned=True, mode='max', "
                       "box_grad=False)")
    assert torch.equal(m(X, BOX), roiops.roi_align(X, BOX, (7, 5), 1 / 16, 2, True, "max"))
    p = roiops.RoIPool(7, 0.25, convention="mmdet")
    assert repr(p) == "RoIPool(output_size=(7, 7), spatial_scale=0.25, convention='mmdet')"
    assert torch.equal(p(X, [BOX[:, 1:], BOX[:0, 1:]]), roiops.roi_pool(X, BOX, 7, 0.25, "mmdet"))
    with pytest.raises(ValueError, match="output_size"):
        roiops.RoIAlign(0, 1.0)
    with pytest.raises(ValueError, match="mode"):
        roiops.RoIAlign(7, 1.0, mode="sum")


def test_use_backend():
    with roiops.use_backend("reference"):
        ref = roiops.roi_align(X, BOX, 2)
    torch.testing.assert_close(ref, roiops.roi_align(X, BOX, 2))
    with pytest.raises(ValueError, match="unknown backend"):
        with roiops.use_backend("cuda"):
            pass
    from roiops import _backend
    with roiops.use_backend("cpu"), pytest.raises(RuntimeError, match="cannot run on cuda"):
        _backend.select(torch.device("cuda"))


def test_backward_runs_on_the_backend_of_its_forward(monkeypatch):
    # Forced in the forward's block, the backend also computes the backward run after the
    # block, here from another thread; with none forced, the C++ kernels do.
    calls: list[str] = []
    for name, module in (("reference", roiops.reference), ("cpu", roiops._C)):
        kernel = module.ps_roi_pool_backward
        monkeypatch.setattr(module, "ps_roi_pool_backward",
                            lambda *a, name=name, kernel=kernel: calls.append(name) or kernel(*a))
    x = torch.randn(1, 2 * 4, 6, 7, generator=torch.Generator().manual_seed(3)).requires_grad_()
    boxes = torch.tensor([[0, 0.5, 1.0, 5.0, 4.5]])
    g = torch.randn(1, 2, 2, 2, generator=torch.Generator().manual_seed(4))
    with roiops.use_backend("reference"):
        out = roiops.ps_roi_pool(x, boxes, 2)
    grads: list[torch.Tensor] = []
    worker = threading.Thread(target=lambda: grads.append(torch.autograd.grad(out, x, g)[0]))
    worker.start()
    worker.join(60)
    assert calls == ["reference"]
    torch.testing.assert_close(grads[0], torch.autograd.grad(roiops.ps_roi_pool(x, boxes, 2), x, g)[0])
    assert calls == ["reference", "cpu"]


def test_meta_tensors_propagate_shapes():
    out = roiops.roi_align(X.to("meta"), BOX.to("meta"), (3, 4))
    assert out.shape == (1, 3, 3, 4) and out.device.type == "meta"


def test_other_devices_fall_back_to_reference():
    from roiops import _backend
    assert _backend.select(torch.device("meta")) == "reference"
    assert _backend.select(torch.device("cpu")) == "cpu"


def test_subpackages_load_on_first_attribute_access():
    code = textwrap.dedent("""
        import sys, roiops
        lazy = ("roiops.compat", "roiops.compat.torchvision", "roiops.onnx", "roiops.reference")
        assert not any(m in sys.modules for m in lazy), [m for m in lazy if m in sys.modules]
        assert roiops.compat.torchvision.MultiScaleRoIAlign.__module__ == "roiops.compat.torchvision"
        assert callable(roiops.compat.mmcv.roi_align) and callable(roiops.onnx.translation_table)
        assert callable(roiops.reference.roi_align_forward)
        assert {"compat", "onnx", "reference"} <= set(dir(roiops)) and "detectron2" in dir(roiops.compat)
        for owner, name in ((roiops, "nope"), (roiops.compat, "nope")):
            try:
                getattr(owner, name)
            except AttributeError as e:
                assert repr(name) in str(e)
            else:
                raise AssertionError(name)
    """)
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
