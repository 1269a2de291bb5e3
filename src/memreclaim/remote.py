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
   signal handler). It publishes ``handler.json`` in a directory only its user can write
   (:func:`state_dir`) so the command knows which signal to send; the command drops a request
   file there, sends the signal (``kill()`` permission: same user or root) and waits for the
   reply file. A bare ``kill -USR2 PID`` trims too, and the result is logged on the
   ``memreclaim.remote`` logger.

Trust (docs/containers.md, "Trust model"): the command believes only files owned by the
target's user (or root) in a directory owned by that user with mode 0700, opened without
following links or blocking, size-capped and parsed strictly; it sends only SIGUSR1, SIGUSR2 or
a real-time signal; a reply must echo the command's random nonce. As root it never writes
through an existing name in a directory another user owns (it only creates new files there with
``O_EXCL | O_NOFOLLOW``), and the ``sys.remote_exec`` script lives in a directory root owns.

When neither is available the command says why and exits with status 1: never a silent no-op.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import json
import logging
import math
import os
import re
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

from . import _core, _validate

__all__ = ["RemoteError", "install_signal_handler", "request", "state_dir"]

log = logging.getLogger("memreclaim.remote")

COMMANDS = ("trim", "stats")
METHODS = ("auto", "remote_exec", "signal")


class RemoteError(RuntimeError):
    """The target cannot be reached or did not answer: the message says why and what to do."""


_MAX_FILE = 64 * 1024  # a marker, request or reply larger than this is refused unread
_NONCE = re.compile(r"[0-9a-f]{32}")
_OPEN_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_OPEN_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _allowed_signal(signum: int) -> bool:
    """True for the signals the handler may use: SIGUSR1, SIGUSR2 and the real-time ones (a
    signal whose default action is not already "terminate and nothing else" could do harm)."""
    return signum in (signal.SIGUSR1, signal.SIGUSR2) or (
        signal.SIGRTMIN <= signum <= signal.SIGRTMAX
    )


def _bases(uid: int) -> list[str]:
    """Where a handler of user ``uid`` may publish: ``/run/user/UID`` when it is that user's own
    directory (not writable by others), then the temporary directory."""
    bases = []
    run = f"/run/user/{uid}"
    with contextlib.suppress(OSError):
        st = os.lstat(run)
        if stat.S_ISDIR(st.st_mode) and st.st_uid == uid and not st.st_mode & 0o022:
            bases.append(run)
    bases.append(tempfile.gettempdir())
    return bases


def _candidates(pid: int, uid: int) -> list[str]:
    """The directories that may hold process ``pid``'s handler: ``memreclaim-PID`` or
    ``memreclaim-PID-XXXX`` (the name taken when another user held the first) in each base."""
    found = []
    for base in _bases(uid):
        try:
            names = os.listdir(base)
        except OSError:
            continue
        prefix = f"memreclaim-{pid}"
        found += [
            os.path.join(base, n)
            for n in sorted(names)
            if n == prefix or n.startswith(prefix + "-")
        ]
    return found


def state_dir(pid: int) -> Path:
    """The directory where process ``pid``'s signal handler publishes itself: the one found for
    a live handler of ``pid``'s user, else where a handler of this user would publish first."""
    pid = _validate.integer("pid", pid, minimum=1)
    with contextlib.suppress(OSError, RemoteError):
        found = _find_handler(pid)
        if found is not None:
            os.close(found[1])
            return Path(found[0])
    return Path(_bases(os.geteuid())[0]) / f"memreclaim-{pid}"


_PID_MAX = (1 << 31) - 1  # pids are C ints: no process has a larger one


def _target_identity(pid: int) -> _core.ProcessIdentity:
    """Process ``pid``'s effective uid (whose files the command trusts) and start time (which
    tells a pid reused by another process apart), both read by the core through one open
    /proc/PID, so both are of the same process. ProcessLookupError when there is none."""
    if pid > _PID_MAX:
        raise ProcessLookupError(errno.ESRCH, f"no process {pid}")
    return _core.process_identity(pid)


