"""The package type-checks: `python -m mypy roiops` with the [tool.mypy] settings of
pyproject.toml (bodies checked everywhere; the public API, the ONNX translations and the
drop-in namespaces fully annotated)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mypy")

ROOT = Path(__file__).resolve().parents[1]


def test_mypy_passes():
    # A cold run analyses torch's stubs (about 20 s of CPU); later runs reuse .mypy_cache.
    result = subprocess.run([sys.executable, "-m", "mypy", "roiops"], cwd=ROOT, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, f"mypy found problems:\n{result.stdout}{result.stderr}"
