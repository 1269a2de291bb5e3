"""Process-wide trim accounting: every :func:`memreclaim.trim` call, direct or made by a runner,
is recorded here exactly once (by the public ``trim`` itself), so metrics agree with the
runners' counters and never count one release twice.

Cheap and lock-protected: a trim takes milliseconds, recording it a microsecond.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass

__all__ = ["SECONDS_BUCKETS", "UNPRODUCTIVE_BELOW", "TrimTotals", "record", "totals"]

UNPRODUCTIVE_BELOW = 1 << 20
"""A trim that gives back less than this many bytes (or an unknown amount) is unproductive."""

SECONDS_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
"""Upper bounds (seconds) of the trim-duration histogram; a last bucket holds the rest."""


@dataclass(frozen=True)
class TrimTotals:
    """What every trim in this process added up to since start (or since the last fork)."""

    trims: int
    unproductive: int
    released_bytes: int
    seconds: float
    seconds_buckets: tuple[int, ...]  # counts per SECONDS_BUCKETS bound, then the overflow


_lock = threading.Lock()
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
    _lock = threading.Lock()
    _trims = _unproductive = _released = 0
    _seconds = 0.0
    _buckets = [0] * (len(SECONDS_BUCKETS) + 1)


os.register_at_fork(after_in_child=_reset_in_child)