def _start_time(pid: int) -> int | None:
    """The process's start time in clock ticks (field 22 of /proc/PID/stat), None when it
    cannot be read."""
    try:
        return _target_identity(pid).start_time
    except OSError:
        return None


def _open_owned_dir(path: str, uid: int, *, dir_fd: int | None = None) -> int | None:
    """A descriptor on directory ``path`` if it is a real directory (no link followed) owned by
    ``uid`` with no access for others (mode 0700), else None."""
    try:
        fd = os.open(path, _OPEN_DIR, dir_fd=dir_fd)
    except OSError:
        return None
    st = os.fstat(fd)
    if st.st_uid != uid or st.st_mode & 0o077:
        os.close(fd)
        return None
    return fd


def _read_owned(dir_fd: int, name: str, owners: tuple[int, ...], what: str) -> bytes:
    """The bytes of regular file ``name`` in ``dir_fd``, owned by one of ``owners``, at most
    :data:`_MAX_FILE`: never follows a link and never blocks (a FIFO is refused).

    Raises:
        FileNotFoundError: there is no such file (yet).
        RemoteError: anything else is wrong with it.
    """
    try:
        fd = os.open(name, _OPEN_READ, dir_fd=dir_fd)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise RemoteError(f"{what}: cannot be opened safely ({exc.strerror}): refused") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise RemoteError(f"{what} is not a regular file: refused")
        if st.st_uid not in owners:
            raise RemoteError(f"{what} belongs to uid {st.st_uid}, not the target's: refused")
        chunks = []
        size = 0
        while size <= _MAX_FILE:
            chunk = os.read(fd, _MAX_FILE + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > _MAX_FILE:
            raise RemoteError(f"{what} is larger than {_MAX_FILE} bytes: refused")
        return b"".join(chunks)
    finally:
        os.close(fd)


def _parse(data: bytes, what: str) -> dict[str, Any]:
    """A JSON object, or one RemoteError line saying what is wrong."""
    try:
        obj = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        raise RemoteError(f"{what} is not valid JSON: refused") from None
    if not isinstance(obj, dict):
        raise RemoteError(f"{what} is not a JSON object: refused")
    return obj


def _field(obj: dict[str, Any], key: str, kinds: tuple[type, ...], what: str) -> Any:
    """``obj[key]`` when it is one of ``kinds`` (a bool is not a number; a float is finite)."""
    value = obj.get(key)
    ok = isinstance(value, kinds) and not (isinstance(value, bool) and bool not in kinds)
    if ok and isinstance(value, float):
        ok = math.isfinite(value)
    if not ok:
        names = " or ".join("null" if k is type(None) else k.__name__ for k in kinds)
        raise RemoteError(f"{what}: {key!r} must be {names}, got {repr(value)[:40]}: refused")
    return value


def _write_new(dir_fd: int, name: str, data: dict[str, Any]) -> None:
    """Publish ``data`` as ``name`` in ``dir_fd`` atomically: a new file (``O_EXCL``, never
    through a link), mode 0644, renamed over ``name`` (the reader never sees half a file)."""
    tmp = f".{name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    fd = os.open(tmp, _OPEN_NEW, 0o644, dir_fd=dir_fd)
    try:
        os.fchmod(fd, 0o644)  # whatever the umask: the requester reads it
        with os.fdopen(fd, "w", encoding="utf-8", closefd=False) as f:
            json.dump(data, f)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise
    os.close(fd)
    os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)


def _write_json(directory: str, name: str, data: dict[str, Any]) -> None:
    """:func:`_write_new` into ``directory`` (a directory of this process's user)."""
    dir_fd = os.open(directory, _OPEN_DIR)
    try:
        _write_new(dir_fd, name, data)
    finally:
        os.close(dir_fd)


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


def _serve(command: str, pools: bool, directory: str, nonce: str, via: str) -> None:
    """Run ``command`` here and write the result (or the error) to ``reply-NONCE.json`` in
    ``directory``, echoing ``nonce``."""
    data: dict[str, Any] = {"pid": os.getpid(), "command": command, "via": via, "nonce": nonce}
    try:
        if command not in COMMANDS:
            raise ValueError(f"unknown command {command!r}")
        data["result"] = _execute(command, bool(pools))
    except Exception as exc:
        data["error"] = f"{type(exc).__name__}: {exc}"
    _write_json(directory, f"reply-{nonce}.json", data)
    if command == "trim" and "result" in data:
        log.info("memreclaim: trim requested from outside (%s): %s", via, data["result"])


