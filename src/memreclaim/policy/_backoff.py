"""Unproductive trims and the re-test schedule.

- **Back-off.** A trim that yields little is information (it taught the level), not a reason to
  wait: the back-off starts only at the second unproductive trim in a row, then the wait doubles
  from ``min_interval`` up to ``backoff_max``.
- **Re-tests.** A provisional level (a trim that missed memory: ``"incomplete"``; memory that
  came back by itself after it: ``"regrowth"``) is re-tested by a trim after ``retest`` seconds,
  then after twice that after each re-test that finds it again, up to ``retest_max``, and never
  sooner than the last trim's cost allows at the CPU budget. A re-test that gives memory back
  starts the spacing over.
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import _validate
from ._reading import Provisional

__all__ = ["Backoff", "BackoffState", "Retest", "RetestState"]


@dataclass
class BackoffState:
    """When the last trim ended, and how many unproductive trims in a row led to it."""

    last_trim: float | None = None
    unproductive_run: int = 0


class Backoff:
    """The minimum interval between trims, doubled after unproductive trims in a row."""

    def __init__(self, min_interval: float, backoff_max: float) -> None:
        if backoff_max < min_interval:
            raise ValueError(
                f"backoff_max ({backoff_max!r} s) must be >= min_interval ({min_interval!r} s)"
            )
        self.min_interval = min_interval
        self.backoff_max = backoff_max
        self.state = BackoffState()

    def start(self) -> None:
        """No trim recorded."""
        self.state = BackoffState()

    @property
    def wait(self) -> float:
        """Seconds that must pass after the last trim before the next (back-off included)."""
        run = self.state.unproductive_run
        if run < 2:
            return self.min_interval
        return min(self.backoff_max, self.min_interval * 2.0 ** (run - 1))

    def waited(self, now: float, wait: float) -> bool:
        """At least ``wait`` seconds passed since the last trim (or there was none)."""
        last = self.state.last_trim
        return last is None or now >= last + wait

    def record(self, now: float, productive: bool) -> None:
        """A trim ended at ``now``."""
        run = 0 if productive else self.state.unproductive_run + 1
        self.state = BackoffState(now, run)


@dataclass
class RetestState:
    """Why the level is provisional, when it is re-tested, and the runs that space re-tests."""

    provisional: Provisional | None = None
    due: float | None = None
    retesting: bool = False
    miss_run: int = 0
    undone_run: int = 0
    undone_seen: bool = False
    seconds_last: float = 0.0


class Retest:
    """The schedule of re-tests of a provisional level."""

    def __init__(
        self, retest: float, retest_max: float, min_interval: float, cpu_budget: float
    ) -> None:
        if retest_max < retest:
            raise ValueError(f"retest_max ({retest_max!r} s) must be >= retest ({retest!r} s)")
        self.retest = retest
        self.retest_max = retest_max
        self.min_interval = min_interval
        self.cpu_budget = cpu_budget
        self.state = RetestState()

    def start(self) -> None:
        """Nothing provisional."""
        self.state = RetestState()

    def spacing(self, run: int) -> float:
        """Seconds between a trim and the re-test of its provisional level after ``run`` (>= 1)
        re-tests in a row found the level again: ``retest * 2 ** (run - 1)``, at least the last
        trim's cost divided by the CPU budget, at most ``retest_max``."""
        run = _validate.integer("run", run, minimum=1)
        spacing = self.retest * 2.0 ** min(run - 1, 64)
        cost_paced = self.state.seconds_last / self.cpu_budget
        return max(self.min_interval, min(self.retest_max, max(spacing, cost_paced)))

    def is_due(self, now: float) -> bool:
        """A provisional level's re-test is due at ``now``."""
        return self.state.due is not None and now >= self.state.due

    def undone(self, last_trim: float) -> None:
        """The trim that ended at ``last_trim`` was undone by regrowth (counted once per trim)."""
        state = self.state
        if not state.undone_seen:
            state.undone_seen = True
            state.undone_run += 1
            state.due = last_trim + self.spacing(state.undone_run)
        state.provisional = "regrowth"

    def trimmed(self, seconds: float, after_a_trim: bool) -> None:
        """A trim that took ``seconds`` ended; ``after_a_trim``: an earlier one was recorded."""
        state = self.state
        if after_a_trim and not state.undone_seen:
            state.undone_run = 0  # the previous trim's release held until this one
        state.undone_seen = False
        state.seconds_last = seconds

    def judge(self, now: float, incomplete: bool, productive: bool) -> None:
        """The level the trim that ended at ``now`` left: provisional when ``incomplete``."""
        state = self.state
        retested, state.retesting = state.retesting, False
        if incomplete:
            # A re-test that found the level again doubles the spacing; one that gave memory
            # back (or the first incomplete trim) starts it over.
            state.miss_run = state.miss_run + 1 if retested and not productive else 1
            state.provisional = "incomplete"
            state.due = now + self.spacing(state.miss_run)
            return
        # Complete. After trims undone by regrowth, the undone run is kept until a trim holds
        # (see trimmed): the next regrowth then waits longer.
        state.miss_run = 0
        state.provisional = None
        state.due = None
