"""The declared operators and the kernel sets' op modules.

``roiops.ops`` adds each operator's spec here as it imports the op modules; the kernel
sets (``roiops.cpu``, ``roiops.triton``, ``roiops.reference``) and the kernel checks read
the declarations from here, below the ops, so that nothing under the ops imports them.
Every kernel set is loaded after ``import roiops`` has declared every operator.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterable

from ._spec import Kernels, OpSpec

_SPECS: list[OpSpec] = []
# Ops with no OpSpec, not RoI-shaped: the mask steps (a forward each, no gradient) and the
# point-cloud ops (with a backward). The kernel sets provide ``<name>_forward`` and, with a
# backward, ``<name>_backward`` (polygon targets: the C++ and reference sets, polygons being
# host data).
_PLAIN: dict[str, bool] = {}


def add(spec: OpSpec) -> None:
    if any(s.name == spec.name for s in _SPECS):
        raise ImportError(f"roiops: operator {spec.name} is declared twice")
    _SPECS.append(spec)


def add_plain(name: str, backward: bool = False) -> None:
    if name in _PLAIN:
        raise ImportError(f"roiops: op {name} is declared twice")
    _PLAIN[name] = backward


def plain_ops() -> tuple[str, ...]:
    """The ops without an OpSpec, in the order they were added."""
    return tuple(_PLAIN)


def plain_kernels() -> dict[str, str]:
    """The kernel functions of the ops without an OpSpec, each with its registered op:
    ``<name>_forward`` runs ``roiops::<name>``, ``<name>_backward`` ``roiops::_<name>_backward``."""
    kernels = {}
    for name, backward in _PLAIN.items():
        kernels[f"{name}_forward"] = name
        if backward:
            kernels[f"{name}_backward"] = f"_{name}_backward"
    return kernels


def specs() -> tuple[OpSpec, ...]:
    """Every declared operator, in the order they were added."""
    return tuple(_SPECS)


def declaration(name: str) -> tuple[OpSpec, Kernels]:
    """The OpSpec and Kernels that declare registered op ``roiops::<name>``."""
    for spec in _SPECS:
        for k in spec.kernels:
            if k.name == name:
                return spec, k
    raise KeyError(f"roiops: no op declares kernels {name!r}")


def collect_kernels(package: str, path: Iterable[str], namespace: dict[str, object]) -> list[str]:
    """Import every op module of a kernel-set package (those not starting with "_") and put
    the kernels each lists in ``__all__`` into the package's namespace: adding an op adds
    a module, and no list of functions changes. Returns the collected names."""
    names: list[str] = []
    for info in sorted(pkgutil.iter_modules(path), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{package}.{info.name}")
        for name in module.__all__:
            if name in namespace:
                raise ImportError(f"{package}: {name} is defined by two op modules")
            namespace[name] = getattr(module, name)
            names.append(name)
    return names
