"""Process-wide trim accounting: every :func:`memreclaim.trim` call, direct or made by a runner,
is recorded here exactly once (by the public ``trim`` itself), so metrics agree with the
runners' counters and never count one release twice.

Cheap and lock-protected: a trim takes milliseconds, recording it a microsecond.
"""

from __future__ import annotations

import _thread  # not threading, nor dataclasses: together ~3.5 MiB of RSS on `import memreclaim`
import os

__all__ = ["SECONDS_BUCKETS", "UNPRODUCTIVE_BELOW", "TrimTotals", "record", "totals"]

UNPRODUCTIVE_BELOW = 1 << 20
"""A trim that gives back less than this many bytes (or an unknown amount) is unproductive."""

SECONDS_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
"""Upper bounds (seconds) of the trim-duration histogram; a last bucket holds the rest."""


class TrimTotals:
    """What every trim in this process added up to since start (or since the last fork).

    Immutable; compares and prints like a frozen dataclass of the same fields.
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


_lock = _thread.allocate_lock()
_trims = 0
_unproductive = 0
_released = 0
_seconds = 0.0
_buckets = [0] * (len(SECONDS_BUCKETS) + 1)


def record(released: int | None, seconds: float) -> None:
    """Add one trim that gave back ``released`` bytes (None: unknown) in ``seconds``."""
    global _trims, _unproductive, _released, _seconds
    slot = next((i for i, bound in enumerate(SECONDS_BUCKETS) if seconds <= bound), -1)
    with _lock:
        _trims += 1
        _seconds += seconds
        _buckets[slot] += 1
        if released is None or released < UNPRODUCTIVE_BELOW:
            _unproductive += 1
        if released:
            _released += released


def totals() -> TrimTotals:
    """A consistent copy of the totals."""
    with _lock:
        return TrimTotals(_trims, _unproductive, _released, _seconds, tuple(_buckets))


def _reset_in_child() -> None:
    """A forked child starts its own account (its parent's trims are not its own)."""
    global _lock, _trims, _unproductive, _released, _seconds, _buckets
    _lock = _thread.allocate_lock()
    _trims = _unproductive = _released = 0
    _seconds = 0.0
    _buckets = [0] * (len(SECONDS_BUCKETS) + 1)


os.register_at_fork(after_in_child=_reset_in_child)
