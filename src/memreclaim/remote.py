"""Trim a running process from outside: ``python -m memreclaim trim --pid PID`` (and ``stats``).

Two ways in, tried in this order:

1. **``sys.remote_exec``** (CPython 3.14+, PEP 768), when the command runs on 3.14+ itself: it
   writes a small script that imports memreclaim in the target, trims (or reads the stats) and
   writes the result as JSON to a file the command waits for. The OS's rules apply: attaching
   needs ptrace permission over the target (same user and ``kernel.yama.ptrace_scope`` <= 1, or
   ``CAP_SYS_PTRACE``), and the target must run the same Python minor version with remote
   debugging allowed (not ``PYTHON_DISABLE_REMOTE_DEBUG``). The script runs when the target's
   main thread next runs Python code.
2. **An opt-in signal handler** the service installs, any Python version::

       import signal, memreclaim
       memreclaim.install_signal_handler(signal.SIGUSR2)

   The handler only writes a byte to a pipe; a helper thread does the work (never inside the
   signal handler). It publishes ``/tmp/memreclaim-<pid>/handler.json`` (directory mode 0700)
   so the command knows which signal to send; the command drops a request file there, sends the
   signal (``kill()`` permission: same user or root) and waits for the reply file. A bare
   ``kill -USR2 PID`` trims too, and the result is logged on the ``memreclaim.remote`` logger.

When neither is available the command says why and exits with status 1: never a silent no-op.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import json
import logging
import os
import secrets
import shutil
import signal
import stat
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from . import _validate

__all__ = ["RemoteError", "install_signal_handler", "request", "state_dir"]

log = logging.getLogger("memreclaim.remote")

COMMANDS = ("trim", "stats")
METHODS = ("auto", "remote_exec", "signal")


class RemoteError(RuntimeError):
    """The target cannot be reached or did not answer: the message says why and what to do."""


def state_dir(pid: int) -> Path:
    """The directory where process ``pid``'s signal handler publishes itself."""
    return Path(tempfile.gettempdir()) / f"memreclaim-{pid}"


def _start_time(pid: int) -> int | None:
    """The process's start time in clock ticks (field 22 of /proc/PID/stat): tells a pid reused
    by another process apart."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read().decode("ascii", "replace")
        return int(text[text.rindex(")") + 2 :].split()[19])
    except (OSError, ValueError, IndexError):
        return None


# ------------------------------------------------------------------------------------------------
# in the target: doing the work


def _figures() -> dict[str, Any]:
    """This process's memory figures as ``stats --json`` prints them and ``stats --pid``
    answers: ``pid``, ``python``, ``allocator_version``, then every field of
    :func:`memreclaim.stats` with ``heap=True`` (``heap`` None under an allocator without
    statistics), as :func:`memreclaim.asdict` names them."""
    import platform

    import memreclaim

    try:
        st = memreclaim.stats(heap=True)
    except memreclaim.UnsupportedAllocatorError:  # an allocator without statistics
        st = memreclaim.stats()
    return {
        "pid": os.getpid(),
        "python": platform.python_version(),
        "allocator_version": memreclaim.allocator_version(),
        **memreclaim.asdict(st),
    }


def _execute(command: str, pools: bool) -> dict[str, Any]:
    import memreclaim

    if command == "trim":
        return memreclaim.asdict(memreclaim.trim(pools=pools))
    return _figures()


def _write_json(path: Path, data: dict[str, Any]) -> None:
    """Write atomically: the reader never sees half a file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def _serve(command: str, pools: bool, reply: str, via: str) -> None:
    """Run ``command`` here and write the result (or the error) to ``reply``."""
    data: dict[str, Any] = {"pid": os.getpid(), "command": command, "via": via}
    try:
        if command not in COMMANDS:
            raise ValueError(f"unknown command {command!r}")
        data["result"] = _execute(command, bool(pools))
    except Exception as exc:
        data["error"] = f"{type(exc).__name__}: {exc}"
    _write_json(Path(reply), data)
    if command == "trim" and "result" in data:
        log.info("memreclaim: trim requested from outside (%s): %s", via, data["result"])


