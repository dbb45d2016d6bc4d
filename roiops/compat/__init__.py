"""Drop-in classes with the signatures of the systems people port from.

Each module mirrors one project's RoI layer API (class names, argument order,
defaults, box format) and reproduces its numbers on top of roiops; its ``__all__``
names its classes and functions:

- ``roiops.compat.maskrcnn_benchmark``: ``ROIAlign``, ``ROIPool``, ``roi_align``,
  ``roi_pool`` of facebookresearch/maskrcnn-benchmark (``maskrcnn_benchmark.layers``).
- ``roiops.compat.faster_rcnn_pytorch``: ``RoIAlign``, ``RoIAlignAvg``,
  ``RoIAlignMax`` (that project's own corner-sampling rule) and ``RoIPool`` of
  jwyang/faster-rcnn.pytorch.
- ``roiops.compat.simple_faster_rcnn``: ``RoIPooling2D`` of
  chenyuntc/simple-faster-rcnn-pytorch.
- ``roiops.compat.mmdet``: ``RoIPool`` and ``roi_pool`` of mmdetection v1
  (``mmdet.ops``), continuous-coordinate RoIPool.
- ``roiops.compat.torchvision``: the RoI layers and functions of ``torchvision.ops``
  (RoIAlign, RoIPool, their position-sensitive versions, ``MultiScaleRoIAlign`` and
  ``LevelMapper``), bit for bit (docs/semantics.md has the two position-sensitive
  exceptions).
- ``roiops.compat.detectron2``: ``ROIAlign`` (``aligned=True`` default), ``ROIAlignRotated``
  and ``roi_align`` of ``detectron2.layers``.
- ``roiops.compat.mmcv``: the RoI layers and functions of ``mmcv.ops``: RoIAlign,
  RoIPool (in mmcv's continuous convention), rotated and rotation-invariant RoIAlign,
  Precise RoI Pooling (gradient to the boxes too), deformable RoI pooling (with the
  ``Pack`` layers that predict the offset), Bezier alignment and border align.

The modules are imported on first use (``roiops.compat.mmdet``, or
``from roiops.compat import mmdet``) so that importing roiops does not pay for them.
Where a peer asserts the boxes' shape, its drop-in raises [`BoxAssertionError`][roiops.compat.BoxAssertionError] for
malformed boxes: an ``AssertionError`` as the peer's and roiops' ``ValueError``.
``docs/porting.md`` lists, per system, the old import, the new one and every behavioural
difference.
"""

import importlib
from types import ModuleType

from ._util import BoxAssertionError

# The drop-in modules, imported on first use.
_MODULES = ("detectron2", "faster_rcnn_pytorch", "maskrcnn_benchmark", "mmcv", "mmdet", "simple_faster_rcnn",
            "torchvision")
__all__ = ["BoxAssertionError", *_MODULES]


def __getattr__(name: str) -> ModuleType:
    if name in _MODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
