"""The asyncio runner: :class:`Watchdog`, a task on the running loop that ticks every ``interval``
seconds and trims, in a thread of its own, when the policy says so and the loop is idle.

Every trim is logged on the ``memreclaim`` logger (INFO: bytes, milliseconds, reason) and passed
to an optional callback; :attr:`~memreclaim.runners._base._Runner.counters` returns the runner's
cumulative :class:`~memreclaim.runners._base.Counters`.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Iterable
from types import TracebackType

from .. import _validate
from .._core import TrimResult
from ..policy import PacingPolicy
from ._base import (
    DEFAULT_WAKE_ON,
    MAX_INTERVAL,
    Gate,
    TrimEvent,
    _instances,
    _Runner,
    _Settings,
    logger,
)
from .wakeups import Wake, Wakeups

__all__ = ["Watchdog"]


async def _sleep_or_wake(
    loop: asyncio.AbstractEventLoop, wakeups: Wakeups, seconds: float
) -> list[Wake]:
    """Sleep ``seconds`` or until a wake-up source fires (returned); a loop without
    ``add_reader`` just sleeps."""
    woken = loop.create_future()
    fd = wakeups.fileno()

    def wake() -> None:
        if not woken.done():
            woken.set_result(None)

    try:
        loop.add_reader(fd, wake)
    except (NotImplementedError, ValueError, OSError):
        await asyncio.sleep(seconds)
        return []
    try:
        await asyncio.wait({woken}, timeout=seconds)
    finally:
        loop.remove_reader(fd)
        woken.cancel()
    return wakeups.wait(0)


class Watchdog(_Runner):
    """Trim in the background of an asyncio program, paced by a :class:`PacingPolicy`.

    Every ``interval`` seconds it reads RSS (cheap) and asks the policy. When the policy says
    "trim" and ``idle_gating`` is on, it samples the loop every ``busy_lag / 2`` seconds; a
    sample is busy when it woke more than ``busy_lag`` late or the callbacks queued meanwhile
    took more than ``busy_lag / 5`` to run. It trims, in a dedicated thread, once the loop has
    been quiet for ``quiet`` seconds right after being busy (the start of a gap between bursts),
    or for ``long_quiet`` seconds (no traffic), or anyway at ``idle_deadline`` seconds. The
    trim cannot be paused: a request arriving during it that mallocs more than ~1 KiB waits for
    it (see docs/watchdog.md for the bound).

    Use it as ``async with Watchdog(...)``, with ``start()`` / ``await stop()``, or as a task:
    ``asyncio.create_task(watchdog.run())``. Configure the pacing with ``policy=`` (a
    :class:`PacingPolicy`, one per runner: it holds the runner's state), or with the shortcuts
    ``slack=``, ``min_interval=`` and ``limit=``, which build one (``limit``: a soft limit in
    bytes or a size string; ``"auto"``, the default: the cgroup's, from
    :func:`memreclaim.memlimits.auto_limit`, or none where there is none; None: no limit).
    ``wake_on`` names the sources it also sleeps on (:mod:`memreclaim.runners.wakeups`): by
    default the cgroup v1 usage alarm at a soft limit's mark and systemd's memory-pressure
    protocol where the unit sets ``$MEMORY_PRESSURE_WATCH``; add ``"psi"`` and
    ``"memory.events"`` to read RSS as soon as the kernel reports pressure; ``()``: the timer
    alone. A wake-up is a reading now; the policy decides. ``on_trim`` is called, on the loop
    thread, with a :class:`TrimEvent` after every trim; an exception in it is logged and counted.
    ``thresholds`` is how the runner makes other threads give back what they keep
    (:mod:`memreclaim.runners`): None, the default, one meaning under every allocator: each fix
    as early as its measured cost allows (under glibc, bound every arena's top at start,
    :func:`memreclaim.glibc.bound_thread_tops`, skipped and said once when the environment sets
    glibc's thresholds; under mimalloc 2, whose purge delay of 0 costs 14-18x on allocation
    loops, that delay once a trim leaves more than ``slack`` with three or more threads; nothing
    elsewhere); True: the fix at start, whatever it costs; False: never.

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
        limit: int | str | None = "auto",
        thresholds: bool | None = None,
        idle_gating: bool = True,
        busy_lag: float = 0.005,
        quiet: float = 0.05,
        long_quiet: float = 0.5,
        idle_deadline: float = 2.0,
        pools: bool = False,
        on_trim: Callable[[TrimEvent], object] | None = None,
        name: str = "memreclaim-watchdog",
        wake_on: Iterable[str] = DEFAULT_WAKE_ON,
    ) -> None:
        super().__init__(_Settings.of(locals()))  # the shared settings, declared once
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
        wakeups = self._wakeups = self._open_wakeups()
        try:
            while True:
                wait = self._policy.tick_interval(self._interval, time.monotonic())
                scheduled = loop.time() + wait
                if wakeups is None:
                    await asyncio.sleep(wait)
                else:
                    woken = await _sleep_or_wake(loop, wakeups, wait)
                    if woken:  # a source fired (the limit's mark...): not late
                        scheduled = loop.time()
                        self._woken(woken)
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
            if wakeups is not None:
                wakeups.close()
            if self._task is current:
                self._task = None

    async def _wait_for_idle(self, loop: asyncio.AbstractEventLoop) -> tuple[Gate, float]:
        """Sample the loop every ``busy_lag / 2`` seconds until it is idle or the deadline passes.

        Idle means: quiet for ``quiet`` seconds right after busy samples (the start of a gap
        between bursts, the best moment to start a trim), or quiet for ``long_quiet`` seconds
        (a loop with no traffic). A sample is busy when the wake-up was more than ``busy_lag``
        late, or when the callbacks queued meanwhile took more than ``busy_lag / 5`` to run (one
        yield to the loop measures them, on any event loop).
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
        woke = loop.time()
        lag = max(0.0, woke - scheduled)
        self._count(lag_last=lag, lag_max=lag)
        # One pass over the callbacks queued meanwhile: a yield returns after every callback that
        # was ready before it has run (on any loop: asyncio's, uvloop), so its duration is the
        # work in flight that the wake-up's lateness alone can miss (a task yielding between
        # chunks shorter than busy_lag).
        await asyncio.sleep(0)
        queued = loop.time() - woke
        return lag > self._busy_lag or queued > self._busy_lag / 5

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