class _Handler:
    def __init__(self, signum: int, directory: Path) -> None:
        from ._daemon import DaemonThread  # the one daemon-thread lifecycle

        self.signum = signum
        self.directory = directory
        self.pid = os.getpid()
        self.read_fd, self.write_fd = os.pipe2(os.O_CLOEXEC)
        os.set_blocking(self.write_fd, False)
        self.thread = DaemonThread("signal handler", "memreclaim-signal", wake=self.wake)

    def wake(self) -> None:
        """Wake the helper thread (a full pipe means a wake-up is pending anyway)."""
        with contextlib.suppress(OSError):
            os.write(self.write_fd, b"\0")

    def on_signal(self, signum: int, frame: object) -> None:
        # Runs in the main thread between two bytecodes: only wake the helper, never trim here.
        if os.getpid() == self.pid:  # a forked child inherits the handler, not the thread
            self.wake()

    def start(self) -> None:
        """Start the helper thread (RuntimeError when it cannot start)."""
        self.thread.start(lambda stop: (lambda: self.run(stop), None))

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                if not os.read(self.read_fd, 512):
                    return
            except OSError:
                return
            if stop.is_set():  # woken to stop (interpreter exit)
                return
            try:
                self.handle_requests()
            except Exception:
                log.exception("memreclaim: the signal handler's request failed")

    def handle_requests(self) -> None:
        served = 0
        for path in sorted(self.directory.glob("request-*.json")):
            try:
                req = json.loads(path.read_text(encoding="utf-8"))
                path.unlink()
            except (OSError, ValueError):
                continue
            reply = str(req.get("reply", ""))
            if "/" in reply or not reply.startswith("reply-"):
                continue  # replies go into this directory only
            _serve(
                str(req.get("command")),
                bool(req.get("pools")),
                str(self.directory / reply),
                "signal",
            )
            served += 1
        if not served:  # a bare `kill -USR2 PID`: trim and log
            from . import trim

            result = trim()
            log.info(
                "memreclaim: trimmed on signal %d: released %s bytes", self.signum, result.released
            )


_lock = threading.Lock()
_handler: _Handler | None = None


def _prepare_dir(directory: Path) -> None:
    try:
        os.mkdir(directory, 0o700)
    except FileExistsError:
        st = os.lstat(directory)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
            raise PermissionError(
                errno.EPERM,
                f"{directory} exists and is not a directory of this user: refusing to use it",
            ) from None
        os.chmod(directory, 0o700)
        for entry in directory.iterdir():  # left by an earlier process with this pid
            with contextlib.suppress(OSError):
                entry.unlink()


