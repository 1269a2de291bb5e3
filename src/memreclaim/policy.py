"""The pacing policy: when is a trim worth it? Pure logic, no threads, no asyncio, no clock.

Every call takes ``now`` (any monotonic seconds) and the signals the caller measured (RSS, and
when it has them: bytes traced by tracemalloc, the allocator's free bytes, the number of
requests in flight), so the policy is deterministic and unit-tested with a fake clock and with
RSS traces recorded from real servers (``tests/test_policy.py``). The runners in
:mod:`memreclaim.runners` read the signals, ask :meth:`PacingPolicy.decide`, trim, and report
the outcome with :meth:`PacingPolicy.record_trim`. :meth:`PacingPolicy.decide` has two stages:
the limit stage (at the soft limit's mark), then the normal pacing.

The model is Go's heap scavenger (reclaim paced to a CPU budget) and the JVM's
``TrimNativeHeapInterval``, adapted to an allocator that does not say what it could give back:

- **Learned level.** The RSS right after a trim is the level that live data pins (plus the
  allocator's unavoidable overhead). Growth is measured against it, not against the RSS at
  start: memory that stays live costs one trim (which learns it), never an endless series.
  The level follows RSS down when memory goes back by itself.
- **Later frees are still seen.** RSS does not fall when memory is freed, so once a cache that
  was live at a trim is freed, RSS says nothing. The allocator's free bytes do (glibc's
  ``mallinfo2().fordblks``, via :func:`memreclaim.heap_stats`): a rise of more than ``slack``
  since the last trim triggers one. The runners read it only while the level is more than
  ``slack`` over the floor (something is pinned), at most once a second: it walks
  the free lists (about 3 ms on a fragmented 500 MiB heap). tracemalloc's traced bytes, when
  tracing, serve the same way. (jemalloc, mimalloc and tcmalloc decay freed memory on their
  own; glibc, the one that needs trims, has the free-bytes signal.)
- **Burst over.** No trim while RSS is still rising (more than ``settle`` over the readings of
  the last ``settle_window`` seconds, and at least the previous one: one stalled reading in the
  middle of a burst does not look like its end), unless the caller knows no request is in
  flight (``in_flight=0``: the burst just ended, the best moment) or the unit of work that
  allocated is over (``settled=True``).
- **Cost, not timers.** A trim that yields little is information (it taught the level), not a
  reason to wait: the back-off starts only at the second unproductive trim in a row (then it
  doubles from ``min_interval`` up to ``backoff_max``). Trims are paced to a CPU budget: the
  time spent trimming may not exceed ``cpu_budget`` of wall time, with a credit of
  ``cpu_budget * budget_window`` seconds (a 1 % budget over 300 s allows 3 s of trims at once:
  a dozen trims of a loaded machine).
  An expensive trim thus pushes the next one back by its measured cost, a cheap one does not.
- **Memory freed after a trim, sized by what it unpins.** Freed survivors of a spike may be
  few bytes (15 MiB of strings) that pinned many pages (44 MiB): the free-bytes rise stays
  under ``slack`` while a trim would give back three times as much. After each trim the policy
  keeps the allocator's in-use bytes and the *pinned excess*: RSS after the trim minus those
  in-use bytes minus the *baseline* (RSS that is no heap's: the lowest ``rss - in_use`` seen at
  a reset or a trim). A later drop ``d`` of the in-use bytes below their after-trim value unpins,
  pro rata, up to ``d + excess * d / in_use_after``; a trim fires when that exceeds ``slack``.
- **An incomplete trim is no floor.** A trim that missed memory (RSS after it more than
  ``slack`` above what the allocators map plus the baseline: memory that no allocator memreclaim
  reads accounts for, e.g. a library's pool or a thread heap the trim did not reach; or, with a
  pinned level, a part the trim could not read or act on) leaves a *provisional* level:
  :attr:`PacingPolicy.provisional` is ``"incomplete"`` and the level is re-tested by a trim
  after ``retest`` seconds, then after twice that after each re-test that finds it again, up to
  ``retest_max``, and never sooner than the last trim's cost allows at ``cpu_budget`` (Go's
  scavenger paces the same way: by the cost of the work, never a permanent stop). A re-test
  that gives memory back starts the spacing over. A trim whose RSS sits over heap pages that
  the allocator maps (survivors that pin) is complete: its level is a real floor and the
  unproductive-trim back-off applies as before.
- **Memory that comes back by itself.** Under transparent huge pages (``enabled=always``),
  khugepaged can fault back the pages a trim released (it collapses a sparse 2 MiB range into
  one huge page): RSS climbs back towards its pre-trim value while the allocator's in-use bytes
  and the mapped address space (``vsize``) do not grow. Such growth (more than ``slack`` of it,
  no more than the last trim released, less than ``release_fraction`` of it explained by
  in-use or address-space growth) is not a trigger: the policy learns the regrown RSS as a
  provisional level (``"regrowth"``) and re-tests it on the same spacing as an incomplete one
  (first after ``retest`` seconds, doubling with each trim undone in a row), so a runner makes
  a few trims a minute, not one per ``min_interval``. Growth that allocation explains triggers
  as before. The runners pass ``vsize`` (and so enable this rule) only under
  ``enabled=always``: elsewhere nothing faults freed pages back in, and pages that pymalloc
  pools released with ``trim(pools=True)`` and reused would look the same.
- **Soft limit.** With ``limit=`` (bytes), the policy works harder as RSS nears the limit, in
  two stages. Approaching: once RSS is nearer the mark (``limit_fraction``, 90 %, of the limit)
  than the learned level, the back-off no longer applies (the rising check and the CPU budget
  still do), and :meth:`PacingPolicy.tick_interval` asks the runner for a reading every 20 ms
  instead of every ``interval``. At the mark: it trims at every ``min_interval`` whatever the
  trigger, the back-off and the budget say, as long as the learned level is below that mark and
  the burst is over (a trim in the middle of one gives nothing back and was measured to cost
  the race against the limit, ``benchmarks/bench_limits.py``); and at once, whatever the
  level, when the allocator's free bytes (read every 100 ms there) rose by more than
  ``min_release`` since the last trim. When the level itself, live memory,
  reaches it, trimming cannot help: the policy logs that once, with figures (WARNING on the
  ``memreclaim`` logger), and goes back to its normal pacing.

Defaults: ``slack=None`` derives the trigger from the learned level, ``max(8 MiB, level / 8)``
(so a 60 MiB service trims after 8 MiB of growth, a 2 GiB one after 256 MiB); ``min_interval``
1 s; ``backoff_max`` 30 s; ``cpu_budget`` 1 %; ``retest`` 8 s, ``retest_max`` 300 s.

Unproductive: a trim that gave back less than ``min_release``, by default
:data:`memreclaim._accounting.UNPRODUCTIVE_BELOW` (1 MiB: the process totals' definition), or, for
the policy, less than ``release_fraction`` of the growth that triggered it
(:meth:`PacingPolicy.productive`, what the runners count).

Limit: ``limit=None`` means no soft limit, here and in the runners; ``limit="auto"`` is the
limit :func:`memreclaim.memlimits.auto_limit` finds (the cgroup's), read when the policy is made:
the runners resolve it themselves and pass bytes or None, and no rule of the policy reads a file.
"""

