"""Argument helpers shared by the compat modules."""

from __future__ import annotations

import functools
import numbers
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from .._validation import BoxFormatError

_P = ParamSpec("_P")
_T = TypeVar("_T")


def as_int(value: object, name: str, minimum: int) -> int:
    """An integer argument that legacy code may have passed as an int-valued float.

    The ported projects wrapped such arguments in ``int()``, which silently
    truncated 6.5 to 6; we accept 7 and 7.0 but refuse anything that is not a
    whole number.
    """
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got bool")
    if isinstance(value, numbers.Integral):
        result = int(value)
    elif isinstance(value, float) and value.is_integer():
        result = int(value)
    elif isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a whole number, got {value!r}")
    else:
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if result < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {result}")
    return result


class BoxAssertionError(BoxFormatError, AssertionError):
    """Boxes of the wrong shape, from a drop-in whose peer asserts their shape: an
    AssertionError, as the peer raises, and roiops' ValueError."""


def box_assertions(function: Callable[_P, _T]) -> Callable[_P, _T]:
    """A drop-in's call whose peer asserts the boxes' shape: malformed boxes raise
    :class:`BoxAssertionError`."""
    @functools.wraps(function)
    def call(*args: _P.args, **kwargs: _P.kwargs) -> _T:
        try:
            return function(*args, **kwargs)
        except BoxFormatError as error:
            raise BoxAssertionError(*error.args) from None

    return call