def install_signal_handler(signum: int = signal.SIGUSR2) -> Path:
    """Let ``python -m memreclaim trim --pid`` (and ``stats --pid``) reach this process on any
    Python version: on ``signum`` a helper thread trims (never the signal handler itself) and
    answers the command's request. Returns the directory where the handler publishes itself.

    Call it from the main thread (Python runs signal handlers there, and ``signal.signal``
    refuses other threads: ValueError). Calling it again with the same signal does nothing;
    with another one raises RuntimeError. In a child forked afterwards the handler does nothing:
    install it again there (e.g. in gunicorn's ``post_fork``).

    Raises:
        TypeError: ``signum`` is not an int.
        ValueError: not a valid signal, SIGKILL/SIGSTOP, or not the main thread.
        RuntimeError: already installed for another signal.
        OSError: the directory cannot be created (e.g. it belongs to another user).
    """
    global _handler
    if isinstance(signum, bool) or not isinstance(signum, int):
        raise TypeError(f"signum must be a signal number (int), not {type(signum).__name__}")
    if signum not in signal.valid_signals():
        raise ValueError(f"signum {signum} is not a valid signal number")
    if signum in (signal.SIGKILL, signal.SIGSTOP):
        raise ValueError(f"{signal.Signals(signum).name} cannot be caught")
    if threading.current_thread() is not threading.main_thread():
        raise ValueError(
            "install_signal_handler() must be called from the main thread: Python runs signal"
            " handlers there and signal.signal() refuses other threads"
        )
    with _lock:
        if _handler is not None and _handler.pid == os.getpid():
            if _handler.signum == signum:
                return _handler.directory
            raise RuntimeError(
                f"the memreclaim handler is already installed for signal {_handler.signum}"
            )
        directory = state_dir(os.getpid())
        _prepare_dir(directory)
        handler = _Handler(signum, directory)
        try:
            previous = signal.signal(signum, handler.on_signal)
        except BaseException:
            os.close(handler.read_fd)
            os.close(handler.write_fd)
            raise
        try:
            handler.start()
        except RuntimeError:
            signal.signal(signum, previous)
            os.close(handler.read_fd)
            os.close(handler.write_fd)
            raise
        _write_json(
            directory / "handler.json",
            {
                "pid": os.getpid(),
                "signal": signum,
                "start_time": _start_time(os.getpid()),
                "python": sys.version.split()[0],
            },
        )
        _handler = handler
        atexit.register(shutil.rmtree, directory, True)
        return directory


# ------------------------------------------------------------------------------------------------
# in the command: reaching the target


def _wait_reply(path: Path, timeout: float, what: str) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        try:
            data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
            return data
        except FileNotFoundError:
            pass
        if time.monotonic() > deadline:
            raise RemoteError(f"no answer within {timeout:g} s: {what}")
        time.sleep(0.02)


_SCRIPT = """\
import json as _mr_json, os as _mr_os
try:
    import memreclaim.remote as _mr_remote
    _mr_remote._serve({command!r}, {pools!r}, {reply!r}, "remote_exec")
except BaseException as _mr_exc:
    _mr_tmp = {reply!r} + ".err"
    _mr_err = f"{{type(_mr_exc).__name__}}: {{_mr_exc}}"
    with open(_mr_tmp, "w") as _mr_f:
        _mr_json.dump({{"pid": _mr_os.getpid(), "error": _mr_err}}, _mr_f)
    _mr_os.replace(_mr_tmp, {reply!r})
"""


def _via_remote_exec(pid: int, command: str, pools: bool, timeout: float) -> dict[str, Any]:
    remote_exec = getattr(sys, "remote_exec", None)
    if remote_exec is None:
        raise RemoteError(
            f"sys.remote_exec needs Python 3.14+ (this command runs on {sys.version.split()[0]})"
        )
    work = Path(tempfile.mkdtemp(prefix=f"memreclaim-cli-{pid}-"))
    target_uid = os.stat(f"/proc/{pid}").st_uid
    if target_uid != os.geteuid():
        with contextlib.suppress(OSError):  # as root: let the target write its reply
            os.chown(work, target_uid, -1)
    reply = work / "reply.json"
    script = work / "script.py"
    script.write_text(_SCRIPT.format(command=command, pools=pools, reply=str(reply)))
    os.chmod(script, 0o644)
    try:
        remote_exec(pid, str(script))
    except PermissionError as exc:
        shutil.rmtree(work, ignore_errors=True)
        raise PermissionError(
            exc.errno or errno.EPERM,
            f"sys.remote_exec cannot attach to {pid} (ptrace permission: same user and"
            f" kernel.yama.ptrace_scope <= 1, or CAP_SYS_PTRACE): {exc}",
        ) from exc
    except (OSError, RuntimeError, ValueError) as exc:
        shutil.rmtree(work, ignore_errors=True)
        raise RemoteError(f"sys.remote_exec({pid}) failed: {exc}") from exc
    data = _wait_reply(
        reply,
        timeout,
        f"the script sent with sys.remote_exec runs when {pid}'s main thread next runs Python"
        f" code (it may be blocked in a system call); it is left in {script}",
    )
    shutil.rmtree(work, ignore_errors=True)
    return data


