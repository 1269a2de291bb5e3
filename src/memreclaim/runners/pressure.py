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
  stall within 1 s) and waits in ``poll()`` for ``POLLPRI``. Without ``CAP_SYS_RESOURCE`` the
  kernel (5.19+) accepts only windows that are a multiple of 2 s: the watcher then widens the
  window to the next multiple of 2 s (scaling the stall alike) and says so in :attr:`notes`. Where
  no trigger can be written at all (no PSI, ``psi=0``, a read-only file), it reads the file's
  ``total=`` stall every ``poll_interval`` seconds instead and fires on the same stall share.
- **memory.events** (cgroup v2): fires when ``high`` (or ``max``, ``oom``) increments. The kernel
  signals a change of the file with ``POLLPRI``; the file is also read every ``poll_interval``.

The watcher runs in its own daemon thread (never on an event loop; its lifecycle is
:class:`memreclaim._daemon.DaemonThread`'s). The callback gets a
:class:`PressureEvent`; two calls are at least ``min_interval`` seconds apart (events meanwhile
are counted in :attr:`PressureWatcher.suppressed`). A callback that raises is logged and counted;
the watcher keeps running.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import select
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from .. import _deprecated, _validate
from .._daemon import DaemonThread, FdIdentity, close_owned, fd_identity, owns_fd
from ..memlimits import _read
from . import wakeups
from ._base import StartStop
from .wakeups import EventsFile, PsiTrigger, WakeSource

__all__ = ["PressureEvent", "PressureWatcher"]

log = logging.getLogger("memreclaim.pressure")


@dataclass(frozen=True)
class PressureEvent:
    """One report of memory pressure: ``source`` is ``"psi"`` or ``"memory.events"``, ``path``
    the file, ``detail`` what was seen (the trigger, or which counters grew by how much)."""

    source: str
    path: str
    detail: str
    monotonic: float


def _psi_total(text: str | None, kind: str) -> int | None:
    """The ``total=`` stall in microseconds of the ``some`` or ``full`` line."""
    for line in (text or "").splitlines():
        if line.startswith(kind + " "):
            for part in line.split():
                if part.startswith("total="):
                    with contextlib.suppress(ValueError):
                        return int(part[6:])
    return None


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


class PressureWatcher(StartStop):
    """Call ``callback`` (default: :func:`memreclaim.trim`) when the kernel reports memory
    pressure. See the module docstring for the sources.

    ``stall``/``window`` (seconds) make the PSI trigger: fire when tasks stalled on memory for
    ``stall`` seconds within ``window`` (``kind="some"``: at least one task; ``"full"``: all).
    ``psi``/``events`` are the files to watch (default ``"auto"``:
    :func:`memreclaim.runners.wakeups.find_sources`; None: do not watch that kind).
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
        auto_psi, auto_events = wakeups.find_sources() if "auto" in (psi, events) else (None, None)
        self._psi_path = auto_psi if psi == "auto" else (None if psi is None else os.fspath(psi))
        self._events_path = (
            auto_events if events == "auto" else (None if events is None else os.fspath(events))
        )
        self._triggers = _validate.flag("triggers", triggers)
        self._name = _validate.instance("name", name, str)
        self._worker = DaemonThread("PressureWatcher", self._name, wake=self._wake)
        self._wake_w = -1
        self._wake_ident: FdIdentity | None = None
        self._sources: tuple[wakeups.PressureSource, ...] = ()
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
    def sources(self) -> tuple[wakeups.PressureSource, ...]:
        """What the running (or last) watcher watches, and how."""
        return self._sources

    @property
    def notes(self) -> tuple[str, ...]:
        """Why a source was adapted or fell back to polling, or is missing."""
        return tuple(self._notes)

    def start(self) -> None:
        """Open the files, write the PSI trigger and start the thread.

        Raises:
            RuntimeError: when already running, or when the thread cannot start.
            OSError: when there is nothing to watch at all (no PSI file, no memory.events):
                ``errno.ENOENT``.
        """

        def setup(stop_event: threading.Event) -> tuple[Callable[[], None], Callable[[], None]]:
            self._close_wake()  # of a thread that ended without stop()
            self._notes = []
            opened = self._open()
            if not opened:
                self._notes.append("nothing to watch: no PSI file and no memory.events")
                raise OSError(
                    errno.ENOENT,
                    "no memory pressure source: neither PSI (/proc/pressure/memory, the"
                    " cgroup's memory.pressure) nor a cgroup v2 memory.events is available",
                )
            wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
            self._wake_ident = fd_identity(self._wake_w)
            r_ident = fd_identity(wake_r)

            def cleanup() -> None:
                self._close_fds(opened)
                close_owned(wake_r, r_ident)
                self._close_wake()

            return (lambda: self._run(opened, wake_r, r_ident)), cleanup

        self._worker.start(setup)

    def stop(self, timeout: float | None = 5.0) -> bool:
        """Stop the thread and wait up to ``timeout`` seconds (a callback in flight finishes).

        True when the thread has ended (or never ran). Safe to call twice or before start().

        Raises:
            TypeError, ValueError: a ``timeout`` that is not a number of seconds >= 0 or None.
        """
        return self._worker.stop(timeout, stopped=self._close_wake)

    def _wake(self) -> None:
        if owns_fd(self._wake_w, self._wake_ident):  # never a byte into the program's file
            with contextlib.suppress(OSError):
                os.write(self._wake_w, b"x")

    def _close_wake(self) -> None:
        close_owned(self._wake_w, self._wake_ident)
        self._wake_w = -1

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

    def _open(self) -> list[_Source]:
        opened: list[_Source] = []
        sources: list[wakeups.PressureSource] = []
        if self._psi_path is not None:
            path = self._psi_path
            try:
                trigger = self._open_trigger(path)
                opened.append(_Source("psi", path, "trigger", trigger))
                sources.append(wakeups.PressureSource("psi", path, "trigger"))
            except OSError as exc:
                total = _psi_total(_read(path), self._kind)
                if total is None:
                    self._notes.append(f"{path}: no PSI ({exc.strerror or exc}); not watched")
                else:
                    why = f"cannot write a trigger ({errno.errorcode.get(exc.errno or 0, exc)}:"
                    why += f" {exc.strerror}); reading it every {self._poll_interval:g} s"
                    self._notes.append(f"{path}: {why}")
                    src = _Source("psi", path, "poll", None)
                    src.total = total
                    src.at = time.monotonic()
                    opened.append(src)
                    sources.append(wakeups.PressureSource("psi", path, "poll", why))
        else:
            self._notes.append("no PSI file (kernel without CONFIG_PSI, or not asked for)")
        if self._events_path is not None:
            path = self._events_path
            try:
                events = EventsFile(path)
            except OSError as exc:
                self._notes.append(f"{path}: cannot open ({exc.strerror}); not watched")
            else:
                opened.append(_Source("memory.events", path, "poll", events))
                sources.append(wakeups.PressureSource("memory.events", path, "trigger"))
        self._sources = tuple(sources)
        return opened

    @staticmethod
    def _close_fds(opened: list[_Source]) -> None:
        for src in opened:
            if src.wake is not None:
                src.wake.close()

    # ---------------------------------------------------------------------------------------
    # the thread

    def _lost(self, opened: list[_Source], wake_r: int, r_ident: FdIdentity | None) -> bool:
        """True (and one warning) when the program closed or reused one of our descriptors."""
        if owns_fd(wake_r, r_ident) and all(s.wake is None or s.wake.owned() for s in opened):
            return False
        why = "a descriptor of the watcher was closed or reused by the program"
        self._notes.append(f"{why}: the watcher stopped")
        log.warning("memreclaim pressure watcher: %s: it stops (start it again)", why)
        return True

    def _run(self, opened: list[_Source], wake_r: int, r_ident: FdIdentity | None) -> None:
        poller = select.poll()
        poller.register(wake_r, select.POLLIN)
        by_fd = {}
        for src in opened:
            if src.fd >= 0:
                poller.register(src.fd, select.POLLPRI)
                by_fd[src.fd] = src
        polled = [s for s in opened if s.mode == "poll"]
        timeout_ms = round(self._poll_interval * 1000) if polled else None
        try:
            while True:
                try:
                    ready = poller.poll(timeout_ms)
                except InterruptedError:  # pragma: no cover - PEP 475 retries
                    continue
                if self._lost(opened, wake_r, r_ident):
                    return
                if any(fd == wake_r for fd, _ in ready):
                    return
                for fd, mask in ready:
                    found = by_fd.get(fd)
                    if found is None:
                        continue
                    src = found
                    if src.mode == "trigger" and src.wake is not None:
                        detail = src.wake.consume(mask)
                        if src.wake.lost:
                            # the trigger went away (its cgroup was removed): poll instead
                            poller.unregister(fd)
                            self._notes.append(f"{src.path}: trigger lost; polling the file")
                            src.mode = "poll"
                            polled.append(src)
                            timeout_ms = round(self._poll_interval * 1000)
                        elif detail is not None:
                            self._fire(src, detail)
                for src in polled:
                    self._check(src)
        finally:
            self._close_fds(opened)
            close_owned(wake_r, r_ident)  # stop() closes the write end, after the join

    def _check(self, src: _Source) -> None:
        """Read a polled file; fire if it shows pressure since the last read."""
        if isinstance(src.wake, EventsFile):
            grew = src.wake.check()
            if grew is not None:
                self._fire(src, grew)
            return
        now = time.monotonic()
        total = _psi_total(_read(src.path), self._kind)
        if total is None:
            return
        if src.total is None:
            src.total, src.at = total, now
            return
        stalled = (total - src.total) / 1e6
        elapsed = max(now - src.at, 1e-9)
        src.total, src.at = total, now
        if stalled / elapsed >= self._stall / self._window:
            self._fire(src, f"{self._kind} stall {stalled * 1000:.0f} ms in {elapsed:.1f} s")

    def _fire(self, src: _Source, detail: str) -> None:
        now = time.monotonic()
        if self._last_fire is not None and now - self._last_fire < self._min_interval:
            self.suppressed += 1
            return
        self._last_fire = now
        self.fired += 1
        try:
            self._callback(PressureEvent(src.kind, src.path, detail, now))
        except Exception:
            self.errors += 1
            log.exception("memreclaim pressure callback failed (the watcher keeps running)")


class _Source:
    """A file the thread watches (mutable, thread-private): a wake-up source, or a PSI file
    read every ``poll_interval`` (``wake`` None)."""

    def __init__(self, kind: str, path: str, mode: str, wake: WakeSource | None) -> None:
        self.kind = kind
        self.path = path
        self.wake = wake
        self.fd = -1 if wake is None else wake.fileno()
        self.mode = mode
        self.total: int | None = None
        self.at = 0.0


# Moved to memreclaim.runners.wakeups (one release, then gone).
_MOVED: dict[str, tuple[str, object]] = {
    "PressureSource": ("memreclaim.runners.wakeups.PressureSource", wakeups.PressureSource),
    "find_sources": ("memreclaim.runners.wakeups.find_sources", wakeups.find_sources),
}


def __getattr__(name: str) -> object:
    return _deprecated.lookup(__name__, name, _MOVED)