from __future__ import annotations

import collections
import logging
from typing import Literal

from . import _deprecated, _validate
from ._accounting import UNPRODUCTIVE_BELOW
from .units import format_bytes

__all__ = [
    "NEAR_LIMIT_HOLD",
    "Decision",
    "PacingPolicy",
    "Provisional",
]

logger = logging.getLogger("memreclaim")

Decision = Literal["below-slack", "rising", "min-interval", "backoff", "budget", "trim"]
"""What :meth:`PacingPolicy.decide` answers."""

Provisional = Literal["incomplete", "regrowth"]
"""Why the learned level is provisional (see :attr:`PacingPolicy.provisional`)."""

_AUTO_SLACK_MIN = 8 << 20
"""With ``slack=None``, the trigger is at least this many bytes of growth."""
_AUTO_SLACK_FRACTION = 0.125
"""With ``slack=None``, the trigger is this fraction of the learned level (if larger)."""
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


class PacingPolicy:
    """Decide when to trim, from measured signals and the measured cost of past trims.

    Pure: no clock, no thread, no I/O (but for ``limit="auto"``, resolved once when it is made).
    Not thread-safe by itself (the runners lock it). One
    policy per runner: it holds that runner's state.

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
            provisional level is re-tested by a trim (>= min_interval is not required: the
            minimum interval applies anyway).
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
        min_release: int | str = UNPRODUCTIVE_BELOW,
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
        self._slack = None if slack is None else _validate.size("slack", slack)
        self._min_interval = _validate.seconds("min_interval", min_interval)
        self._backoff_max = _validate.seconds("backoff_max", backoff_max)
        if self._backoff_max < self._min_interval:
            raise ValueError(
                f"backoff_max ({backoff_max!r} s) must be >= min_interval ({min_interval!r} s)"
            )
        self._min_release = _validate.size("min_release", min_release, allow_zero=True)
        self._release_fraction = _validate.fraction("release_fraction", release_fraction)
        self._cpu_budget = _validate.fraction("cpu_budget", cpu_budget, allow_zero=False)
        self._budget_window = _validate.seconds("budget_window", budget_window)
        self._settle = None if settle is None else _validate.size("settle", settle, allow_zero=True)
        self._settle_window = _validate.seconds("settle_window", settle_window)
        if isinstance(limit, str) and limit == "auto":
            from .memlimits import auto_limit  # the one resolution; the runners resolve it first

            self._limit = auto_limit()
        else:
            self._limit = None if limit is None else _validate.size("limit", limit)
        self._limit_fraction = _validate.fraction(
            "limit_fraction", limit_fraction, allow_zero=False
        )
        self._use_traced = _validate.flag("use_traced", use_traced)
        self._retest = _validate.seconds("retest", retest)
        self._retest_max = _validate.seconds("retest_max", retest_max)
        if self._retest_max < self._retest:
            raise ValueError(f"retest_max ({retest_max!r} s) must be >= retest ({retest!r} s)")
        # What the last trim left, for the rules that look past RSS (see the module docstring).
        self._baseline: int | None = None
        self._in_use_after: int | None = None
        self._vsize_after: int | None = None
        self._excess: int | None = None
        self._unexplained: int | None = None
        self._released_last = 0
        self._seconds_last = 0.0
        self._provisional: Provisional | None = None
        self._retest_due: float | None = None
        self._retesting = False
        self._miss_run = 0
        self._undone_run = 0
        self._undone_seen = False
        self._floor: int | None = None
        self._level: int | None = None
        self._traced_level: int | None = None
        self._free_mark: int | None = None
        self._previous: int | None = None
        self._recent: collections.deque[tuple[float, int]] = collections.deque()
        self._last_trim: float | None = None
        self._last_free_read: float | None = None
        self._unproductive_run = 0
        self._credit = 0.0
        self._credit_at = 0.0
        self._reason = ""
        self._warned_limit = False
        self._urgent = False
        self._hold_until = float("-inf")

    # ---- configuration (read-only) ----------------------------------------------------------

    @property
    def min_interval(self) -> float:
        """Minimum seconds between two trims."""
        return self._min_interval

    @property
    def backoff_max(self) -> float:
        """Longest wait, in seconds, after unproductive trims in a row."""
        return self._backoff_max

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
        return self._cpu_budget

    @property
    def limit(self) -> int | None:
        """The soft memory limit in bytes, or None."""
        return self._limit

    @property
    def urgent(self) -> bool:
        """True when the last ``"trim"`` answer came from the limit (RSS at or approaching its
        mark): a runner should not defer that trim (e.g. to wait for an idle event loop)."""
        return self._urgent

    @property
    def limit_mark(self) -> int | None:
        """The RSS at which trims ignore all pacing: ``limit_fraction`` of ``limit``, or None."""
        return None if self._limit is None else int(self._limit * self._limit_fraction)

    @property
    def use_traced(self) -> bool:
        """Whether tracemalloc's traced bytes are used when tracing."""
        return self._use_traced

    @property
    def retest(self) -> float:
        """Seconds before the first re-test of a provisional level."""
        return self._retest

    @property
    def retest_max(self) -> float:
        """Longest spacing, in seconds, between two re-tests of a provisional level."""
        return self._retest_max

    # ---- state ------------------------------------------------------------------------------

    @property
    def slack(self) -> int:
        """Growth over the level that triggers a trim, in bytes (derived when ``slack=None``)."""
        if self._slack is not None:
            return self._slack
        level = self._level or 0
        return max(_AUTO_SLACK_MIN, int(level * _AUTO_SLACK_FRACTION))

    @property
    def settle(self) -> int:
        """No trim while RSS rose more than this many bytes since the previous reading."""
        return self.slack // 4 if self._settle is None else self._settle

    @property
    def floor(self) -> int | None:
        """The lowest RSS seen since :meth:`reset` (None before it)."""
        return self._floor

    @property
    def level(self) -> int | None:
        """The learned level: RSS right after the last trim, or lower if RSS fell since."""
        return self._level

    @property
    def wait(self) -> float:
        """Seconds that must pass after the last trim before the next (back-off included)."""
        if self._unproductive_run < 2:
            return self._min_interval
        return min(self._backoff_max, self._min_interval * 2.0 ** (self._unproductive_run - 1))

    @property
    def provisional(self) -> Provisional | None:
        """Why the learned level will be re-tested: ``"incomplete"`` (the last trim left memory
        that no allocator read accounts for, or could not act on a part), ``"regrowth"`` (RSS came
        back after the last trim without allocation), or None (the level is what live data
        pins)."""
        return self._provisional

    @property
    def retesting(self) -> bool:
        """True when the last ``"trim"`` answer was a re-test of a provisional level (until the
        trim is recorded)."""
        return self._retesting

    @property
    def retest_due(self) -> float | None:
        """The ``now`` from which a provisional level is re-tested by a trim, or None."""
        return self._retest_due

    @property
    def baseline(self) -> int | None:
        """The learned RSS that no heap holds: the lowest ``rss - in_use`` seen at a reset or a
        trim (None until the caller passed ``in_use``)."""
        return self._baseline

    @property
    def excess(self) -> int | None:
        """The pinned excess after the last trim: RSS after it minus the in-use bytes and the
        baseline (free heap pages kept resident by the memory still in use), or None."""
        return self._excess

    @property
    def unexplained(self) -> int | None:
        """RSS after the last trim that neither the allocators' mapped bytes nor the baseline
        account for (< 0 when they account for all of it), or None without figures."""
        return self._unexplained

    def retest_spacing(self, run: int) -> float:
        """Seconds between a trim and the re-test of its provisional level, after ``run``
        re-tests in a row found the level again (``run >= 1``): ``retest * 2 ** (run - 1)``,
        at least the last trim's cost divided by ``cpu_budget``, at most ``retest_max``."""
        run = _validate.integer("run", run, minimum=1)
        spacing = self._retest * 2.0 ** min(run - 1, 64)
        cost_paced = self._seconds_last / self._cpu_budget
        return max(self._min_interval, min(self._retest_max, max(spacing, cost_paced)))

    def productive(self, released: int, growth: int) -> bool:
        """Whether a trim that gave back ``released`` bytes after ``growth`` bytes of growth was
        productive: at least ``max(min_release, release_fraction * growth)``. The one
        definition: :meth:`record_trim` returns it and the runners count it."""
        return released >= max(self._min_release, int(self._release_fraction * growth))

    @property
    def last_trim(self) -> float | None:
        """The ``now`` of the last recorded trim, or None."""
        return self._last_trim

    @property
    def reason(self) -> str:
        """Why the last ``"trim"`` decision fired, e.g. ``"growth 90.0 MiB > slack 8.0 MiB"``."""
        return self._reason

    def credit(self, now: float) -> float:
        """Seconds of trim time the CPU budget allows at ``now`` (negative: in debt)."""
        cap = self._cpu_budget * self._budget_window
        return min(cap, self._credit + max(0.0, now - self._credit_at) * self._cpu_budget)

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
        self._baseline = None if in_use is None else rss - in_use
        self._in_use_after = self._vsize_after = self._excess = self._unexplained = None
        self._released_last = 0
        self._seconds_last = 0.0
        self._provisional = None
        self._retest_due = None
        self._retesting = False
        self._miss_run = self._undone_run = 0
        self._undone_seen = False
        self._floor = self._level = self._previous = rss
        self._recent.clear()
        self._recent.append((now, rss))
        self._traced_level = traced
        self._free_mark = None
        self._last_trim = None
        self._last_free_read = None
        self._unproductive_run = 0
        self._credit = self._cpu_budget * self._budget_window
        self._credit_at = now
        self._warned_limit = False

    def _require_reset(self) -> tuple[int, int]:
        if self._floor is None or self._level is None:
            raise RuntimeError("PacingPolicy.reset() must be called before decide()/record_trim()")
        return self._floor, self._level

    def growth(self, rss: int, traced: int | None = None) -> int:
        """RSS growth over the learned level, minus traced growth when tracing (may be < 0)."""
        _, level = self._require_reset()
        grown = rss - level
        if self._use_traced and traced is not None and self._traced_level is not None:
            grown -= max(0, traced - self._traced_level)
        return grown

    def wants_free(self, now: float, rss: int | None = None) -> bool:
        """Whether the caller should pass the allocator's figures (``free=``, ``in_use=``,
        ``vsize=``) to this tick.

        True while the level is more than ``slack`` over the floor (half of it once a trim has
        recorded ``mapped``), or the pinned excess is more than ``slack`` (memory pinned at the last
        trim may be freed later, which RSS cannot show), at most once per ``min_interval`` (or per
        second), and every 0.1 s near the limit. With ``rss`` (this tick's reading), also at every
        tick whose growth could be memory that came back by itself after the last trim (more than
        ``slack``, at most what that trim released plus ``slack``): only the figures tell it from
        allocation.
        """
        floor, level = self._require_reset()
        if (
            rss is not None
            and self._vsize_after is not None  # regrowth is possible here (see decide)
            and self._regrowth_candidate(rss, level)
        ):
            return True
        # Half a slack over the floor with figures known: memory a library pool keeps after the
        # trim shows only in them (see decide's ``mapped``).
        over = self.slack // 2 if self._unexplained is not None else self.slack
        if level - floor <= over and (self._excess or 0) <= self.slack:
            return False
        last = self._last_free_read
        every = min(self._min_interval, 1.0)
        held = now < self._hold_until
        if held or (self._previous is not None and self._near_limit(self._previous, level)):
            every = min(every, _NEAR_LIMIT_FREE_READ)
        return last is None or now - last >= every

    def _regrowth_candidate(self, rss: int, level: int) -> bool:
        """RSS grew more than slack since the last trim, by no more than that trim gave back
        (plus slack), away from the limit: memory that may have come back without allocation."""
        if self._last_trim is None or self._released_last <= self.slack:
            return False
        grown = rss - level
        if not self.slack < grown <= self._released_last + self.slack:
            return False
        mark = self.limit_mark
        return mark is None or (rss < mark and not self._approaching(rss, level))

    def _check_regrowth(self, rss: int, level: int, in_use: int | None, vsize: int | None) -> bool:
        """Learn RSS as a provisional level when its growth since the last trim is memory that
        came back by itself (see the module docstring); True when it did."""
        if (
            in_use is None
            or vsize is None
            or self._in_use_after is None
            or self._vsize_after is None
            or not self._regrowth_candidate(rss, level)
        ):
            return False
        grown = rss - level
        explained = max(0, in_use - self._in_use_after) + max(0, vsize - self._vsize_after)
        if explained >= self._release_fraction * grown:
            return False  # allocation: a trim can give it back for good
        if not self._undone_seen:  # the last trim was undone: count it once
            self._undone_seen = True
            self._undone_run += 1
            assert self._last_trim is not None
            self._retest_due = self._last_trim + self.retest_spacing(self._undone_run)
        self._provisional = "regrowth"
        self._level = rss
        return True

    def decide(
        self,
        now: float,
        rss: int,
        *,
        traced: int | None = None,
        free: int | None = None,
        in_flight: int | None = None,
        settled: bool = False,
        in_use: int | None = None,
        vsize: int | None = None,
        mapped: int | None = None,
    ) -> Decision:
        """Take one reading and say whether to trim now.

        Args:
            now: monotonic seconds.
            rss: resident bytes now.
            traced: tracemalloc's traced bytes, or None when not tracing.
            free: the allocator's free bytes (:attr:`HeapStats.free`), when the caller read
                them (see :meth:`wants_free`); None otherwise.
            in_flight: requests being handled now, when the caller knows; None otherwise.
            settled: the unit of work that allocated is over (a hook after a request or task
                in a process that handles one at a time): skip the rising check.
            in_use: the allocator's in-use bytes (:attr:`HeapStats.in_use`), read with ``free``;
                a drop below their value after the last trim sizes what it unpinned.
            vsize: the process's mapped address space (``/proc/self/statm``'s first field, in
                bytes), read with ``in_use``, where memory can come back without allocation
                (transparent huge pages ``enabled=always``: the runners pass it only then):
                growth that neither it nor ``in_use`` explains is regrowth, not a trigger.
                Without it no growth is taken for regrowth.
            mapped: the bytes the allocators map plus what library pools report in use (as
                for :meth:`record_trim`), read with ``in_use``. Resident memory that none of
                them accounts for and that grew by more than half of ``slack`` since the last
                trim, to more than ``slack``, is a trigger: a library pool freed what it held
                after the trim (a trim in the middle of a worker's burst learnt its level).
                Not used with ``vsize`` (under THP ``always`` such growth is regrowth).

        Returns ``"trim"`` (:attr:`reason` says why), ``"below-slack"``, ``"rising"`` (RSS
        still rising with work in flight: wait for the burst to end), ``"min-interval"``,
        ``"backoff"`` or ``"budget"`` (the CPU budget is spent).
        """
        self._require_reset()
        if in_flight is not None:
            _validate.integer("in_flight", in_flight)
        for name, value in (("in_use", in_use), ("vsize", vsize), ("mapped", mapped)):
            if value is not None:
                _validate.integer(name, value)
        self._retesting = False
        level, lowest = self._take_reading(now, rss, traced, free, in_use, vsize)
        busy = rss - lowest > self.settle and not settled and in_flight != 0
        mark = self.limit_mark
        self._urgent = mark is not None and (rss >= mark or self._approaching(rss, level))
        if mark is not None and rss >= mark:
            at_limit = self._limit_stage(now, rss, level, mark, free, busy)
            if at_limit is not None:
                return at_limit
        return self._pacing(now, rss, level, busy, traced, free, in_use, vsize, mapped)

    def _take_reading(
        self,
        now: float,
        rss: int,
        traced: int | None,
        free: int | None,
        in_use: int | None,
        vsize: int | None,
    ) -> tuple[int, int]:
        """Fold one reading into the state; return (the learned level now, the lowest RSS of
        the readings in the last ``settle_window`` seconds before this one)."""
        floor, level = self._require_reset()
        if rss < floor:
            self._floor = rss
        if rss < level:  # memory went back by itself: the level follows it down
            self._level = level = rss
            self._traced_level = traced
        self._previous = rss
        recent = self._recent
        while len(recent) > 1 and recent[0][0] < now - self._settle_window:
            recent.popleft()  # keeps at least the previous reading
        lowest = min((value for _, value in recent), default=rss)
        recent.append((now, rss))
        if free is not None:
            self._last_free_read = now
            if self._free_mark is None or free < self._free_mark:
                self._free_mark = free
        if self._traced_level is None and traced is not None:
            self._traced_level = traced
        if self._check_regrowth(rss, level, in_use, vsize):
            level = rss
            self._traced_level = traced
        return level, lowest

    def _limit_stage(
        self, now: float, rss: int, level: int, mark: int, free: int | None, busy: bool
    ) -> Decision | None:
        """At or over the limit's mark: trim at once what was freed since the last trim, else
        at every ``min_interval`` while the level is below the mark and the burst is over.
        None: the normal pacing decides (the level itself is at the mark: warned once)."""
        freed = 0 if free is None or self._free_mark is None else free - self._free_mark
        of_limit = f"{self._limit_fraction:.0%} of limit {format_bytes(self._limit or 0)}"
        if freed > self._min_release:  # freed since the last trim: it can go back now
            self._reason = f"freed {format_bytes(freed)} with RSS {format_bytes(rss)} >= {of_limit}"
            return "trim"
        if level < mark and rss - level > self._min_release:
            if busy:
                return "rising"  # a trim in the middle of a burst gives nothing back
            if self._last_trim is not None and now < self._last_trim + self._min_interval:
                return "min-interval"
            self._reason = f"RSS {format_bytes(rss)} >= {of_limit}"
            return "trim"
        if level >= mark:
            self._warn_limit(level, mark)
        return None

    def _pacing(
        self,
        now: float,
        rss: int,
        level: int,
        busy: bool,
        traced: int | None,
        free: int | None,
        in_use: int | None,
        vsize: int | None,
        mapped: int | None,
    ) -> Decision:
        """The normal pacing: a trigger (or a re-test that is due), then the rising check, the
        minimum interval or back-off, and the CPU budget."""
        slack = self.slack
        reason = self._trigger(rss, traced, free, in_use, slack)
        if reason is None and vsize is None:
            reason = self._unaccounted(rss, mapped, slack)
        retest = False
        if reason is None and self._retest_due is not None and now >= self._retest_due:
            reason = f"re-test of the {self._provisional} level {format_bytes(level)}"
            retest = True
        if reason is None:
            return "below-slack"
        # Approaching the limit (nearer the mark than the learned level: the growth a trim could
        # give back exceeds the headroom left), the back-off may not make it wait. The rising
        # check still holds: trims in the middle of a burst give nothing and would only spend
        # the minimum interval that the trim at the mark needs.
        approaching = self._approaching(rss, level)
        if busy:
            return "rising"
        # A re-test has its own spacing (longer than the back-off's): only the minimum applies.
        wait = self._min_interval if approaching or retest else self.wait
        if self._last_trim is not None and now < self._last_trim + wait:
            return "backoff" if wait > self._min_interval else "min-interval"
        if self.credit(now) < 0:
            return "budget"
        self._retesting = retest
        self._reason = reason if not approaching else f"{reason}, approaching the limit"
        return "trim"

    def _near_limit(self, rss: int, level: int) -> bool:
        """RSS approaching the limit's mark, or over it and risen since the last trim (a burst
        that a trim at the mark learned in its middle). A process whose live memory sits at
        the mark, RSS flat at its level, is not near: its readings stay at the normal pace."""
        mark = self.limit_mark
        if mark is None:
            return False
        return self._approaching(rss, level) or (rss >= mark and rss - level > self.settle)

    def _approaching(self, rss: int, level: int) -> bool:
        """RSS is nearer the limit's mark than the learned level (and the level below it)."""
        if self._limit is None:
            return False
        mark = int(self._limit * self._limit_fraction)
        return level < mark and rss - level > mark - rss

    def tick_interval(self, interval: float, now: float | None = None) -> float:
        """Seconds a runner should wait before its next reading, given its ``interval``.

        ``interval`` itself, except while RSS (the last reading) is near the limit: then
        0.02 s, so that the trim at the mark comes within a few MiB of
        allocation, not a second of it; also for :data:`NEAR_LIMIT_HOLD` seconds after a trim
        made at or approaching the limit, when ``now`` is given. A reading costs about a
        microsecond.
        """
        if self._previous is None or self._level is None:
            return interval
        held = now is not None and now < self._hold_until
        if held or self._near_limit(self._previous, self._level):
            return min(interval, _NEAR_LIMIT_TICK)
        return interval

    def _trigger(
        self, rss: int, traced: int | None, free: int | None, in_use: int | None, slack: int
    ) -> str | None:
        grown = self.growth(rss, traced)
        if grown > slack:
            return f"growth {format_bytes(grown)} > slack {format_bytes(slack)}"
        if free is not None and self._free_mark is not None and free - self._free_mark > slack:
            return f"freed {format_bytes(free - self._free_mark)} since the last trim"
        if (
            self._use_traced
            and traced is not None
            and self._traced_level is not None
            and self._traced_level - traced > slack
        ):
            return f"traced memory fell {format_bytes(self._traced_level - traced)}"
        unpinned = self._unpinned(in_use)
        if unpinned > slack:
            assert in_use is not None and self._in_use_after is not None
            return (
                f"in use fell {format_bytes(self._in_use_after - in_use)} since the last trim:"
                f" up to {format_bytes(unpinned)} returnable"
            )
        return None

    def _unaccounted(self, rss: int, mapped: int | None, slack: int) -> str | None:
        """The trigger for resident memory no allocator accounts for, grown since the trim."""
        if mapped is None or self._baseline is None or self._unexplained is None:
            return None
        unexplained = rss - mapped - self._baseline
        grown = unexplained - self._unexplained
        if unexplained > slack and 2 * grown > slack:
            return (
                f"{format_bytes(unexplained)} resident that no allocator accounts for"
                f" ({format_bytes(grown)} more than after the last trim)"
            )
        return None

    def _unpinned(self, in_use: int | None) -> int:
        """Bytes a drop of in-use bytes to ``in_use`` may let a trim return: the drop, plus the
        pinned excess pro rata (0 without figures)."""
        after = self._in_use_after
        if in_use is None or after is None or in_use >= after:
            return 0
        dropped = after - in_use
        return dropped + (self._excess or 0) * dropped // max(after, 1)

    def _warn_limit(self, level: int, mark: int) -> None:
        if self._warned_limit:
            return
        self._warned_limit = True
        logger.warning(
            "memreclaim: live memory is near the limit: after a trim RSS stays at %s, %.0f%% of"
            " the %s limit (mark %s); trimming cannot bring it lower: the data is live",
            format_bytes(level),
            100.0 * level / (self._limit or 1),
            format_bytes(self._limit or 0),
            format_bytes(mark),
        )

    def record_trim(
        self,
        now: float,
        *,
        growth: int,
        released: int,
        rss_after: int,
        seconds: float = 0.0,
        traced: int | None = None,
        free: int | None = None,
        in_use: int | None = None,
        mapped: int | None = None,
        vsize: int | None = None,
        unreached: bool = False,
    ) -> bool:
        """Record a trim's outcome at ``now`` (its end); return True when it was productive.

        The level becomes ``rss_after`` (what live data pins now); ``free`` (the allocator's
        free bytes right after the trim, when known) is the mark later frees are measured
        from; ``seconds`` is charged to the CPU budget. Productive: see :meth:`productive`.

        The allocator's figures right after the trim, when known, let the policy see what the
        trim missed: ``in_use`` (:attr:`HeapStats.in_use`), ``mapped`` (the bytes the
        allocators map, :attr:`HeapStats.mapped`, plus the in-use bytes that library pools
        report), ``vsize`` (mapped address space) and ``unreached`` (the trim could not act on
        or read a part: a ``None`` in :attr:`TrimResult.parts`, or a :attr:`TrimResult.reason`).
        When RSS after the trim is more than ``slack`` over ``mapped`` plus the baseline, or
        ``unreached`` with the level more than ``slack`` over the floor, the level is
        provisional (:attr:`provisional`): re-tested at :attr:`retest_due`.
        """
        self._require_reset()
        seconds = _validate.seconds("seconds", seconds, allow_zero=True)
        for name, value in (("in_use", in_use), ("mapped", mapped), ("vsize", vsize)):
            if value is not None:
                _validate.integer(name, value)
        _validate.flag("unreached", unreached)
        productive = self.productive(released, growth)
        if self._urgent:  # made at or approaching the limit: keep watching closely a while
            self._hold_until = now + NEAR_LIMIT_HOLD
        self._urgent = False
        self._unproductive_run = 0 if productive else self._unproductive_run + 1
        if self._last_trim is not None and not self._undone_seen:
            self._undone_run = 0  # the previous trim's release held until this one
        self._undone_seen = False
        self._credit = self.credit(now) - seconds
        self._credit_at = now
        self._last_trim = now
        self._level = self._previous = rss_after
        self._recent.clear()
        self._recent.append((now, rss_after))
        if self._floor is not None and rss_after < self._floor:
            self._floor = rss_after
        self._traced_level = traced
        self._free_mark = free
        if free is not None:
            self._last_free_read = now
        self._released_last = max(0, released)
        self._seconds_last = seconds
        self._learn_figures(rss_after, in_use, mapped, vsize)
        self._judge_level(now, rss_after, productive, unreached)
        if self._limit is not None:
            mark = int(self._limit * self._limit_fraction)
            if rss_after >= mark:
                self._warn_limit(rss_after, mark)
        return productive

    def _learn_figures(
        self, rss_after: int, in_use: int | None, mapped: int | None, vsize: int | None
    ) -> None:
        self._in_use_after = in_use
        self._vsize_after = vsize
        if in_use is not None:
            outside = rss_after - in_use
            if self._baseline is None or outside < self._baseline:
                self._baseline = outside
        baseline = self._baseline
        if in_use is None or baseline is None:
            self._excess = None
        else:
            self._excess = max(0, rss_after - in_use - baseline)
        self._unexplained = (
            None if mapped is None or baseline is None else (rss_after - mapped - baseline)
        )

    def _judge_level(self, now: float, rss_after: int, productive: bool, unreached: bool) -> None:
        """Provisional or not: the level a trim left (see :attr:`provisional`)."""
        slack = self.slack
        floor = self._floor if self._floor is not None else rss_after
        missed = self._unexplained is not None and self._unexplained > slack
        incomplete = missed or (unreached and rss_after - floor > slack)
        retested = self._retesting
        self._retesting = False
        if incomplete:
            # A re-test that found the level again doubles the spacing; one that gave memory
            # back (or the first incomplete trim) starts it over.
            self._miss_run = self._miss_run + 1 if retested and not productive else 1
            self._provisional = "incomplete"
            self._retest_due = now + self.retest_spacing(self._miss_run)
            return
        # Complete. After trims undone by regrowth, the run is kept until a trim holds (see
        # record_trim): the next regrowth then waits longer.
        self._miss_run = 0
        self._provisional = None
        self._retest_due = None


# Made private (one release, then gone): tuning constants no user needs.
_PRIVATE: dict[str, tuple[str, object]] = {
    "AUTO_SLACK_MIN": ("PacingPolicy(slack=...) to set the trigger", _AUTO_SLACK_MIN),
    "AUTO_SLACK_FRACTION": ("PacingPolicy(slack=...) to set the trigger", _AUTO_SLACK_FRACTION),
    "NEAR_LIMIT_TICK": ("PacingPolicy.tick_interval() for the interval", _NEAR_LIMIT_TICK),
    "NEAR_LIMIT_FREE_READ": ("PacingPolicy.wants_free() for the reads", _NEAR_LIMIT_FREE_READ),
}


def __getattr__(name: str) -> object:
    return _deprecated.lookup(__name__, name, _PRIVATE)
