"""The smaller findings of issue 30, each a clear error at the call or documented behaviour: a
runner's tiny interval, a huge stop timeout, a start that fails, the start-up hook under
``python -I``/``-E``, ``run -- /dev/null``, the handler's signals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest

import memreclaim
from memreclaim import _validate


def test_a_tiny_interval_is_refused() -> None:
    """interval=1e-9 was accepted and busy-looped: below 1 ms is a ValueError now."""
    for bad in (1e-9, 1e-6, _validate.MIN_INTERVAL / 2):
        with pytest.raises(ValueError, match=r"interval must be at least 0\.001 seconds"):
            memreclaim.BackgroundTrimmer(interval=bad, limit=None)
    trimmer = memreclaim.BackgroundTrimmer(interval=_validate.MIN_INTERVAL, limit=None)
    assert trimmer.interval == _validate.MIN_INTERVAL
    with pytest.raises(ValueError, match="at least"):
        _validate.seconds("x", 0.5, minimum=1.0)
    assert _validate.seconds("x", 0, allow_zero=True, minimum=1.0) == 0.0


def test_stop_with_a_huge_timeout_does_not_overflow() -> None:
    """stop(timeout=1e300) raised OverflowError: a timeout is clamped to ~31 years."""
    trimmer = memreclaim.BackgroundTrimmer(interval=3000, limit=None)
    assert trimmer.stop(timeout=1e300) is True  # never started
    trimmer.start()
    assert trimmer.running
    assert trimmer.stop(timeout=1e300) is True
    assert not trimmer.running


def test_a_start_that_fails_sets_no_allocator_knob(
    run_python: Callable[..., dict[str, Any]],
) -> None:
    """A runner whose thread cannot start left glibc's thresholds pinned: it sets none now
    (memreclaim's own record and its log line; glibc has no getter for mallopt)."""
    out = run_python(
        """
        import logging, threading
        from memreclaim import glibc
        records = []
        class Keep(logging.Handler):
            def emit(self, record):
                records.append(record.getMessage())
        logging.getLogger("memreclaim").addHandler(Keep())
        logging.getLogger("memreclaim").setLevel(logging.INFO)
        real = threading.Thread.start
        def refuse(self):
            raise RuntimeError("can't start new thread")
        threading.Thread.start = refuse
        trimmer = memreclaim.BackgroundTrimmer(interval=1, limit=None, thresholds=True)
        try:
            trimmer.start()
            error = None
        except RuntimeError as exc:
            error = str(exc)
        failed = {"error": error, "set": glibc._thread_fix_made(),
                  "pinned": any("pinned glibc" in r for r in records)}
        threading.Thread.start = real
        trimmer.start()
        ok = {"set": glibc._thread_fix_made(), "pinned": any("pinned glibc" in r for r in records)}
        trimmer.stop()
        emit(failed=failed, ok=ok, allocator=memreclaim.allocator())
        """
    )
    assert "cannot start" in out["failed"]["error"]
    assert out["failed"]["set"] is False and out["failed"]["pinned"] is False, out
    if out["allocator"] == "glibc":
        assert out["ok"]["set"] is True, out  # a start that works does set them


@pytest.mark.parametrize("flag", ["-I", "-E"])
def test_the_start_up_hook_does_nothing_under_isolated_or_ignore_environment(flag: str) -> None:
    """``python -I``/``-E`` asks the interpreter to ignore its environment: MEMRECLAIM=1
    included (the hook imports nothing, starts nothing)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMRECLAIM")}
    env.pop("LD_PRELOAD", None)
    env["MEMRECLAIM"] = "1"
    code = "import sys; print(sorted(m for m in sys.modules if m.startswith('memreclaim')))"
    plain = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert "memreclaim.runners.autostart" in plain.stdout, plain.stderr  # the hook works
    isolated = subprocess.run(
        [sys.executable, flag, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert isolated.returncode == 0, isolated.stderr
    assert isolated.stdout.strip() == "[]", isolated.stdout
    # the entry point itself says no too (a .pth of an older install may still call it)
    from memreclaim.runners import autostart

    src = os.path.dirname(os.path.dirname(os.path.dirname(autostart.__file__)))
    probe = subprocess.run(
        [
            sys.executable,
            flag,
            "-c",
            f"import sys; sys.path[:0] = [{src!r}]\n"
            "from memreclaim.runners import autostart\n"
            "print(autostart.__file__.startswith(sys.path[0]), autostart.from_environment())",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert probe.stdout.strip() == "True None", (probe.stdout, probe.stderr)


def test_run_dev_null_says_what_it_is(tmp_path: Any) -> None:
    """``run -- /dev/null`` said "no such file"."""

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "memreclaim", "run", "--", *argv],
            capture_output=True,
            text=True,
            timeout=120,
        )

    null = run("/dev/null")
    assert null.returncode == 1
    assert "'/dev/null': it is a character device, not a Python script" in null.stderr
    assert "no such file" in run(str(tmp_path / "missing.py")).stderr
    assert "a directory without __main__.py" in run(str(tmp_path)).stderr
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert "it is a FIFO" in run(str(fifo)).stderr  # refused without opening it (no hang)


def test_the_handler_takes_only_user_and_realtime_signals() -> None:
    """The handler accepted SIGSEGV, SIGTERM...: only SIGUSR1, SIGUSR2 and real-time signals."""
    for bad in (signal.SIGSEGV, signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD):
        with pytest.raises(ValueError, match="SIGUSR1, SIGUSR2 or a real-time signal"):
            memreclaim.install_signal_handler(bad)
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # nothing changed
