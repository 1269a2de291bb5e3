"""The limit stage: how far RSS is from a soft limit's mark (``fraction`` of ``limit``).

- **Far**: the normal pacing decides.
- **Near** (approaching: RSS nearer the mark than the learned level): the back-off no longer
  applies (the rising check and the CPU budget still do), and a runner reads every 20 ms.
- **Urgent** (at the mark): trim at once what was freed since the last trim (more than
  ``min_release``), else at every ``min_interval`` while the level is below the mark and the
  burst is over (a trim in the middle of one gives nothing back and was measured to cost the
  race against the limit, ``benchmarks/bench_limits.py``). When the level itself, live memory,
  reaches the mark, trimming cannot help: said once (WARNING), then the normal pacing decides.

The limit is bytes or None: ``"auto"`` is resolved before (see :class:`PacingPolicy`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from ..units import format_bytes
from ._reading import Decision, Reading, TrimOutcome

__all__ = ["NEAR_LIMIT_HOLD", "LimitStage", "LimitState"]

logger = logging.getLogger("memreclaim")

_NEAR_LIMIT_TICK = 0.02
"""Seconds between a runner's readings while RSS approaches the limit (see
:meth:`PacingPolicy.tick_interval`)."""
NEAR_LIMIT_HOLD = 2.0
"""Seconds after a trim made at or approaching the limit during which readings stay fast: a
burst that crossed the mark may be freed, or grow on, right after that trim."""
_NEAR_LIMIT_FREE_READ = 0.1
"""Seconds between two reads of the allocator's free bytes near the limit (see
:meth:`PacingPolicy.wants_free`; a read walks glibc's free lists: about 3 ms on a fragmented
500 MiB heap)."""


@dataclass
class LimitState:
    """Whether the last decision came from the limit, how long readings stay fast after a trim
    made there, and whether live memory at the mark was said."""

    urgent: bool = False
    hold_until: float = float("-inf")
    warned: bool = False


class LimitStage:
    """Distance to a soft limit: far, near (approaching its mark) or urgent (at the mark)."""

    def __init__(
        self, limit: int | None, fraction: float, min_release: int, min_interval: float
    ) -> None:
        self.limit = limit
        self.fraction = fraction
        self.min_release = min_release
        self.min_interval = min_interval
        self.state = LimitState()

    @property
    def mark(self) -> int | None:
        """The RSS at which trims ignore all pacing, or None without a limit."""
        return None if self.limit is None else int(self.limit * self.fraction)

    def approaching(self, rss: int, level: int) -> bool:
        """RSS is nearer the mark than the learned level (and the level below it)."""
        mark = self.mark
        return mark is not None and level < mark and rss - level > mark - rss

    def near(self, rss: int, level: int, settle: int) -> bool:
        """Approaching the mark, or over it and risen (more than ``settle``) since the last trim
        (a burst that a trim at the mark learned in its middle). Live memory at the mark, RSS
        flat at its level, is not near: its readings stay at the normal pace."""
        mark = self.mark
        if mark is None:
            return False
        return self.approaching(rss, level) or (rss >= mark and rss - level > settle)

    def held(self, now: float | None) -> bool:
        """Within :data:`NEAR_LIMIT_HOLD` seconds of a trim made at or approaching the limit."""
        return now is not None and now < self.state.hold_until

    def observe(self, reading: Reading, level: int) -> None:
        """Whether a trim answered for ``reading`` is urgent (at or approaching the mark)."""
        mark = self.mark
        rss = reading.rss
        self.state.urgent = mark is not None and (rss >= mark or self.approaching(rss, level))

    def decide(
        self, reading: Reading, level: int, freed: int, busy: bool, waited: bool
    ) -> tuple[Decision, str] | None:
        """At or over the mark: (decision, reason); None elsewhere, or where the normal pacing
        decides (the level itself is at the mark: warned once). ``freed``: the allocator's free
        bytes gained since the last trim; ``waited``: ``min_interval`` passed since it."""
        mark, rss = self.mark, reading.rss
        if mark is None or rss < mark:
            return None
        of_limit = f"{self.fraction:.0%} of limit {format_bytes(self.limit or 0)}"
        if freed > self.min_release:  # freed since the last trim: it can go back now
            return "trim", f"freed {format_bytes(freed)} with RSS {format_bytes(rss)} >= {of_limit}"
        if level < mark and rss - level > self.min_release:
            if busy:
                return "rising", ""  # a trim in the middle of a burst gives nothing back
            if not waited:
                return "min-interval", ""
            return "trim", f"RSS {format_bytes(rss)} >= {of_limit}"
        if level >= mark:
            self.warn(level)
        return None

    def record(self, outcome: TrimOutcome) -> None:
        """A trim ended: readings stay fast a while if it was urgent; live memory at the mark
        is said once."""
        if self.state.urgent:  # made at or approaching the limit: keep watching closely a while
            self.state.hold_until = outcome.now + NEAR_LIMIT_HOLD
        self.state.urgent = False
        mark = self.mark
        if mark is not None and outcome.rss_after >= mark:
            self.warn(outcome.rss_after)

    def warn(self, level: int) -> None:
        """Say once that live memory (``level``) sits at the mark: trimming cannot help."""
        if self.state.warned or self.limit is None:
            return
        self.state.warned = True
        logger.warning(
            "memreclaim: live memory is near the limit: after a trim RSS stays at %s, %.0f%% of"
            " the %s limit (mark %s); trimming cannot bring it lower: the data is live",
            format_bytes(level),
            100.0 * level / self.limit,
            format_bytes(self.limit),
            format_bytes(self.mark or 0),
        )
