"""The release files: the sdist holds exactly what builds and describes the wheel, and the
version is written once. (`make dist` builds the wheel from that sdist and refuses a tag
other than cp310-abi3-manylinux; `make test` installs it with no compiler on the PATH and
runs every operator there under the newest and the oldest supported torch.)"""

import importlib.util
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

import roiops

ROOT = Path(__file__).resolve().parent.parent
# What an sdist adds of its own: the metadata setuptools writes.
METADATA = {"PKG-INFO", "setup.cfg", *(f"roiops.egg-info/{name}" for name in (
    "PKG-INFO", "SOURCES.txt", "dependency_links.txt", "entry_points.txt", "requires.txt", "top_level.txt"))}


def _tracked(*paths):
    if not shutil.which("git") or not (ROOT / ".git").exists():
        pytest.skip("needs the git checkout (the sdist is built from it)")
    out = subprocess.run(["git", "ls-files", "--", *paths], cwd=ROOT, capture_output=True, text=True, check=True)
    return set(out.stdout.split())


def test_the_sdist_holds_the_sources_and_nothing_else(tmp_path):
    if importlib.util.find_spec("build") is None:
        pytest.skip("needs the `build` package (Makefile's RELEASE_TOOLS)")
    expected = _tracked("roiops", "setup.py", "pyproject.toml", "README.md", "LICENSE", "CHANGELOG.md", "MANIFEST.in")
    subprocess.run([sys.executable, "-m", "build", "--sdist", "--no-isolation", "--outdir", str(tmp_path),
                    str(ROOT)], check=True, capture_output=True, timeout=600)
    (sdist,) = tmp_path.glob("roiops-*.tar.gz")
    assert sdist.name == f"roiops-{roiops.__version__}.tar.gz"
    with tarfile.open(sdist) as tar:
        prefix = f"roiops-{roiops.__version__}/"
        files = {m.name.removeprefix(prefix) for m in tar.getmembers() if m.isfile()}
        pkg_info = tar.extractfile(prefix + "PKG-INFO").read().decode()
    assert files - METADATA == expected
    assert METADATA <= files
    assert f"\nVersion: {roiops.__version__}\n" in pkg_info
    assert "License-File: LICENSE" in pkg_info


def test_the_version_is_written_once():
    version = roiops.__version__
    # The benchmark results record the version that measured them; they are data.
    out = subprocess.run(["git", "grep", "-l", "-F", version, "--", ".", ":!benchmarks/results", ":!BENCHMARKS.md"],
                         cwd=ROOT, capture_output=True, text=True)
    if out.returncode > 1:
        pytest.skip("needs the git checkout")
    # The changelog names the release; everything else reads roiops.__version__.
    assert set(out.stdout.split()) == {"roiops/__init__.py", "CHANGELOG.md"}
    releases = [line for line in (ROOT / "CHANGELOG.md").read_text().splitlines() if line.startswith("## ")]
    assert releases[0].startswith(f"## {version} ")
    cli = subprocess.run([sys.executable, "-m", "roiops", "--version"], capture_output=True, text=True, check=True)
    assert cli.stdout.strip() == f"roiops {version}"
