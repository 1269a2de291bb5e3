"""Argument checks shared by every layer: one place per validator.

Each function takes the parameter's name (for the message) and the value, and returns the value
normalised (a float of seconds, an int of bytes, ...) or raises TypeError (wrong type) or
ValueError (right type, value out of range). ``bool`` is never accepted as a number. Nothing
here has side effects, so a call that raises changes nothing.
"""

from __future__ import annotations

import math
from typing import Any, TypeVar

from .units import parse_bytes

__all__ = ["callback", "flag", "fraction", "instance", "integer", "seconds", "size"]

_T = TypeVar("_T")


MIN_INTERVAL = 0.001
"""The shortest interval a runner accepts (1 ms): below it a runner would only busy-loop."""


def seconds(
    name: str,
    value: object,
    *,
    allow_zero: bool = False,
    minimum: float | None = None,
    maximum: float | None = None,
) -> float:
    """A finite duration in seconds (> 0, or >= 0 with ``allow_zero``), at least ``minimum``
    (when not 0) and at most ``maximum``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(
            f"{name} must be a number of seconds (int or float), not {type(value).__name__}"
        )
    result = float(value)
    if not math.isfinite(result):
        raise ValueError(f"{name} must be a finite number of seconds, got {value!r}")
    if result < 0 or (result == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be {bound} seconds, got {value!r}")
    if minimum is not None and 0 < result < minimum:
        raise ValueError(f"{name} must be at least {minimum:g} seconds, got {value!r}")
    if maximum is not None and result > maximum:
        raise ValueError(f"{name} must be at most {maximum:g} seconds, got {value!r}")
    return result


def size(name: str, value: object, *, allow_zero: bool = False) -> int:
    """A byte count from an int or a string such as ``"200 MiB"`` (see :func:`parse_bytes`)."""
    try:
        nbytes = parse_bytes(value)  # type: ignore[arg-type]
    except TypeError as exc:
        raise TypeError(f"{name}: {exc}") from None
    except ValueError as exc:
        raise ValueError(f"{name}: {exc}") from None
    if nbytes == 0 and not allow_zero:
        raise ValueError(f"{name} must be > 0 bytes, got {value!r}")
    return nbytes


def integer(name: str, value: object, *, minimum: int = 0, maximum: int | None = None) -> int:
    """A whole number in ``[minimum, maximum]`` (an int, or a float with no fractional part)."""
    if isinstance(value, float) and not isinstance(value, bool):
        if not value.is_integer():
            raise ValueError(f"{name} must be a whole number, got {value!r}")
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {value}")
    return value


def fraction(name: str, value: object, *, allow_zero: bool = True) -> float:
    """A number in ``[0, 1]`` (``(0, 1]`` without ``allow_zero``)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number between 0 and 1, not {type(value).__name__}")
    result = float(value)
    if not (0.0 <= result <= 1.0) or (result == 0 and not allow_zero):
        low = "0 (inclusive)" if allow_zero else "0 (exclusive)"
        raise ValueError(f"{name} must be between {low} and 1, got {value!r}")
    return result


def flag(name: str, value: object) -> bool:
    """A real ``bool`` (not a truthy int or string)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, not {type(value).__name__}")
    return value


def callback(name: str, value: _T | None, *, takes: str = "one argument") -> _T | None:
    """``None`` or a callable (``takes`` says what it is called with, for the message)."""
    if value is not None and not callable(value):
        raise TypeError(
            f"{name} must be a callable taking {takes}, or None, not {type(value).__name__}"
        )
    return value


def instance(name: str, value: object, kind: type[_T] | tuple[type[Any], ...]) -> _T:
    """``value`` if it is an instance of ``kind``, else TypeError naming what was expected."""
    if not isinstance(value, kind):
        expected = (
            " or ".join(k.__name__ for k in kind) if isinstance(kind, tuple) else kind.__name__
        )
        raise TypeError(f"{name} must be a {expected}, not {type(value).__name__}")
    return value