def _handler_of(pid: int) -> dict[str, Any] | None:
    try:
        marker: dict[str, Any] = json.loads(
            (state_dir(pid) / "handler.json").read_text(encoding="utf-8")
        )
    except (OSError, ValueError):
        return None
    if marker.get("pid") != pid or marker.get("start_time") != _start_time(pid):
        return None  # left by an earlier process with the same pid
    return marker


def _via_signal(pid: int, command: str, pools: bool, timeout: float) -> dict[str, Any]:
    marker = _handler_of(pid)
    if marker is None:
        raise RemoteError(
            f"process {pid} has no memreclaim signal handler ({state_dir(pid)}/handler.json:"
            " call memreclaim.install_signal_handler() in the service)"
        )
    directory = state_dir(pid)
    nonce = secrets.token_hex(8)
    reply = directory / f"reply-{nonce}.json"
    _write_json(
        directory / f"request-{nonce}.json",
        {"command": command, "pools": pools, "reply": reply.name},
    )
    try:
        os.kill(pid, int(marker["signal"]))
    except PermissionError as exc:
        with contextlib.suppress(OSError):
            (directory / f"request-{nonce}.json").unlink()
        raise PermissionError(
            exc.errno, f"not allowed to signal {pid} (kill() needs the same user or root)"
        ) from exc
    try:
        return _wait_reply(
            reply,
            timeout,
            f"signal {marker['signal']} was sent to {pid}; its handler thread did not reply",
        )
    finally:
        with contextlib.suppress(OSError):
            reply.unlink()


def request(
    pid: int,
    command: str = "trim",
    *,
    pools: bool = False,
    timeout: float = 30.0,
    method: str = "auto",
) -> dict[str, Any]:
    """Run ``command`` (``"trim"`` or ``"stats"``) in process ``pid`` and return its answer:
    ``{"pid", "command", "via", "result": {...}}`` or ``{"pid", ..., "error": "..."}``.

    ``method="auto"`` uses ``sys.remote_exec`` when this interpreter has it (3.14+), else (or
    when that fails) the target's signal handler; ``"remote_exec"`` or ``"signal"`` forces one.

    Raises:
        ProcessLookupError: no such process.
        PermissionError: the OS does not allow attaching to or signalling it.
        RemoteError: no way in (the message says why for each), or no answer within
            ``timeout`` seconds.
    """
    pid = _validate.integer("pid", pid, minimum=1)
    if command not in COMMANDS:
        raise ValueError(f"command must be one of {', '.join(COMMANDS)}, got {command!r}")
    pools = _validate.flag("pools", pools)
    timeout = _validate.seconds("timeout", timeout)
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
    if not os.path.exists(f"/proc/{pid}"):
        raise ProcessLookupError(errno.ESRCH, f"no process {pid}")
    if method == "signal":
        return _via_signal(pid, command, pools, timeout)
    if method == "remote_exec":
        return _via_remote_exec(pid, command, pools, timeout)
    reasons = []
    if hasattr(sys, "remote_exec"):
        try:
            return _via_remote_exec(pid, command, pools, timeout)
        except (RemoteError, PermissionError) as exc:
            if _handler_of(pid) is None:
                raise
            reasons.append(str(exc))
    else:
        reasons.append(
            f"sys.remote_exec needs Python 3.14+ (this command runs on {sys.version.split()[0]})"
        )
    if _handler_of(pid) is None:
        raise RemoteError(
            f"cannot reach process {pid}: {'; '.join(reasons)}; and it has no memreclaim signal"
            " handler (call memreclaim.install_signal_handler() in the service)"
        )
    return _via_signal(pid, command, pools, timeout)
