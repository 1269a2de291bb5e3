"""Background reclaim runners: an asyncio :class:`Watchdog`, a thread :class:`BackgroundTrimmer`,
and hook calls (:meth:`BackgroundTrimmer.tick`) for the end of a request or task.

The runners are thin: they read the signals (RSS from ``/proc/self/statm``, tracemalloc's traced
bytes when tracing, the allocator's free bytes when the policy asks, the number of requests in
flight that integrations report with :meth:`request_started` / :meth:`request_finished`), ask
their :class:`~memreclaim.policy.PacingPolicy` whether to trim, trim with
:func:`memreclaim.trim` (which counts every trim once in the process-wide totals), and report
the outcome back. Everything about *when* lives in :mod:`memreclaim.policy`.

- All runners of a process share one trim lock: a runner whose turn comes while another is
  trimming skips (that trim is already giving the memory back) instead of trimming twice.
- The floor is taken at ``start()`` / ``__aenter__`` (a spike made right after start, before
  the first tick, is measured as growth and given back).
- Threaded servers (``thresholds=None``, the default): glibc's ``malloc_trim`` does not shrink
  the tops of non-main thread arenas; when a trim leaves more than ``slack`` in two or more
  thread arenas, the runner fixes glibc's trim threshold (``set_trim_threshold(128 KiB)``,
  which also stops the adaptive thresholds) so that frees in those threads give their tops
  back, and logs it once. Under mimalloc 2 (a live thread's freed pages wait for that thread)
  the same trigger, with three or more threads, sets the purge delay to 0
  (``set_purge_delay(0)``). ``thresholds=True`` does it at start, ``False`` never.

Every trim is logged on the ``memreclaim`` logger (INFO: bytes, milliseconds, reason) and passed
to an optional callback; :attr:`counters` returns this runner's cumulative :class:`Counters`
(per runner; :func:`memreclaim._accounting.totals` has the process-wide totals).
"""

from __future__ import annotations

import asyncio
import atexit
import collections.abc
import contextlib
import logging
import os
import threading
import time
import tracemalloc
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal

import memreclaim

from . import _core, _libraries, _validate
from ._core import HeapStats, TrimResult, UnsupportedAllocatorError, heap_stats, rss
from ._limits import UsageAlarm, usage_alarm
from .policy import Decision, PacingPolicy
from .units import format_bytes

__all__ = [
    "BackgroundTrimmer",
    "Counters",
    "Decision",
    "PacingPolicy",
    "TrimEvent",
    "Watchdog",
]

logger = logging.getLogger("memreclaim")

Gate = Literal["idle", "deadline", "ungated", "thread", "hook"]

# An idle loop has at most one other callback queued when the watchdog wakes (a timer of
# another task that fell due at the same moment); two or more means work is in flight.
_READY_BUSY = 2

# The longest interval a runner accepts: a thread waiting longer than this on an Event fails
# with OverflowError (threading.TIMEOUT_MAX), and nobody means a trimmer that never ticks.
MAX_INTERVAL = 3600.0

# glibc trim threshold set for threaded servers (see the module docstring).
THREAD_TRIM_THRESHOLD = 128 * 1024

# A free of a chunk this big (>= glibc's FASTBIN_CONSOLIDATION_THRESHOLD, 64 KiB, and under
# any mmap threshold, >= 128 KiB) in a thread's arena makes glibc trim that arena's top.
_NUDGE_BYTES = 96 * 1024

# One lock for every runner of the process: two trims at once would walk the same arenas twice.
_TRIM_LOCK = threading.Lock()
_thresholds_set = False


def _traced() -> int | None:
    if tracemalloc.is_tracing():
        return tracemalloc.get_traced_memory()[0]
    return None


_free_unsupported = False


def _heap() -> HeapStats | None:
    """The allocator's figures (glibc mallinfo2: microseconds on a tidy heap, about 3 ms on a
    fragmented 400 MiB one), or None when it does not say."""
    global _free_unsupported
    if _free_unsupported:
        return None
    try:
        return heap_stats()
    except (UnsupportedAllocatorError, OSError):
        _free_unsupported = True
        return None


