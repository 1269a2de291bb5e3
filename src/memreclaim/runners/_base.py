"""What every runner shares: the signals it reads, one trim under the process lock, its
counters and events, and fork handling. (The runners' threads live in
:class:`memreclaim._daemon.DaemonThread`, the one daemon-thread lifecycle of the package.)

A runner is thin: it reads the signals (RSS from ``/proc/self/statm``, tracemalloc's traced bytes
when tracing, the allocator's figures when the policy asks, the requests in flight that
integrations report), asks its :class:`~memreclaim.policy.PacingPolicy` whether to trim, trims
with :func:`memreclaim.trim` (which counts every trim once in the process-wide totals), and
reports the outcome back to the policy, its counters, the log and the ``on_trim`` callback.

- All runners of a process share one trim lock: a runner whose turn comes while another is
  trimming skips (that trim is already giving the memory back) instead of trimming twice.
- The floor is taken at ``start()`` / ``__aenter__`` (a spike made right after start, before
  the first tick, is measured as growth and given back).
- Memory other threads keep (``thresholds=``). glibc's ``malloc_trim`` never shrinks the top
  of a thread arena, and its adaptive thresholds let such a top keep up to twice the largest
  block freed so far (25 MiB in a pandas pool worker). Under glibc a runner bounds every
  arena's top at start (:func:`memreclaim.glibc.bound_thread_tops`: the mmap threshold pinned
  at 32 MiB, the trim threshold at 4 MiB), once per process, and logs it once: a free in any
  thread then gives back what its arena's top keeps above 4 MiB. Measured
  (``benchmarks/bench_knob_cost.py``): no cost on loops of blocks under 4 MiB, where the
  128 KiB trim threshold of before cost up to 16x; loops of 4-32 MiB blocks give their pages
  back at each free. It is skipped, and said once, when the environment sets glibc's thresholds
  (``MALLOC_TRIM_THRESHOLD_``, ``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TOP_PAD_`` or
  ``GLIBC_TUNABLES``). Under mimalloc 2 (a live thread's freed pages wait for that thread) the
  purge delay goes to 0 (``set_purge_delay(0)``) when a trim leaves more than ``slack`` with
  three or more threads. ``thresholds=None`` (the default) has one meaning under every
  allocator: each fix as early as its measured cost allows (glibc's bound costs nothing
  measurable: at start; mimalloc 2's purge delay costs 14-18x on allocation loops: once threads
  are seen retaining; none elsewhere). ``True``: the fix at start, whatever it costs;
  ``False``: never. (The heuristics and their once-per-process state live in
  :mod:`memreclaim.glibc`; the runner says when.)
"""

from __future__ import annotations

import logging
import os
import threading
import time
import tracemalloc
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, fields
from types import TracebackType
from typing import Any, Literal, NamedTuple, Self

import memreclaim

from .. import _core, _libraries, _validate, glibc
from .._core import HeapStats, TrimResult, UnsupportedAllocatorError, heap_stats, rss, sample
from ..memlimits import auto_limit
from ..policy import Decision, PacingPolicy, Reading, TrimOutcome
from ..units import format_bytes
from .wakeups import WAKE_KINDS, UsageAlarm, UsageAlarmSource, Wake, Wakeups, open_source

__all__ = ["Counters", "Gate", "StartStop", "TrimEvent"]

logger = logging.getLogger("memreclaim")

Gate = Literal["idle", "deadline", "ungated", "thread", "hook"]


# The longest interval a runner accepts: a thread waiting longer than this on an Event fails
# with OverflowError (threading.TIMEOUT_MAX), and nobody means a trimmer that never ticks.
MAX_INTERVAL = 3600.0

# One lock for every runner of the process: two trims at once would walk the same arenas twice.
_TRIM_LOCK = threading.Lock()


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


_thp_always: bool | None = None


def _thp_is_always() -> bool:
    """Whether transparent huge pages are ``enabled=always`` (read once per process, by the C
    core): then khugepaged may fault back in the free pages a trim released, with no allocation."""
    global _thp_always
    if _thp_always is None:
        try:
            _thp_always = _core.thp_settings().enabled == "always"
        except OSError:
            _thp_always = False
    return _thp_always


def _regrowth_vsize(vsize: int, heap: HeapStats | None) -> int | None:
    """The address space the policy compares regrowth with (``vsize``, from the tick's
    :func:`~memreclaim._core.sample`), where regrowth can happen and the allocator's figures were
    read with it; else None."""
    return vsize if heap is not None and _thp_is_always() else None


