"""The one lifecycle of a daemon thread (start, stop, stop before start, a thread that cannot
start, fork, interpreter exit): :class:`DaemonThread`, used by the runners' threads
(:class:`~memreclaim.runners.thread.BackgroundTrimmer`,
:class:`~memreclaim.runners.pressure.PressureWatcher`) and the remote handler
(:mod:`memreclaim.remote`). Private: its users are the package's own layers above.

The descriptors such threads keep open (an eventfd, an epoll, a pipe, a PSI trigger) can be
closed under them by the program (a daemon closing what it inherited) and the number reused for
one of its own files: :func:`fd_identity` records what a descriptor is when opened,
:func:`owns_fd` tells whether the number is still that, and :func:`close_owned` closes it only
then. Limit: eventfds (and epolls) share one anonymous inode, so another eventfd the program
opened at the same number is not told apart.
"""

from __future__ import annotations

import atexit
import os
import threading
import weakref
from collections.abc import Callable

from . import _core, _validate

TIMEOUT_MAX = min(threading.TIMEOUT_MAX, 1e9)  # ~31 years: longer waits are clamped to it

__all__ = ["DaemonThread", "FdIdentity", "abandon", "close_owned", "fd_identity", "owns_fd"]

FdIdentity = tuple[int, int, int]


def fd_identity(fd: int) -> FdIdentity | None:
    """What descriptor ``fd`` is: (st_dev, st_ino, file type), None when it is closed (or -1)."""
    if fd < 0:
        return None
    try:
        st = os.fstat(fd)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_mode & 0o170000


def owns_fd(fd: int, identity: FdIdentity | None) -> bool:
    """True when ``fd`` is still the file ``identity`` (from :func:`fd_identity`) recorded."""
    return identity is not None and fd >= 0 and fd_identity(fd) == identity


def close_owned(fd: int, identity: FdIdentity | None) -> bool:
    """Close ``fd`` if it is still ours (``identity``); never a number the program reused.
    True when it was closed."""
    if not owns_fd(fd, identity):
        return False
    try:
        os.close(fd)
    except OSError:
        return False
    return True


def abandon(obj: object) -> None:
    """Keep ``obj`` (an epoll object whose number the program took over) alive for good, so
    that its finalizer never closes the program's descriptor, not even when the interpreter
    clears the modules at exit (the C core takes one reference it never releases)."""
    _core._keep_forever(obj)


class DaemonThread:
    """The lifecycle of one daemon thread that can be started, stopped and started again.

    ``start(setup)`` calls ``setup(stop_event)`` under the control lock; it opens what the thread
    needs and returns ``(target, cleanup)``: the thread runs ``target()`` and must return soon
    after ``stop_event`` is set; ``cleanup`` (or None) undoes ``setup`` when the thread cannot
    start. ``stop()`` sets the event, calls ``wake`` (given at construction: it interrupts a
    thread sleeping on a file) and joins. Guarantees, for every user:

    - ``stop()`` before ``start()``, twice, or after a failed start returns True at once;
    - a thread that cannot start (interpreter shutdown, no more threads) raises RuntimeError from
      ``start()`` naming the owner, leaves nothing open, and stops nothing later;
    - ``stop()`` from the thread itself only asks it to stop (no self-join);
    - in a forked child the thread does not exist: not running, and startable again;
    - at interpreter exit a running thread is asked to stop and joined for up to 1 s
      (``stop_at_exit=False``: left to die with the process).

    Raises:
        TypeError: a ``kind`` or ``name`` that is not a string.
    """

    def __init__(
        self,
        kind: str,
        name: str,
        *,
        wake: Callable[[], None] | None = None,
        stop_at_exit: bool = True,
    ) -> None:
        self._kind = _validate.instance("kind", kind, str)
        self.name = _validate.instance("name", name, str)
        self._wake = _validate.callback("wake", wake, takes="no argument")
        self._stop_at_exit = _validate.flag("stop_at_exit", stop_at_exit)
        self._thread: threading.Thread | None = None
        self._stop_event = threading.Event()
        self._pid = os.getpid()
        self._control = threading.Lock()  # serialises start/stop
        _threads.add(self)

    @property
    def running(self) -> bool:
        """True while the thread is alive in this process."""
        thread = self._thread
        return thread is not None and thread.is_alive() and self._pid == os.getpid()

    @property
    def thread(self) -> threading.Thread | None:
        """The thread, or None when not running."""
        return self._thread if self.running else None

    def start(
        self,
        setup: Callable[[threading.Event], tuple[Callable[[], object], Callable[[], None] | None]],
    ) -> None:
        """Run ``setup`` and start the thread on the target it returns.

        Raises:
            RuntimeError: when already running, or when the thread cannot start (``cleanup``
                has run, the owner stays stopped).
            Exception: whatever ``setup`` raises (nothing started).
        """
        with self._control:
            if self.running:
                raise RuntimeError(f"{self._kind} {self.name!r} is already running")
            stop_event = threading.Event()
            target, cleanup = setup(stop_event)
            thread = threading.Thread(target=target, name=self.name, daemon=True)
            try:
                thread.start()
            except BaseException as exc:
                self._thread = None
                if cleanup is not None:
                    cleanup()
                if isinstance(exc, RuntimeError):  # at shutdown, or out of threads
                    raise RuntimeError(f"{self._kind} {self.name!r} cannot start: {exc}") from exc
                raise
            self._stop_event = stop_event
            self._pid = os.getpid()
            self._thread = thread

    def stop(
        self,
        timeout: float | None = 5.0,
        *,
        stopped: Callable[[], None] | None = None,
    ) -> bool:
        """Ask the thread to stop, wake it, wait up to ``timeout`` seconds for it.

        True when the thread has ended (or never ran); then ``stopped`` (if given) runs, under
        the control lock. Called from the thread itself it only asks, and returns False.

        Raises:
            TypeError, ValueError: a ``timeout`` that is not a number of seconds >= 0 or None.
        """
        if timeout is not None:  # beyond threading.TIMEOUT_MAX: wait that long (no overflow)
            timeout = min(_validate.seconds("timeout", timeout, allow_zero=True), TIMEOUT_MAX)
        with self._control:
            thread = self._thread
            if thread is None or self._pid != os.getpid() or thread.ident is None:
                self._thread = None
                return True
            self._stop_event.set()
            if self._wake is not None:
                self._wake()
            if thread is threading.current_thread():
                return False
            thread.join(timeout)
            if thread.is_alive():
                return False
            self._thread = None
            if stopped is not None:
                stopped()
            return True

    def _forget_after_fork(self) -> None:
        # The thread was not copied into the child: not running there, startable again.
        self._thread = None
        self._stop_event = threading.Event()
        self._control = threading.Lock()
        self._pid = os.getpid()


_threads: weakref.WeakSet[DaemonThread] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for thread in list(_threads):
        thread._forget_after_fork()


def _at_exit() -> None:
    for thread in list(_threads):
        if thread._stop_at_exit and thread.running:
            thread.stop(timeout=1.0)


os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(_at_exit)
