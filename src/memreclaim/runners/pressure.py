"""Act when the kernel reports memory pressure: PSI triggers and cgroup v2 ``memory.events``.

    >>> from memreclaim.pressure import PressureWatcher
    >>> watcher = PressureWatcher()  # memreclaim.trim() on pressure, at most every 10 s
    >>> watcher.start()
    >>> watcher.sources              # what it watches and how: "trigger" or "poll"
    >>> watcher.stop()

Sources (the PSI trigger and ``memory.events`` of :mod:`memreclaim.runners.wakeups`, which the
runners can sleep on too), found through ``/proc/self/cgroup`` unless given:

- **PSI** (pressure stall information): the cgroup's ``memory.pressure`` (cgroup v2), else
  ``/proc/pressure/memory``. The watcher writes a trigger (``some 150000 1000000``: 150 ms of
  stall within 1 s) and sleeps on it (:class:`~memreclaim.runners.wakeups.Wakeups`). Without
  ``CAP_SYS_RESOURCE`` the kernel (5.19+) accepts only windows that are a multiple of 2 s: the
  watcher then widens the window to the next multiple of 2 s (scaling the stall alike) and says
  so in :attr:`notes`. Where no trigger can be written at all (no PSI, ``psi=0``, a read-only
  file), it reads the file's ``total=`` stall every ``poll_interval`` seconds instead and fires
  on the same stall share (:class:`~memreclaim.runners.wakeups.PsiPoll`).
- **memory.events** (cgroup v2): fires when ``high`` (or ``max``, ``oom``) increments. The kernel
  signals a change of the file with ``POLLPRI``; the file is also read every ``poll_interval``.

The watcher is a thin face over :mod:`memreclaim.runners.wakeups` (the one wake-up multiplexer:
its sources, its epoll, its poke to stop): it opens the sources, sleeps on them and calls back. It
runs in its own daemon thread (never on an event loop; its lifecycle is
:class:`memreclaim._daemon.DaemonThread`'s). The callback gets a
:class:`PressureEvent`; two calls are at least ``min_interval`` seconds apart (events meanwhile
are counted in :attr:`PressureWatcher.suppressed`). A callback that raises is logged and counted;
the watcher keeps running.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from .. import _validate, memlimits
from .._daemon import DaemonThread
from ._base import StartStop
from .wakeups import EventsFile, PressureSource, PsiPoll, PsiTrigger, WakeSource, Wakeups

__all__ = ["PressureEvent", "PressureWatcher"]

log = logging.getLogger("memreclaim.pressure")

_STOPS = "the pressure watcher stops (start it again)"


@dataclass(frozen=True)
class PressureEvent:
    """One report of memory pressure: ``source`` is ``"psi"`` or ``"memory.events"``, ``path``
    the file, ``detail`` what was seen (the trigger, or which counters grew by how much)."""

    source: str
    path: str
    detail: str
    monotonic: float


def _default_callback(event: PressureEvent) -> None:
    from .. import trim  # the public trim: counted once in the process totals

    result = trim()
    log.info(
        "memory pressure (%s %s: %s): trimmed, released %s bytes",
        event.source,
        event.path,
        event.detail,
        result.released,
    )


class _Watch:
    """What one run of the thread watches: the wake-ups (PSI triggers, ``memory.events``) and the
    files read every ``poll_interval`` (``memory.events`` again, PSI files without a trigger)."""

    def __init__(self, wakes: Wakeups, opened: list[WakeSource], polled: list[PsiPoll]) -> None:
        self.wakes = wakes
        self.opened = opened
        self.polled = polled

    def close(self) -> None:
        self.wakes.close()  # closes every source it holds


class PressureWatcher(StartStop):
    """Call ``callback`` (default: :func:`memreclaim.trim`) when the kernel reports memory
    pressure. See the module docstring for the sources.

    ``stall``/``window`` (seconds) make the PSI trigger: fire when tasks stalled on memory for
    ``stall`` seconds within ``window`` (``kind="some"``: at least one task; ``"full"``: all).
    ``psi``/``events`` are the files to watch (default ``"auto"``:
    :func:`memreclaim.memlimits.find_sources`; None: do not watch that kind).
    ``poll_interval`` is how often polled files are read; ``triggers=False`` polls the PSI file
    instead of writing a trigger.
    """

    def __init__(
        self,
        callback: Callable[[PressureEvent], object] | None = None,
        *,
        stall: float = 0.15,
        window: float = 1.0,
        kind: str = "some",
        min_interval: float = 10.0,
        poll_interval: float = 2.0,
        psi: str | None = "auto",
        events: str | None = "auto",
        triggers: bool = True,
        name: str = "memreclaim-pressure",
    ) -> None:
        self._callback = _validate.callback("callback", callback) or _default_callback
        self._window = _validate.seconds("window", window, maximum=10.0)
        if self._window < 0.5:
            raise ValueError(f"window must be between 0.5 and 10 seconds, got {window!r}")
        self._stall = _validate.seconds("stall", stall, maximum=self._window)
        if kind not in ("some", "full"):
            raise ValueError(f"kind must be 'some' or 'full', got {kind!r}")
        self._kind = kind
        self._min_interval = _validate.seconds("min_interval", min_interval, allow_zero=True)
        self._poll_interval = _validate.seconds("poll_interval", poll_interval)
        for arg, value in (("psi", psi), ("events", events)):
            if value is not None and not isinstance(value, str | os.PathLike):
                raise TypeError(f"{arg} must be a path, 'auto' or None, not {type(value).__name__}")
        found = memlimits.find_sources() if "auto" in (psi, events) else (None, None)
        auto_psi, auto_events = found
        self._psi_path = auto_psi if psi == "auto" else (None if psi is None else os.fspath(psi))
        self._events_path = (
            auto_events if events == "auto" else (None if events is None else os.fspath(events))
        )
        self._triggers = _validate.flag("triggers", triggers)
        self._name = _validate.instance("name", name, str)
        self._watch: _Watch | None = None
        self._worker = DaemonThread("PressureWatcher", self._name, wake=self._wake)
        self._sources: tuple[PressureSource, ...] = ()
        self._notes: list[str] = []
        self.fired = 0
        """Callbacks made."""
        self.suppressed = 0
        """Pressure reports dropped by the rate limit."""
        self.errors = 0
        """Callbacks that raised."""
        self._last_fire: float | None = None

    # ---------------------------------------------------------------------------------------
    # lifecycle

    @property
    def running(self) -> bool:
        """True while the watcher thread is alive in this process."""
        return self._worker.running

    @property
    def sources(self) -> tuple[PressureSource, ...]:
        """What the running (or last) watcher watches, and how."""
        return self._sources

    @property
    def notes(self) -> tuple[str, ...]:
        """Why a source was adapted or fell back to polling, or is missing."""
        if self._watch is None:
            return tuple(self._notes)
        return (*self._notes, *self._watch.wakes.notes)

    def start(self) -> None:
        """Open the files, write the PSI trigger and start the thread.

        Raises:
            RuntimeError: when already running, or when the thread cannot start.
            OSError: when there is nothing to watch at all (no PSI file, no memory.events):
                ``errno.ENOENT``.
        """

        def setup(stop_event: threading.Event) -> tuple[Callable[[], None], Callable[[], None]]:
            self._notes = []
            self._watch = None
            opened, polled = self._open()
            if not opened and not polled:
                self._notes.append("nothing to watch: no PSI file and no memory.events")
                raise OSError(
                    errno.ENOENT,
                    "no memory pressure source: neither PSI (/proc/pressure/memory, the"
                    " cgroup's memory.pressure) nor a cgroup v2 memory.events is available",
                )
            wakes = Wakeups(opened, after_loss=_STOPS, keep_unwatched=True)
            watch = _Watch(wakes, list(opened), polled)
            self._watch = watch
            return (lambda: self._run(watch, stop_event)), watch.close

        self._worker.start(setup)

    def stop(self, timeout: float | None = 5.0) -> bool:
        """Stop the thread and wait up to ``timeout`` seconds (a callback in flight finishes).

        True when the thread has ended (or never ran). Safe to call twice or before start().

        Raises:
            TypeError, ValueError: a ``timeout`` that is not a number of seconds >= 0 or None.
        """
        return self._worker.stop(timeout)

    def _wake(self) -> None:
        watch = self._watch
        if watch is not None:
            watch.wakes.poke()  # identity-checked: never a byte into the program's file

    # ---------------------------------------------------------------------------------------
    # sources

    def _open_trigger(self, path: str) -> PsiTrigger:
        """Write the PSI trigger to ``path`` (a note when the window was widened).

        Raises:
            OSError: no trigger can be written (``ENOTSUP`` with ``triggers=False``).
        """
        if not self._triggers:
            raise OSError(errno.ENOTSUP, "triggers=False: polling")
        trigger = PsiTrigger(path, kind=self._kind, stall=self._stall, window=self._window)
        if trigger.note is not None:
            self._notes.append(trigger.note)
        return trigger

    def _poll_psi(self, path: str, why: str) -> PsiPoll | None:
        """A PSI file read every ``poll_interval`` (``why``: why there is no trigger), or None
        (said in :attr:`notes`) when the file has no stall figure."""
        try:
            poll = PsiPoll(path, kind=self._kind, stall=self._stall, window=self._window)
        except OSError as exc:
            self._notes.append(f"{path}: no PSI ({exc.strerror or exc}); not watched")
            return None
        self._notes.append(f"{path}: {why}")
        return poll

    def _open(self) -> tuple[list[WakeSource], list[PsiPoll]]:
        opened: list[WakeSource] = []
        polled: list[PsiPoll] = []
        sources: list[PressureSource] = []
        if self._psi_path is not None:
            path = self._psi_path
            try:
                opened.append(self._open_trigger(path))
                sources.append(PressureSource("psi", path, "trigger"))
            except OSError as exc:
                why = f"cannot write a trigger ({errno.errorcode.get(exc.errno or 0, exc)}:"
                why += f" {exc.strerror}); reading it every {self._poll_interval:g} s"
                poll = self._poll_psi(path, why)
                if poll is not None:
                    polled.append(poll)
                    sources.append(PressureSource("psi", path, "poll", why))
        else:
            self._notes.append("no PSI file (kernel without CONFIG_PSI, or not asked for)")
        if self._events_path is not None:
            path = self._events_path
            try:
                opened.append(EventsFile(path))  # a wake-up on change, and read on the timer
            except OSError as exc:
                self._notes.append(f"{path}: cannot open ({exc.strerror}); not watched")
            else:
                sources.append(PressureSource("memory.events", path, "trigger"))
        self._sources = tuple(sources)
        return opened, polled

    # ---------------------------------------------------------------------------------------
    # the thread

    def _lost(self, watch: _Watch) -> bool:
        """True when the watcher must stop: the wake-ups stopped (they said why, once), or the
        program closed or reused one of the sources' descriptors (said here, once)."""
        if watch.wakes.fileno() < 0:
            return True
        if all(source.fileno() < 0 or source.owned() for source in watch.opened):
            return False
        why = "a descriptor of the watcher was closed or reused by the program"
        self._notes.append(f"{why}: the watcher stopped")
        log.warning("memreclaim pressure watcher: %s: it stops (start it again)", why)
        return True

    def _retire_lost_triggers(self, watch: _Watch) -> None:
        """A trigger the wake-ups dropped (its cgroup was removed): read its file instead."""
        for source in list(watch.opened):
            if isinstance(source, PsiTrigger) and source.fileno() < 0:
                watch.opened.remove(source)
                poll = self._poll_psi(source.path, "trigger lost; polling the file")
                if poll is not None:
                    watch.polled.append(poll)

    def _run(self, watch: _Watch, stop_event: threading.Event) -> None:
        try:
            while not stop_event.is_set():
                polling = watch.polled or any(isinstance(s, EventsFile) for s in watch.opened)
                wakes = watch.wakes.wait(self._poll_interval if polling else None)
                if stop_event.is_set() or self._lost(watch):
                    return
                for wake in wakes:
                    self._fire(wake.kind, wake.path, wake.detail)
                self._retire_lost_triggers(watch)
                self._poll(watch.opened, watch.polled)
        finally:
            watch.close()

    def _poll(self, opened: list[WakeSource], polled: list[PsiPoll]) -> None:
        """Read the polled files; fire for each that shows pressure since its last read."""
        for source in opened:
            if isinstance(source, EventsFile) and source.fileno() >= 0:
                grew = source.check()
                if grew is not None:
                    self._fire(source.kind, source.path, grew)
        for poll in polled:
            detail = poll.check()
            if detail is not None:
                self._fire(poll.kind, poll.path, detail)

    def _fire(self, source: str, path: str, detail: str) -> None:
        now = time.monotonic()
        if self._last_fire is not None and now - self._last_fire < self._min_interval:
            self.suppressed += 1
            return
        self._last_fire = now
        self.fired += 1
        try:
            self._callback(PressureEvent(source, path, detail, now))
        except Exception:
            self.errors += 1
            log.exception("memreclaim pressure callback failed (the watcher keeps running)")