def _serve_script(command: str, pools: bool, directory: str, nonce: str, expires: float) -> None:
    """The ``sys.remote_exec`` script's body: serve unless the command gave up already."""
    if time.time() > expires:
        log.warning("memreclaim: a remote %s request arrived after its timeout: ignored", command)
        return
    _serve(command, pools, directory, nonce, "remote_exec")


def _request_of(directory: str, name: str) -> dict[str, Any]:
    """Read, remove and check request file ``name`` (one RemoteError line when it is bad)."""
    dir_fd = os.open(directory, _OPEN_DIR)
    try:
        try:
            data = _read_owned(dir_fd, name, (0, os.geteuid()), name)
        finally:
            with contextlib.suppress(OSError):  # a bad request never stays to jam the next ones
                os.unlink(name, dir_fd=dir_fd)
    finally:
        os.close(dir_fd)
    req = _parse(data, name)
    nonce = _field(req, "nonce", (str,), name)
    if f"request-{nonce}.json" != name:
        raise RemoteError(f"{name}: its nonce does not match its name: refused")
    if _field(req, "command", (str,), name) not in COMMANDS:
        raise RemoteError(f"{name}: unknown command {req['command']!r:.40}: refused")
    _field(req, "pools", (bool,), name)
    if time.time() > _field(req, "expires", (int, float), name):
        raise RemoteError(f"{name}: arrived after the command's timeout: ignored")
    return req


class _Handler:
    def __init__(self, signum: int, directory: Path) -> None:
        from ._daemon import DaemonThread  # the one daemon-thread lifecycle

        self.signum = signum
        self.directory = directory
        self.pid = os.getpid()
        self.read_fd, self.write_fd = os.pipe2(os.O_CLOEXEC)
        os.set_blocking(self.write_fd, False)
        # The pipe's identity: a program that closes inherited descriptors and reuses the
        # numbers must never get our bytes in its files.
        self.ident = {fd: _identity(fd) for fd in (self.read_fd, self.write_fd)}
        self.lost = False
        self.thread = DaemonThread("signal handler", "memreclaim-signal", wake=self.wake)

    def owns(self, fd: int) -> bool:
        """True while ``fd`` is still our pipe end; the first time it is not, warn once."""
        if not self.lost and _identity(fd) == self.ident[fd]:
            return True
        if not self.lost:
            self.lost = True
            log.warning(
                "memreclaim: the signal handler's pipe (descriptor %d) was closed or reused by"
                " the program: the handler stops; install it again",
                fd,
            )
        return False

    def wake(self) -> None:
        """Wake the helper thread (a full pipe means a wake-up is pending anyway)."""
        if self.owns(self.write_fd):
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
            if not self.owns(self.read_fd):
                return
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
        names = sorted(
            n
            for n in os.listdir(self.directory)
            if n.startswith("request-") and n.endswith(".json")
        )
        for name in names:
            try:
                req = _request_of(str(self.directory), name)
            except (OSError, RemoteError) as exc:
                log.warning("memreclaim: signal handler: %s", exc)
                served += 1  # a request came, even a bad one: not a bare signal
                continue
            _serve(req["command"], req["pools"], str(self.directory), req["nonce"], "signal")
            served += 1
        if not served:  # a bare `kill -USR2 PID`: trim and log
            from . import trim

            result = trim()
            log.info(
                "memreclaim: trimmed on signal %d: released %s bytes", self.signum, result.released
            )


def _identity(fd: int) -> tuple[int, int] | None:
    """(st_dev, st_ino) of descriptor ``fd``, None when it is closed."""
    try:
        st = os.fstat(fd)
    except OSError:
        return None
    return st.st_dev, st.st_ino


_lock = threading.Lock()
_handler: _Handler | None = None


