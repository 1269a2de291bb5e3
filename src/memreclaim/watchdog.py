"""Background reclaim: an asyncio :class:`Watchdog` and a thread :class:`BackgroundTrimmer`.

Both run the same pacing policy (:class:`PacingPolicy`), which decides *when* a trim is worth it:

- the tick is cheap: one :func:`memreclaim.rss` read (a ``pread`` of ``/proc/self/statm``), never
  a heap walk;
- trigger: RSS grew more than ``slack`` bytes over the *floor*, the lowest RSS seen since start
  (a trim that ends lower lowers it; the floor never moves up). When tracemalloc is tracing,
  growth that tracemalloc explains (live Python objects) is subtracted, so a growing live heap
  does not count. The floor never moves up because RSS does not fall when memory is freed:
  memory that was live (or not yet freed) at one trim and is freed later would otherwise be
  invisible for good;
- back-off: a trim that returns less than ``max(min_release, release_fraction * growth)`` is
  *unproductive* (the memory is live, or not free yet): the wait before the next trim doubles
  (from ``2 * min_interval`` up to ``backoff_max``), so a process whose memory stays live is
  trimmed at ``min_interval`` x 0, 2, 6, 14, 30... and then once per ``backoff_max`` (a cheap
  trim: nothing is free). A productive trim resets the wait to ``min_interval``;
- settling: no trim while RSS is still rising fast (more than ``settle`` bytes since the previous
  tick, a quarter of the slack by default): a trim in the middle of a spike returns nothing,
  stalls the allocating code on the arena lock, and would start a back-off that delays the trim
  that matters, right after the spike;
- a minimum interval between two trims, whatever the trigger says.

The :class:`Watchdog` adds idle gating: when the policy says "trim", it samples the event loop
(lateness of short sleeps, and asyncio's ready queue) and trims, in a thread, at the start of a
quiet gap (``quiet`` seconds of quiet right after busy samples) or after ``long_quiet`` seconds
of quiet, or anyway once ``idle_deadline`` seconds have passed. This matters because
glibc holds an arena's lock for the whole trim: a loop that mallocs objects over ~1 KiB during
the trim blocks in malloc, holding the GIL, for the rest of it.

Every trim is logged on the ``memreclaim`` logger (INFO: bytes, milliseconds, reason) and passed
to an optional callback; :attr:`Watchdog.counters` / :attr:`BackgroundTrimmer.counters` return
cumulative :class:`Counters` at any time.
"""

from __future__ import annotations

import asyncio
import atexit
import collections.abc
import contextlib
import logging
import math
import os
import threading
import time
import tracemalloc
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal

from ._core import TrimResult, rss, trim
from .units import format_bytes, parse_bytes

__all__ = [
    "BackgroundTrimmer",
    "Counters",
    "Decision",
    "PacingPolicy",
    "TrimEvent",
    "Watchdog",
]

logger = logging.getLogger("memreclaim")

Decision = Literal["below-slack", "rising", "min-interval", "backoff", "trim"]
"""What :meth:`PacingPolicy.decide` answers."""

Gate = Literal["idle", "deadline", "ungated", "thread"]

# An idle loop has at most one other callback queued when the watchdog wakes (a timer of
# another task that fell due at the same moment); two or more means work is in flight.
_READY_BUSY = 2


# ---- argument checks ------------------------------------------------------------------------