def _free_bytes() -> int | None:
    """The allocator's free bytes (glibc mallinfo2), or None when it does not say."""
    heap = _heap()
    return None if heap is None else heap.free


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _vsize() -> int | None:
    """The mapped address space in bytes (``/proc/self/statm``'s first field), or None."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[0]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


_thp_always: bool | None = None


def _thp_is_always() -> bool:
    """Whether transparent huge pages are ``enabled=always`` (read once per process): then
    khugepaged may fault back in the free pages a trim released, with no allocation."""
    global _thp_always
    if _thp_always is None:
        try:
            with open("/sys/kernel/mm/transparent_hugepage/enabled") as mode:
                _thp_always = "[always]" in mode.read()
        except OSError:
            _thp_always = False
    return _thp_always


def _regrowth_vsize() -> int | None:
    """The address space the policy compares regrowth with, where regrowth can happen."""
    return _vsize() if _thp_is_always() else None


def _in_use(heap: HeapStats | None) -> int | None:
    """Bytes live data holds: the allocator's in-use figure plus what library pools (pyarrow's)
    report in use, or None when the allocator does not say."""
    if heap is None or heap.in_use is None:
        return None
    return heap.in_use + _libraries.in_use()


def _mapped(heap: HeapStats | None) -> int | None:
    """Bytes the allocator maps plus what library pools report in use, or None."""
    if heap is None or heap.mapped is None:
        return None
    return heap.mapped + _libraries.in_use()


def _mimalloc_2() -> bool:
    """mimalloc 2.x serves malloc: memory a live thread freed stays queued in that thread."""
    version = memreclaim.allocator_version() if memreclaim.allocator() == "mimalloc" else None
    return version is not None and version.startswith("2.")


def _fix_thread_thresholds(reason: str) -> bool:
    """Make frees in other threads give their memory back, once per process; log it once.

    glibc: fix the trim threshold (``malloc_trim`` cannot shrink the tops of thread arenas; a
    free at a top does, below the threshold). mimalloc 2: the purge delay to 0 (a live thread's
    freed pages wait for that thread's next visit to its segment; measured: a worker's 400 MiB
    spike stays resident after any trim, 177 MiB as with ``MIMALLOC_RESET_DELAY=0``).
    """
    global _thresholds_set
    if _thresholds_set:
        return False
    if memreclaim.allocator() == "glibc":
        _thresholds_set = True
        memreclaim.set_trim_threshold(THREAD_TRIM_THRESHOLD)
        logger.info(
            "memreclaim: set glibc's trim threshold to %s (%s): malloc_trim cannot shrink the"
            " tops of thread arenas; a free at a top now gives it back (it does not undo a top"
            " kept already: those go back with the next such free in that arena)",
            format_bytes(THREAD_TRIM_THRESHOLD),
            reason,
        )
        return True
    if _mimalloc_2():
        _thresholds_set = True
        previous = memreclaim.set_purge_delay(0)
        logger.info(
            "memreclaim: set mimalloc's purge delay to 0 ms, was %d (%s): mimalloc 2 keeps what"
            " a live thread freed until that thread returns to it; pages freed from now on go"
            " back as they become free",
            previous,
            reason,
        )
        return True
    return False


def _arenas_retaining(slack: int) -> tuple[int, int] | None:
    """(thread arenas, bytes they map) when two or more thread arenas map more than slack."""
    if memreclaim.allocator() != "glibc":
        return None
    from .glibc import arenas

    others = [arena for arena in arenas() if arena.nr != 0]
    mapped = sum(arena.mapped for arena in others)
    if len(others) >= 2 and mapped > slack:
        return len(others), mapped
    return None


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
    (Watchdog with idle gating off), ``"thread"`` (BackgroundTrimmer's thread) or ``"hook"``
    (:meth:`BackgroundTrimmer.tick` called by a hook)."""
    growth: int
    """Bytes of growth over the learned level when the trim fired."""
    productive: bool
    """False when the trim returned too little (it taught the policy the pinned level)."""
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
    retest_trims: int = 0
    """Of those, re-tests of a provisional level (see :attr:`PacingPolicy.provisional`)."""
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
    skipped_budget: int = 0
    """Ticks whose trigger fired but the CPU budget for trims was spent."""
    skipped_concurrent: int = 0
    """Trims skipped because another runner of this process was trimming at that moment."""
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
    """The policy's floor: the lowest RSS since start (bytes)."""
    level: int | None = None
    """The policy's learned level: RSS right after the last trim, or lower (bytes)."""
    last_rss: int | None = None
    """RSS read at the last tick (bytes)."""


