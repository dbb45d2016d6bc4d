"""Installs: the C++ kernels run only under the torch release they were built against,
and an isolated build (plain `pip install .`) compiles against the target's torch."""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

import pytest
import torch

import roiops
from roiops import _backend, _validation

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("build_backend", ROOT / "build_backend.py")
assert _spec is not None and _spec.loader is not None
build_backend = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(build_backend)

RELEASE = torch.__version__.split("+")[0]


@pytest.fixture
def fresh_kernel_lookup():
    _backend._cpu_kernels.cache_clear()
    _validation._row_scan.cache_clear()
    yield
    _backend._cpu_kernels.cache_clear()
    _validation._row_scan.cache_clear()


def test_build_records_the_torch_it_was_built_against():
    import roiops._build_info as info

    assert info.TORCH_VERSION.split("+")[0] == RELEASE
    assert Path(info.SOURCE, "setup.py").is_file()


def test_cpu_kernels_refuse_another_torch_naming_both_and_the_fix(monkeypatch, fresh_kernel_lookup):
    other = "1.0.0" if RELEASE != "1.0.0" else "1.0.1"
    fake = types.ModuleType("roiops._build_info")
    fake.TORCH_VERSION, fake.SOURCE, fake.EDITABLE = other, str(ROOT), True
    monkeypatch.setitem(sys.modules, "roiops._build_info", fake)
    x, boxes = torch.randn(1, 1, 4, 4), torch.tensor([[0.0, 0, 0, 3, 3]])
    with pytest.raises(ImportError) as e:
        roiops.roi_align(x, boxes, 2)
    msg = str(e.value)
    assert f"built against torch {other}" in msg and f"torch {torch.__version__} is running" in msg
    assert msg.endswith(f"pip install --no-build-isolation --no-deps --force-reinstall -e {ROOT}")
    # The other backends need no C++ build.
    with roiops.use_backend("reference"):
        assert roiops.roi_align(x, boxes, 2).shape == (1, 1, 2, 2)
    # A local build tag of the same release is the same ABI.
    fake.TORCH_VERSION = RELEASE + "+cpu"
    _backend._cpu_kernels.cache_clear()
    assert roiops.roi_align(x, boxes, 2).shape == (1, 1, 2, 2)


def _fake_site(tmp_path: Path, name: str, version: str) -> str:
    d = tmp_path / f"{name}-{version}.dist-info"
    d.mkdir()
    (d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return str(tmp_path)


def test_isolated_build_requires_the_target_environments_torch(tmp_path):
    assert build_backend.torch_requirement() == f"torch=={RELEASE}"
    assert build_backend.torch_requirement([_fake_site(tmp_path, "torch", "2.9.0+cpu")]) == "torch==2.9.0"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert build_backend.torch_requirement([str(empty)]) == f"torch>={build_backend.MIN_TORCH}"
    assert build_backend.get_requires_for_build_wheel()[-1] == f"torch=={RELEASE}"