def _after_trim(result: TrimResult, heap: HeapStats | None) -> tuple[int, int | None]:
    """RSS after a trim (the trim's own figure, else read now) and the address space the policy
    compares regrowth with (read only where regrowth can happen, as in :func:`_regrowth_vsize`)."""
    vsize_wanted = heap is not None and _thp_is_always()
    if result.rss_after is not None and not vsize_wanted:
        return result.rss_after, None
    reading = sample()
    rss_after = reading.rss if result.rss_after is None else result.rss_after
    return rss_after, reading.vsize if vsize_wanted else None


class _Figures(NamedTuple):
    """The allocator's figures as the policy takes them, with what library pools report."""

    free: int | None
    in_use: int | None
    """Bytes live data holds: the allocator's in-use figure plus what library pools (pyarrow's)
    report in use; None when the allocator does not say."""
    mapped: int | None
    """Bytes the allocator maps plus what library pools report in use, or None."""


_NO_FIGURES = _Figures(None, None, None)


def _figures(heap: HeapStats | None) -> _Figures:
    """``heap``'s figures with the library pools' in-use bytes (asked once: the same figure in
    ``in_use`` and ``mapped``)."""
    if heap is None:
        return _NO_FIGURES
    pools = _libraries.in_use() if heap.in_use is not None or heap.mapped is not None else 0
    return _Figures(
        heap.free,
        None if heap.in_use is None else heap.in_use + pools,
        None if heap.mapped is None else heap.mapped + pools,
    )


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


DEFAULT_WAKE_ON = ("usage-alarm", "systemd")
"""The runners' default wake-up sources: the cgroup v1 usage alarm at a soft limit's mark, and
systemd's memory-pressure protocol when the unit sets ``$MEMORY_PRESSURE_WATCH``."""


def _wake_kinds(wake_on: Iterable[str]) -> tuple[str, ...]:
    if isinstance(wake_on, str) or not isinstance(wake_on, Iterable):
        raise TypeError(
            f"wake_on must be an iterable of source kinds, not {type(wake_on).__name__}"
        )
    kinds = tuple(wake_on)
    for kind in kinds:
        if kind not in WAKE_KINDS:
            raise ValueError(f"wake_on: unknown source {kind!r} (one of {', '.join(WAKE_KINDS)})")
    return tuple(dict.fromkeys(kinds))


def _make_policy(
    policy: PacingPolicy | None,
    slack: int | str | None,
    min_interval: float | None,
    limit: int | str | None,
) -> PacingPolicy:
    """The runner's policy: ``policy`` itself, or one built from the shortcuts.

    ``limit="auto"`` (the runners' default) is resolved here, not in the policy: the cgroup's
    soft limit (:func:`memreclaim.memlimits.auto_limit`), or None; ``limit=None`` is no limit.
    """
    shortcuts: dict[str, object] = {
        key: value
        for key, value in (("slack", slack), ("min_interval", min_interval))
        if value is not None
    }
    if not (isinstance(limit, str) and limit == "auto"):
        shortcuts["limit"] = limit
    if policy is not None:
        _validate.instance("policy", policy, PacingPolicy)
        if shortcuts:
            raise TypeError(
                f"pass either policy= or {', '.join(sorted(shortcuts))}=, not both"
                " (set them on the PacingPolicy)"
            )
        return policy
    if "limit" not in shortcuts:
        shortcuts["limit"] = auto_limit()
    return PacingPolicy(**shortcuts)  # type: ignore[arg-type]


@dataclass(frozen=True)
class _Settings:
    """The settings every runner takes, declared once: ``Watchdog`` and ``BackgroundTrimmer``
    keep them in their explicit signatures (docs/api.md is checked against those) with these
    defaults (tests/test_runners_base.py checks they agree) and hand them over as one record;
    :class:`_Runner` validates them. ``name`` has no default: each runner has its own."""

    name: str
    interval: float = 1.0
    policy: PacingPolicy | None = None
    slack: int | str | None = None
    min_interval: float | None = None
    limit: int | str | None = "auto"
    thresholds: bool | None = None
    pools: bool = False
    on_trim: Callable[[TrimEvent], object] | None = None
    wake_on: Iterable[str] = DEFAULT_WAKE_ON

    @classmethod
    def of(cls, arguments: Mapping[str, Any]) -> _Settings:
        """The settings among a constructor's ``arguments`` (its ``locals()``), by field name."""
        return cls(**{field.name: arguments[field.name] for field in fields(cls)})


