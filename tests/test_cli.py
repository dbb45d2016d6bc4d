"""The ``roiops`` command itself: version, command dispatch and usage errors."""

import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest

import roiops
from roiops import cli
from roiops.ops import SPECS, multi_scale


def test_version_is_the_installed_one(capsys):
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out == f"roiops {importlib.metadata.version('roiops')}\n"


def test_version_from_the_command_line():
    result = subprocess.run([sys.executable, "-m", "roiops", "--version"], capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"roiops {importlib.metadata.version('roiops')}"


def test_version_without_installed_metadata(monkeypatch):
    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    assert cli.package_version() == roiops.__version__


@pytest.mark.parametrize("argv, message", [
    ([], "the following arguments are required: command"),
    (["paint"], "invalid choice: 'paint'"),
    (["--verbose", "demo"], "unrecognized arguments: --verbose"),
])
def test_usage_errors(argv, message, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "usage: roiops" in err and message in err


def test_help_lists_the_commands_and_every_operator(capsys):
    assert cli.main(["--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())  # argparse wraps the description
    for word in ("demo", "explain", "bench", "--version"):
        assert word in out, word
    titles = [spec.title for spec in SPECS] + [multi_scale.TITLE]
    assert len(set(titles)) == len(SPECS) + 1
    for title in titles:
        assert title in out, title


@pytest.mark.parametrize("path", ["README.md", "pyproject.toml"])
def test_the_package_descriptions_name_every_operator(path):
    """Text written by hand that lists the operators: each spec's title, less its
    parenthesis, in any case."""
    text = " ".join((Path(__file__).resolve().parents[1] / path).read_text().lower().split())
    for spec in SPECS:
        assert spec.title.split(" (")[0].lower() in text, spec.title


def test_explain_needs_a_box_and_leaves_the_demo_picture_alone(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["explain"]) == 2
    err = capsys.readouterr().err
    assert "usage: roiops explain" in err and "required: --box" in err
    assert list(tmp_path.iterdir()) == []

    (tmp_path / "roiops_demo.png").write_bytes(b"the demo picture")
    assert cli.main(["explain", "--box", "300", "250", "420", "330"]) == 0
    assert "wrote roiops_explain.png" in capsys.readouterr().out
    assert (tmp_path / "roiops_demo.png").read_bytes() == b"the demo picture"
    assert (tmp_path / "roiops_explain.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("command", ["demo", "explain", "bench"])
def test_command_help_is_the_commands_own(command, capsys):
    assert cli.main([command, "--help"]) == 0
    assert capsys.readouterr().out.startswith(f"usage: roiops {command} ")
