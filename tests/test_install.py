"""Installs: one build of the C++ kernels for every supported torch. They use LibTorch's
stable ABI only, target the oldest torch pyproject.toml admits, register the ops' schemas
and CPU kernels in the dispatcher, and load under Python's limited API."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import roiops
from roiops import _requirements
from roiops.ops import _declare

ROOT = Path(__file__).resolve().parents[1]


def test_supported_torch_is_declared_once_and_checked_at_import(monkeypatch):
    pyproject = (ROOT / "pyproject.toml").read_text()
    wanted = {tuple(int(v) for v in m) for m in re.findall(r'"torch>=(\d+)\.(\d+)"', pyproject)}
    assert wanted == {_requirements.MIN_TORCH}  # the package's and the build's requirement
    assert _requirements.torch_too_old() == ""
    monkeypatch.setattr(torch, "__version__", "2.10.0+cu128")
    assert _requirements.torch_too_old() == ("roiops needs torch >= 2.11, whose stable C++ ABI its CPU kernels are "
                                        "built for; found torch 2.10.0+cu128")
    code = "import torch; torch.__version__ = '2.9.1'\ntry:\n import roiops\nexcept ImportError as e: print(e)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.strip().endswith("found torch 2.9.1"), out.stdout + out.stderr


def test_the_library_defines_every_op_and_runs_its_cpu_kernel():
    """The schemas come from the library (C++ programs and AOTInductor find them without
    Python): the file setup.py generates from the declarations, so equal to them; and the
    CPU key holds the C++ kernel."""
    from roiops.ops import SPECS

    for spec in SPECS:
        for k in spec.kernels:
            for role, op in k.ops().items():
                dump = torch._C._dispatch_dump(f"roiops::{op}")
                assert f"schema: roiops::{op}{k.schema(role)}\n" in dump, dump
                assert re.search(r"debug: registered at .*generated/schemas\.cpp", dump), dump
                assert re.search(r"CPU: registered at .*csrc/\w+\.cpp", dump), dump
                assert "CompositeExplicitAutograd[alias]: registered at" in dump  # every other device


def test_a_schema_that_differs_from_the_declaration_refuses_to_load():
    with pytest.raises(ImportError, match=r"roiops: its C\+\+ kernels define roiops::roi_pool\(.*but the op is "
                                          r"declared as roiops::roi_pool\(Tensor input\) -> Tensor: rebuild"):
        _declare.define("roi_pool", "(Tensor input) -> Tensor", lambda input: input, lambda input: input)


@pytest.mark.skipif(not shutil.which("nm"), reason="needs binutils")
def test_the_library_reaches_libtorch_through_its_stable_c_interface_only():
    """No C++ symbol of torch, c10 or Python's own API beyond the limited one: what keeps one
    build working under later torch and Python releases."""
    import roiops._C as library

    assert library.__file__.endswith(".abi3.so")
    out = subprocess.run(["nm", "-D", "--undefined-only", library.__file__], capture_output=True, text=True,
                         check=True).stdout
    names = [line.split()[-1] for line in out.splitlines() if line.strip()]
    torch_cxx = [n for n in names if re.match(r"_ZN?K?\d*(c10|at|torch)\d", n) or "c10" in n]
    assert torch_cxx == []
    shims = {n for n in names if n.startswith(("aoti_torch_", "torch_"))}
    assert {"torch_parallel_for", "torch_get_num_threads", "torch_from_blob", "aoti_torch_library_def"} <= shims
    assert "PyModule_Create2" in names and not [n for n in names if n.startswith("_Py")]



CXX_PROGRAM = r"""
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <dlfcn.h>
#include <cstdio>
int main(int argc, char** argv) {
  if (!dlopen(argv[1], RTLD_LAZY | RTLD_GLOBAL)) { std::fprintf(stderr, "%s\n", dlerror()); return 2; }
  auto op = c10::Dispatcher::singleton().findSchemaOrThrow("roiops::roi_align", "")
                .typed<at::Tensor(const at::Tensor&, const at::Tensor&, double, int64_t, int64_t, int64_t, bool)>();
  at::Tensor x = at::arange(16, at::kFloat).reshape({1, 1, 4, 4});
  at::Tensor rois = at::tensor({0.f, 0.5f, 0.5f, 3.f, 2.5f}).reshape({1, 5});
  at::Tensor out = op.call(x, rois, 1.0, 2, 2, 2, true).contiguous();
  for (int64_t i = 0; i < out.numel(); ++i) std::printf("%.9g\n", out.data_ptr<float>()[i]);
  return 0;
}
"""


@pytest.mark.skipif(not (shutil.which("g++") and sys.platform == "linux"), reason="needs g++ on Linux")
def test_a_cxx_program_without_python_runs_the_ops(tmp_path):
    """A C++ program (no Python) that loads the library finds roiops::roi_align in the
    dispatcher, with its CPU kernel: the same numbers as the Python call."""
    from torch.utils.cpp_extension import include_paths, library_paths

    import roiops._C as library

    src, exe = tmp_path / "main.cpp", tmp_path / "main"
    src.write_text(CXX_PROGRAM)
    flags = [f"-I{p}" for p in include_paths()] + [f for p in library_paths() for f in (f"-L{p}", f"-Wl,-rpath,{p}")]
    subprocess.run(["g++", "-std=c++20", "-O1", str(src), *flags, "-ltorch", "-ltorch_cpu", "-lc10", "-ldl", "-o",
                    str(exe)], check=True, capture_output=True, timeout=600)
    out = subprocess.run([str(exe), library.__file__], check=True, capture_output=True, text=True, timeout=120)
    got = torch.tensor([float(v) for v in out.stdout.split()])
    x, rois = torch.arange(16.0).reshape(1, 1, 4, 4), torch.tensor([[0.0, 0.5, 0.5, 3.0, 2.5]])
    assert torch.equal(got, roiops.roi_align(x, rois, 2, 1.0, 2, True).flatten())
    # Hand-computed: the map is 4 * y + x, which bilinear sampling follows exactly; bin (0, 0)
    # averages it at y in {0.25, 0.75} and x in {0.3125, 0.9375}: 4 * 0.5 + 0.625.
    assert got.tolist() == [2.625, 3.875, 6.625, 7.875]


@pytest.mark.skipif(not shutil.which("g++"), reason="needs g++")
def test_an_aotinductor_package_runs_the_op(tmp_path):
    class Head(torch.nn.Module):
        def forward(self, x, rois):
            return roiops.roi_align(x, rois, 2, 1.0, 2, True)

    x, rois = torch.arange(16.0).reshape(1, 1, 4, 4), torch.tensor([[0.0, 0.5, 0.5, 3.0, 2.5]])
    package = torch._inductor.aoti_compile_and_package(torch.export.export(Head(), (x, rois)),
                                                        package_path=str(tmp_path / "head.pt2"))
    assert torch._inductor.aoti_load_package(package)(x, rois).flatten().tolist() == [2.625, 3.875, 6.625, 7.875]