def _prepare_dir(base: str, pid: int) -> Path:
    """This process's state directory in ``base``: ``memreclaim-PID`` (emptied when an earlier
    process of this user with this pid left it), or ``memreclaim-PID-XXXX`` when that name is
    someone else's (never denied by another user's directory)."""
    directory = os.path.join(base, f"memreclaim-{pid}")
    try:
        os.mkdir(directory, 0o700)
    except FileExistsError:
        fd = _open_owned_dir(directory, os.geteuid())
        if fd is None:  # another user's, a link, or not a directory: take a name of our own
            return Path(tempfile.mkdtemp(prefix=f"memreclaim-{pid}-", dir=base))
        try:
            for entry in os.listdir(fd):  # left by an earlier process with this pid
                with contextlib.suppress(OSError):
                    os.unlink(entry, dir_fd=fd)
        finally:
            os.close(fd)
    return Path(directory)


def _remove_state(directory: Path, owner_pid: int) -> None:
    """At exit: remove the handler's directory, in the process that made it only (a forked
    child's exit leaves its parent reachable)."""
    if os.getpid() == owner_pid:
        shutil.rmtree(directory, True)


def install_signal_handler(signum: int = signal.SIGUSR2) -> Path:
    """Let ``python -m memreclaim trim --pid`` (and ``stats --pid``) reach this process on any
    Python version: on ``signum`` a helper thread trims (never the signal handler itself) and
    answers the command's request. Returns the directory where the handler publishes itself.

    ``signum`` must be SIGUSR1, SIGUSR2 or a real-time signal (the command sends what the
    handler publishes: never a signal that could do harm). Call it from the main thread (Python
    runs signal handlers there, and ``signal.signal`` refuses other threads: ValueError).
    Calling it again with the same signal does nothing; with another one raises RuntimeError.
    In a child forked afterwards the handler does nothing: install it again there (e.g. in
    gunicorn's ``post_fork``); a child's exit never removes the parent's directory.

    Raises:
        TypeError: ``signum`` is not an int.
        ValueError: not SIGUSR1, SIGUSR2 or a real-time signal, or not the main thread.
        RuntimeError: already installed for another signal.
        OSError: the directory cannot be created.
    """
    global _handler
    if isinstance(signum, bool) or not isinstance(signum, int):
        raise TypeError(f"signum must be a signal number (int), not {type(signum).__name__}")
    if not _allowed_signal(signum):
        raise ValueError(
            f"signum must be SIGUSR1, SIGUSR2 or a real-time signal"
            f" ({int(signal.SIGRTMIN)}..{int(signal.SIGRTMAX)}), got {signum}"
        )
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
        _handler = _install(signum)
        atexit.register(_remove_state, _handler.directory, os.getpid())
        return _handler.directory


def _install(signum: int) -> _Handler:
    directory = _prepare_dir(_bases(os.geteuid())[0], os.getpid())
    handler = _Handler(signum, directory)
    try:
        previous = signal.signal(signum, handler.on_signal)
    except BaseException:
        os.close(handler.read_fd)
        os.close(handler.write_fd)
        shutil.rmtree(directory, True)
        raise
    try:
        handler.start()
    except RuntimeError:
        signal.signal(signum, previous)
        os.close(handler.read_fd)
        os.close(handler.write_fd)
        shutil.rmtree(directory, True)
        raise
    marker = {
        "pid": os.getpid(),
        "signal": signum,
        "start_time": _start_time(os.getpid()),
        "python": sys.version.split()[0],
    }
    _write_json(str(directory), "handler.json", marker)
    return handler


# ------------------------------------------------------------------------------------------------
# in the command: reaching the target


def _wait_reply(
    dir_fd: int, name: str, owners: tuple[int, ...], deadline: float, what: str
) -> bytes:
    """The reply file's bytes once it is there; RemoteError at ``deadline`` (monotonic)."""
    while True:
        try:
            return _read_owned(dir_fd, name, owners, f"the reply {name}")
        except FileNotFoundError:
            pass
        left = deadline - time.monotonic()
        if left <= 0:
            raise RemoteError(f"no answer in time: {what}")
        time.sleep(min(0.02, left))


