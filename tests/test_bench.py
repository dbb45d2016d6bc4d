"""``roiops bench``: runs end to end (tiny shapes: this checks the plumbing, not speed), from
an installed package as well as from the checkout, and rejects bad options cleanly."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import roiops
from roiops import bench, cli

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _check_results(out: Path, workloads: set[str]) -> None:
    data = json.loads((out / "results.json").read_text())
    assert {r["workload"] for r in data["rows"]} == workloads
    assert {r["direction"] for r in data["rows"]} == {"forward", "backward"}
    assert {r["layout"] for r in data["rows"]} == {"NCHW", "channels_last"}
    assert all(r["roiops_ms"] > 0 and r["torchvision_ms"] > 0 for r in data["rows"])
    assert data["meta"]["torch"] and data["meta"]["cpu"] and data["meta"]["roiops"]
    assert (out / "ratios.png").read_bytes()[:8] == PNG_MAGIC


def test_bench_tiny(tmp_path, capsys):
    assert cli.main(["bench", "--tiny", "--quick", "--out", str(tmp_path)]) == 0
    _check_results(tmp_path, {w.name for w in bench.WORKLOADS})
    out = capsys.readouterr().out
    assert "ratio" in out and f"wrote {tmp_path / 'results.json'}" in out


def test_bench_from_an_installed_package(tmp_path):
    """Only the package, as a wheel installs it, on the path, run from an unrelated folder."""
    site = tmp_path / "site"
    shutil.copytree(Path(roiops.__file__).parent, site / "roiops",
                    ignore=shutil.ignore_patterns("__pycache__"))
    work = tmp_path / "work"
    work.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site)}

    def run(*args):
        return subprocess.run([sys.executable, *args], cwd=work, env=env, capture_output=True,
                              text=True, timeout=600)

    where = run("-c", "import importlib.util; print(importlib.util.find_spec('roiops').origin)")
    assert Path(where.stdout.strip()) == site / "roiops" / "__init__.py", where.stderr
    result = run("-m", "roiops", "bench", "--tiny", "--quick", "--workload", "roi_pool",
                 "--out", "results")
    assert result.returncode == 0, result.stderr
    assert "roi_pool" in result.stdout
    _check_results(work / "results", {"roi_pool"})


def test_help_explains_every_option_and_lists_the_workloads(capsys):
    assert bench.main(["--help"]) == 0
    out = capsys.readouterr().out
    for action in bench.build_parser()._actions:
        assert action.help, action.option_strings
        assert all(option in out for option in action.option_strings)
    for w in bench.WORKLOADS:
        assert f"  {w.name}\n    {w.describe()}" in out


@pytest.mark.parametrize("argv, message", [
    (["--threads", "0"], "argument --threads: must be at least 1, got 0"),
    (["--threads", "2", "-3"], "argument --threads: must be at least 1, got -3"),
    (["--threads", "two"], "argument --threads: expected a whole number, got 'two'"),
    (["--repeats", "-1"], "argument --repeats: must be at least 1, got -1"),
    (["--repeats", "0"], "argument --repeats: must be at least 1, got 0"),
    (["--workload", "box head"], "argument --workload: invalid choice: 'box head'"),
    (["--speed"], "unrecognized arguments: --speed"),
])
def test_bad_options_exit_2_with_one_line(argv, message, tmp_path, capsys):
    assert cli.main(["bench", *argv, "--out", str(tmp_path / "out")]) == 2
    captured = capsys.readouterr()
    error = captured.err.strip().splitlines()[-1]
    assert error.startswith("roiops bench: error: ") and message in error
    assert "Traceback" not in captured.err and captured.out == ""
    assert not (tmp_path / "out").exists()


def test_out_must_be_a_folder(tmp_path, capsys):
    (tmp_path / "file").write_text("")
    assert bench.main(["--tiny", "--quick", "--out", str(tmp_path / "file")]) == 2
    assert "--out must be a folder" in capsys.readouterr().err


def test_without_torchvision(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "torchvision", None)  # makes `import torchvision` fail
    assert bench.main(["--tiny", "--quick", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("roiops bench: error: ") and len(err.strip().splitlines()) == 1
    assert "install the torchvision release built for your torch" in err
    assert "Traceback" not in err
    assert not (tmp_path / "out").exists()
