"""``roiops bench``: runs the CPU benchmark suite kept in the source tree's benchmarks/."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    suite = Path(__file__).resolve().parents[1] / "benchmarks" / "cpu.py"
    if not suite.exists():
        print("roiops bench needs the roiops source tree (benchmarks/cpu.py next to the package); "
              "install from a clone with `pip install --no-build-isolation -e .`", file=sys.stderr)
        return 2
    spec = importlib.util.spec_from_file_location("roiops_benchmarks_cpu", suite)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return int(module.main(argv))
