"""memreclaim._daemon.DaemonThread: the one daemon-thread lifecycle (start, stop, stop before start,
restart, a thread that cannot start, a failing setup, stop from the thread itself, fork)."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

import pytest

from memreclaim._daemon import DaemonThread, _at_exit

Setup = Callable[[threading.Event], tuple[Callable[[], object], Callable[[], None] | None]]


def _waiting(log: list[str], woken: threading.Event | None = None) -> Setup:
    """A setup whose thread waits for its stop event; cleanup is logged."""

    def setup(stop_event: threading.Event) -> tuple[Callable[[], object], Callable[[], None]]:
        log.append("setup")

        def target() -> None:
            log.append("running")
            stop_event.wait(60)  # the overall deadline: stop() ends it long before
            log.append("ended")

        return target, lambda: log.append("cleanup")

    return setup


def test_stop_before_start_and_twice_returns_true_at_once() -> None:
    worker = DaemonThread("Test", "t-never")
    assert not worker.running and worker.thread is None
    assert worker.stop(timeout=0) is True
    assert worker.stop() is True


def test_start_stop_restart() -> None:
    log: list[str] = []
    worker = DaemonThread("Test", "t-restart")
    for _ in range(2):
        worker.start(_waiting(log))
        assert worker.running and worker.thread is not None
        assert worker.thread.daemon and worker.thread.name == "t-restart"
        with pytest.raises(RuntimeError, match="'t-restart' is already running"):
            worker.start(_waiting(log))
        assert worker.stop(timeout=30) is True
        assert not worker.running
    assert log.count("ended") == 2 and "cleanup" not in log


def test_a_thread_that_cannot_start_cleans_up_and_raises_now(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    log: list[str] = []
    worker = DaemonThread("Test", "t-refused")

    def refuse(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", refuse)
    with pytest.raises(RuntimeError, match="Test 't-refused' cannot start: can't start new"):
        worker.start(_waiting(log))
    monkeypatch.undo()
    assert log == ["setup", "cleanup"]
    assert not worker.running and worker.stop(timeout=0) is True
    _at_exit()  # what atexit runs: nothing to stop, nothing raised
    worker.start(_waiting(log))  # and it starts once threads can
    assert worker.stop(timeout=30) is True


def test_a_failing_setup_starts_nothing() -> None:
    worker = DaemonThread("Test", "t-setup")

    def setup(stop_event: threading.Event) -> tuple[Callable[[], object], None]:
        raise OSError(2, "nothing to watch")

    with pytest.raises(OSError, match="nothing to watch"):
        worker.start(setup)
    assert not worker.running and worker.stop() is True


def test_wake_is_called_by_stop_and_stop_from_the_thread_only_asks() -> None:
    woken = threading.Event()
    asked: list[bool] = []
    has_asked = threading.Event()
    worker = DaemonThread("Test", "t-self", wake=woken.set)

    def setup(stop_event: threading.Event) -> tuple[Callable[[], object], None]:
        def target() -> None:
            asked.append(worker.stop(timeout=1))  # from the thread itself: no self-join
            has_asked.set()
            stop_event.wait(60)  # set by its own stop(): returns at once

        return target, None

    worker.start(setup)
    assert has_asked.wait(60), "the thread's own stop() did not return"
    assert worker.stop(timeout=30) is True
    assert asked == [False] and woken.is_set()


def test_stopped_runs_only_once_the_thread_has_ended() -> None:
    calls: list[str] = []
    worker = DaemonThread("Test", "t-stopped")
    worker.start(_waiting([]))
    assert worker.stop(timeout=30, stopped=lambda: calls.append("stopped")) is True
    assert worker.stop(stopped=lambda: calls.append("again")) is True  # never ran: not called
    assert calls == ["stopped"]


def test_bad_arguments() -> None:
    with pytest.raises(TypeError, match="name must be a str"):
        DaemonThread("Test", 5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="wake must be a callable"):
        DaemonThread("Test", "t", wake=3)  # type: ignore[arg-type]
    worker = DaemonThread("Test", "t-bad")
    with pytest.raises(ValueError, match="timeout"):
        worker.stop(timeout=-1)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_in_a_forked_child_the_thread_is_not_running_and_can_start_again() -> None:
    worker = DaemonThread("Test", "t-fork")
    worker.start(_waiting([]))
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, then leave at once
        try:
            ok = not worker.running and worker.stop(timeout=0) is True
            worker.start(_waiting([]))
            ok = ok and worker.running and worker.stop(timeout=30) is True
            os.write(write, b"1" if ok else b"0")
        finally:
            os._exit(0)
    os.close(write)
    try:
        assert os.read(read, 1) == b"1"
    finally:
        os.close(read)
        os.waitpid(pid, 0)
    assert worker.running  # the parent's thread is untouched
    assert worker.stop(timeout=30) is True


def test_remote_takes_the_lifecycle_from_the_api_layer_not_from_a_runner() -> None:
    # remote (a face) used runners._base.DaemonThread, a private module of another layer's
    # package: the lifecycle lives in memreclaim._daemon, below both.
    import ast
    from pathlib import Path

    import memreclaim.remote

    tree = ast.parse(Path(memreclaim.remote.__file__).read_text())
    imported = {
        (node.level, node.module or "")
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
        if alias.name == "DaemonThread"
    }
    assert imported == {(1, "_daemon")}


def test_the_runners_shared_settings_are_declared_once() -> None:
    """Watchdog and BackgroundTrimmer keep explicit signatures (docs/api.md is checked against
    them); every setting they share is a field of one record, _base._Settings, with the same
    default (name aside: each runner has its own)."""
    import dataclasses
    import inspect as pyinspect

    from memreclaim.runners import BackgroundTrimmer, Watchdog
    from memreclaim.runners._base import _Runner, _Settings

    fields = {f.name: f.default for f in dataclasses.fields(_Settings)}
    assert fields.pop("name") is dataclasses.MISSING
    for runner in (Watchdog, BackgroundTrimmer):
        params = pyinspect.signature(runner.__init__).parameters
        for name, default in fields.items():
            assert params[name].default == default, (runner.__name__, name)
    assert list(pyinspect.signature(_Runner.__init__).parameters) == ["self", "settings"]
