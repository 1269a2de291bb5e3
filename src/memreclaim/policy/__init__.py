"""The pacing policy: when is a trim worth it? Pure logic, no threads, no asyncio, no clock.

Every call takes one record of what the caller measured: a :class:`Reading` (``now``, in any
monotonic seconds, RSS, and when it has them: bytes traced by tracemalloc, the allocator's
figures, the requests in flight) for :meth:`PacingPolicy.decide`, a :class:`TrimOutcome` for
:meth:`PacingPolicy.record_trim`; so the policy is deterministic and unit-tested with a fake
clock and with RSS traces recorded from real servers (``tests/test_policy.py``). The runners in
:mod:`memreclaim.runners` read the signals, ask :meth:`PacingPolicy.decide`, trim, and report
the outcome with :meth:`PacingPolicy.record_trim`.

The model is Go's heap scavenger (a few small controllers, each with its own state, reclaim
paced to a CPU budget) and the JVM's ``TrimNativeHeapInterval``, adapted to an allocator that
does not say what it could give back. :class:`PacingPolicy` composes small rules, each a class
with its own state dataclass and unit tests (``tests/test_policy_rules.py``), and is the only
place that knows them all:

- :mod:`~memreclaim.policy._limit`: the distance to a soft limit's mark (far, near: the back-off
  no longer applies and readings come every 20 ms; at the mark: trim at every ``min_interval``
  once the burst is over, or at once what was freed since the last trim).
- :mod:`~memreclaim.policy._growth`: the learnt level (RSS right after a trim: what live data
  pins) and the triggers: growth over it, the allocator's free bytes, tracemalloc's traced
  bytes, a drop of in-use bytes sized by the excess it unpins, resident memory no allocator
  accounts for; and memory that comes back by itself after a trim (THP ``always``).
- :mod:`~memreclaim.policy._backoff`: unproductive trims (the back-off starts at the second in a
  row) and the re-test schedule of a provisional level (an incomplete trim, or regrowth).
- :mod:`~memreclaim.policy._budget`: the CPU budget over a window.
- :mod:`~memreclaim.policy._settle`: wait for a burst to end.

:meth:`PacingPolicy.decide` has two stages: the limit stage (at the mark), then the pacing (a
trigger or a re-test that is due, then the rising check, the minimum interval or back-off, the
CPU budget).

Defaults: ``slack=None`` derives the trigger from the learned level, ``max(8 MiB, level / 8)``
(so a 60 MiB service trims after 8 MiB of growth, a 2 GiB one after 256 MiB); ``min_interval``
1 s; ``backoff_max`` 30 s; ``cpu_budget`` 1 %; ``retest`` 8 s, ``retest_max`` 300 s.

Unproductive: a trim that gave back less than ``min_release``, by default the process totals'
floor (``memreclaim._core.UNPRODUCTIVE_BELOW``, 1 MiB), or less than ``release_fraction`` of the
growth that triggered it (:meth:`PacingPolicy.productive`, what the runners count).

Limit: ``limit=None`` means no soft limit, here and in the runners; ``limit="auto"`` is the
limit :func:`memreclaim.memlimits.auto_limit` finds (the cgroup's), read once when the policy is
made: the runners resolve it themselves and pass bytes or None, and no rule reads a file.
"""

from __future__ import annotations

import warnings
from typing import Any, TypeVar

from .. import _core, _deprecated, _validate
from ..units import format_bytes
from ._backoff import Backoff, Retest
from ._budget import CpuBudget
from ._growth import _AUTO_SLACK_FRACTION, _AUTO_SLACK_MIN, GrowthTrigger, LearntLevel
from ._limit import _NEAR_LIMIT_FREE_READ, _NEAR_LIMIT_TICK, NEAR_LIMIT_HOLD, LimitStage
from ._reading import Decision, Provisional, Reading, TrimOutcome
from ._settle import Settle

__all__ = [
    "NEAR_LIMIT_HOLD",
    "Decision",
    "PacingPolicy",
    "Provisional",
    "Reading",
    "TrimOutcome",
]

_R = TypeVar("_R", Reading, TrimOutcome)


def _limit_bytes(limit: int | str | None) -> int | None:
    """``limit`` in bytes or None; ``"auto"``: :func:`memreclaim.memlimits.auto_limit` (the one
    cgroup discovery; the runners resolve it before they make a policy)."""
    if isinstance(limit, str) and limit == "auto":
        from ..memlimits import auto_limit

        return auto_limit()
    return None if limit is None else _validate.size("limit", limit)


