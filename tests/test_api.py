"""The public API layer: the exports, backends, configuration and lazy subpackages (what
every op does with its arguments, its Module included: test_generic.py)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading

import pytest
import torch

import roiops
import roiops.ops
from cases import SCALE, config_set, feature, forward_kernels, kernel_name, spec_params
from roiops.ops import SPECS
from roiops.ops._declare import RoIModule

X = torch.randn(2, 3, 8, 9)
BOX = torch.tensor([[0, 1.0, 1.0, 6.0, 5.0]])


def test_exports_follow_the_specs():
    """Each spec's function and Module are exported, by name, from roiops and roiops.ops,
    with the exports that are no spec's; every exported name resolves."""
    from_specs = {name for spec in SPECS for name in (spec.name, spec.module.__name__)}
    assert set(roiops.__all__) == from_specs | {"config", "fpn_levels", "mask_targets", "multi_scale_roi_align",
                                                "paste_masks", "use_backend", "points_in_boxes", "PointsInBoxes",
                                                "roiaware_pool3d", "RoIAwarePool3d", "roipoint_pool3d",
                                                "RoIPointPool3d"}
    assert set(roiops.ops.__all__) == from_specs | {"BoxesType", "OutputSize", "SPECS", "fpn_levels",
                                                    "multi_scale_roi_align"}
    assert len(roiops.__all__) == len(set(roiops.__all__)) and len(roiops.ops.__all__) == len(set(roiops.ops.__all__))
    for module in (roiops, roiops.ops):
        for name in module.__all__:
            assert getattr(module, name) is not None, (module.__name__, name)
    for spec in SPECS:
        assert getattr(roiops, spec.name) is getattr(roiops.ops, spec.name) is spec.function
        assert getattr(roiops, spec.module.__name__) is spec.module and spec.module.function is spec.function
    # roiops/__init__.py imports them by name: no Module there that no spec declares.
    modules = {n for n, v in vars(roiops).items() if isinstance(v, type) and issubclass(v, RoIModule)}
    assert modules == {spec.module.__name__ for spec in SPECS}


def test_value_checks_can_be_skipped_and_kernels_still_refuse():
    bad = torch.tensor([[5, 1.0, 1, 2, 2]])
    assert roiops.config.check_box_values is None  # default: checked on CPU tensors
    with pytest.raises(ValueError, match="boxes row 0"):
        roiops.roi_align(X, bad, 2)
    with config_set(check_box_values=False), pytest.raises(ValueError, match="batch index"):
        roiops.roi_align(X, bad, 2)  # now raised by the C++ kernel


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


@pytest.mark.parametrize("case", spec_params())
def test_backward_runs_on_the_backend_of_its_forward(case, monkeypatch):
    # Forced in the forward's block, the backend also computes the backward run after the
    # block, here from another thread; with none forced, the C++ kernels do.
    calls: list[str] = []
    name = kernel_name(forward_kernels(case).ops()["backward"])
    for backend, module in (("reference", roiops.reference), ("cpu", roiops.cpu)):
        kernel = getattr(module, name)
        monkeypatch.setattr(module, name,
                            lambda *a, backend=backend, kernel=kernel: calls.append(backend) or kernel(*a))
    x = feature(channels=case.channels(2, 2)).requires_grad_()
    boxes = case.boxes()
    g = torch.randn(len(boxes), case.out_channels(2), 2, 2, generator=torch.Generator().manual_seed(4))
    with roiops.use_backend("reference"):
        out = case(x, boxes, 2, SCALE)
    grads: list[torch.Tensor] = []
    worker = threading.Thread(target=lambda: grads.append(torch.autograd.grad(out, x, g)[0]))
    worker.start()
    worker.join(60)
    assert calls == ["reference"]
    torch.testing.assert_close(grads[0], torch.autograd.grad(case(x, boxes, 2, SCALE), x, g)[0])
    assert calls == ["reference", "cpu"]


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