def _check_reply(data: bytes, pid: int, command: str, nonce: str) -> dict[str, Any]:
    """The reply as a dict, checked (one RemoteError line when anything is off)."""
    what = "the reply"
    reply = _parse(data, what)
    if reply.get("nonce") != nonce:
        raise RemoteError(f"{what} does not carry this request's nonce: refused")
    if _field(reply, "pid", (int,), what) != pid:
        raise RemoteError(f"{what} comes from pid {reply['pid']}, not {pid}: refused")
    _field(reply, "via", (str,), what)
    if "error" in reply:
        _field(reply, "error", (str,), what)
        return reply
    result = _field(reply, "result", (dict,), what)
    _field(result, "allocator", (str,), what)
    if command == "trim":
        _field(result, "method", (str,), what)
        _field(result, "released", (int, type(None)), what)
        _field(result, "seconds", (int, float), what)
        return reply
    for key in ("rss", "rss_anon", "rss_file", "rss_shmem", "peak_rss", "swap"):
        _field(result, key, (int, type(None)), what)
    heap = _field(result, "heap", (dict, type(None)), what)
    for key in ("in_use", "free", "mapped") if heap is not None else ():
        _field(heap, key, (int, type(None)), what)
    return reply


_SCRIPT = """\
import json as _mr_json, os as _mr_os, time as _mr_time
_mr_reply = {directory!r} + "/reply-" + {nonce!r} + ".json"
try:
    import memreclaim.remote as _mr_remote
    _mr_remote._serve_script({command!r}, {pools!r}, {directory!r}, {nonce!r}, {expires!r})
except BaseException as _mr_exc:
    if _mr_time.time() <= {expires!r}:
        _mr_tmp = _mr_reply + ".err"
        _mr_err = f"{{type(_mr_exc).__name__}}: {{_mr_exc}}"
        _mr_fd = _mr_os.open(_mr_tmp, _mr_os.O_WRONLY | _mr_os.O_CREAT | _mr_os.O_EXCL
                             | _mr_os.O_NOFOLLOW, 0o644)
        with open(_mr_fd, "w") as _mr_f:
            _mr_json.dump({{"pid": _mr_os.getpid(), "via": "remote_exec", "nonce": {nonce!r},
                           "error": _mr_err}}, _mr_f)
        _mr_os.replace(_mr_tmp, _mr_reply)
"""


def _remote_exec_dir(uid: int) -> tuple[str, int, int]:
    """(work directory, its descriptor, the reply directory's descriptor): the work directory
    is root's (this user's), mode 0711, and holds the script; only its ``reply`` subdirectory,
    mode 0700, belongs to the target's user ``uid``. Nothing is done through a path the target's
    user could change."""
    work = tempfile.mkdtemp(prefix="memreclaim-cli-")
    work_fd = os.open(work, _OPEN_DIR)
    try:
        os.fchmod(work_fd, 0o711)  # the target may read the script by its name, nothing more
        os.mkdir("reply", 0o700, dir_fd=work_fd)
        if uid != os.geteuid():  # as root: let the target write its reply there
            os.chown("reply", uid, -1, dir_fd=work_fd, follow_symlinks=False)
        reply_fd = _open_owned_dir("reply", uid, dir_fd=work_fd)
        if reply_fd is None:
            raise RemoteError(f"cannot give {work}/reply to uid {uid}")
    except BaseException:
        os.close(work_fd)
        shutil.rmtree(work, ignore_errors=True)
        raise
    return work, work_fd, reply_fd


