"""ONNX translations of the point-cloud operators: points in boxes, RoIAware and
RoIPoint pooling."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

TRANSLATIONS: dict[str, Callable[..., Any]] = {}