def _seconds(name: str, value: object, *, allow_zero: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(
            f"{name} must be a number of seconds (int or float), not {type(value).__name__}"
        )
    seconds = float(value)
    if not math.isfinite(seconds):
        raise ValueError(f"{name} must be a finite number of seconds, got {value!r}")
    if seconds < 0 or (seconds == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be {bound} seconds, got {value!r}")
    return seconds


def _size(name: str, value: object, *, allow_zero: bool) -> int:
    try:
        nbytes = parse_bytes(value)  # type: ignore[arg-type]
    except TypeError as exc:
        raise TypeError(f"{name}: {exc}") from None
    except ValueError as exc:
        raise ValueError(f"{name}: {exc}") from None
    if nbytes == 0 and not allow_zero:
        raise ValueError(f"{name} must be > 0 bytes, got {value!r}")
    return nbytes


def _flag(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, not {type(value).__name__}")
    return value


def _callback(name: str, value: object) -> Callable[[TrimEvent], object] | None:
    if value is not None and not callable(value):
        raise TypeError(
            f"{name} must be a callable taking a TrimEvent, or None, not {type(value).__name__}"
        )
    return value


def _traced() -> int | None:
    if tracemalloc.is_tracing():
        return tracemalloc.get_traced_memory()[0]
    return None


# ---- the policy -----------------------------------------------------------------------------


class PacingPolicy:
    """Pure decision logic shared by :class:`Watchdog` and :class:`BackgroundTrimmer`.

    It does no I/O and reads no clock: callers pass ``now`` (any monotonic seconds) and the RSS
    they read, which makes it cheap and testable. Not thread-safe by itself; the runners lock it.

    Args:
        slack: growth over the floor, in bytes or a string like ``"64 MiB"``, that triggers a trim.
        min_interval: seconds that must pass between two trims (> 0).
        backoff_max: cap, in seconds, of the wait after unproductive trims (>= min_interval).
        min_release: a trim releasing less than this (bytes or string) is unproductive.
        release_fraction: a trim releasing less than this fraction of the growth that triggered
            it is unproductive (0 to 1).
        use_traced: when tracemalloc is tracing, subtract traced growth from RSS growth.
        settle: do not trim while RSS grew more than this (bytes or string) since the previous
            check; None means ``slack // 4``.

    Raises:
        TypeError, ValueError: for a wrong type or an out-of-range value, naming the argument.
    """

    def __init__(
        self,
        *,
        slack: int | str = "64 MiB",
        min_interval: float = 10.0,
        backoff_max: float = 300.0,
        min_release: int | str = "1 MiB",
        release_fraction: float = 0.25,
        use_traced: bool = True,
        settle: int | str | None = None,
    ) -> None:
        self._slack = _size("slack", slack, allow_zero=False)
        self._min_interval = _seconds("min_interval", min_interval)
        self._backoff_max = _seconds("backoff_max", backoff_max)
        if self._backoff_max < self._min_interval:
            raise ValueError(
                f"backoff_max ({backoff_max!r} s) must be >= min_interval ({min_interval!r} s)"
            )
        self._min_release = _size("min_release", min_release, allow_zero=True)
        if isinstance(release_fraction, bool) or not isinstance(release_fraction, int | float):
            raise TypeError(
                f"release_fraction must be a number, not {type(release_fraction).__name__}"
            )
        if not 0.0 <= float(release_fraction) <= 1.0:
            raise ValueError(f"release_fraction must be between 0 and 1, got {release_fraction!r}")
        self._release_fraction = float(release_fraction)
        self._use_traced = _flag("use_traced", use_traced)
        self._settle = (
            self._slack // 4 if settle is None else _size("settle", settle, allow_zero=True)
        )
        self._previous: int | None = None
        self._floor: int | None = None
        self._traced_floor: int | None = None
        self._last_trim: float | None = None
        self._wait = self._min_interval

    # read-only configuration
    @property
    def slack(self) -> int:
        """Bytes of growth over the floor that trigger a trim."""
        return self._slack

    @property
    def min_interval(self) -> float:
        """Minimum seconds between two trims."""
        return self._min_interval

    @property
    def backoff_max(self) -> float:
        """Longest wait, in seconds, after a run of unproductive trims."""
        return self._backoff_max

    @property
    def min_release(self) -> int:
        """A trim releasing fewer bytes than this is unproductive."""
        return self._min_release

    @property
    def release_fraction(self) -> float:
        """A trim releasing less than this fraction of the growth is unproductive."""
        return self._release_fraction

    @property
    def use_traced(self) -> bool:
        """Whether growth explained by tracemalloc is subtracted from RSS growth."""
        return self._use_traced

    @property
    def settle(self) -> int:
        """No trim while RSS grew more than this many bytes since the previous check."""
        return self._settle

    # state
    @property
    def floor(self) -> int | None:
        """The lowest RSS seen since the last trim (or since :meth:`reset`); None before reset."""
        return self._floor

    @property
    def wait(self) -> float:
        """Seconds that must pass after the last trim before the next one (back-off included)."""
        return self._wait

    @property
    def last_trim(self) -> float | None:
        """The ``now`` of the last recorded trim, or None."""
        return self._last_trim

    def reset(self, rss: int, traced: int | None = None) -> None:
        """Start over: the floor is ``rss``, no trim recorded, no back-off."""
        self._floor = rss
        self._traced_floor = traced
        self._previous = rss
        self._last_trim = None
        self._wait = self._min_interval

    def growth(self, rss: int, traced: int | None = None) -> int:
        """RSS growth over the floor, minus traced growth when tracing (may be negative)."""
        if self._floor is None:
            raise RuntimeError("PacingPolicy.reset() must be called before growth()/decide()")
        grown = rss - self._floor
        if self._use_traced and traced is not None and self._traced_floor is not None:
            grown -= max(0, traced - self._traced_floor)
        return grown

    def observe(self, rss: int, traced: int | None = None) -> None:
        """Lower the floor when RSS falls under it (memory went back by itself)."""
        if self._floor is None:
            raise RuntimeError("PacingPolicy.reset() must be called before observe()")
        if rss < self._floor:
            self._floor = rss
            self._traced_floor = traced
        elif self._traced_floor is None and traced is not None:
            self._traced_floor = traced

    def decide(
        self, now: float, rss: int, traced: int | None = None, *, settled: bool = False
    ) -> Decision:
        """Observe one RSS reading and say whether to trim now.

        Returns ``"trim"``, ``"below-slack"`` (growth <= slack), ``"rising"`` (RSS grew more
        than ``settle`` since the previous call: wait for the spike to end), ``"min-interval"``
        (too soon after the last trim) or ``"backoff"`` (too soon after an unproductive trim).
        ``settled=True`` skips the rising check: the caller knows the allocating work is over
        (e.g. a check at the end of a request or task).
        """
        self.observe(rss, traced)
        previous, self._previous = self._previous, rss
        if self.growth(rss, traced) <= self._slack:
            return "below-slack"
        if not settled and previous is not None and rss - previous > self._settle:
            return "rising"
        if self._last_trim is not None and now < self._last_trim + self._wait:
            return "min-interval" if self._wait <= self._min_interval else "backoff"
        return "trim"

    def record_trim(
        self, now: float, *, growth: int, released: int, rss_after: int, traced: int | None = None
    ) -> bool:
        """Record a trim's outcome; return True when it was productive.

        After a productive trim the wait before the next one is reset to ``min_interval``; after
        an unproductive one it doubles (so from ``2 * min_interval``), up to ``backoff_max``. The
        floor is lowered to ``rss_after`` if that is lower, never raised: what a trim left above
        the floor + slack is tried again after the wait (a productive trim of a spike whose
        free was still in progress is followed up; live memory meets the back-off).
        """
        productive = released >= max(self._min_release, int(self._release_fraction * growth))
        if productive:
            self._wait = self._min_interval
        else:
            self._wait = min(self._backoff_max, 2 * self._wait)
        self._last_trim = now
        self._previous = rss_after
        if self._floor is None or rss_after < self._floor:
            self._floor = rss_after
            self._traced_floor = traced
        return productive


# ---- reporting ------------------------------------------------------------------------------


@dataclass(frozen=True)
class TrimEvent:
    """One trim made by a watchdog or trimmer, as passed to the ``on_trim`` callback."""

    result: TrimResult
    """What :func:`memreclaim.trim` returned."""
    reason: str
    """Why it fired, e.g. ``"growth 310.2 MiB > slack 64.0 MiB"``."""
    gate: Gate
    """``"idle"`` (loop was quiet), ``"deadline"`` (busy until the deadline), ``"ungated"``
    (Watchdog with idle gating off) or ``"thread"`` (BackgroundTrimmer)."""
    growth: int
    """Bytes of growth over the floor that triggered the trim."""
    productive: bool
    """False when the trim returned too little, which starts or extends the back-off."""
    deferred: float
    """Seconds the trim waited for the loop to go idle (0 for the thread trimmer)."""

    @property
    def released(self) -> int:
        """Bytes given back (0 when /proc could not be read)."""
        return self.result.released or 0

    @property
    def seconds(self) -> float:
        """Seconds the trim took."""
        return self.result.seconds


@dataclass(frozen=True)
class Counters:
    """Cumulative counters of a watchdog or trimmer (kept across stop/start)."""

    ticks: int = 0
    """Policy checks made (one RSS read each)."""
    trims: int = 0
    """Trims made."""
    unproductive_trims: int = 0
    """Trims that returned too little (each one extends the back-off)."""
    bytes_released: int = 0
    """Sum of the bytes the trims gave back."""
    trim_seconds: float = 0.0
    """Sum of the seconds the trims took."""
    tick_seconds: float = 0.0
    """Wall seconds spent in the ticks themselves, trims and waits excluded."""
    skipped_min_interval: int = 0
    """Ticks whose trigger fired but the minimum interval had not passed."""
    skipped_backoff: int = 0
    """Ticks whose trigger fired but the back-off wait had not passed."""
    skipped_rising: int = 0
    """Ticks whose trigger fired while RSS was still rising fast (mid-spike)."""
    skipped_busy: int = 0
    """Idle checks that found the event loop busy and deferred the trim (Watchdog only)."""
    deadline_trims: int = 0
    """Trims made at the idle deadline while the loop was still busy (Watchdog only)."""
    callback_errors: int = 0
    """Exceptions raised by the on_trim callback (logged, then ignored)."""
    trim_errors: int = 0
    """Exceptions raised by trim() itself (logged, then ignored)."""
    lag_last: float = 0.0
    """Lateness, in seconds, of the last tick's wake-up: event-loop lag for the Watchdog,
    thread wake-up lateness (GIL contention) for the BackgroundTrimmer."""
    lag_max: float = 0.0
    """Largest such lateness seen."""
    floor: int | None = None
    """The policy's current floor (bytes)."""
    last_rss: int | None = None
    """RSS read at the last tick (bytes)."""


class _Runner:
    """State and reporting shared by Watchdog and BackgroundTrimmer."""

    _kind = "runner"

    def __init__(
        self,
        interval: float,
        policy: PacingPolicy | None,
        pools: bool,
        on_trim: Callable[[TrimEvent], object] | None,
        name: str,
        **policy_kwargs: object,
    ) -> None:
        self._interval = _seconds("interval", interval)
        given = {key: value for key, value in policy_kwargs.items() if value is not None}
        if policy is not None:
            if not isinstance(policy, PacingPolicy):
                raise TypeError(f"policy must be a PacingPolicy, not {type(policy).__name__}")
            if given:
                raise TypeError(
                    "pass either policy= or the policy arguments "
                    f"({', '.join(sorted(given))}), not both"
                )
            self._policy = policy
        else:
            self._policy = PacingPolicy(**given)  # type: ignore[arg-type]
        self._pools = _flag("pools", pools)
        self._on_trim = _callback("on_trim", on_trim)
        if not isinstance(name, str):
            raise TypeError(f"name must be a str, not {type(name).__name__}")
        self._name = name
        self._lock = threading.Lock()
        self._counters = Counters()

    @property
    def interval(self) -> float:
        """Seconds between two ticks."""
        return self._interval

    @property
    def policy(self) -> PacingPolicy:
        """The pacing policy in use."""
        return self._policy

    @property
    def counters(self) -> Counters:
        """A snapshot of the cumulative counters (safe to read from any thread)."""
        with self._lock:
            return self._counters

    def _count(self, **changes: Any) -> None:
        with self._lock:
            self._add(**changes)

    def _add(self, **changes: Any) -> None:
        # caller holds the lock; numeric fields are incremented, others replaced
        current = self._counters
        values: dict[str, Any] = {}
        for key, change in changes.items():
            if key in ("lag_last", "floor", "last_rss"):
                values[key] = change
            elif key == "lag_max":
                values[key] = max(current.lag_max, float(change))
            else:
                values[key] = getattr(current, key) + change
        self._counters = Counters(**{**current.__dict__, **values})

    def _check(self, now: float, lag: float, settled: bool = False) -> tuple[Decision, int]:
        started = time.perf_counter()
        current = rss()
        traced = _traced()
        with self._lock:
            decision = self._policy.decide(now, current, traced, settled=settled)
            growth = self._policy.growth(current, traced)
            skipped = {
                "min-interval": {"skipped_min_interval": 1},
                "backoff": {"skipped_backoff": 1},
                "rising": {"skipped_rising": 1},
            }.get(decision, {})
            self._add(
                ticks=1,
                lag_last=lag,
                lag_max=lag,
                last_rss=current,
                floor=self._policy.floor,
                tick_seconds=time.perf_counter() - started,
                **skipped,
            )
        return decision, growth

    def _report(
        self, now: float, result: TrimResult, growth: int, gate: Gate, deferred: float
    ) -> TrimEvent:
        released = result.released or 0
        rss_after = result.rss_after if result.rss_after is not None else rss()
        with self._lock:
            productive = self._policy.record_trim(
                now, growth=growth, released=released, rss_after=rss_after, traced=_traced()
            )
            self._add(
                trims=1,
                unproductive_trims=0 if productive else 1,
                bytes_released=released,
                trim_seconds=result.seconds,
                deadline_trims=1 if gate == "deadline" else 0,
                floor=self._policy.floor,
            )
            slack = self._policy.slack
        event = TrimEvent(
            result=result,
            reason=f"growth {format_bytes(growth)} > slack {format_bytes(slack)}",
            gate=gate,
            growth=growth,
            productive=productive,
            deferred=deferred,
        )
        logger.info(
            "%s %s: trim released %s in %.1f ms (%s, gate=%s%s)%s",
            self._kind,
            self._name,
            format_bytes(released),
            result.seconds * 1000.0,
            event.reason,
            gate,
            f", deferred {deferred * 1000.0:.0f} ms" if deferred else "",
            "" if productive else "; unproductive, backing off",
        )
        if self._on_trim is not None:
            try:
                self._on_trim(event)
            except Exception:
                self._count(callback_errors=1)
                logger.exception("%s %s: on_trim callback raised", self._kind, self._name)
        return event

    def _trim_failed(self) -> None:
        self._count(trim_errors=1)
        logger.exception("%s %s: trim() raised", self._kind, self._name)

    def _forget_after_fork(self) -> None:
        """Called in a forked child: drop what belongs to the parent's threads."""
        self._lock = threading.Lock()

    def _reset_policy(self) -> None:
        current = rss()
        with self._lock:
            self._policy.reset(current, _traced())
            self._add(floor=current, last_rss=current)


# ---- fork and shutdown safety ---------------------------------------------------------------

_instances: weakref.WeakSet[_Runner] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for instance in list(_instances):
        instance._forget_after_fork()


def _at_exit() -> None:
    for instance in list(_instances):
        if isinstance(instance, BackgroundTrimmer):
            instance.stop(timeout=1.0)


os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(_at_exit)


# ---- asyncio --------------------------------------------------------------------------------


class Watchdog(_Runner):
    """Trim in the background of an asyncio program, paced by a :class:`PacingPolicy`.

    Every ``interval`` seconds it reads RSS (cheap) and measures the loop's lag. When the policy
    says "trim" and ``idle_gating`` is on, it samples the loop every ``busy_lag / 2`` seconds; a
    sample is busy when it woke more than ``busy_lag`` late or other callbacks were queued. It
    trims, in a dedicated thread, once the loop has been quiet for ``quiet`` seconds right after
    being busy (the start of a gap between bursts), or for ``long_quiet`` seconds (no traffic),
    or anyway at ``idle_deadline`` seconds. The trim cannot be paused: a request arriving during
    it that mallocs more than ~1 KiB waits for it (see docs/watchdog.md for the bound).

    Use it as ``async with Watchdog(...)``, with ``start()`` / ``await stop()``, or as a task:
    ``asyncio.create_task(watchdog.run())``. Policy arguments (``slack``, ``min_interval``,
    ``backoff_max``, ``min_release``, ``release_fraction``, ``settle``) build a
    :class:`PacingPolicy`; or pass a pre-built one as ``policy=`` (one policy per runner: it
    holds the runner's state). ``on_trim`` is
    called, on the loop thread, with a :class:`TrimEvent` after every trim; an exception in it
    is logged and counted.

    Raises:
        TypeError, ValueError: for a wrong type or out-of-range argument, naming it.
    """

    _kind = "Watchdog"

    def __init__(
        self,
        *,
        interval: float = 1.0,
        slack: int | str | None = None,
        min_interval: float | None = None,
        backoff_max: float | None = None,
        min_release: int | str | None = None,
        release_fraction: float | None = None,
        settle: int | str | None = None,
        policy: PacingPolicy | None = None,
        idle_gating: bool = True,
        busy_lag: float = 0.005,
        quiet: float = 0.05,
        long_quiet: float = 0.5,
        idle_deadline: float = 30.0,
        pools: bool = False,
        on_trim: Callable[[TrimEvent], object] | None = None,
        name: str = "memreclaim-watchdog",
    ) -> None:
        super().__init__(
            interval,
            policy,
            pools,
            on_trim,
            name,
            slack=slack,
            min_interval=min_interval,
            backoff_max=backoff_max,
            min_release=min_release,
            release_fraction=release_fraction,
            settle=settle,
        )
        self._idle_gating = _flag("idle_gating", idle_gating)
        self._busy_lag = _seconds("busy_lag", busy_lag)
        self._quiet = _seconds("quiet", quiet)
        self._long_quiet = _seconds("long_quiet", long_quiet)
        if self._long_quiet < self._quiet:
            raise ValueError(f"long_quiet ({long_quiet!r} s) must be >= quiet ({quiet!r} s)")
        self._idle_deadline = _seconds("idle_deadline", idle_deadline, allow_zero=True)
        self._task: asyncio.Task[None] | None = None
        self._trim_thread: threading.Thread | None = None
        _instances.add(self)

    @property
    def running(self) -> bool:
        """True while the watchdog's task is alive."""
        task = self._task
        return task is not None and not task.done()

    @property
    def task(self) -> asyncio.Task[None] | None:
        """The task running :meth:`run`, or None."""
        return self._task

    def start(self) -> asyncio.Task[None]:
        """Start the watchdog as a task on the running loop and return the task.

        Raises:
            RuntimeError: when it is already running, or when no event loop is running.
        """
        if self.running:
            raise RuntimeError(f"Watchdog {self._name!r} is already running; stop() it first")
        loop = asyncio.get_running_loop()
        self._task = loop.create_task(self.run(), name=self._name)
        return self._task

    async def stop(self) -> None:
        """Stop the watchdog and wait until its task (and any trim in flight) has finished.

        Safe to call twice, or when it never started.
        """
        task = self._task
        if task is None:
            return
        if task is asyncio.current_task():
            raise RuntimeError("Watchdog.stop() cannot be awaited from the watchdog's own task")
        task.cancel()
        await asyncio.wait({task})
        if not task.cancelled() and task.exception() is not None:
            logger.error("Watchdog %s ended with an error", self._name, exc_info=task.exception())

    async def __aenter__(self) -> Watchdog:
        self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    async def run(self) -> None:
        """Run until cancelled: tick every ``interval`` seconds, trim when the policy says so."""
        current = asyncio.current_task()
        if self._task is not None and self._task is not current and not self._task.done():
            raise RuntimeError(f"Watchdog {self._name!r} is already running")
        self._task = current
        loop = asyncio.get_running_loop()
        self._reset_policy()
        try:
            while True:
                scheduled = loop.time() + self._interval
                await asyncio.sleep(self._interval)
                now = loop.time()
                try:
                    decision, growth = self._check(now, max(0.0, now - scheduled))
                except Exception:  # e.g. /proc unreadable: log, keep ticking
                    logger.exception("Watchdog %s: tick failed", self._name)
                    continue
                if decision != "trim":
                    continue
                gate: Gate = "ungated"
                deferred = 0.0
                if self._idle_gating:
                    gate, deferred = await self._wait_for_idle(loop)
                try:
                    result = await self._trim_in_thread(loop)
                except asyncio.CancelledError:
                    raise
                except Exception:
                    self._trim_failed()
                    continue
                self._report(loop.time(), result, growth, gate, deferred)
        finally:
            if self._task is current:
                self._task = None

    async def _wait_for_idle(self, loop: asyncio.AbstractEventLoop) -> tuple[Gate, float]:
        """Sample the loop every ``busy_lag / 2`` seconds until it is idle or the deadline passes.

        Idle means: quiet for ``quiet`` seconds right after busy samples (the start of a gap
        between bursts, the best moment to start a trim), or quiet for ``long_quiet`` seconds
        (a loop with no traffic). A sample is busy when the wake-up was more than ``busy_lag``
        late, or when other callbacks were queued to run (asyncio's ready queue, when the loop
        exposes it).
        """
        started = loop.time()
        deadline = started + self._idle_deadline
        seen_busy = False
        quiet_since: float | None = None
        while True:
            sampled = loop.time()
            busy = await self._sample_is_busy(loop)
            now = loop.time()
            if busy:
                seen_busy = True
                quiet_since = None
                self._count(skipped_busy=1)
            else:
                if quiet_since is None:
                    quiet_since = sampled
                quiet_for = now - quiet_since
                if (seen_busy and quiet_for >= self._quiet) or quiet_for >= self._long_quiet:
                    return "idle", now - started
            if now >= deadline:
                return "deadline", now - started

    async def _sample_is_busy(self, loop: asyncio.AbstractEventLoop) -> bool:
        period = self._busy_lag / 2
        scheduled = loop.time() + period
        await asyncio.sleep(period)
        lag = max(0.0, loop.time() - scheduled)
        self._count(lag_last=lag, lag_max=lag)
        ready = getattr(loop, "_ready", None)  # asyncio's default loops; not uvloop
        queued = len(ready) if isinstance(ready, collections.abc.Sized) else 0
        return lag > self._busy_lag or queued >= _READY_BUSY

    async def _trim_in_thread(self, loop: asyncio.AbstractEventLoop) -> TrimResult:
        """Run trim() in a dedicated thread (not the default executor, which may be busy)."""
        future: asyncio.Future[TrimResult] = loop.create_future()

        def deliver(result: TrimResult | None, error: BaseException | None) -> None:
            if future.done():
                return
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(result)  # type: ignore[arg-type]

        def work() -> None:
            result: TrimResult | None = None
            error: BaseException | None = None
            try:
                result = trim(pools=self._pools)
            except BaseException as exc:
                error = exc
            # RuntimeError: the loop was closed meanwhile, and nobody waits for the result.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(deliver, result, error)

        thread = threading.Thread(target=work, name=f"{self._name}-trim", daemon=True)
        self._trim_thread = thread
        thread.start()
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            # A trim cannot be interrupted: let it finish, so that no thread outlives stop().
            if not future.done():
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.wait({future})
            raise
        finally:
            if future.done() and not future.cancelled():
                future.exception()  # mark retrieved
            self._trim_thread = None

    def _forget_after_fork(self) -> None:
        # The parent's loop and task do not exist in a child; start again there if needed.
        self._task = None
        self._trim_thread = None
        self._lock = threading.Lock()


# ---- threads --------------------------------------------------------------------------------


class BackgroundTrimmer(_Runner):
    """Trim in the background of a synchronous program, from a daemon thread.

    Same :class:`PacingPolicy` as :class:`Watchdog`, minus loop gating: every ``interval``
    seconds the thread reads RSS, and trims when the policy says so (the trim releases the GIL,
    so the other threads keep running; a thread that mallocs > ~1 KiB meanwhile may wait for the
    arena lock).

    Use ``start()`` / ``stop()`` or ``with BackgroundTrimmer(...):``. Fork-safe: in a forked
    child the trimmer is marked not running (its thread does not exist there) and can be started
    again; in gunicorn, start one per worker in ``post_fork`` (see
    :mod:`memreclaim.integrations.gunicorn`). ``on_trim`` is called on the trimmer thread.

    Raises:
        TypeError, ValueError: for a wrong type or out-of-range argument, naming it.
    """

    _kind = "BackgroundTrimmer"

    def __init__(
        self,
        *,
        interval: float = 1.0,
        slack: int | str | None = None,
        min_interval: float | None = None,
        backoff_max: float | None = None,
        min_release: int | str | None = None,
        release_fraction: float | None = None,
        settle: int | str | None = None,
        policy: PacingPolicy | None = None,
        pools: bool = False,
        on_trim: Callable[[TrimEvent], object] | None = None,
        name: str = "memreclaim-trimmer",
    ) -> None:
        super().__init__(
            interval,
            policy,
            pools,
            on_trim,
            name,
            slack=slack,
            min_interval=min_interval,
            backoff_max=backoff_max,
            min_release=min_release,
            release_fraction=release_fraction,
            settle=settle,
        )
        self._thread: threading.Thread | None = None
        self._stop_event = threading.Event()
        self._pid = os.getpid()
        self._control = threading.Lock()  # serialises start/stop
        self._tick_lock = threading.Lock()  # serialises ticks
        _instances.add(self)

    @property
    def running(self) -> bool:
        """True while the trimmer thread is alive in this process."""
        thread = self._thread
        return thread is not None and thread.is_alive() and self._pid == os.getpid()

    @property
    def thread(self) -> threading.Thread | None:
        """The trimmer thread, or None when not running."""
        return self._thread if self.running else None

    def start(self) -> None:
        """Start the trimmer thread.

        Raises:
            RuntimeError: when it is already running.
        """
        with self._control:
            if self.running:
                raise RuntimeError(f"BackgroundTrimmer {self._name!r} is already running")
            self._reset_policy()
            self._stop_event = threading.Event()
            self._pid = os.getpid()
            thread = threading.Thread(
                target=self._run, args=(self._stop_event,), name=self._name, daemon=True
            )
            self._thread = thread
            thread.start()

    def stop(self, timeout: float | None = 5.0) -> bool:
        """Stop the thread and wait up to ``timeout`` seconds for it (a trim in flight finishes).

        Returns True when the thread has ended (or never ran). Safe to call twice. Called from
        the trimmer's own thread (e.g. in on_trim), it only asks the thread to stop.
        """
        if timeout is not None:
            timeout = _seconds("timeout", timeout, allow_zero=True)
        with self._control:
            thread = self._thread
            if thread is None or self._pid != os.getpid():
                self._thread = None
                return True
            self._stop_event.set()
            if thread is threading.current_thread():
                return False
            thread.join(timeout)
            if thread.is_alive():
                return False
            self._thread = None
            return True

    def tick(self, *, settled: bool = True) -> TrimEvent | None:
        """Run one policy check now, in the calling thread; trim if due. Return the trim's event.

        Meant for hooks at the end of a unit of work (gunicorn ``post_request``, Celery
        ``task_postrun``): the work that allocated is over, so by default (``settled=True``) the
        policy's "still rising" check is skipped. The policy needs a floor: the first call on a
        trimmer never started sets it and returns None.
        """
        _flag("settled", settled)
        if self._policy.floor is None:
            self._reset_policy()
            return None
        return self._tick(lag=0.0, settled=settled)

    def __enter__(self) -> BackgroundTrimmer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _tick(self, lag: float, settled: bool = False) -> TrimEvent | None:
        # One tick at a time (the thread and hooks calling tick() may race): a tick that waited
        # for another's trim then sees the minimum interval and does not trim again.
        with self._tick_lock:
            decision, growth = self._check(time.monotonic(), lag, settled)
            if decision != "trim":
                return None
            try:
                result = trim(pools=self._pools)
            except Exception:
                self._trim_failed()
                return None
            return self._report(time.monotonic(), result, growth, "thread", 0.0)

    def _run(self, stop_event: threading.Event) -> None:
        while True:
            scheduled = time.monotonic() + self._interval
            if stop_event.wait(self._interval):
                return
            try:
                self._tick(lag=max(0.0, time.monotonic() - scheduled))
            except Exception:  # never let the thread die silently
                logger.exception("BackgroundTrimmer %s: tick failed", self._name)

    def _forget_after_fork(self) -> None:
        # The thread was not copied into the child: mark this trimmer not running there.
        self._thread = None
        self._stop_event = threading.Event()
        self._lock = threading.Lock()
        self._control = threading.Lock()
        self._tick_lock = threading.Lock()
        self._pid = os.getpid()