class _Runner:
    """Signals, trimming and reporting shared by Watchdog and BackgroundTrimmer."""

    _kind = "runner"

    def __init__(
        self,
        *,
        interval: float,
        policy: PacingPolicy | None,
        slack: int | str | None,
        min_interval: float | None,
        limit: int | str | None,
        thresholds: bool | None,
        pools: bool,
        on_trim: Callable[[TrimEvent], object] | None,
        name: str,
    ) -> None:
        self._interval = _validate.seconds("interval", interval, maximum=MAX_INTERVAL)
        shortcuts = {
            key: value
            for key, value in (("slack", slack), ("min_interval", min_interval), ("limit", limit))
            if value is not None
        }
        if policy is not None:
            self._policy = _validate.instance("policy", policy, PacingPolicy)
            if shortcuts:
                raise TypeError(
                    f"pass either policy= or {', '.join(sorted(shortcuts))}=, not both"
                    " (set them on the PacingPolicy)"
                )
        else:
            self._policy = PacingPolicy(**shortcuts)  # type: ignore[arg-type]
        if thresholds is not None:
            _validate.flag("thresholds", thresholds)
        self._thresholds = thresholds
        self._pools = _validate.flag("pools", pools)
        self._on_trim = _validate.callback("on_trim", on_trim, takes="a TrimEvent")
        _validate.instance("name", name, str)
        self._name = name
        self._lock = threading.Lock()
        self._counters = Counters()
        self._in_flight = 0
        self._requests_seen = False
        self._alarm: UsageAlarm | None = None

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
        """A snapshot of this runner's cumulative counters (safe to read from any thread)."""
        with self._lock:
            return self._counters

    @property
    def in_flight(self) -> int | None:
        """Requests in flight as reported by :meth:`request_started`; None if never called."""
        with self._lock:
            return self._in_flight if self._requests_seen else None

    def request_started(self) -> None:
        """Tell the runner a request (or task) started: the policy waits for the burst to end."""
        with self._lock:
            self._requests_seen = True
            self._in_flight += 1

    def request_finished(self) -> None:
        """Tell the runner a request (or task) finished (never goes below zero)."""
        with self._lock:
            self._in_flight = max(0, self._in_flight - 1)

    def _count(self, **changes: Any) -> None:
        with self._lock:
            self._add(**changes)

    def _add(self, **changes: Any) -> None:
        # caller holds the lock; numeric fields are incremented, others replaced
        current = self._counters
        values: dict[str, Any] = {}
        for key, change in changes.items():
            if key in ("lag_last", "floor", "level", "last_rss"):
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
            wants_heap = self._policy.wants_free(now, current)
        heap = _heap() if wants_heap else None
        vsize = _regrowth_vsize() if heap is not None else None
        with self._lock:
            in_flight = self._in_flight if self._requests_seen else None
            decision = self._policy.decide(
                now,
                current,
                traced=traced,
                free=None if heap is None else heap.free,
                in_flight=in_flight,
                settled=settled,
                in_use=_in_use(heap),
                vsize=vsize,
                mapped=_mapped(heap),
            )
            growth = self._policy.growth(current, traced)
            skipped = {
                "min-interval": {"skipped_min_interval": 1},
                "backoff": {"skipped_backoff": 1},
                "rising": {"skipped_rising": 1},
                "budget": {"skipped_budget": 1},
            }.get(decision, {})
            self._add(
                ticks=1,
                lag_last=lag,
                lag_max=lag,
                last_rss=current,
                floor=self._policy.floor,
                level=self._policy.level,
                tick_seconds=time.perf_counter() - started,
                **skipped,
            )
        return decision, growth

    def _trim(self) -> TrimResult | None:
        """One trim under the process-wide lock; None when another runner is trimming."""
        if not _TRIM_LOCK.acquire(blocking=False):
            self._count(skipped_concurrent=1)
            return None
        try:
            return memreclaim.trim(pools=self._pools)
        finally:
            _TRIM_LOCK.release()

    def _report(
        self, now: float, result: TrimResult, growth: int, gate: Gate, deferred: float
    ) -> TrimEvent:
        released = result.released or 0
        rss_after = result.rss_after if result.rss_after is not None else rss()
        heap = _heap()
        mapped = _mapped(heap)
        # A part it could not measure or act on: the trim may have missed memory there.
        unreached = result.reason is not None or None in result.parts.values()
        with self._lock:
            reason = self._policy.reason
            retest = self._policy.retesting
            productive = self._policy.record_trim(
                now,
                growth=growth,
                released=released,
                rss_after=rss_after,
                seconds=result.seconds,
                traced=_traced(),
                free=None if heap is None else heap.free,
                in_use=_in_use(heap),
                mapped=mapped,
                vsize=_regrowth_vsize() if heap is not None else None,
                unreached=unreached,
            )
            provisional = self._policy.provisional
            retest_due = self._policy.retest_due
            self._add(
                trims=1,
                retest_trims=1 if retest else 0,
                unproductive_trims=0 if productive else 1,
                bytes_released=released,
                trim_seconds=result.seconds,
                deadline_trims=1 if gate == "deadline" else 0,
                floor=self._policy.floor,
                level=self._policy.level,
            )
            slack = self._policy.slack
            left = rss_after - (self._policy.floor or rss_after)
        event = TrimEvent(
            result=result,
            reason=reason,
            gate=gate,
            growth=growth,
            productive=productive,
            deferred=deferred,
        )
        if provisional == "incomplete" and retest_due is not None:
            outcome = (
                f"; the trim missed memory: level provisional, re-test in"
                f" {max(0.0, retest_due - now):.1f} s"
            )
        elif productive:
            outcome = ""
        else:
            outcome = "; little was free: level learned"
        logger.info(
            "%s %s: trim released %s in %.1f ms (%s, gate=%s%s)%s",
            self._kind,
            self._name,
            format_bytes(released),
            result.seconds * 1000.0,
            event.reason,
            gate,
            f", deferred {deferred * 1000.0:.0f} ms" if deferred else "",
            outcome,
        )
        if self._thresholds is None and left > slack and threading.active_count() >= 3:
            self._check_arenas(slack)
        if self._on_trim is not None:
            try:
                self._on_trim(event)
            except Exception:
                self._count(callback_errors=1)
                logger.exception("%s %s: on_trim callback raised", self._kind, self._name)
        return event

    def _check_arenas(self, slack: int) -> None:
        if _thresholds_set:
            return
        if _mimalloc_2():
            _fix_thread_thresholds(
                f"{threading.active_count()} threads, a trim left more than"
                f" {format_bytes(slack)} over the floor"
            )
            return
        try:
            found = _arenas_retaining(slack)
        except Exception:  # malloc_info unreadable: nothing to learn, say it once
            logger.debug("memreclaim: could not read malloc_info", exc_info=True)
            return
        if found is not None:
            count, mapped = found
            _fix_thread_thresholds(f"{count} thread arenas map {format_bytes(mapped)} after a trim")

    def _nudge_arena(self) -> None:
        """In a hook (the worker thread): give back what this thread holds.

        ``malloc_trim`` cannot shrink a thread arena's top; a free of a chunk of 64 KiB or
        more in that arena does, once the trim threshold is fixed. Done only while the
        thresholds are fixed and the level is more than ``slack`` over the floor, so it stops
        once the tops are back. Under mimalloc 2 it is this thread's collect
        (``_core.collect_thread(abandon=True)``): only the thread that freed can give back.
        """
        if not _thresholds_set:
            return
        with self._lock:
            floor, level = self._policy.floor, self._policy.level
            slack = self._policy.slack
        if floor is not None and level is not None and level - floor > slack:
            if memreclaim.allocator() == "glibc":
                block = bytearray(_NUDGE_BYTES)
                del block
            else:  # mimalloc 2: this thread's share (its queued pages), handed over
                _core.collect_thread(abandon=True)

    def _trim_failed(self) -> None:
        self._count(trim_errors=1)
        logger.exception("%s %s: trim() raised", self._kind, self._name)

    @property
    def running(self) -> bool:
        """True while the runner runs in this process (each kind says how)."""
        raise NotImplementedError

    @property
    def limit_alarm(self) -> UsageAlarm | None:
        """The kernel notification the thread also sleeps on while running, or None.

        With a soft limit (``policy.limit``) in a cgroup v1, a running runner has registered a
        :class:`memreclaim._limits.UsageAlarm` at the limit's mark: it wakes when the cgroup's
        usage crosses it, within about a MiB of allocation, not at its next tick. Where none
        can be registered (cgroup v2, no limit, no permission) it only ticks, faster near the
        limit (:meth:`PacingPolicy.tick_interval`); the reason is logged at DEBUG level.
        """
        alarm = self._alarm
        return alarm if alarm is not None and alarm.fileno() >= 0 and self.running else None

    def _open_alarm(self) -> UsageAlarm | None:
        mark = self._policy.limit_mark
        if mark is None:
            return None
        alarm, why = usage_alarm(mark)
        if alarm is None:
            logger.debug("%s %s: no usage alarm: %s", self._kind, self._name, why)
        return alarm

    def _forget_after_fork(self) -> None:
        """Called in a forked child: drop what belongs to the parent's threads."""
        self._lock = threading.Lock()
        self._in_flight = 0
        if self._alarm is not None:
            self._alarm._forget_after_fork()
            self._alarm = None

    def _reset_policy(self) -> None:
        if self._thresholds:
            _fix_thread_thresholds("thresholds=True")
        current = rss()
        heap = _heap()
        with self._lock:
            in_use = _in_use(heap)
            self._policy.reset(time.monotonic(), current, _traced(), in_use=in_use)
            self._add(floor=current, level=current, last_rss=current)


