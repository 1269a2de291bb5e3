"""The learnt level and the growth triggers.

- **Learnt level.** The RSS right after a trim is the level that live data pins (plus the
  allocator's unavoidable overhead). Growth is measured against it, not against the RSS at
  start: memory that stays live costs one trim (which learns it), never an endless series. The
  level follows RSS down when memory goes back by itself. ``slack=None`` derives the trigger
  from it: ``max(8 MiB, level / 8)``.
- **Later frees.** RSS does not fall when memory is freed; the allocator's free bytes do rise
  (a rise of more than ``slack`` since the last trim triggers one), tracemalloc's traced bytes
  fall, and a drop ``d`` of the in-use bytes below their after-trim value unpins, pro rata, up
  to ``d + excess * d / in_use_after`` (the *pinned excess*: RSS after the trim minus the in-use
  bytes minus the *baseline*, the lowest ``rss - in_use`` seen). In-use bytes that fell while
  the trim ran (another thread freed: a Dask worker dropping its results) count from their
  figure when it started (``TrimOutcome.in_use_before``), not the lower one after it: the trim
  may have passed those pages before they were free, and nothing later would show them.
- **Unaccounted memory.** Resident memory that neither the allocators' mapped bytes nor the
  baseline account for, grown by more than half of ``slack`` since the last trim to more than
  ``slack``, is a trigger (a library pool freed what it held after the trim).
- **Regrowth.** Growth after a trim of no more than it released (plus ``slack``) that neither
  in-use nor address-space growth explains (less than ``release_fraction`` of it) is memory
  that came back by itself (THP ``always``): the composition learns it as a provisional level.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..units import format_bytes
from ._reading import Reading, TrimOutcome

__all__ = ["GrowthTrigger", "LearntLevel", "LevelState", "TriggerState"]

_AUTO_SLACK_MIN = 8 << 20
"""With ``slack=None``, the trigger is at least this many bytes of growth."""
_AUTO_SLACK_FRACTION = 0.125
"""With ``slack=None``, the trigger is this fraction of the learned level (if larger)."""


@dataclass
class LevelState:
    """The lowest RSS seen, the learnt level, the last reading, and the traced bytes at the
    level (None until the policy is started)."""

    floor: int | None = None
    level: int | None = None
    previous: int | None = None
    traced: int | None = None


class LearntLevel:
    """What live data pins: RSS right after the last trim, or lower when RSS fell since."""

    def __init__(self, slack: int | None, use_traced: bool) -> None:
        self.fixed_slack = slack
        self.use_traced = use_traced
        self.state = LevelState()

    def start(self, rss: int, traced: int | None) -> None:
        """Floor and level at ``rss``."""
        self.state = LevelState(rss, rss, rss, traced)

    def require(self) -> tuple[int, int]:
        """(floor, level); RuntimeError before :meth:`start`."""
        floor, level = self.state.floor, self.state.level
        if floor is None or level is None:
            raise RuntimeError("PacingPolicy.reset() must be called before decide()/record_trim()")
        return floor, level

    @property
    def slack(self) -> int:
        """Growth over the level that triggers a trim (derived from the level when not set)."""
        if self.fixed_slack is not None:
            return self.fixed_slack
        level = self.state.level or 0
        return max(_AUTO_SLACK_MIN, int(level * _AUTO_SLACK_FRACTION))

    def growth(self, rss: int, traced: int | None) -> int:
        """RSS growth over the level, minus traced growth when tracing (may be < 0)."""
        _, level = self.require()
        grown = rss - level
        if self.use_traced and traced is not None and self.state.traced is not None:
            grown -= max(0, traced - self.state.traced)
        return grown

    def traced_fall(self, traced: int | None) -> int:
        """Bytes tracemalloc's traced memory fell below its value at the level (0 unknown)."""
        if not self.use_traced or traced is None or self.state.traced is None:
            return 0
        return self.state.traced - traced

    def observe(self, reading: Reading) -> int:
        """Fold ``reading`` in; return the level now."""
        floor, level = self.require()
        state = self.state
        if reading.rss < floor:
            state.floor = reading.rss
        if reading.rss < level:  # memory went back by itself: the level follows it down
            state.level = level = reading.rss
            state.traced = reading.traced
        state.previous = reading.rss
        if state.traced is None and reading.traced is not None:
            state.traced = reading.traced
        return level

    def relearn(self, reading: Reading) -> None:
        """Take ``reading`` as the level (memory that came back by itself)."""
        self.state.level = reading.rss
        self.state.traced = reading.traced

    def learn(self, outcome: TrimOutcome) -> None:
        """A trim ended: its RSS after is the level."""
        state = self.state
        state.level = state.previous = outcome.rss_after
        if state.floor is not None and outcome.rss_after < state.floor:
            state.floor = outcome.rss_after
        state.traced = outcome.traced


@dataclass
class TriggerState:
    """The figures the last trim left (see the module docstring), and the free-bytes mark."""

    free_mark: int | None = None
    last_free_read: float | None = None
    baseline: int | None = None
    in_use_after: int | None = None
    vsize_after: int | None = None
    excess: int | None = None
    unexplained: int | None = None
    released_last: int = 0


