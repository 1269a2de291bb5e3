"""One wake-up multiplexer: the kernel's (and the service manager's) memory notifications that a
runner or the pressure watcher sleeps on besides its timer. This is the package's one module that
uses epoll, eventfd or poll/select (tests/test_wakeups.py keeps it so).

Sources, each a file descriptor the kernel makes ready:

- :class:`UsageAlarmSource`: the cgroup v1 usage threshold (:class:`UsageAlarm`, an eventfd,
  readable once the usage crossed the limit's mark).
- :class:`PsiTrigger`: a PSI trigger (``some 150000 1000000``: 150 ms of stall within 1 s)
  written to the cgroup's ``memory.pressure`` or ``/proc/pressure/memory``; ``POLLPRI`` when it
  fires.
- :class:`EventsFile`: cgroup v2 ``memory.events``; ``POLLPRI`` when the file changes, a wake-up
  when ``high``, ``max``, ``oom`` or ``oom_kill`` grew.
- :class:`SystemdPressure`: systemd's memory-pressure protocol, when the unit sets
  ``$MEMORY_PRESSURE_WATCH`` (a PSI file, a FIFO or an ``AF_UNIX`` socket; ``/dev/null``: off)
  and maybe ``$MEMORY_PRESSURE_WRITE`` (base64 of what to write to it once opened, e.g. a PSI
  trigger). A PSI file signals with ``POLLPRI``; a FIFO or socket is readable: what arrives is
  read and dropped.

:class:`Wakeups` holds a set of them in one ``epoll`` descriptor: a thread sleeps in
:meth:`Wakeups.wait`, an event loop watches :meth:`Wakeups.fileno` with ``add_reader`` (an epoll
descriptor is readable when one of its sources is ready). :meth:`Wakeups.poke` wakes a sleeper
(a runner being stopped). :class:`PsiPoll` is the one source without a descriptor: a PSI file
read on a timer where no trigger can be written (the pressure watcher's fallback).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import errno
import logging
import os
import select
import socket
import stat
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from .. import _validate
from .._daemon import abandon, close_owned, fd_identity, owns_fd
from ..memlimits import find_sources, limits, parse_counters

__all__ = [
    "EVENT_COUNTERS",
    "WAKE_KINDS",
    "EventsFile",
    "PressureSource",
    "PsiPoll",
    "PsiTrigger",
    "SystemdPressure",
    "UsageAlarm",
    "UsageAlarmSource",
    "Wake",
    "WakeSource",
    "Wakeups",
    "open_source",
    "usage_alarm",
]

log = logging.getLogger("memreclaim.wakeups")

EVENT_COUNTERS = ("high", "max", "oom", "oom_kill")
"""The ``memory.events`` counters whose growth is a wake-up."""


@dataclass(frozen=True)
class Wake:
    """One wake-up: ``kind`` of the source (``"usage-alarm"``, ``"psi"``, ``"memory.events"``,
    ``"systemd"``), its ``path``, and ``detail``, what was seen."""

    kind: str
    path: str
    detail: str


def _eventfd_poke(fd: int) -> None:
    """Add 1 to the eventfd ``fd`` (readable now); no-op for -1 (closed) or a full counter."""
    if fd >= 0:
        try:
            os.eventfd_write(fd, 1)
        except OSError as exc:  # the counter is full: a wake-up is pending anyway
            if exc.errno != errno.EAGAIN:
                raise


def _event_counts(text: str | None) -> dict[str, int]:
    """The :data:`EVENT_COUNTERS` of a ``memory.events`` text (the others are dropped)."""
    return {k: v for k, v in parse_counters(text).items() if k in EVENT_COUNTERS}


class UsageAlarm:
    """A kernel notification when a cgroup v1 memory cgroup's usage crosses ``threshold`` bytes.

    ``memory.usage_in_bytes`` is registered with an eventfd through ``cgroup.event_control``. The
    kernel checks thresholds as it charges pages (every few hundred KiB), so the eventfd becomes
    readable within about a MiB of the crossing (upwards or downwards), however fast memory
    grows: a runner sleeping on it (:meth:`wait`, or a :class:`Wakeups` through
    :class:`UsageAlarmSource`) wakes at the limit's mark instead of at its next tick. The
    registration ends when the eventfd is closed (:meth:`close`).

    cgroup v2 has no usage threshold: there, the runners' readings speed up near the limit
    instead (:meth:`memreclaim.policy.PacingPolicy.tick_interval`).

    Raises:
        OSError: the cgroup has no ``memory.usage_in_bytes`` or ``cgroup.event_control``, or the
            kernel refused the registration (e.g. ``EACCES`` for a cgroup this user cannot
            write): nothing stays open.
        ValueError: for a threshold that is not > 0.
    """

    def __init__(self, cgroup_dir: str, threshold: int) -> None:
        self.threshold = _validate.size("threshold", threshold)
        self.cgroup_dir = os.fspath(cgroup_dir)
        self._lock = threading.Lock()
        self._efd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
        try:
            usage = os.open(
                os.path.join(self.cgroup_dir, "memory.usage_in_bytes"),
                os.O_RDONLY | os.O_CLOEXEC,
            )
            try:
                control = os.open(
                    os.path.join(self.cgroup_dir, "cgroup.event_control"),
                    os.O_WRONLY | os.O_CLOEXEC,
                )
                try:
                    os.write(control, f"{self._efd} {usage} {self.threshold}".encode())
                finally:
                    os.close(control)
            finally:
                os.close(usage)  # the kernel keeps what it needs of it
        except BaseException:
            os.close(self._efd)
            raise
        # A program that closes inherited descriptors may reuse the number: never poke into or
        # close its file (see memreclaim._daemon.owns_fd).
        self._ident = fd_identity(self._efd)

    def fileno(self) -> int:
        """The eventfd (readable once the threshold was crossed), or -1 once closed."""
        return self._efd

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for a crossing (or :meth:`poke`); True if one came.

        Consumes the notification. Returns False at once when the alarm is closed.
        """
        fd = self._efd
        if not owns_fd(fd, self._ident):
            return False
        try:
            ready, _, _ = select.select([fd], [], [], max(0.0, timeout))
        except (OSError, ValueError):  # closed meanwhile by another thread
            return False
        return bool(ready) and self._drain()

    def _drain(self) -> bool:
        with self._lock:
            if not owns_fd(self._efd, self._ident):
                return False
            try:
                os.eventfd_read(self._efd)
            except BlockingIOError:
                return False
            return True

    def poke(self) -> None:
        """Make :meth:`wait` return now (a stopping runner wakes its thread); no-op once closed."""
        with self._lock:
            if owns_fd(self._efd, self._ident):
                _eventfd_poke(self._efd)

    def close(self) -> None:
        """Unregister (close the eventfd, unless the program reused its number); idempotent."""
        with self._lock:
            fd, self._efd = self._efd, -1
        close_owned(fd, self._ident)

    def _forget_after_fork(self) -> None:
        """In a forked child: close this copy of the eventfd without the (maybe held) lock."""
        fd, self._efd = self._efd, -1
        self._lock = threading.Lock()
        close_owned(fd, self._ident)

    def __repr__(self) -> str:
        state = "closed" if self._efd < 0 else f"fd {self._efd}"
        return f"UsageAlarm({self.cgroup_dir!r}, threshold={self.threshold}, {state})"


