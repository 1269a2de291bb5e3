"""Settle: wait for a burst to end. No trim while RSS is still rising: more than ``settle``
over the lowest of the readings of the last ``window`` seconds (and at least the previous one:
one stalled reading in the middle of a burst does not look like its end), unless no request is
in flight (``in_flight=0``: the burst just ended) or the work that allocated is over
(``settled=True``)."""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

from ._reading import Reading

__all__ = ["Settle", "SettleState"]


@dataclass
class SettleState:
    """The readings of the last window: (now, rss), oldest first."""

    recent: collections.deque[tuple[float, int]] = field(default_factory=collections.deque)


class Settle:
    """The rising check over ``window`` seconds of readings."""

    def __init__(self, window: float) -> None:
        self.window = window
        self.state = SettleState()

    def start(self, now: float, rss: int) -> None:
        """Forget every reading but this one (at a reset, or right after a trim)."""
        self.state.recent.clear()
        self.state.recent.append((now, rss))

    def observe(self, reading: Reading) -> int:
        """Fold ``reading`` in; return the lowest RSS of the readings in the window before it
        (the reading's own RSS when there is none)."""
        recent = self.state.recent
        while len(recent) > 1 and recent[0][0] < reading.now - self.window:
            recent.popleft()  # keeps at least the previous reading
        lowest = min((value for _, value in recent), default=reading.rss)
        recent.append((reading.now, reading.rss))
        return lowest

    @staticmethod
    def busy(reading: Reading, lowest: int, settle: int) -> bool:
        """RSS rose more than ``settle`` over ``lowest`` with work that may still allocate."""
        return reading.rss - lowest > settle and not reading.settled and reading.in_flight != 0