def _record(kind: type[_R], first: object, rest: tuple[object, ...], fields: dict[str, Any]) -> _R:
    """``first`` when it is a ``kind``; else the call's old form (one release): a ``kind`` made
    of the arguments, with a DeprecationWarning."""
    if isinstance(first, kind):
        if rest or fields:
            raise TypeError(f"pass a {kind.__name__} alone, or the arguments of one")
        return first
    name = "decide" if kind is Reading else "record_trim"
    warnings.warn(
        f"PacingPolicy.{name}(now, ...) is deprecated and goes in the next release: pass a"
        f" memreclaim.policy.{kind.__name__}",
        DeprecationWarning,
        stacklevel=3,
    )
    return kind(first, *rest, **fields)  # type: ignore[arg-type]


class PacingPolicy:
    """Decide when to trim, from measured signals and the measured cost of past trims.

    Pure: no clock, no thread, no I/O (but for ``limit="auto"``, resolved once when it is made).
    Not thread-safe (the runners lock it). One policy per runner: it holds that runner's state.

    Args:
        slack: growth over the learned level (bytes or a string like ``"64 MiB"``) that
            triggers a trim; None derives it: ``max(8 MiB, level / 8)``.
        min_interval: seconds between two trims (> 0).
        backoff_max: cap, in seconds, of the wait after unproductive trims in a row.
        min_release: a trim releasing less than this (bytes or string) is unproductive
            (default: ``UNPRODUCTIVE_BELOW``, 1 MiB, as in the process totals).
        release_fraction: ... or less than this fraction of the growth that triggered it.
        cpu_budget: fraction of wall time trims may take, over ``budget_window`` (0-1].
        budget_window: seconds of budget that may be spent at once (the credit cap).
        settle: no trim while RSS grew more than this (bytes) over the last ``settle_window``
            seconds of readings, unless no request is in flight; None: a quarter of the slack.
        settle_window: seconds of readings the rising check looks back over (> 0).
        limit: a soft memory limit (bytes or string); None: no limit; ``"auto"`` (the
            default): :func:`memreclaim.memlimits.auto_limit`, the cgroup's ``memory.high`` or
            ``memory.max``/``memory.limit_in_bytes``, whichever is lower, or no limit where the
            process has none (read once, here: the policy's rules read no file).
        limit_fraction: fraction of ``limit`` at which trims ignore back-off and budget.
        use_traced: when tracemalloc is tracing, growth it explains (live objects) does not
            count, and a fall of traced bytes counts as a free.
        retest: seconds after an incomplete trim (or a trim undone by regrowth) before the
            provisional level is re-tested by a trim (the minimum interval applies anyway).
        retest_max: cap, in seconds, of the spacing between re-tests, which doubles with each
            re-test that finds the level again (>= ``retest``).

    Raises:
        TypeError, ValueError: for a wrong type or an out-of-range value, naming the argument.
    """

    def __init__(
        self,
        *,
        slack: int | str | None = None,
        min_interval: float = 1.0,
        backoff_max: float = 30.0,
        min_release: int | str = _core.UNPRODUCTIVE_BELOW,
        release_fraction: float = 0.25,
        cpu_budget: float = 0.01,
        budget_window: float = 300.0,
        settle: int | str | None = None,
        settle_window: float = 1.0,
        limit: int | str | None = "auto",
        limit_fraction: float = 0.9,
        use_traced: bool = True,
        retest: float = 8.0,
        retest_max: float = 300.0,
    ) -> None:
        fixed_slack = None if slack is None else _validate.size("slack", slack)
        self._min_interval = _validate.seconds("min_interval", min_interval)
        self._backoff = Backoff(self._min_interval, _validate.seconds("backoff_max", backoff_max))
        self._min_release = _validate.size("min_release", min_release, allow_zero=True)
        self._release_fraction = _validate.fraction("release_fraction", release_fraction)
        cpu = _validate.fraction("cpu_budget", cpu_budget, allow_zero=False)
        self._budget = CpuBudget(cpu, _validate.seconds("budget_window", budget_window))
        self._settle_bytes = (
            None if settle is None else _validate.size("settle", settle, allow_zero=True)
        )
        self._settle = Settle(_validate.seconds("settle_window", settle_window))
        self._limit = LimitStage(
            _limit_bytes(limit),
            _validate.fraction("limit_fraction", limit_fraction, allow_zero=False),
            self._min_release,
            self._min_interval,
        )
        self._level = LearntLevel(fixed_slack, _validate.flag("use_traced", use_traced))
        self._trigger = GrowthTrigger(self._release_fraction)
        self._retest = Retest(
            _validate.seconds("retest", retest),
            _validate.seconds("retest_max", retest_max),
            self._min_interval,
            cpu,
        )
        self._reason = ""

    # ---- configuration (read-only) ----------------------------------------------------------

    @property
    def min_interval(self) -> float:
        """Minimum seconds between two trims."""
        return self._min_interval

    @property
    def backoff_max(self) -> float:
        """Longest wait, in seconds, after unproductive trims in a row."""
        return self._backoff.backoff_max

    @property
    def min_release(self) -> int:
        """A trim releasing fewer bytes than this is unproductive."""
        return self._min_release

    @property
    def release_fraction(self) -> float:
        """A trim releasing less than this fraction of its growth is unproductive."""
        return self._release_fraction

    @property
    def cpu_budget(self) -> float:
        """Fraction of wall time that trims may take."""
        return self._budget.fraction

    @property
    def limit(self) -> int | None:
        """The soft memory limit in bytes, or None."""
        return self._limit.limit

    @property
    def limit_mark(self) -> int | None:
        """The RSS at which trims ignore all pacing: ``limit_fraction`` of ``limit``, or None."""
        return self._limit.mark

    @property
    def use_traced(self) -> bool:
        """Whether tracemalloc's traced bytes are used when tracing."""
        return self._level.use_traced

    @property
    def retest(self) -> float:
        """Seconds before the first re-test of a provisional level."""
        return self._retest.retest

    @property
    def retest_max(self) -> float:
        """Longest spacing, in seconds, between two re-tests of a provisional level."""
        return self._retest.retest_max

    # ---- state ------------------------------------------------------------------------------

    @property
    def urgent(self) -> bool:
        """True when the last ``"trim"`` answer came from the limit (RSS at or approaching its
        mark): a runner should not defer that trim (e.g. to wait for an idle event loop)."""
        return self._limit.state.urgent

    @property
    def slack(self) -> int:
        """Growth over the level that triggers a trim, in bytes (derived when ``slack=None``)."""
        return self._level.slack

    @property
    def settle(self) -> int:
        """No trim while RSS rose more than this many bytes over the recent readings."""
        return self.slack // 4 if self._settle_bytes is None else self._settle_bytes

    @property
    def floor(self) -> int | None:
        """The lowest RSS seen since :meth:`reset` (None before it)."""
        return self._level.state.floor

    @property
    def level(self) -> int | None:
        """The learned level: RSS right after the last trim, or lower if RSS fell since."""
        return self._level.state.level

    @property
    def wait(self) -> float:
        """Seconds that must pass after the last trim before the next (back-off included)."""
        return self._backoff.wait

    @property
    def provisional(self) -> Provisional | None:
        """Why the learned level will be re-tested: ``"incomplete"`` (the last trim left memory
        that no allocator read accounts for, or could not act on a part), ``"regrowth"`` (RSS came
        back after the last trim without allocation), or None (the level is what live data
        pins)."""
        return self._retest.state.provisional

    @property
    def retesting(self) -> bool:
        """True when the last ``"trim"`` answer was a re-test of a provisional level (until the
        trim is recorded)."""
        return self._retest.state.retesting

    @property
    def retest_due(self) -> float | None:
        """The ``now`` from which a provisional level is re-tested by a trim, or None."""
        return self._retest.state.due

    @property
    def baseline(self) -> int | None:
        """The learned RSS that no heap holds: the lowest ``rss - in_use`` seen at a reset or a
        trim (None until the caller passed ``in_use``)."""
        return self._trigger.state.baseline

    @property
    def excess(self) -> int | None:
        """The pinned excess after the last trim: RSS after it minus the in-use bytes and the
        baseline (free heap pages kept resident by the memory still in use), or None."""
        return self._trigger.state.excess

    @property
    def unexplained(self) -> int | None:
        """RSS after the last trim that neither the allocators' mapped bytes nor the baseline
        account for (< 0 when they account for all of it), or None without figures."""
        return self._trigger.state.unexplained

    @property
    def last_trim(self) -> float | None:
        """The ``now`` of the last recorded trim, or None."""
        return self._backoff.state.last_trim

    @property
    def reason(self) -> str:
        """Why the last ``"trim"`` decision fired, e.g. ``"growth 90.0 MiB > slack 8.0 MiB"``."""
        return self._reason

    def retest_spacing(self, run: int) -> float:
        """Seconds between a trim and the re-test of its provisional level, after ``run``
        re-tests in a row found the level again (``run >= 1``): ``retest * 2 ** (run - 1)``,
        at least the last trim's cost divided by ``cpu_budget``, at most ``retest_max``."""
        return self._retest.spacing(run)

    def productive(self, released: int, growth: int) -> bool:
        """Whether a trim that gave back ``released`` bytes after ``growth`` bytes of growth was
        productive: at least ``max(min_release, release_fraction * growth)``. The one
        definition: :meth:`record_trim` returns it and the runners count it."""
        return released >= max(self._min_release, int(self._release_fraction * growth))

    def credit(self, now: float) -> float:
        """Seconds of trim time the CPU budget allows at ``now`` (negative: in debt)."""
        return self._budget.credit(now)

    def growth(self, rss: int, traced: int | None = None) -> int:
        """RSS growth over the learned level, minus traced growth when tracing (may be < 0)."""
        return self._level.growth(rss, traced)

    # ---- the calls --------------------------------------------------------------------------

    def reset(
        self,
        now: float,
        rss: int,
        traced: int | None = None,
        *,
        in_use: int | None = None,
    ) -> None:
        """Start over at ``now``: floor and level are ``rss``, no trim recorded, full credit.

        ``in_use`` (the allocator's in-use bytes, :attr:`HeapStats.in_use`, when known) seeds
        the baseline (``rss - in_use``: what no heap holds).
        """
        _validate.integer("rss", rss)
        if in_use is not None:
            _validate.integer("in_use", in_use)
        self._trigger.start(rss, in_use)
        self._retest.start()
        self._level.start(rss, traced)
        self._settle.start(now, rss)
        self._backoff.start()
        self._budget.start(now)
        self._limit.state.warned = False

    def wants_free(self, now: float, rss: int | None = None) -> bool:
        """Whether the caller should read the allocator's figures (``free``, ``in_use``,
        ``vsize``, ``mapped`` of :class:`Reading`) for this tick: while the level is more than
        ``slack`` over the floor (half of it once a trim has recorded ``mapped``), or the pinned
        excess is more than ``slack`` (memory pinned at the last trim may be freed later, which
        RSS cannot show), at most once per ``min_interval`` (or per second), every 0.1 s near
        the limit; with ``rss`` (this tick's reading), also at every tick whose growth could be
        memory that came back by itself after the last trim (more than ``slack``, at most what
        that trim released plus ``slack``): only the figures tell it from allocation."""
        floor, level = self._level.require()
        figures = self._trigger.state
        if rss is not None and figures.vsize_after is not None and self._may_regrow(rss, level):
            return True
        # Half a slack over the floor with figures known: memory a library pool keeps after the
        # trim shows only in them (see Reading.mapped).
        slack = self.slack
        over = slack // 2 if figures.unexplained is not None else slack
        if level - floor <= over and (figures.excess or 0) <= slack:
            return False
        every = min(self._min_interval, 1.0)
        if self._fast(now):
            every = min(every, _NEAR_LIMIT_FREE_READ)
        last = figures.last_free_read
        return last is None or now - last >= every

    def tick_interval(self, interval: float, now: float | None = None) -> float:
        """Seconds a runner should wait before its next reading, given its ``interval``:
        ``interval`` itself, except while RSS (the last reading) is near the limit, then 0.02 s
        (the trim at the mark comes within a few MiB of allocation, not a second of it), also
        for :data:`NEAR_LIMIT_HOLD` seconds after a trim made at or approaching the limit, when
        ``now`` is given. A reading costs about a microsecond."""
        return min(interval, _NEAR_LIMIT_TICK) if self._fast(now) else interval

    def _fast(self, now: float | None) -> bool:
        """Readings come fast: near the limit, or held after a trim made there."""
        rss, level = self._level.state.previous, self._level.state.level
        if rss is None or level is None:
            return False
        return self._limit.held(now) or self._limit.near(rss, level, self.settle)

    def decide(self, reading: Reading | float, *old: Any, **figures: Any) -> Decision:
        """Take one :class:`Reading` and say whether to trim now.

        Returns ``"trim"`` (:attr:`reason` says why), ``"below-slack"``, ``"rising"`` (RSS
        still rising with work in flight: wait for the burst to end), ``"min-interval"``,
        ``"backoff"`` or ``"budget"`` (the CPU budget is spent). The old form,
        ``decide(now, rss, *, traced=None, ...)``, warns (DeprecationWarning) for one release.
        """
        reading = _record(Reading, reading, old, figures)
        self._level.require()
        self._retest.state.retesting = False
        level = self._level.observe(reading)
        lowest = self._settle.observe(reading)
        self._trigger.observe(reading)
        if self._regrown(reading, level):
            level = reading.rss
        busy = self._settle.busy(reading, lowest, self.settle)
        self._limit.observe(reading, level)
        waited = self._backoff.waited(reading.now, self._min_interval)
        at_limit = self._limit.decide(reading, level, self._trigger.freed(reading), busy, waited)
        if at_limit is None:
            return self._pacing(reading, level, busy)
        decision, reason = at_limit
        if decision == "trim":
            self._reason = reason
        return decision

    def _may_regrow(self, rss: int, level: int) -> bool:
        """RSS grew more than slack since the last trim, by no more than that trim gave back
        (plus slack), away from the limit: memory that may have come back without allocation."""
        if self.last_trim is None or not self._trigger.may_have_regrown(rss - level, self.slack):
            return False
        mark = self._limit.mark
        return mark is None or (rss < mark and not self._limit.approaching(rss, level))

    def _regrown(self, reading: Reading, level: int) -> bool:
        """Learn RSS as a provisional level when its growth since the last trim is memory that
        came back by itself (see :mod:`~memreclaim.policy._growth`); True when it did."""
        if not self._may_regrow(reading.rss, level):
            return False
        if self._trigger.allocation_explains(reading, reading.rss - level) is not False:
            return False  # allocation (a trim can give it back for good), or no figures
        last = self.last_trim
        assert last is not None
        self._retest.undone(last)
        self._level.relearn(reading)
        return True

    def _pacing(self, reading: Reading, level: int, busy: bool) -> Decision:
        """The normal pacing: a trigger (or a re-test that is due), then the rising check, the
        minimum interval or back-off, and the CPU budget."""
        now = reading.now
        reason = self._trigger.reason(reading, self._level, self.slack)
        retest = reason is None and self._retest.is_due(now)
        if retest:
            reason = f"re-test of the {self.provisional} level {format_bytes(level)}"
        if reason is None:
            return "below-slack"
        # Approaching the limit (nearer the mark than the learned level: the growth a trim could
        # give back exceeds the headroom left), the back-off may not make it wait. The rising
        # check still holds: trims in the middle of a burst give nothing and would only spend
        # the minimum interval that the trim at the mark needs.
        approaching = self._limit.approaching(reading.rss, level)
        if busy:
            return "rising"
        # A re-test has its own spacing (longer than the back-off's): only the minimum applies.
        wait = self._min_interval if approaching or retest else self._backoff.wait
        if not self._backoff.waited(now, wait):
            return "backoff" if wait > self._min_interval else "min-interval"
        if self._budget.credit(now) < 0:
            return "budget"
        self._retest.state.retesting = retest
        self._reason = reason if not approaching else f"{reason}, approaching the limit"
        return "trim"

    def record_trim(self, outcome: TrimOutcome | float, *old: Any, **fields: Any) -> bool:
        """Record a trim's :class:`TrimOutcome`; return True when it was productive.

        The level becomes ``rss_after`` (what live data pins now); ``free`` is the mark later
        frees are measured from; ``seconds`` is charged to the CPU budget. Productive: see
        :meth:`productive`. When RSS after the trim is more than ``slack`` over ``mapped`` plus
        the baseline, or ``unreached`` with the level more than ``slack`` over the floor, the
        level is provisional (:attr:`provisional`): re-tested at :attr:`retest_due`. The old
        form, ``record_trim(now, *, growth, released, rss_after, ...)``, warns
        (DeprecationWarning) for one release.
        """
        outcome = _record(TrimOutcome, outcome, old, fields)
        self._level.require()
        productive = self.productive(outcome.released, outcome.growth)
        now = outcome.now
        self._limit.record(outcome)
        self._retest.trimmed(outcome.seconds, after_a_trim=self.last_trim is not None)
        self._backoff.record(now, productive)
        self._budget.charge(now, outcome.seconds)
        self._level.learn(outcome)
        self._settle.start(now, outcome.rss_after)
        self._trigger.learn(outcome)
        incomplete = self._trigger.missed(outcome, self._level.require()[0], self.slack)
        self._retest.judge(now, incomplete, productive)
        return productive


# Made private (one release, then gone): tuning constants no user needs.
_PRIVATE: dict[str, tuple[str, object]] = {
    "AUTO_SLACK_MIN": ("PacingPolicy(slack=...) to set the trigger", _AUTO_SLACK_MIN),
    "AUTO_SLACK_FRACTION": ("PacingPolicy(slack=...) to set the trigger", _AUTO_SLACK_FRACTION),
    "NEAR_LIMIT_TICK": ("PacingPolicy.tick_interval() for the interval", _NEAR_LIMIT_TICK),
    "NEAR_LIMIT_FREE_READ": ("PacingPolicy.wants_free() for the reads", _NEAR_LIMIT_FREE_READ),
}


def __getattr__(name: str) -> object:
    return _deprecated.lookup(__name__, name, _PRIVATE)