# ---- fork and shutdown safety ---------------------------------------------------------------

_instances: weakref.WeakSet[_Runner] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    global _TRIM_LOCK
    _TRIM_LOCK = threading.Lock()
    for instance in list(_instances):
        instance._forget_after_fork()


def _at_exit() -> None:
    for instance in list(_instances):
        if isinstance(instance, BackgroundTrimmer):
            instance.stop(timeout=1.0)


os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(_at_exit)


# ---- asyncio --------------------------------------------------------------------------------


async def _sleep_or_alarm(
    loop: asyncio.AbstractEventLoop, alarm: UsageAlarm, seconds: float
) -> bool:
    """Sleep ``seconds`` or until the usage alarm fires (True); a loop without ``add_reader``
    just sleeps."""
    woken = loop.create_future()
    fd = alarm.fileno()

    def wake() -> None:
        if not woken.done():
            woken.set_result(None)

    try:
        loop.add_reader(fd, wake)
    except (NotImplementedError, ValueError, OSError):
        await asyncio.sleep(seconds)
        return False
    try:
        await asyncio.wait({woken}, timeout=seconds)
    finally:
        loop.remove_reader(fd)
        woken.cancel()
    return alarm.wait(0)


class Watchdog(_Runner):
    """Trim in the background of an asyncio program, paced by a :class:`PacingPolicy`.

    Every ``interval`` seconds it reads RSS (cheap) and asks the policy. When the policy says
    "trim" and ``idle_gating`` is on, it samples the loop every ``busy_lag / 2`` seconds; a
    sample is busy when it woke more than ``busy_lag`` late or other callbacks were queued. It
    trims, in a dedicated thread, once the loop has been quiet for ``quiet`` seconds right after
    being busy (the start of a gap between bursts), or for ``long_quiet`` seconds (no traffic),
    or anyway at ``idle_deadline`` seconds. The trim cannot be paused: a request arriving during
    it that mallocs more than ~1 KiB waits for it (see docs/watchdog.md for the bound).

    Use it as ``async with Watchdog(...)``, with ``start()`` / ``await stop()``, or as a task:
    ``asyncio.create_task(watchdog.run())``. Configure the pacing with ``policy=`` (a
    :class:`PacingPolicy`, one per runner: it holds the runner's state), or with the shortcuts
    ``slack=``, ``min_interval=`` and ``limit=``, which build one. ``on_trim`` is called, on
    the loop thread, with a :class:`TrimEvent` after every trim; an exception in it is logged
    and counted.

    Raises:
        TypeError, ValueError: for a wrong type or out-of-range argument, naming it.
    """

    _kind = "Watchdog"

    def __init__(
        self,
        *,
        interval: float = 1.0,
        policy: PacingPolicy | None = None,
        slack: int | str | None = None,
        min_interval: float | None = None,
        limit: int | str | None = None,
        thresholds: bool | None = None,
        idle_gating: bool = True,
        busy_lag: float = 0.005,
        quiet: float = 0.05,
        long_quiet: float = 0.5,
        idle_deadline: float = 2.0,
        pools: bool = False,
        on_trim: Callable[[TrimEvent], object] | None = None,
        name: str = "memreclaim-watchdog",
    ) -> None:
        super().__init__(
            interval=interval,
            policy=policy,
            slack=slack,
            min_interval=min_interval,
            limit=limit,
            thresholds=thresholds,
            pools=pools,
            on_trim=on_trim,
            name=name,
        )
        self._idle_gating = _validate.flag("idle_gating", idle_gating)
        self._busy_lag = _validate.seconds("busy_lag", busy_lag, maximum=MAX_INTERVAL)
        self._quiet = _validate.seconds("quiet", quiet, maximum=MAX_INTERVAL)
        self._long_quiet = _validate.seconds("long_quiet", long_quiet, maximum=MAX_INTERVAL)
        if self._long_quiet < self._quiet:
            raise ValueError(f"long_quiet ({long_quiet!r} s) must be >= quiet ({quiet!r} s)")
        self._idle_deadline = _validate.seconds(
            "idle_deadline", idle_deadline, allow_zero=True, maximum=MAX_INTERVAL
        )
        self._task: asyncio.Task[None] | None = None
        self._trim_thread: threading.Thread | None = None
        self._policy_ready = False
        _instances.add(self)

    def _live_task(self) -> asyncio.Task[None] | None:
        """The task, unless it is done or its loop was closed without stop() (then forgotten)."""
        task = self._task
        if task is None:
            return None
        if task.done() or task.get_loop().is_closed():
            self._task = None
            return None
        return task

    @property
    def running(self) -> bool:
        """True while the watchdog's task is alive on an open loop."""
        return self._live_task() is not None

    @property
    def task(self) -> asyncio.Task[None] | None:
        """The task running :meth:`run`, or None."""
        return self._live_task()

    def start(self) -> asyncio.Task[None]:
        """Take the floor now and start the watchdog as a task on the running loop.

        Raises:
            RuntimeError: when it is already running, or when no event loop is running.
        """
        if self.running:
            raise RuntimeError(f"Watchdog {self._name!r} is already running; stop() it first")
        loop = asyncio.get_running_loop()
        self._reset_policy()  # the floor is the RSS now, before anything else runs
        self._policy_ready = True
        self._task = loop.create_task(self.run(), name=self._name)
        return self._task

    async def stop(self) -> None:
        """Stop the watchdog and wait until its task (and any trim in flight) has finished.

        Safe to call twice, when it never started, and after its loop was closed (then there
        is nothing left to wait for). Called from another loop than the watchdog's, it cancels
        the task there and does not wait.
        """
        task = self._live_task()
        if task is None:
            self._task = None
            return
        if task is asyncio.current_task():
            raise RuntimeError("Watchdog.stop() cannot be awaited from the watchdog's own task")
        if task.get_loop() is not asyncio.get_running_loop():
            task.get_loop().call_soon_threadsafe(task.cancel)
            self._task = None
            return
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
        live = self._live_task()
        if live is not None and live is not current:
            raise RuntimeError(f"Watchdog {self._name!r} is already running")
        self._task = current
        loop = asyncio.get_running_loop()
        if not self._policy_ready:
            self._reset_policy()
        self._policy_ready = False
        alarm = self._alarm = self._open_alarm()
        try:
            while True:
                wait = self._policy.tick_interval(self._interval, time.monotonic())
                scheduled = loop.time() + wait
                if alarm is None:
                    await asyncio.sleep(wait)
                elif await _sleep_or_alarm(loop, alarm, wait):
                    scheduled = loop.time()  # woken at the limit's mark: not late
                now = loop.time()
                try:
                    decision, growth = self._check(time.monotonic(), max(0.0, now - scheduled))
                except Exception:  # e.g. /proc unreadable: log, keep ticking
                    logger.exception("Watchdog %s: tick failed", self._name)
                    continue
                if decision != "trim":
                    continue
                gate: Gate = "ungated"
                deferred = 0.0
                if self._idle_gating and not self._policy.urgent:  # never wait at the limit
                    gate, deferred = await self._wait_for_idle(loop)
                try:
                    result = await self._trim_in_thread(loop)
                except asyncio.CancelledError:
                    raise
                except Exception:
                    self._trim_failed()
                    continue
                if result is not None:
                    self._report(time.monotonic(), result, growth, gate, deferred)
        finally:
            if alarm is not None:
                alarm.close()
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

    async def _trim_in_thread(self, loop: asyncio.AbstractEventLoop) -> TrimResult | None:
        """Run one trim in a dedicated thread (not the default executor, which may be busy)."""
        future: asyncio.Future[TrimResult | None] = loop.create_future()

        def deliver(result: TrimResult | None, error: BaseException | None) -> None:
            if future.done():
                return
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(result)

        def work() -> None:
            result: TrimResult | None = None
            error: BaseException | None = None
            try:
                result = self._trim()
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
            if future.done():
                if not future.cancelled():
                    future.exception()  # mark retrieved
                # the thread has delivered: it is returning; let no thread outlive stop()
                thread.join(1.0)
            self._trim_thread = None

    def _forget_after_fork(self) -> None:
        # The parent's loop and task do not exist in a child; start again there if needed.
        super()._forget_after_fork()
        self._task = None
        self._trim_thread = None