def usage_alarm(threshold: int) -> tuple[UsageAlarm | None, str]:
    """A :class:`UsageAlarm` on this process's limiting cgroup v1, or None and why not."""
    lim = limits()
    if lim.source != "cgroup1" or lim.path is None:
        return None, f"no cgroup v1 memory limit (limit source: {lim.source})"
    try:
        return UsageAlarm(lim.path, threshold), ""
    except OSError as exc:
        return None, f"cannot register a usage threshold in {lim.path}: {exc}"


class WakeSource:
    """A file descriptor that the kernel makes ready: :meth:`consume` says what it was.

    ``events`` is ``select.POLLPRI`` or ``select.POLLIN``; ``lost`` turns True when the source
    can no longer fire (its cgroup was removed, the peer closed the socket).
    """

    kind = "source"
    events = select.POLLPRI

    def __init__(self, path: str, fd: int) -> None:
        self.path = path
        self._fd = fd
        self._ident = fd_identity(fd)  # the program may close and reuse the number
        self.lost = False

    def owned(self) -> bool:
        """True while the descriptor is still this source's file (not closed, not reused by the
        program for one of its own)."""
        return owns_fd(self._fd, self._ident)

    def fileno(self) -> int:
        """The descriptor to poll, or -1 once closed."""
        return self._fd

    def consume(self, mask: int) -> str | None:
        """Read what made the descriptor ready (``mask``: the poll events); return what was
        seen, or None when it was no wake-up (nothing grew, a spurious readiness)."""
        if mask & select.POLLERR and not mask & self.events:
            self.lost = True
            return None
        return "ready" if mask & self.events else None

    def close(self) -> None:
        """Close the descriptor (only if it is still ours); idempotent."""
        fd, self._fd = self._fd, -1
        close_owned(fd, self._ident)

    def _forget_after_fork(self) -> None:
        """In a forked child: close this copy (no lock is taken)."""
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.path!r}, fd {self._fd})"