class GrowthTrigger:
    """Growth over the level, and the frees that RSS cannot show, measured against ``slack``."""

    def __init__(self, release_fraction: float) -> None:
        self.release_fraction = release_fraction
        self.state = TriggerState()

    def start(self, rss: int, in_use: int | None) -> None:
        """No trim yet; ``in_use`` seeds the baseline (``rss - in_use``: what no heap holds)."""
        self.state = TriggerState(baseline=None if in_use is None else rss - in_use)

    def observe(self, reading: Reading) -> None:
        """The lowest free bytes since the last trim are the mark later frees count from."""
        state = self.state
        if reading.free is not None:
            state.last_free_read = reading.now
            if state.free_mark is None or reading.free < state.free_mark:
                state.free_mark = reading.free

    def freed(self, reading: Reading) -> int:
        """Free bytes gained since the last trim (0 unknown)."""
        mark = self.state.free_mark
        return 0 if reading.free is None or mark is None else reading.free - mark

    def reason(self, reading: Reading, level: LearntLevel, slack: int) -> str | None:
        """Why ``reading`` triggers a trim, or None."""
        grown = level.growth(reading.rss, reading.traced)
        if grown > slack:
            return f"growth {format_bytes(grown)} > slack {format_bytes(slack)}"
        freed = self.freed(reading)
        if freed > slack:
            return f"freed {format_bytes(freed)} since the last trim"
        fell = level.traced_fall(reading.traced)
        if fell > slack:
            return f"traced memory fell {format_bytes(fell)}"
        unpinned = self.unpinned(reading.in_use)
        if unpinned > slack:
            assert reading.in_use is not None and self.state.in_use_after is not None
            return (
                f"in use fell {format_bytes(self.state.in_use_after - reading.in_use)} since"
                f" the last trim: up to {format_bytes(unpinned)} returnable"
            )
        return None if reading.vsize is not None else self.unaccounted(reading, slack)

    def unaccounted(self, reading: Reading, slack: int) -> str | None:
        """The trigger for resident memory no allocator accounts for, grown since the trim."""
        state = self.state
        if reading.mapped is None or state.baseline is None or state.unexplained is None:
            return None
        unexplained = reading.rss - reading.mapped - state.baseline
        grown = unexplained - state.unexplained
        if unexplained > slack and 2 * grown > slack:
            return (
                f"{format_bytes(unexplained)} resident that no allocator accounts for"
                f" ({format_bytes(grown)} more than after the last trim)"
            )
        return None

    def unpinned(self, in_use: int | None) -> int:
        """Bytes a drop of in-use bytes to ``in_use`` may let a trim return: the drop, plus the
        pinned excess pro rata (0 without figures)."""
        after = self.state.in_use_after
        if in_use is None or after is None or in_use >= after:
            return 0
        dropped = after - in_use
        return dropped + (self.state.excess or 0) * dropped // max(after, 1)

    def may_have_regrown(self, grown: int, slack: int) -> bool:
        """Growth since the last trim of more than ``slack`` and no more than it released
        (plus ``slack``): memory that may have come back without allocation."""
        released = self.state.released_last
        return released > slack and slack < grown <= released + slack

    def allocation_explains(self, reading: Reading, grown: int) -> bool | None:
        """Whether in-use and address-space growth since the last trim explain ``grown`` (at
        least ``release_fraction`` of it); None without the figures to tell."""
        state = self.state
        if reading.in_use is None or reading.vsize is None:
            return None
        if state.in_use_after is None or state.vsize_after is None:
            return None
        explained = max(0, reading.in_use - state.in_use_after)
        explained += max(0, reading.vsize - state.vsize_after)
        return explained >= self.release_fraction * grown

    def learn(self, outcome: TrimOutcome) -> None:
        """A trim ended: its free bytes are the new mark; its figures size what it left. A fall
        of the in-use bytes between the reading that decided the trim and its end (frees while
        it ran, which it may have missed) stays a drop to trigger on."""
        state = self.state
        state.free_mark = outcome.free
        if outcome.free is not None:
            state.last_free_read = outcome.now
        state.released_last = max(0, outcome.released)
        before = outcome.in_use_before
        state.in_use_after = outcome.in_use
        if before is not None and outcome.in_use is not None and before > outcome.in_use:
            state.in_use_after = before
        state.vsize_after = outcome.vsize
        if outcome.in_use is not None:
            outside = outcome.rss_after - outcome.in_use
            if state.baseline is None or outside < state.baseline:
                state.baseline = outside
        baseline = state.baseline
        if outcome.in_use is None or baseline is None:
            state.excess = None
        else:
            state.excess = max(0, outcome.rss_after - outcome.in_use - baseline)
        state.unexplained = (
            None
            if outcome.mapped is None or baseline is None
            else outcome.rss_after - outcome.mapped - baseline
        )

    def missed(self, outcome: TrimOutcome, floor: int, slack: int) -> bool:
        """The trim (already learnt) missed memory: RSS after it more than ``slack`` over what
        the allocators map plus the baseline, or a part it could not reach with the level more
        than ``slack`` over ``floor``: its level is provisional."""
        unexplained = self.state.unexplained
        missed = unexplained is not None and unexplained > slack
        return missed or (outcome.unreached and outcome.rss_after - floor > slack)