# ---- threads --------------------------------------------------------------------------------


class BackgroundTrimmer(_Runner):
    """Trim in the background of a synchronous program, from a daemon thread, and from hooks.

    Same :class:`PacingPolicy` as :class:`Watchdog`, minus loop gating: every ``interval``
    seconds the thread reads RSS, and trims when the policy says so (the trim releases the GIL,
    so the other threads keep running; a thread that mallocs > ~1 KiB meanwhile may wait for the
    arena lock). Hooks at the end of a request or task call :meth:`tick` (in the worker thread)
    and report requests with :meth:`request_started` / :meth:`request_finished`, so that the
    policy trims when the burst is over, not in the middle of it.

    Use ``start()`` / ``stop()`` or ``with BackgroundTrimmer(...):``. Fork-safe: in a forked
    child the trimmer is marked not running (its thread does not exist there) and can be started
    again; in gunicorn, start one per worker in ``post_fork`` (see
    :mod:`memreclaim.integrations.gunicorn`). ``on_trim`` is called on the thread that trimmed.

    Raises:
        TypeError, ValueError: for a wrong type or out-of-range argument, naming it.
    """

    _kind = "BackgroundTrimmer"

    def __init__(
        self,
        *,
        interval: float = 1.0,
        policy: PacingPolicy | None = None,
        slack: int | str | None = None,
        min_interval: float | None = None,
        limit: int | str | None = None,
        thresholds: bool | None = None,
        pools: bool = False,
        on_trim: Callable[[TrimEvent], object] | None = None,
        name: str = "memreclaim-trimmer",
    ) -> None:
        super().__init__(
            interval=interval,
            policy=policy,
            slack=slack,
            min_interval=min_interval,
            limit=limit,
            thresholds=thresholds,
            pools=pools,
            on_trim=on_trim,
            name=name,
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
        """Take the floor now and start the trimmer thread.

        Raises:
            RuntimeError: when it is already running, or when the thread cannot start (then
                the trimmer stays stopped and ``stop()`` is a no-op).
        """
        with self._control:
            if self.running:
                raise RuntimeError(f"BackgroundTrimmer {self._name!r} is already running")
            self._reset_policy()
            self._stop_event = threading.Event()
            self._pid = os.getpid()
            alarm = self._open_alarm()
            thread = threading.Thread(
                target=self._run, args=(self._stop_event, alarm), name=self._name, daemon=True
            )
            try:
                thread.start()
            except BaseException:
                self._thread = None
                if alarm is not None:
                    alarm.close()
                raise
            self._alarm = alarm
            self._thread = thread

    def stop(self, timeout: float | None = 5.0) -> bool:
        """Stop the thread and wait up to ``timeout`` seconds for it (a trim in flight finishes).

        Returns True when the thread has ended (or never ran). Safe to call twice. Called from
        the trimmer's own thread (e.g. in on_trim), it only asks the thread to stop.
        """
        if timeout is not None:
            timeout = _validate.seconds("timeout", timeout, allow_zero=True)
        with self._control:
            thread = self._thread
            if thread is None or self._pid != os.getpid() or thread.ident is None:
                self._thread = None
                return True
            self._stop_event.set()
            if self._alarm is not None:
                self._alarm.poke()  # wakes the thread if it sleeps on the alarm
            if thread is threading.current_thread():
                return False
            thread.join(timeout)
            if thread.is_alive():
                return False
            self._thread = None
            return True

    def tick(self, *, settled: bool = False) -> TrimEvent | None:
        """Run one policy check now, in the calling thread; trim if due. Return the trim's event.

        Meant for hooks at the end of a unit of work (gunicorn ``post_request``, Celery
        ``task_postrun``): call :meth:`request_finished` first, so the policy knows whether
        other requests are still in flight. ``settled=True`` skips the "still rising" check
        altogether (the caller knows the allocating work is over). The policy needs a floor:
        the first call on a trimmer never started sets it and returns None.
        """
        _validate.flag("settled", settled)
        if self._policy.floor is None:
            self._reset_policy()
            return None
        event = self._tick(lag=0.0, settled=settled, gate="hook")
        self._nudge_arena()
        return event

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

    def _tick(self, lag: float, settled: bool = False, gate: Gate = "thread") -> TrimEvent | None:
        # One tick at a time (the thread and hooks calling tick() may race): a tick that waited
        # for another's trim then sees the minimum interval and does not trim again.
        with self._tick_lock:
            decision, growth = self._check(time.monotonic(), lag, settled)
            if decision != "trim":
                return None
            try:
                result = self._trim()
            except Exception:
                self._trim_failed()
                return None
            if result is None:
                return None
            return self._report(time.monotonic(), result, growth, gate, 0.0)

    def _run(self, stop_event: threading.Event, alarm: UsageAlarm | None) -> None:
        try:
            while True:
                wait = self._policy.tick_interval(self._interval, time.monotonic())
                scheduled = time.monotonic() + wait
                if alarm is None:
                    if stop_event.wait(wait):
                        return
                else:
                    woken = alarm.wait(wait)  # the limit's mark crossed, or stop() poked
                    if stop_event.is_set():
                        return
                    if woken:  # not late: the reading comes now, on purpose
                        scheduled = time.monotonic()
                try:
                    self._tick(lag=max(0.0, time.monotonic() - scheduled))
                except Exception:  # never let the thread die silently
                    logger.exception("BackgroundTrimmer %s: tick failed", self._name)
        finally:
            if alarm is not None:
                alarm.close()  # the thread owns it: stop() only pokes it

    def _forget_after_fork(self) -> None:
        # The thread was not copied into the child: mark this trimmer not running there.
        super()._forget_after_fork()
        self._thread = None
        self._stop_event = threading.Event()
        self._control = threading.Lock()
        self._tick_lock = threading.Lock()
        self._pid = os.getpid()
