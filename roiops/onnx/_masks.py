"""ONNX translations of the mask steps of Mask R-CNN: mask targets (from masks and from polygons) and
mask pasting (detectron2's and torchvision's rules)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

TRANSLATIONS: dict[str, Callable[..., Any]] = {}