class UsageAlarmSource(WakeSource):
    """The cgroup v1 usage alarm (:class:`UsageAlarm`) as a source."""

    kind = "usage-alarm"
    events = select.POLLIN

    def __init__(self, alarm: UsageAlarm) -> None:
        super().__init__(alarm.cgroup_dir, alarm.fileno())
        self.alarm = alarm

    def consume(self, mask: int) -> str | None:
        if not self.alarm.wait(0):
            return None
        return f"usage crossed {self.alarm.threshold} bytes"

    def close(self) -> None:
        self._fd = -1
        self.alarm.close()

    def _forget_after_fork(self) -> None:
        self._fd = -1
        self.alarm._forget_after_fork()


class PsiTrigger(WakeSource):
    """A PSI trigger on ``path``: wakes when tasks stalled on memory for ``stall`` seconds within
    ``window`` (``kind="some"``: at least one task; ``"full"``: all).

    Without ``CAP_SYS_RESOURCE`` the kernel (5.19+) accepts only windows that are a multiple of
    2 s: the window is then widened to the next multiple of 2 s (the stall scaled alike) and
    :attr:`note` says so. ``trigger`` is the text written.

    Raises:
        OSError: the file cannot be opened or refuses the trigger (no PSI, read-only): nothing
            stays open.
    """

    kind = "psi"

    def __init__(self, path: str, *, kind: str = "some", stall: float = 0.15, window: float = 1.0):
        if kind not in ("some", "full"):
            raise ValueError(f"kind must be 'some' or 'full', got {kind!r}")
        stall_us = round(stall * 1e6)
        window_us = round(window * 1e6)
        fd = os.open(path, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
        self.note: str | None = None
        try:
            self.trigger = f"{kind} {stall_us} {window_us}"
            try:
                os.write(fd, self.trigger.encode() + b"\0")
            except OSError as exc:
                two_s = 2_000_000
                if exc.errno != errno.EINVAL or window_us % two_s == 0:
                    raise
                wide = -(-window_us // two_s) * two_s
                self.trigger = f"{kind} {stall_us * wide // window_us} {wide}"
                os.write(fd, self.trigger.encode() + b"\0")
                self.note = (
                    f"{path}: the kernel refused a {window_us // 1000} ms window (unprivileged"
                    f" triggers need a multiple of 2 s): using '{self.trigger}'"
                )
        except BaseException:
            os.close(fd)
            raise
        super().__init__(path, fd)

    def consume(self, mask: int) -> str | None:
        if mask & select.POLLERR and not mask & select.POLLPRI:
            self.lost = True  # the trigger went away (its cgroup was removed)
            return None
        return f"trigger '{self.trigger}'" if mask & select.POLLPRI else None


class EventsFile(WakeSource):
    """cgroup v2 ``memory.events``: a wake-up when one of :data:`EVENT_COUNTERS` grew since the
    last read (:meth:`check`; the kernel signals a change of the file with ``POLLPRI``).

    Raises:
        OSError: the file cannot be opened.
    """

    kind = "memory.events"

    def __init__(self, path: str) -> None:
        super().__init__(path, os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC))
        self.counters = _event_counts(self._pread())

    def _pread(self) -> str | None:
        try:
            return os.pread(self._fd, 65536, 0).decode("ascii", "replace")
        except OSError:
            return None

    def check(self) -> str | None:
        """Read the file; which counters grew by how much since the last read, or None."""
        # A counter missing from a read (a failed or empty one: a file being rewritten) keeps
        # its last value; taken as 0 it would count everything since boot again next time.
        counters = {**self.counters, **_event_counts(self._pread())}
        grew = {
            key: counters[key] - self.counters.get(key, 0)
            for key in EVENT_COUNTERS
            if counters.get(key, 0) > self.counters.get(key, 0)
        }
        self.counters = counters
        return ", ".join(f"{key} +{n}" for key, n in grew.items()) if grew else None

    def consume(self, mask: int) -> str | None:
        return self.check()


def _psi_total(text: str | None, kind: str) -> int | None:
    """The ``total=`` stall in microseconds of the ``some`` or ``full`` line."""
    for line in (text or "").splitlines():
        if line.startswith(kind + " "):
            for part in line.split():
                if part.startswith("total="):
                    with contextlib.suppress(ValueError):
                        return int(part[6:])
    return None


class PsiPoll:
    """A PSI file read on a timer where no trigger can be written (no ``CAP_SYS_RESOURCE`` on an
    old kernel, a read-only file, ``triggers=False``): :meth:`check` says when tasks stalled on
    memory for at least ``stall`` seconds per ``window`` since the last read. No descriptor is
    kept (the file is opened by path for each read), so it is not a :class:`WakeSource`.

    Raises:
        OSError: the file cannot be read or has no ``total=`` stall for ``kind``
            (``errno.ENODATA``).
    """

    kind = "psi"

    def __init__(self, path: str, *, kind: str = "some", stall: float = 0.15, window: float = 1.0):
        if kind not in ("some", "full"):
            raise ValueError(f"kind must be 'some' or 'full', got {kind!r}")
        self.path = path
        self._kind = kind
        self._share = stall / window
        with open(path, encoding="ascii", errors="replace") as f:
            total = _psi_total(f.read(), kind)
        if total is None:
            raise OSError(errno.ENODATA, f"no '{kind} ... total=' line", path)
        self._total, self._at = total, time.monotonic()

    def check(self) -> str | None:
        """Read the file: the stall since the last read when its share reached ``stall /
        window``, else None (also when the file cannot be read)."""
        now = time.monotonic()
        try:
            with open(self.path, encoding="ascii", errors="replace") as f:
                total = _psi_total(f.read(), self._kind)
        except OSError:
            return None
        if total is None:
            return None
        stalled = (total - self._total) / 1e6
        elapsed = max(now - self._at, 1e-9)
        self._total, self._at = total, now
        if stalled / elapsed < self._share:
            return None
        return f"{self._kind} stall {stalled * 1000:.0f} ms in {elapsed:.1f} s"


class SystemdPressure(WakeSource):
    """systemd's memory-pressure protocol: watch ``path`` (``$MEMORY_PRESSURE_WATCH``) after
    writing ``write`` (the decoded ``$MEMORY_PRESSURE_WRITE``) to it once.

    A regular (PSI) file is opened read-write when there is something to write, else read-only,
    and signals with ``POLLPRI``; a FIFO is opened read-write (so that a writer closing it does
    not leave it hung up) and a socket (``open`` fails with ``ENXIO``) is connected; both are
    readable when the manager reports pressure, and what arrives is read and dropped.

    Raises:
        OSError: the path cannot be opened, connected or written: nothing stays open.
    """

    kind = "systemd"

    def __init__(self, path: str, write: bytes = b"") -> None:
        self._socket: socket.socket | None = None
        flags = os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
        try:
            mode = os.stat(path).st_mode
        except OSError:
            mode = 0
        if stat.S_ISFIFO(mode):
            flags |= os.O_RDWR
        else:
            flags |= os.O_RDWR if write else os.O_RDONLY
        try:
            fd = os.open(path, flags)
        except OSError as exc:
            if exc.errno != errno.ENXIO:  # ENXIO: an AF_UNIX socket
                raise
            fd = self._connect(path)
        try:
            if stat.S_ISFIFO(mode) or self._socket is not None:
                self.events = select.POLLIN
            if write:
                os.write(fd, write)
        except BaseException:
            self._close_fd(fd)
            raise
        super().__init__(path, fd)

    def _connect(self, path: str) -> int:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            sock.connect(path)
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        self._socket = sock
        return sock.fileno()

    def _close_fd(self, fd: int) -> None:
        ident = getattr(self, "_ident", None) or fd_identity(fd)
        if self._socket is not None:
            sock, self._socket = self._socket, None
            if owns_fd(fd, ident):
                sock.close()
            else:  # the program took the number over: let go of it, never close it
                sock.detach()
        else:
            close_owned(fd, ident)

    @classmethod
    def from_environment(
        cls, environ: Mapping[str, str] | None = None
    ) -> tuple[SystemdPressure | None, str]:
        """The source the unit's environment asks for, or None and why not.

        Raises:
            OSError: ``$MEMORY_PRESSURE_WATCH`` names a path that cannot be watched.
            ValueError: ``$MEMORY_PRESSURE_WRITE`` is not base64.
        """
        env = os.environ if environ is None else environ
        path = env.get("MEMORY_PRESSURE_WATCH")
        if not path:
            return None, "$MEMORY_PRESSURE_WATCH is not set"
        if path == "/dev/null":
            return None, "$MEMORY_PRESSURE_WATCH is /dev/null: memory pressure handling is off"
        encoded = env.get("MEMORY_PRESSURE_WRITE", "")
        try:
            write = base64.b64decode(encoded, validate=True) if encoded else b""
        except binascii.Error as exc:
            raise ValueError(f"$MEMORY_PRESSURE_WRITE is not base64: {exc}") from None
        return cls(path, write), ""

    def consume(self, mask: int) -> str | None:
        if self.events == select.POLLPRI:
            if mask & select.POLLERR and not mask & select.POLLPRI:
                self.lost = True
                return None
            return "pressure (PSI)" if mask & select.POLLPRI else None
        got = self._drain()
        if got is None or (mask & (select.POLLHUP | select.POLLERR) and not got):
            self.lost = True  # the peer closed the socket
            return None
        return f"pressure ({got} bytes)" if got else None

    def _drain(self) -> int | None:
        """Read and drop what arrived: the byte count, or None at end of file."""
        total = 0
        for _ in range(64):  # bounded: a peer that writes without end cannot hold the thread
            try:
                chunk = os.read(self._fd, 4096)
            except BlockingIOError:
                return total
            except OSError:
                return None
            if not chunk:
                return None if total == 0 else total
            total += len(chunk)
        return total

    def close(self) -> None:
        fd, self._fd = self._fd, -1
        if fd >= 0:
            self._close_fd(fd)


_EPOLL = {select.POLLIN: select.EPOLLIN, select.POLLPRI: select.EPOLLPRI}


def _poll_mask(epoll_mask: int) -> int:
    """epoll's event bits as poll's (the same values on Linux, named for clarity)."""
    mask = 0
    for poll_bit, epoll_bit in (
        (select.POLLIN, select.EPOLLIN),
        (select.POLLPRI, select.EPOLLPRI),
        (select.POLLERR, select.EPOLLERR),
        (select.POLLHUP, select.EPOLLHUP),
    ):
        if epoll_mask & epoll_bit:
            mask |= poll_bit
    return mask


_TAKEN = "its epoll or eventfd descriptor was closed or reused by the program"


class Wakeups:
    """A set of :class:`WakeSource` in one epoll descriptor, plus a poke to wake the sleeper.

    Owns its sources (:meth:`close` closes them). A source the epoll cannot watch (a regular
    file: ``EPERM``) is left out, and :attr:`notes` says so: it is closed, or with
    ``keep_unwatched=True`` kept open (and closed with the rest) for an owner that reads it on its
    timer. ``after_loss`` is what the owner does once the wake-ups stopped (said in the one
    warning).

    Raises:
        OSError: the epoll or eventfd cannot be made (out of descriptors): nothing stays open.
    """

    def __init__(
        self,
        sources: Iterable[WakeSource],
        *,
        after_loss: str = "the runner goes on with its timer",
        keep_unwatched: bool = False,
    ) -> None:
        self._after_loss = _validate.instance("after_loss", after_loss, str)
        self._keep_unwatched = _validate.flag("keep_unwatched", keep_unwatched)
        self._unwatched: list[WakeSource] = []
        self._lock = threading.Lock()
        self.notes: list[str] = []
        self._sources: dict[int, WakeSource] = {}
        given = list(sources)
        try:
            self._epoll = select.epoll(flags=select.EPOLL_CLOEXEC)
        except BaseException:
            for source in given:
                source.close()
            raise
        try:
            self._poke = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
        except BaseException:
            self._epoll.close()
            for source in given:
                source.close()
            raise
        self._epoll.register(self._poke, select.EPOLLIN)
        # What our epoll and eventfd are: a program that closes inherited descriptors and
        # reuses the numbers must never get our pokes in its files nor its files closed.
        self._idents = (fd_identity(self._epoll.fileno()), fd_identity(self._poke))
        self._broken: str | None = None
        self._closed = False
        self._asleep = threading.Event()  # the timer alone, once the descriptors are lost
        for source in given:
            self._add(source)

    def _add(self, source: WakeSource) -> None:
        try:
            self._epoll.register(source.fileno(), _EPOLL[source.events])
        except OSError as exc:
            if self._keep_unwatched:
                self.notes.append(
                    f"{source.path}: cannot be watched ({exc.strerror}); read on the timer"
                )
                self._unwatched.append(source)
            else:
                self.notes.append(f"{source.path}: cannot be watched ({exc.strerror}); left out")
                source.close()
            return
        self._sources[source.fileno()] = source

    @property
    def sources(self) -> tuple[WakeSource, ...]:
        """The sources watched now (a lost one is dropped)."""
        return tuple(self._sources.values())

    def fileno(self) -> int:
        """The epoll descriptor: readable when a source is ready or :meth:`poke` was called;
        -1 once the wake-ups stopped (closed, or the program took the descriptor over: an event
        loop's ``add_reader(-1)`` refuses it and the caller sleeps its timer)."""
        if self._closed or self._epoll.closed:
            return -1
        if self._broken is None and not self._owned():
            self._break(_TAKEN)
        return -1 if self._broken is not None else self._epoll.fileno()

    def wait(self, timeout: float | None) -> list[Wake]:
        """Sleep up to ``timeout`` seconds (None: no limit) for a source or a poke; return the
        wake-ups seen (empty after a timeout or a poke). Returns at once once closed.

        When the epoll fails or its descriptors were closed or reused by the program, the
        wake-ups end with one warning (:attr:`notes` says why) and this sleeps the timeout
        (a poke still wakes it): never a busy loop."""
        if self._closed or self._epoll.closed:
            return []
        if self._broken is None and not self._owned():
            self._break(_TAKEN)
        if self._broken is not None:
            self._asleep.wait(timeout)
            self._asleep.clear()
            return []
        try:
            ready = self._epoll.poll(-1 if timeout is None else max(0.0, timeout))
        except (OSError, ValueError) as exc:
            if not self._epoll.closed:  # else: closed meanwhile by another thread
                # The program may close our numbers between the check above and the poll: then
                # the poll's EBADF is that, and is said so.
                self._break(f"epoll failed ({exc})" if self._owned() else _TAKEN)
            return []
        wakes: list[Wake] = []
        for fd, mask in ready:
            if fd == self._poke:
                with contextlib.suppress(OSError):
                    os.eventfd_read(self._poke)
                continue
            source = self._sources.get(fd)
            if source is None:
                continue
            if not source.owned():
                source.lost = True
                self._drop(source)
                continue
            detail = source.consume(_poll_mask(mask))
            if detail is not None:
                wakes.append(Wake(source.kind, source.path, detail))
            if source.lost:
                self._drop(source)
        return wakes

    def _owned(self) -> bool:
        return owns_fd(self._epoll.fileno(), self._idents[0]) and owns_fd(
            self._poke, self._idents[1]
        )

    def _break(self, why: str) -> None:
        """Stop the wake-ups for good, saying why once; keep every number we no longer own."""
        self._broken = why
        self.notes.append(f"wake-ups stopped: {why}; {self._after_loss}")
        log.warning("memreclaim: wake-ups stopped: %s; %s", why, self._after_loss)

    def _drop(self, source: WakeSource) -> None:
        self.notes.append(f"{source.path}: {source.kind} source lost; no longer watched")
        with contextlib.suppress(OSError, ValueError):
            self._epoll.unregister(source.fileno())
        self._sources.pop(source.fileno(), None)
        source.close()

    def poke(self) -> None:
        """Make :meth:`wait` return now; no-op once closed."""
        with self._lock:
            self._asleep.set()
            if owns_fd(self._poke, self._idents[1]):
                _eventfd_poke(self._poke)

    def close(self) -> None:
        """Close the epoll, the poke and every source; idempotent."""
        with self._lock:
            self._close_all(fork=False)

    def _forget_after_fork(self) -> None:
        """In a forked child: close this copy without the (maybe held) locks."""
        self._lock = threading.Lock()
        self._close_all(fork=True)

    def _close_all(self, *, fork: bool) -> None:
        self._closed = True
        self._asleep.set()
        poke, self._poke = self._poke, -1
        sources, self._sources = [*self._sources.values(), *self._unwatched], {}
        self._unwatched = []
        close_owned(poke, self._idents[1])
        if self._epoll.closed or owns_fd(self._epoll.fileno(), self._idents[0]):
            self._epoll.close()
        else:  # the program took the number over: its file stays open
            abandon(self._epoll)
        for source in sources:
            if fork:
                source._forget_after_fork()
            else:
                source.close()


@dataclass(frozen=True)
class PressureSource:
    """One file a :class:`~memreclaim.runners.pressure.PressureWatcher` watches (its
    ``sources``): ``mode`` is ``"trigger"`` (the kernel wakes the watcher) or ``"poll"`` (read
    every ``poll_interval``); ``why`` says why it polls, when it does."""

    kind: str
    path: str
    mode: str
    why: str | None = None


WAKE_KINDS = ("usage-alarm", "psi", "memory.events", "systemd")
"""The sources a runner can sleep on (its ``wake_on``)."""


def open_source(kind: str, *, mark: int | None = None) -> tuple[WakeSource | None, str]:
    """Open the source ``kind`` (one of :data:`WAKE_KINDS`) for this process, or None and why.

    ``"usage-alarm"`` needs the limit's ``mark`` (bytes) and a cgroup v1 memory limit; ``"psi"``
    and ``"memory.events"`` the files :func:`memreclaim.memlimits.find_sources` finds (the PSI
    trigger at its defaults); ``"systemd"`` a unit that set ``$MEMORY_PRESSURE_WATCH``.

    Raises:
        ValueError: an unknown ``kind``.
    """
    if kind == "usage-alarm":
        if mark is None:
            return None, "no soft limit"
        alarm, why = usage_alarm(mark)
        return (None, why) if alarm is None else (UsageAlarmSource(alarm), "")
    if kind == "systemd":
        try:
            return SystemdPressure.from_environment()
        except (OSError, ValueError) as exc:
            return None, f"cannot watch $MEMORY_PRESSURE_WATCH: {exc}"
    if kind not in WAKE_KINDS:
        raise ValueError(f"wake-up kind must be one of {', '.join(WAKE_KINDS)}, got {kind!r}")
    psi, events = find_sources()
    path = psi if kind == "psi" else events
    if path is None:
        return None, f"no {'PSI file' if kind == 'psi' else 'cgroup v2 memory.events'}"
    try:
        return (PsiTrigger(path) if kind == "psi" else EventsFile(path)), ""
    except OSError as exc:
        return None, f"{path}: {exc.strerror or exc}"
