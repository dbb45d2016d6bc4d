"""Adds roiops' ONNX translations to torch's exporter once torch loads it, so that a plain
``torch.onnx.export(..., dynamo=True)`` handles the roiops ops while ``import roiops``
loads no ONNX code (see roiops.onnx for the translations and the fallback)."""

from __future__ import annotations

import sys
from importlib.machinery import ModuleSpec
from importlib.util import find_spec
from types import ModuleType

_ONNX_REGISTRATION = "torch.onnx._internal.exporter._registration"


def _add_onnx_translations(registration: ModuleType) -> None:
    try:
        from .onnx import _extend_default_registry
    except ImportError:  # no onnxscript: torch's exporter cannot run either, and says why
        return
    _extend_default_registry(registration)


class _OnnxExporterHook:
    """A meta-path finder that waits for torch's exporter registry module and runs
    _add_onnx_translations right after that module executes."""

    def find_spec(self, name: str, path: object, target: object = None) -> ModuleSpec | None:
        if name != _ONNX_REGISTRATION:
            return None
        sys.meta_path.remove(self)
        spec = find_spec(name)
        if spec is not None and spec.loader is not None:
            exec_module = spec.loader.exec_module

            def exec_then_add(module: ModuleType) -> None:
                exec_module(module)
                _add_onnx_translations(module)

            spec.loader.exec_module = exec_then_add  # type: ignore[method-assign]
        return spec


def install() -> None:
    if _ONNX_REGISTRATION in sys.modules:
        _add_onnx_translations(sys.modules[_ONNX_REGISTRATION])
    elif not any(isinstance(f, _OnnxExporterHook) for f in sys.meta_path):
        sys.meta_path.insert(0, _OnnxExporterHook())