class _Runner:
    """Signals, trimming and reporting shared by Watchdog and BackgroundTrimmer."""

    _kind = "runner"

    def __init__(self, settings: _Settings) -> None:
        self._interval = _validate.seconds(
            "interval", settings.interval, minimum=_validate.MIN_INTERVAL, maximum=MAX_INTERVAL
        )
        self._policy = _make_policy(
            settings.policy, settings.slack, settings.min_interval, settings.limit
        )
        if settings.thresholds is not None:
            _validate.flag("thresholds", settings.thresholds)
        self._thresholds = settings.thresholds
        self._pools = _validate.flag("pools", settings.pools)
        self._on_trim = _validate.callback("on_trim", settings.on_trim, takes="a TrimEvent")
        self._name = _validate.instance("name", settings.name, str)
        self._lock = threading.Lock()
        self._counters = Counters()
        self._in_flight = 0
        self._requests_seen = False
        self._in_use_decided: int | None = None
        self._wake_on = _wake_kinds(settings.wake_on)
        self._wakeups: Wakeups | None = None

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
        # The tick's reading: one statm read, then the allocator's figures if the policy asks.
        reading = sample()
        current = reading.rss
        traced = _traced()
        with self._lock:
            wants_heap = self._policy.wants_free(now, current)
        heap = _heap() if wants_heap else None
        vsize = _regrowth_vsize(reading.vsize, heap)
        figures = _figures(heap)
        with self._lock:
            self._in_use_decided = figures.in_use
            in_flight = self._in_flight if self._requests_seen else None
            decision = self._policy.decide(
                Reading(
                    now,
                    current,
                    traced=traced,
                    free=figures.free,
                    in_flight=in_flight,
                    settled=settled,
                    in_use=figures.in_use,
                    vsize=vsize,
                    mapped=figures.mapped,
                )
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
        """One trim under the process-wide lock; None when another runner is trimming. The
        in-use bytes as it starts are the deciding tick's, or read now if it had none (frees
        while it runs are told from them: :attr:`TrimOutcome.in_use_before`)."""
        if self._in_use_decided is None:
            self._in_use_decided = _figures(_heap()).in_use
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
        heap = _heap()
        rss_after, vsize = _after_trim(result, heap)
        figures = _figures(heap)
        # A part it could not measure or act on: the trim may have missed memory there.
        unreached = result.reason is not None or None in result.parts.values()
        with self._lock:
            reason = self._policy.reason
            retest = self._policy.retesting
            productive = self._policy.record_trim(
                TrimOutcome(
                    now,
                    growth=growth,
                    released=released,
                    rss_after=rss_after,
                    seconds=result.seconds,
                    traced=_traced(),
                    free=figures.free,
                    in_use=figures.in_use,
                    mapped=figures.mapped,
                    vsize=vsize,
                    unreached=unreached,
                    in_use_before=self._in_use_decided,
                )
            )
            provisional = self._policy.provisional
            retest_due = self._policy.retest_due
            floor = self._policy.floor
            self._add(
                trims=1,
                retest_trims=1 if retest else 0,
                unproductive_trims=0 if productive else 1,
                bytes_released=released,
                trim_seconds=result.seconds,
                deadline_trims=1 if gate == "deadline" else 0,
                floor=floor,
                level=self._policy.level,
            )
            slack = self._policy.slack
            left = rss_after - (floor or rss_after)
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
        self._call_on_trim(event)
        return event

    def _call_on_trim(self, event: TrimEvent) -> None:
        """The user's ``on_trim``; what it raises is counted and logged, never propagated."""
        if self._on_trim is None:
            return
        try:
            self._on_trim(event)
        except Exception:
            self._count(callback_errors=1)
            logger.exception("%s %s: on_trim callback raised", self._kind, self._name)

    def _check_arenas(self, slack: int) -> None:
        """A trim left more than ``slack`` with three or more threads: under mimalloc 2, set the
        purge delay to 0. (glibc's arena tops are bounded at start, in :meth:`_reset_policy`,
        unless ``thresholds=False``: a top kept by an idle worker before a trigger fired would
        stay, as no free in that arena comes.)"""
        if glibc._thread_fix_made() or not glibc._mimalloc_2():
            return
        glibc._fix_thread_retention(
            f"{threading.active_count()} threads, a trim left more than"
            f" {format_bytes(slack)} over the floor"
        )

    def _nudge_arena(self) -> None:
        """In a hook (the worker thread): give back what this thread holds.

        ``malloc_trim`` cannot shrink a thread arena's top; a free of a chunk of 64 KiB or
        more in that arena does, once the trim threshold is fixed. Done only while the
        thresholds are fixed and the level is more than ``slack`` over the floor, so it stops
        once the tops are back. Under mimalloc 2 it is this thread's collect
        (``_core.collect_thread(abandon=True)``): only the thread that freed can give back.
        """
        if not glibc._thread_fix_made():
            return
        with self._lock:
            floor, level = self._policy.floor, self._policy.level
            slack = self._policy.slack
        if floor is not None and level is not None and level - floor > slack:
            glibc._give_back_thread_share()

    def _woken(self, wakes: list[Wake]) -> None:
        logger.debug(
            "%s %s: woken by %s",
            self._kind,
            self._name,
            "; ".join(f"{w.kind} {w.path}: {w.detail}" for w in wakes),
        )

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
        :class:`~memreclaim.runners.wakeups.UsageAlarm` at the limit's mark: it wakes when the
        cgroup's usage crosses it, within about a MiB of allocation, not at its next tick. Where
        none can be registered (cgroup v2, no limit, no permission) it only ticks, faster near the
        limit (:meth:`PacingPolicy.tick_interval`); the reason is logged at DEBUG level.
        """
        wakeups = self._wakeups
        if wakeups is None or not self.running:
            return None
        for source in wakeups.sources:
            if isinstance(source, UsageAlarmSource) and source.alarm.fileno() >= 0:
                return source.alarm
        return None

    @property
    def wake_sources(self) -> tuple[tuple[str, str], ...]:
        """(kind, path) of each wake-up source the running runner sleeps on besides its timer
        (see ``wake_on`` and :mod:`memreclaim.runners.wakeups`); empty when stopped."""
        wakeups = self._wakeups
        if wakeups is None or not self.running:
            return ()
        return tuple((source.kind, source.path) for source in wakeups.sources)

    def _open_wakeups(self) -> Wakeups | None:
        """The sources of ``wake_on`` that can be opened here, in one :class:`Wakeups`; why a
        source is missing is logged (DEBUG; WARNING for a systemd unit's request)."""
        sources = []
        for kind in self._wake_on:
            source, why = open_source(kind, mark=self._policy.limit_mark)
            if source is not None:
                sources.append(source)
            elif why.startswith("cannot watch"):  # the unit asked for it: say why not
                logger.warning("%s %s: %s", self._kind, self._name, why)
            else:
                logger.debug("%s %s: no %s wake-up: %s", self._kind, self._name, kind, why)
        if not sources:
            return None
        try:
            return Wakeups(sources)
        except OSError as exc:  # out of descriptors: the timer alone
            logger.warning("%s %s: no wake-ups: %s", self._kind, self._name, exc)
            return None

    def _forget_after_fork(self) -> None:
        """Called in a forked child: drop what belongs to the parent's threads."""
        self._lock = threading.Lock()
        self._in_flight = 0
        if self._wakeups is not None:
            self._wakeups._forget_after_fork()
            self._wakeups = None

    def _apply_knobs(self) -> None:
        """The allocator knobs ``thresholds`` asks for at start (:func:`glibc._fix_at_start`
        says which, per allocator): set once per process, by the first runner that starts."""
        if self._thresholds is not False:
            glibc._fix_at_start(self._thresholds)

    def _reset_policy(self, *, knobs: bool = True) -> None:
        """Take the floor now (and, with ``knobs``, first set the allocator knobs)."""
        if knobs:
            self._apply_knobs()
        current = rss()
        heap = _heap()
        with self._lock:
            in_use = _figures(heap).in_use
            self._policy.reset(time.monotonic(), current, _traced(), in_use=in_use)
            self._add(floor=current, level=current, last_rss=current)


# ---- fork and shutdown safety ---------------------------------------------------------------

_instances: weakref.WeakSet[_Runner] = weakref.WeakSet()


class StartStop:
    """``with owner:`` for an owner with ``start()`` and ``stop()`` (the thread runners)."""

    def start(self) -> None:
        """Start (each owner says how)."""
        raise NotImplementedError

    def stop(self, timeout: float | None = 5.0) -> bool:
        """Stop (each owner says how)."""
        raise NotImplementedError

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _after_fork_in_child() -> None:
    global _TRIM_LOCK
    _TRIM_LOCK = threading.Lock()
    for instance in list(_instances):
        instance._forget_after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)
