"""memreclaim.pressure: a real PSI trigger under real memory pressure (a 32 MiB cgroup v1
streaming a file), memory.events and PSI polling from fixture files, and lifecycle misuse."""

from __future__ import annotations

import errno
import os
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from test_limits import v1_cgroup  # noqa: F401  (a fixture: a fresh cgroup v1, removed after)

from memreclaim import memlimits
from memreclaim.pressure import PressureEvent, PressureWatcher

MiB = 1 << 20


def wait_for(what: str, condition: Callable[[], bool], deadline: float = 30.0) -> None:
    end = time.monotonic() + deadline
    while not condition():
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {deadline:g} s waiting for {what}")
        time.sleep(0.02)


class Recorder:
    def __init__(self) -> None:
        self.events: list[PressureEvent] = []
        self.lock = threading.Lock()

    def __call__(self, event: PressureEvent) -> None:
        with self.lock:
            self.events.append(event)


EVENTS = "low 0\nhigh {high}\nmax 0\noom 0\noom_kill 0\n"


def test_memory_events_increment_fires(tmp_path: Path) -> None:
    path = tmp_path / "memory.events"
    path.write_text(EVENTS.format(high=5))
    rec = Recorder()
    with PressureWatcher(rec, psi=None, events=str(path), poll_interval=0.05, min_interval=0) as w:
        assert [(s.kind, s.path) for s in w.sources] == [("memory.events", str(path))]
        time.sleep(0.2)
        assert rec.events == []  # the counters at start are the baseline
        path.write_text(EVENTS.format(high=8))
        wait_for("a memory.events callback", lambda: len(rec.events) == 1)
    assert not w.running
    assert rec.events[0].source == "memory.events"
    assert rec.events[0].detail == "high +3"


def test_memory_events_read_while_rewritten_is_not_counted_again(tmp_path: Path) -> None:
    # A read that finds the file empty (caught between truncation and write) keeps the counters:
    # reset to 0, the next read would report every event since the start again ("high +8").
    path = tmp_path / "memory.events"
    path.write_text(EVENTS.format(high=5))
    rec = Recorder()
    w = PressureWatcher(rec, psi=None, events=str(path), min_interval=0)
    opened, polled = w._open()  # the watcher's own polling step, driven without its thread
    try:
        (src,) = opened
        path.write_text("")
        w._poll(opened, polled)
        path.write_text(EVENTS.format(high=8))
        w._poll(opened, polled)
    finally:
        src.close()
    assert [event.detail for event in rec.events] == ["high +3"]


def _psi(total: int) -> str:
    return (
        f"some avg10=0.00 avg60=0.00 avg300=0.00 total={total}\n"
        "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
    )


def test_psi_polling_fires_on_the_stall_share(tmp_path: Path) -> None:
    path = tmp_path / "memory.pressure"
    path.write_text(_psi(1000))
    rec = Recorder()
    w = PressureWatcher(
        rec, psi=str(path), events=None, triggers=False, poll_interval=0.05, min_interval=0
    )
    w.start()
    try:
        assert w.sources[0].mode == "poll" and "triggers=False" in (w.sources[0].why or "")
        time.sleep(0.2)
        assert rec.events == []  # no stall since the start
        path.write_text(_psi(1000 + 60_000_000))  # 60 s of stall: above any share
        wait_for("a PSI polling callback", lambda: len(rec.events) >= 1)
    finally:
        assert w.stop()
    assert rec.events[0].source == "psi"
    assert rec.events[0].detail.startswith("some stall 60000 ms")


def test_trigger_refused_falls_back_to_polling(tmp_path: Path) -> None:
    class Refused(PressureWatcher):
        def _open_trigger(self, path: str) -> tuple[int, str]:
            raise OSError(errno.EACCES, "Permission denied")

    path = tmp_path / "memory.pressure"
    path.write_text(_psi(0))
    w = Refused(lambda e: None, psi=str(path), events=None, poll_interval=0.05)
    with w:
        (source,) = w.sources
        assert source.mode == "poll"
        assert "EACCES" in (source.why or "")
    assert any("EACCES" in note for note in w.notes)


def test_rate_limit_and_failing_callback(tmp_path: Path) -> None:
    path = tmp_path / "memory.events"
    path.write_text(EVENTS.format(high=0))
    calls = []

    def boom(event: PressureEvent) -> None:
        calls.append(event)
        raise RuntimeError("callback failed")

    w = PressureWatcher(boom, psi=None, events=str(path), poll_interval=0.05, min_interval=3600)
    with w:
        path.write_text(EVENTS.format(high=1))
        wait_for("the first callback", lambda: len(calls) == 1)
        path.write_text(EVENTS.format(high=2))
        wait_for("the rate limit to drop the second report", lambda: w.suppressed == 1)
        assert w.running  # the raising callback did not end the thread
    assert (w.fired, w.errors, len(calls)) == (1, 1, 1)


