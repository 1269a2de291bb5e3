"""The thread runner: :class:`BackgroundTrimmer`, a daemon thread that ticks every ``interval``
seconds, and :meth:`BackgroundTrimmer.tick` for hooks at the end of a request or task.

Every trim is logged on the ``memreclaim`` logger (INFO: bytes, milliseconds, reason) and passed
to an optional callback; :attr:`~memreclaim.runners._base._Runner.counters` returns the runner's
cumulative :class:`~memreclaim.runners._base.Counters` (per runner; :func:`memreclaim.totals`
has the process-wide totals).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable

from .. import _validate
from .._daemon import DaemonThread
from ..policy import PacingPolicy
from ._base import (
    DEFAULT_WAKE_ON,
    Gate,
    StartStop,
    TrimEvent,
    _instances,
    _Runner,
    _Settings,
    logger,
)
from .wakeups import Wakeups

__all__ = ["BackgroundTrimmer"]


class BackgroundTrimmer(_Runner, StartStop):
    """Trim in the background of a synchronous program, from a daemon thread, and from hooks.

    Same :class:`PacingPolicy` as :class:`Watchdog`, minus loop gating: every ``interval``
    seconds the thread reads RSS, and trims when the policy says so (the trim releases the GIL,
    so the other threads keep running; a thread that mallocs > ~1 KiB meanwhile may wait for the
    arena lock). Hooks at the end of a request or task call :meth:`tick` (in the worker thread)
    and report requests with :meth:`request_started` / :meth:`request_finished`, so that the
    policy trims when the burst is over, not in the middle of it.

    Configure it as a :class:`Watchdog`: ``policy=``, or the shortcuts ``slack=``,
    ``min_interval=`` and ``limit=`` (a soft limit in bytes or a size string; ``"auto"``, the
    default: the cgroup's, from :func:`memreclaim.memlimits.auto_limit`, or none where there is
    none; None: no limit), and ``wake_on``, the sources its thread also sleeps on (as the
    Watchdog's: the cgroup v1 usage alarm and systemd's memory-pressure protocol by default),
    and ``thresholds``, how the runner makes other threads give back what they keep (as the
    Watchdog's; :mod:`memreclaim.runners`).

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
        limit: int | str | None = "auto",
        thresholds: bool | None = None,
        pools: bool = False,
        on_trim: Callable[[TrimEvent], object] | None = None,
        name: str = "memreclaim-trimmer",
        wake_on: Iterable[str] = DEFAULT_WAKE_ON,
    ) -> None:
        super().__init__(_Settings.of(locals()))  # the shared settings, declared once
        self._worker = DaemonThread(self._kind, name, wake=self._poke)
        self._tick_lock = threading.Lock()  # serialises ticks
        _instances.add(self)

    @property
    def running(self) -> bool:
        """True while the trimmer thread is alive in this process."""
        return self._worker.running

    @property
    def thread(self) -> threading.Thread | None:
        """The trimmer thread, or None when not running."""
        return self._worker.thread

    @property
    def _thread(self) -> threading.Thread | None:
        # The last thread started, alive or not (tests join it; DaemonThread owns it).
        return self._worker._thread

    def start(self) -> None:
        """Take the floor now and start the trimmer thread.

        Raises:
            RuntimeError: when it is already running, or when the thread cannot start (then
                the trimmer stays stopped and ``stop()`` is a no-op).
        """

        def setup(stop_event: threading.Event) -> tuple[Callable[[], None], Callable[[], None]]:
            wakeups = self._wakeups = self._open_wakeups()
            # The floor now; the allocator's knobs (glibc's thresholds) only once the thread
            # runs: a start that fails changes no allocator setting.
            try:
                self._reset_policy(knobs=False)
            except BaseException:
                self._wakeups = None
                if wakeups is not None:
                    wakeups.close()
                raise

            def cleanup() -> None:
                self._wakeups = None
                if wakeups is not None:
                    wakeups.close()

            return (lambda: self._run(stop_event, wakeups)), cleanup

        self._worker.start(setup)
        self._apply_knobs()

    def stop(self, timeout: float | None = 5.0) -> bool:
        """Stop the thread and wait up to ``timeout`` seconds for it (a trim in flight finishes).

        Returns True when the thread has ended (or never ran). Safe to call twice. Called from
        the trimmer's own thread (e.g. in on_trim), it only asks the thread to stop.

        Raises:
            TypeError, ValueError: a ``timeout`` that is not a number of seconds >= 0 or None.
        """
        return self._worker.stop(timeout)

    def _poke(self) -> None:
        wakeups = self._wakeups
        if wakeups is not None:
            wakeups.poke()  # wakes the thread if it sleeps on its wake-up sources

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

    def _run(self, stop_event: threading.Event, wakeups: Wakeups | None) -> None:
        try:
            while True:
                wait = self._policy.tick_interval(self._interval, time.monotonic())
                scheduled = time.monotonic() + wait
                if wakeups is None:
                    if stop_event.wait(wait):
                        return
                else:
                    woken = wakeups.wait(wait)  # a source fired (the limit's mark...), or a poke
                    if stop_event.is_set():
                        return
                    if woken:  # not late: the reading comes now, on purpose
                        scheduled = time.monotonic()
                        self._woken(woken)
                try:
                    self._tick(lag=max(0.0, time.monotonic() - scheduled))
                except Exception:  # never let the thread die silently
                    logger.exception("BackgroundTrimmer %s: tick failed", self._name)
        finally:
            if wakeups is not None:
                wakeups.close()  # the thread owns them: stop() only pokes

    def _forget_after_fork(self) -> None:
        # The thread was not copied into the child (its DaemonThread forgets it there).
        super()._forget_after_fork()
        self._tick_lock = threading.Lock()
