"""runners.wakeups: one interface over the wake-up sources, with files the tests make (a FIFO, a
socket, an eventfd, a regular file for systemd's protocol), PSI only where the kernel has it;
and both runners sleeping on them. No timing: every wait is bounded and returns on readiness."""

from __future__ import annotations

import asyncio
import base64
import errno
import os
import select
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import memreclaim
from memreclaim.runners import wakeups as wk
from memreclaim.runners.wakeups import EventsFile, PsiTrigger, SystemdPressure, Wake, Wakeups

DEADLINE = 60.0  # seconds a wait may take at most; readiness ends it long before


class _EventFd(wk.WakeSource):
    kind = "test"
    events = select.POLLIN

    def consume(self, mask: int) -> str | None:
        try:
            return f"count {os.eventfd_read(self._fd)}"
        except BlockingIOError:
            return None


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "pressure.fifo"
    os.mkfifo(path)
    return path


def _write_fifo(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)  # the source holds it open for reading
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def test_an_eventfd_source_and_the_poke() -> None:
    wakeups = Wakeups([_EventFd("eventfd", os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC))])
    try:
        assert wakeups.wait(0) == []  # nothing pending
        (source,) = wakeups.sources
        os.eventfd_write(source.fileno(), 3)
        assert wakeups.wait(DEADLINE) == [Wake("test", "eventfd", "count 3")]
        wakeups.poke()
        assert wakeups.wait(DEADLINE) == []  # a poke wakes the sleeper with nothing to report
        assert wakeups.wait(0) == []  # and was consumed
    finally:
        wakeups.close()
    wakeups.close()  # idempotent
    assert wakeups.wait(DEADLINE) == [] and source.fileno() == -1  # closed: returns at once


def test_systemd_fifo(fifo: Path) -> None:
    source, why = SystemdPressure.from_environment({"MEMORY_PRESSURE_WATCH": str(fifo)})
    assert source is not None and why == "" and source.events == select.POLLIN
    wakeups = Wakeups([source])
    try:
        assert wakeups.wait(0) == []
        _write_fifo(fifo, b"pressure!")
        assert wakeups.wait(DEADLINE) == [Wake("systemd", str(fifo), "pressure (9 bytes)")]
        assert wakeups.wait(0) == []  # what arrived was read and dropped
    finally:
        wakeups.close()


def test_systemd_regular_file_gets_the_write_and_cannot_be_polled(tmp_path: Path) -> None:
    target = tmp_path / "memory.pressure"
    target.write_text("")
    trigger = b"some 200000 2000000\0"
    env = {
        "MEMORY_PRESSURE_WATCH": str(target),
        "MEMORY_PRESSURE_WRITE": base64.b64encode(trigger).decode(),
    }
    source, _ = SystemdPressure.from_environment(env)
    assert source is not None and source.events == select.POLLPRI
    assert target.read_bytes() == trigger  # written once, as the protocol says
    wakeups = Wakeups([source])  # a regular file is no PSI file: epoll refuses it
    try:
        assert wakeups.sources == ()
        assert len(wakeups.notes) == 1 and "cannot be watched" in wakeups.notes[0]
        assert source.fileno() == -1  # left out, and closed
    finally:
        wakeups.close()


