"""PEP 517 build backend: setuptools', except that an isolated build (plain `pip install .`)
compiles against the torch release the target environment already has, not the newest on
the index: the C++ kernels work only with the torch they were compiled against.

pip runs an isolated build with the target environment's interpreter and prefix, its
packages hidden from sys.path; sysconfig still names their directory. Build tools that
isolate in a separate environment (uv) see no torch here and get the newest; roiops then
refuses, at the first use of its C++ kernels, to run under a torch other than its build's,
naming the command that rebuilds it.
"""

from __future__ import annotations

import sysconfig
from importlib import metadata

from setuptools.build_meta import (  # noqa: F401  (the rest of the backend, unchanged)
    build_editable,
    build_sdist,
    build_wheel,
    prepare_metadata_for_build_editable,
    prepare_metadata_for_build_wheel,
)

MIN_TORCH = "2.6"


def torch_requirement(paths: list[str] | None = None) -> str:
    """`torch==<release>` of the torch installed in the target environment, else the
    oldest supported range."""
    if paths is None:
        paths = sorted({sysconfig.get_paths()[k] for k in ("purelib", "platlib")})
    for dist in metadata.distributions(path=paths):
        if (dist.metadata["Name"] or "").lower() == "torch":
            return f"torch=={dist.version.split('+')[0]}"  # any local build of that release
    return f"torch>={MIN_TORCH}"


def _requires() -> list[str]:
    # Not setuptools' own hooks: they run setup.py, which imports torch, not installed yet.
    return ["setuptools>=77", "wheel", "ninja", torch_requirement()]


def get_requires_for_build_wheel(config_settings: dict | None = None) -> list[str]:
    return _requires()


def get_requires_for_build_editable(config_settings: dict | None = None) -> list[str]:
    return _requires()


def get_requires_for_build_sdist(config_settings: dict | None = None) -> list[str]:
    return _requires()
