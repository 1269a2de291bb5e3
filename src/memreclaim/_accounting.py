"""Process-wide trim accounting, a shim over the C core's totals (kept for its importers).

Every trim is counted by the C core's ``trim`` itself (the public :func:`memreclaim.trim`, the
runners and any direct ``memreclaim._core.trim`` call alike), once, so metrics agree with the
runners' counters, never count one release twice, and no call can bypass them. The public face is
:func:`memreclaim.totals`, which returns the C core's :class:`memreclaim.TrimTotals`.
:func:`totals` here returns the same figures as this module's own :class:`TrimTotals` record,
which its callers construct too (a zero starting point); ``UNPRODUCTIVE_BELOW`` and
``SECONDS_BUCKETS`` are the C core's.
"""

from __future__ import annotations

from . import _core

__all__ = ["SECONDS_BUCKETS", "UNPRODUCTIVE_BELOW", "TrimTotals", "record", "totals"]

UNPRODUCTIVE_BELOW: int = _core.UNPRODUCTIVE_BELOW
"""A trim that gives back less than this many bytes (or an unknown amount) is unproductive."""

SECONDS_BUCKETS: tuple[float, ...] = _core.SECONDS_BUCKETS
"""Upper bounds (seconds) of the trim-duration histogram; a last bucket holds the rest."""


class TrimTotals:
    """What every trim in this process added up to since start (or since the last fork).

    This module's record of :class:`memreclaim.TrimTotals`' fields, as :func:`totals` has always
    returned them. Immutable; compares and prints like a frozen dataclass of the same fields.
    """

    __slots__ = ("released_bytes", "seconds", "seconds_buckets", "trims", "unproductive")
    _FIELDS = ("trims", "unproductive", "released_bytes", "seconds", "seconds_buckets")

    trims: int
    unproductive: int
    released_bytes: int
    seconds: float
    seconds_buckets: tuple[int, ...]  # counts per SECONDS_BUCKETS bound, then the overflow

    def __init__(
        self,
        trims: int,
        unproductive: int,
        released_bytes: int,
        seconds: float,
        seconds_buckets: tuple[int, ...],
    ) -> None:
        values = (trims, unproductive, released_bytes, seconds, seconds_buckets)
        for name, value in zip(self._FIELDS, values, strict=True):
            object.__setattr__(self, name, value)

    def _values(self) -> tuple[object, ...]:
        return tuple(getattr(self, name) for name in self._FIELDS)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"TrimTotals is immutable: cannot set {name!r}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"TrimTotals is immutable: cannot delete {name!r}")

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        assert isinstance(other, TrimTotals)
        return self._values() == other._values()

    def __hash__(self) -> int:
        return hash(self._values())

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self._FIELDS)
        return f"TrimTotals({fields})"


def record(released: int | None, seconds: float) -> None:
    """Count a trim made outside the C core's ``trim`` that gave back ``released`` bytes (None:
    unknown) in ``seconds``; ``trim`` counts itself.

    Raises:
        TypeError: ``released`` is not an int or None, or ``seconds`` not a number.
        ValueError: ``released`` is negative, or ``seconds`` negative or not finite.
    """
    _core._record_trim(released, seconds)


def totals() -> TrimTotals:
    """A consistent copy of the process totals (the figures of :func:`memreclaim.totals`)."""
    t = _core.totals()
    return TrimTotals(t.trims, t.unproductive, t.released_bytes, t.seconds, t.seconds_buckets)