@pytest.fixture
def unix_server(tmp_path: Path) -> Iterator[tuple[str, socket.socket]]:
    path = str(tmp_path / "pressure.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)
    server.settimeout(DEADLINE)
    try:
        yield path, server
    finally:
        server.close()


def test_systemd_socket(unix_server: tuple[str, socket.socket]) -> None:
    path, server = unix_server
    hello = b"watch me"
    env = {"MEMORY_PRESSURE_WATCH": path, "MEMORY_PRESSURE_WRITE": base64.b64encode(hello).decode()}
    source, _ = SystemdPressure.from_environment(env)
    assert source is not None and source.events == select.POLLIN
    peer, _ = server.accept()
    peer.settimeout(DEADLINE)
    wakeups = Wakeups([source])
    try:
        assert peer.recv(64) == hello  # the write, sent once connected
        peer.sendall(b"xx")
        assert wakeups.wait(DEADLINE) == [Wake("systemd", path, "pressure (2 bytes)")]
        peer.close()  # the manager went away: the source is lost, and dropped
        assert wakeups.wait(DEADLINE) == []
        assert wakeups.sources == () and "source lost" in wakeups.notes[-1]
    finally:
        peer.close()
        wakeups.close()


def test_systemd_environment_failure_modes(tmp_path: Path) -> None:
    assert SystemdPressure.from_environment({}) == (None, "$MEMORY_PRESSURE_WATCH is not set")
    source, why = SystemdPressure.from_environment({"MEMORY_PRESSURE_WATCH": "/dev/null"})
    assert source is None and "off" in why
    with pytest.raises(ValueError, match="not base64"):
        SystemdPressure.from_environment(
            {"MEMORY_PRESSURE_WATCH": str(tmp_path), "MEMORY_PRESSURE_WRITE": "***"}
        )
    with pytest.raises(FileNotFoundError):
        SystemdPressure.from_environment({"MEMORY_PRESSURE_WATCH": str(tmp_path / "none")})


def test_memory_events_file(tmp_path: Path) -> None:
    path = tmp_path / "memory.events"
    path.write_text("low 0\nhigh 1\nmax 0\noom 0\noom_kill 0\n")
    events = EventsFile(str(path))
    try:
        assert events.check() is None
        path.write_text("low 5\nhigh 3\nmax 1\noom 0\noom_kill 0\n")
        assert events.check() == "high +2, max +1"
        path.write_text("")  # a read that finds nothing keeps the counters
        assert events.check() is None
        path.write_text("low 5\nhigh 3\nmax 1\noom 0\noom_kill 0\n")
        assert events.check() is None
    finally:
        events.close()
    with pytest.raises(FileNotFoundError):
        EventsFile(str(tmp_path / "missing"))


PSI = "/proc/pressure/memory"


@pytest.mark.skipif(not os.path.exists(PSI), reason="no /proc/pressure (kernel without PSI)")
def test_psi_trigger_opens_and_waits() -> None:
    try:
        trigger = PsiTrigger(PSI, stall=0.5, window=2.0)  # a 2 s window: allowed unprivileged
    except PermissionError as exc:
        pytest.skip(f"PSI triggers need write access here: {exc}")
    wakeups = Wakeups([trigger])
    try:
        assert wakeups.sources == (trigger,) and trigger.trigger == "some 500000 2000000"
        for wake in wakeups.wait(0):  # a stall may be reported: then it says which trigger
            assert wake == Wake("psi", PSI, "trigger 'some 500000 2000000'")
    finally:
        wakeups.close()
    with pytest.raises(ValueError, match="kind"):
        PsiTrigger(PSI, kind="most")


def test_bad_kinds() -> None:
    with pytest.raises(ValueError, match="wake-up kind"):
        wk.open_source("soon")
    assert wk.open_source("usage-alarm", mark=None) == (None, "no soft limit")
    with pytest.raises(TypeError, match="wake_on"):
        memreclaim.BackgroundTrimmer(wake_on="psi")
    with pytest.raises(ValueError, match="unknown source 'soon'"):
        memreclaim.Watchdog(wake_on=("psi", "soon"))


@pytest.mark.timeout(120)
def test_both_runners_wake_on_the_systemd_fifo(fifo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tick interval far longer than the deadline: only the FIFO can make the second reading."""
    monkeypatch.setenv("MEMORY_PRESSURE_WATCH", str(fifo))
    monkeypatch.delenv("MEMORY_PRESSURE_WRITE", raising=False)
    trimmer = memreclaim.BackgroundTrimmer(interval=3000, limit=None, wake_on=("systemd",))
    with trimmer:
        assert trimmer.wake_sources == (("systemd", str(fifo)),)
        _write_fifo(fifo, b"1")
        waited = threading.Event()
        for _ in range(6000):  # bounded: 60 s
            if trimmer.counters.ticks >= 1:
                break
            waited.wait(0.01)
        assert trimmer.counters.ticks >= 1, "the trimmer did not wake on the FIFO"
    assert trimmer.wake_sources == ()

    async def main() -> int:
        async with memreclaim.Watchdog(interval=3000, limit=None, wake_on=("systemd",)) as wd:
            await asyncio.sleep(0)  # the task starts and opens its sources
            for _ in range(6000):  # bounded: 60 s
                if wd.wake_sources:
                    break
                await asyncio.sleep(0.01)
            _write_fifo(fifo, b"1")
            for _ in range(6000):
                if wd.counters.ticks >= 1:
                    break
                await asyncio.sleep(0.01)
            return wd.counters.ticks

    assert asyncio.run(main()) >= 1, "the watchdog did not wake on the FIFO"


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_closes_its_copy() -> None:
    wakeups = Wakeups([_EventFd("eventfd", os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC))])
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            wakeups._forget_after_fork()
            ok = wakeups.sources == () and wakeups.wait(DEADLINE) == []
            os.write(write, b"1" if ok else b"0")
        finally:
            os._exit(0)
    os.close(write)
    try:
        assert os.read(read, 1) == b"1"
    finally:
        os.close(read)
        os.waitpid(pid, 0)
    (source,) = wakeups.sources  # the parent's copy is untouched
    os.eventfd_write(source.fileno(), 1)
    assert wakeups.wait(DEADLINE) == [Wake("test", "eventfd", "count 1")]
    wakeups.close()


def test_a_daemon_that_closes_and_reuses_descriptors(
    run_python: Callable[..., dict[str, Any]], fifo: Path, tmp_path: Path
) -> None:
    """Issue 30: under $MEMORY_PRESSURE_WATCH, a program that closed the descriptors it had and
    opened its own files made the wake-up thread spin (the epoll's errors swallowed: every
    wait() returned at once) and the eventfd poke at exit wrote 8 bytes into its file. Now the
    wake-ups stop with one warning and the runner sleeps on its timer: counted, of the waits
    after the descriptors were lost, at most the one that saw it returns before its timeout;
    and no byte lands in the program's files (checked after the process exited)."""
    out = run_python(
        """
        import logging, time
        from memreclaim.runners.wakeups import Wakeups
        logging.basicConfig(level=logging.WARNING)
        calls = []
        real = Wakeups.wait
        def counted(self, timeout):
            began = time.monotonic()
            woken = real(self, timeout)
            calls.append([timeout, time.monotonic() - began, bool(woken)])
            return woken
        Wakeups.wait = counted
        trimmer = memreclaim.BackgroundTrimmer(interval=0.05, limit=None, wake_on=("systemd",))
        trimmer.start()
        end = time.monotonic() + 60
        while not calls and time.monotonic() < end:
            time.sleep(0.01)
        os.closerange(3, 1024)  # a daemon: close what was inherited, then open its own files
        fds = [os.open(f"{DIR}/own{i}", os.O_RDWR | os.O_CREAT, 0o600) for i in range(32)]
        seen = len(calls)
        end = time.monotonic() + 60
        while len(calls) < seen + 12 and time.monotonic() < end:
            time.sleep(0.01)
        after = calls[seen + 1 : seen + 12]  # the first may be the one asleep at the close
        early = [c for c in after if c[1] < c[0] / 2 and not c[2]]
        emit(after=len(after), early=len(early), stopped=trimmer.stop(timeout=30))
        """,
        env={"MEMORY_PRESSURE_WATCH": str(fifo)},
        params={"DIR": str(tmp_path)},
        check=False,
    )
    assert out["returncode"] == 0, out["stderr"]
    assert out["after"] == 11, out
    assert out["early"] <= 1, out
    assert out["stopped"] is True
    assert out["stderr"].count("wake-ups stopped") == 1, out["stderr"]
    for i in range(32):
        assert (tmp_path / f"own{i}").read_bytes() == b"", f"bytes written into file {i}"


def test_a_lost_epoll_is_said_once_and_never_used(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 30: the program took over the epoll's and the eventfd's numbers (a readable pipe,
    a file of its own). ``fileno()`` is -1 from then on (an event loop's ``add_reader`` refuses
    it, so the Watchdog sleeps its timer instead of waking at once forever), a poke writes
    nothing into the program's file, and nothing of the program's is closed; said once."""
    wakeups = Wakeups([])
    ep, poke = wakeups.fileno(), wakeups._poke
    keep = (os.dup(ep), os.dup(poke))  # what the program would have closed
    r, w = os.pipe()
    os.write(w, b"x")  # readable: the old code's add_reader woke at once, every time
    own = os.open(tmp_path / "own", os.O_RDWR | os.O_CREAT, 0o600)
    os.dup2(r, ep)
    os.dup2(own, poke)
    try:
        with caplog.at_level("WARNING", logger="memreclaim.wakeups"):
            assert wakeups.fileno() == -1
            wakeups.poke()
            assert wakeups.wait(0.01) == []
            assert wakeups.fileno() == -1
            wakeups.close()
        assert (tmp_path / "own").read_bytes() == b""
        os.fstat(ep)  # still the program's: not closed
        os.fstat(poke)
        assert sum("wake-ups stopped" in r.getMessage() for r in caplog.records) == 1
        assert sum("wake-ups stopped" in n for n in wakeups.notes) == 1
    finally:
        for fd in (*keep, r, w, own, ep, poke):
            os.close(fd)


def test_an_epoll_closed_between_the_check_and_the_poll_is_said_as_taken(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The program closes the epoll's number after ``wait`` checked it and before the poll
    (CI's matrix under load): the poll's EBADF is reported as the program's doing, once, not as
    an epoll failure; an epoll failing while still ours is said as such."""
    wakeups = Wakeups([])
    ep = wakeups.fileno()
    checks = iter([True])  # the check before the poll passes; every later one sees the truth
    real = wakeups._owned
    monkeypatch.setattr(wakeups, "_owned", lambda: next(checks, None) or real())
    keep = os.dup(ep)
    os.close(ep)  # closed, not yet reused: the poll fails with EBADF
    try:
        with caplog.at_level("WARNING", logger="memreclaim.wakeups"):
            assert wakeups.wait(0.01) == []
            assert wakeups.wait(0.01) == []
        said = [r.getMessage() for r in caplog.records if "wake-ups stopped" in r.getMessage()]
        assert len(said) == 1 and "closed or reused by the program" in said[0], said
    finally:
        os.dup2(keep, ep)  # give the number back so that close() closes what it opened
        os.close(keep)
        wakeups.close()

    class Broken:
        """The epoll, still ours, whose poll fails."""

        closed = False

        def __init__(self, epoll: select.epoll) -> None:
            self.fileno, self.close = epoll.fileno, epoll.close

        def poll(self, timeout: float) -> list[tuple[int, int]]:
            raise OSError(errno.EINVAL, "Invalid argument")

    failing = Wakeups([])
    monkeypatch.setattr(failing, "_epoll", Broken(failing._epoll))
    monkeypatch.setattr(failing, "_owned", lambda: True)
    with caplog.at_level("WARNING", logger="memreclaim.wakeups"):
        assert failing.wait(0.01) == []
    assert any("epoll failed ([Errno 22] Invalid argument)" in n for n in failing.notes)
    failing.close()


def test_psi_poll_failure_modes_and_stall_share(tmp_path: Path) -> None:
    path = tmp_path / "memory.pressure"
    with pytest.raises(ValueError, match="kind must be"):
        wk.PsiPoll(str(path), kind="most")
    with pytest.raises(FileNotFoundError):
        wk.PsiPoll(str(path))
    path.write_text("garbage\n")
    with pytest.raises(OSError) as info:
        wk.PsiPoll(str(path))
    assert info.value.errno == errno.ENODATA
    path.write_text("some avg10=0.00 total=1000\nfull avg10=0.00 total=0\n")
    poll = wk.PsiPoll(str(path), stall=0.15, window=1.0)
    assert poll.check() is None  # no stall since the last read
    path.write_text("some avg10=0.00 total=60001000\nfull avg10=0.00 total=0\n")
    detail = poll.check()
    assert detail is not None and detail.startswith("some stall 60000 ms"), detail
    path.unlink()
    assert poll.check() is None  # a file gone: no wake-up, no exception


def test_wakeups_keep_unwatched_sources_for_the_owner(tmp_path: Path) -> None:
    path = tmp_path / "memory.events"
    path.write_text("high 1\n")
    with pytest.raises(TypeError, match="after_loss"):
        Wakeups([], after_loss=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="keep_unwatched"):
        Wakeups([], keep_unwatched="yes")  # type: ignore[arg-type]
    kept = EventsFile(str(path))  # a regular file: epoll refuses it (EPERM)
    wakes = Wakeups([kept], keep_unwatched=True)
    try:
        assert wakes.sources == () and kept.fileno() >= 0
        assert any("cannot be watched" in note for note in wakes.notes)
    finally:
        wakes.close()
    assert kept.fileno() == -1  # closed with the rest
    dropped = EventsFile(str(path))
    Wakeups([dropped]).close()
    assert dropped.fileno() == -1
