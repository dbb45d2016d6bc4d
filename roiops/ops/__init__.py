"""The operators, one module each: its declaration (``SPEC``, :class:`._spec.OpSpec`), the
registered ``torch.ops.roiops`` ops built from it, its public function and its Module.
Importing this package registers them all and collects their specs in ``SPECS``: adding an
operator adds a module, and no list changes.

``multi_scale.py`` is FPN RoIAlign over a list of maps: RoIAlign's kernels once per level
(or one multi-level kernel), with ops of its own but no spec of its own.
"""

import importlib
import pkgutil

from .. import _registry
from .._spec import OpSpec
from .._validation import BoxesType, OutputSize
from .multi_scale import fpn_levels, multi_scale_roi_align


def _collect() -> tuple[OpSpec, ...]:
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        spec = getattr(importlib.import_module(f"{__name__}.{info.name}"), "SPEC", None)
        if spec is not None:
            _registry.add(spec)
            globals()[spec.name] = spec.function
            globals()[spec.module.__name__] = spec.module
    return _registry.specs()


#: Every operator's spec, in the order of their modules' names.
SPECS = _collect()

__all__ = ["BoxesType", "OutputSize", "SPECS", "fpn_levels", "multi_scale_roi_align"]
__all__ += [name for spec in SPECS for name in (spec.name, spec.module.__name__)]