def _via_remote_exec(pid: int, command: str, pools: bool, timeout: float) -> dict[str, Any]:
    remote_exec = getattr(sys, "remote_exec", None)
    if remote_exec is None:
        raise RemoteError(
            f"sys.remote_exec needs Python 3.14+ (this command runs on {sys.version.split()[0]})"
        )
    deadline = time.monotonic() + timeout
    uid = _target_identity(pid).uid
    work, work_fd, reply_fd = _remote_exec_dir(uid)
    nonce = secrets.token_hex(16)
    code = _SCRIPT.format(
        command=command,
        pools=pools,
        directory=os.path.join(work, "reply"),
        nonce=nonce,
        expires=time.time() + timeout,
    )
    try:
        fd = os.open("script.py", _OPEN_NEW, 0o644, dir_fd=work_fd)
        os.fchmod(fd, 0o644)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(code)
        try:
            remote_exec(pid, os.path.join(work, "script.py"))
        except PermissionError as exc:
            raise PermissionError(
                exc.errno or errno.EPERM,
                f"sys.remote_exec cannot attach to {pid} (ptrace permission: same user and"
                f" kernel.yama.ptrace_scope <= 1, or CAP_SYS_PTRACE): {exc}",
            ) from exc
        except (OSError, RuntimeError, ValueError) as exc:
            raise RemoteError(f"sys.remote_exec({pid}) failed: {exc}") from exc
        data = _wait_reply(
            reply_fd,
            f"reply-{nonce}.json",
            (uid,),
            deadline,
            f"the script sent with sys.remote_exec runs when {pid}'s main thread next runs"
            f" Python code (it may be blocked in a system call); it will not act after"
            f" {timeout:g} s",
        )
        return _check_reply(data, pid, command, nonce)
    finally:
        os.close(reply_fd)
        os.close(work_fd)
        shutil.rmtree(work, ignore_errors=True)


def _find_handler(pid: int) -> tuple[str, int, dict[str, Any], int] | None:
    """(directory, its descriptor, the checked marker, the target's uid) of process ``pid``'s
    live handler, or None when it has none. Only a directory owned by the target's user with
    mode 0700 is looked into; a marker there that is malformed is one RemoteError line."""
    identity = _target_identity(pid)  # both figures of one process
    uid, start = identity.uid, identity.start_time
    for path in _candidates(pid, uid):
        dir_fd = _open_owned_dir(path, uid)
        if dir_fd is None:
            continue  # another user's directory (or a link): never believed
        try:
            what = f"{path}/handler.json"
            marker = _parse(_read_owned(dir_fd, "handler.json", (uid,), what), what)
            if _field(marker, "pid", (int,), what) != pid:
                raise FileNotFoundError
            if _field(marker, "start_time", (int, type(None)), what) != start:
                raise FileNotFoundError  # left by an earlier process with the same pid
            signum = _field(marker, "signal", (int,), what)
            if not _allowed_signal(signum):
                raise RemoteError(f"{what}: signal {signum} is not SIGUSR1/2 or real-time")
        except FileNotFoundError:
            os.close(dir_fd)
            continue
        except BaseException:
            os.close(dir_fd)
            raise
        return path, dir_fd, marker, uid
    return None


def _handler_of(pid: int) -> dict[str, Any] | None:
    """Process ``pid``'s checked handler marker, or None (RemoteError when it is malformed)."""
    found = _find_handler(pid)
    if found is None:
        return None
    os.close(found[1])
    return found[2]


def _via_signal(pid: int, command: str, pools: bool, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    found = _find_handler(pid)
    if found is None:
        raise RemoteError(
            f"process {pid} has no memreclaim signal handler (no handler.json of its user:"
            " call memreclaim.install_signal_handler() in the service)"
        )
    _, dir_fd, marker, uid = found
    nonce = secrets.token_hex(16)
    request_name = f"request-{nonce}.json"
    try:
        _write_new(
            dir_fd,
            request_name,
            {"command": command, "pools": pools, "nonce": nonce, "expires": time.time() + timeout},
        )
        try:
            os.kill(pid, marker["signal"])
        except PermissionError as exc:
            raise PermissionError(
                exc.errno, f"not allowed to signal {pid} (kill() needs the same user or root)"
            ) from exc
        data = _wait_reply(
            dir_fd,
            f"reply-{nonce}.json",
            (uid,),
            deadline,
            f"signal {marker['signal']} was sent to {pid}; its handler thread did not reply"
            f" within {timeout:g} s",
        )
        return _check_reply(data, pid, command, nonce)
    finally:
        for name in (request_name, f"reply-{nonce}.json"):  # a late request is never served
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=dir_fd)
        os.close(dir_fd)


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
    _target_identity(pid)  # ProcessLookupError now, before any way in is tried
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
