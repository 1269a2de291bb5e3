"""Byte sizes for humans: format_bytes() and parse_bytes()."""

from __future__ import annotations

import re

__all__ = ["format_bytes", "parse_bytes"]

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)\s*$")


def parse_bytes(value: int | str) -> int:
    """Return a byte count from an int or a string such as ``"1 MiB"``, ``"500 KB"``, ``"2g"``.

    IEC units (KiB, MiB, GiB, TiB) are powers of 1024; SI units (kB, MB, GB, TB, or k, m, g, t)
    are powers of 1000. Case does not matter.

    Raises:
        TypeError: for anything but an int or a str (bool included).
        ValueError: for a negative number, an unknown unit, or a string that is not a size.
    """
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise TypeError(f"a size must be an int or a str like '1 MiB', not {type(value).__name__}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"a size must be >= 0 bytes, got {value}")
        return value
    match = _PATTERN.match(value)
    if match is None:
        raise ValueError(f"not a size: {value!r} (expected e.g. '512', '500 KB', '1 MiB')")
    number, unit = match.groups()
    factor = _UNITS.get(unit.lower())
    if factor is None:
        raise ValueError(
            f"unknown unit {unit!r} in {value!r}: use B, kB/MB/GB/TB (x1000) or KiB/MiB/GiB/TiB"
            " (x1024)"
        )
    return int(float(number) * factor)


def format_bytes(nbytes: int | float) -> str:
    """Format a byte count with IEC units: ``format_bytes(3 * 2**20) == '3.0 MiB'``.

    Negative values keep their sign (useful for deltas). Raises TypeError for non-numbers.
    """
    if isinstance(nbytes, bool) or not isinstance(nbytes, int | float):
        raise TypeError(f"nbytes must be a number, not {type(nbytes).__name__}")
    sign = "-" if nbytes < 0 else ""
    size = float(abs(nbytes))
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024:
            return f"{sign}{size:.0f} {unit}" if unit == "B" else f"{sign}{size:.1f} {unit}"
        size /= 1024
    return f"{sign}{size:.1f} TiB"