def test_lifecycle_misuse(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "memory.events"
    path.write_text(EVENTS.format(high=0))
    w = PressureWatcher(lambda e: None, psi=None, events=str(path))
    assert w.stop() is True  # before start
    w.start()
    with pytest.raises(RuntimeError, match="already running"):
        w.start()
    assert w.stop() is True
    assert w.stop() is True  # twice
    w.start()  # restartable
    assert w.running
    assert w.stop()

    nothing = PressureWatcher(lambda e: None, psi=None, events=None)
    with pytest.raises(OSError) as info:
        nothing.start()
    assert info.value.errno == errno.ENOENT and not nothing.running

    fds_before = len(os.listdir("/proc/self/fd"))

    def no_thread(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", no_thread)
    with pytest.raises(RuntimeError, match="cannot start"):
        w.start()
    monkeypatch.undo()
    assert not w.running and w.stop() is True
    assert len(os.listdir("/proc/self/fd")) == fds_before  # nothing leaked


def test_bad_arguments() -> None:
    for kwargs, error in [
        ({"window": 0.1}, ValueError),
        ({"window": 11}, ValueError),
        ({"stall": 2.0, "window": 1.0}, ValueError),
        ({"kind": "avg10"}, ValueError),
        ({"min_interval": -1}, ValueError),
        ({"poll_interval": 0}, ValueError),
        ({"psi": 5}, TypeError),
        ({"triggers": 1}, TypeError),
    ]:
        with pytest.raises(error):
            PressureWatcher(lambda e: None, events=None, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="callback"):
        PressureWatcher(5, psi=None, events=None)  # type: ignore[arg-type]


def test_find_sources_fixture(tmp_path: Path) -> None:
    cg = tmp_path / "sys/fs/cgroup/app"
    cg.mkdir(parents=True)
    (cg / "memory.pressure").write_text(_psi(0))
    (cg / "memory.events").write_text(EVENTS.format(high=0))
    (tmp_path / "proc/self").mkdir(parents=True)
    (tmp_path / "proc/self/cgroup").write_text("0::/app\n")
    (tmp_path / "proc/self/mountinfo").write_text(
        "30 22 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"
    )
    assert memlimits.find_sources(str(tmp_path)) == (
        str(cg / "memory.pressure"),
        str(cg / "memory.events"),
    )
    (tmp_path / "proc/self/cgroup").write_text("4:memory:/x\n")
    (tmp_path / "proc/pressure").mkdir()
    (tmp_path / "proc/pressure/memory").write_text(_psi(0))
    assert memlimits.find_sources(str(tmp_path)) == (str(tmp_path / "proc/pressure/memory"), None)
    assert memlimits.find_sources(str(tmp_path / "nothing")) == (None, None)
    with pytest.raises(TypeError):
        memlimits.find_sources(42)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------------
# for real: a PSI trigger, and memory pressure made in a 32 MiB cgroup v1

STREAM = """
echo $$ > {cgroup}/cgroup.procs
dd if=/dev/zero of={file} bs=1M count=256 2>/dev/null
end=$(($(date +%s) + 60))
while [ ! -e {stop} ] && [ $(date +%s) -lt $end ]; do cat {file} > /dev/null; done
"""


def test_psi_trigger_for_real(v1_cgroup: Path, tmp_path: Path) -> None:  # noqa: F811
    psi, _events = memlimits.find_sources()
    if psi is None:
        pytest.skip("no PSI file here (kernel without CONFIG_PSI?)")
    rec = Recorder()
    w = PressureWatcher(rec, stall=0.05, window=1.0, events=None, min_interval=0)
    w.start()
    stop = tmp_path / "stop"
    proc = None
    try:
        (source,) = w.sources
        if source.mode != "trigger":
            pytest.skip(f"the kernel took no PSI trigger on {source.path}: {source.why}")
        (v1_cgroup / "memory.limit_in_bytes").write_text(str(32 * MiB))
        script = STREAM.format(cgroup=v1_cgroup, file=tmp_path / "data", stop=stop)
        proc = subprocess.Popen(["sh", "-c", script])
        wait_for("the PSI trigger to fire under a 32 MiB cgroup's reclaim", lambda: rec.events, 60)
    finally:
        stop.touch()
        if proc is not None:
            proc.wait(timeout=60)
        assert w.stop()
    assert rec.events[0].source == "psi" and rec.events[0].path == source.path
    assert rec.events[0].detail.startswith("trigger 'some ")


def test_a_daemon_that_closes_and_reuses_descriptors(
    run_python: Callable[..., dict[str, Any]], tmp_path: Path
) -> None:
    """Issue 30: a program closing the descriptors it had and opening its own files under a
    running watcher: the watcher stops with one warning, never writes into nor closes the
    program's files (its wake pipe's numbers now name them)."""
    events = tmp_path / "memory.events"
    events.write_text(EVENTS.format(high=1))
    out = run_python(
        """
        import logging, time
        from memreclaim.pressure import PressureWatcher
        logging.basicConfig(level=logging.WARNING)
        w = PressureWatcher(lambda e: None, psi=None, events=EVENTS_PATH, poll_interval=0.05,
                            min_interval=0)
        w.start()
        os.closerange(3, 1024)  # a daemon: close what was inherited, then open its own files
        fds = [os.open(f"{DIR}/own{i}", os.O_RDWR | os.O_CREAT, 0o600) for i in range(32)]
        end = time.monotonic() + 60
        while w.running and time.monotonic() < end:
            time.sleep(0.01)
        running = w.running
        stopped = w.stop(timeout=30)
        still_open = []
        for fd in fds:
            try:
                os.fstat(fd)
                still_open.append(fd)
            except OSError:
                pass
        emit(running=running, stopped=stopped, open=len(still_open), notes=list(w.notes))
        """,
        params={"DIR": str(tmp_path), "EVENTS_PATH": str(events)},
        check=False,
    )
    assert out["returncode"] == 0, out["stderr"]
    assert out["running"] is False and out["stopped"] is True, out
    assert out["open"] == 32, f"the watcher closed {32 - out['open']} of the program's files"
    assert out["stderr"].count("closed or reused by the program") == 1, out["stderr"]
    for i in range(32):
        assert (tmp_path / f"own{i}").read_bytes() == b"", f"bytes written into file {i}"
