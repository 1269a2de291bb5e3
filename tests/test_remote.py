"""Trimming a running process from outside: the signal handler for real, and sys.remote_exec on
3.14+ (in CI: the interpreter matrix runs this file on Debian forky's 3.14)."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import memreclaim
from memreclaim import remote

MiB = 1 << 20
PAGE = os.sysconf("SC_PAGESIZE")

# A service that spiked: the fragmented heap stays resident until someone trims.
TARGET = """
import logging, os, signal, sys, time
import memreclaim
from memreclaim import workloads
logging.basicConfig(level=logging.INFO, stream=sys.stderr)
if HANDLER:
    memreclaim.install_signal_handler(signal.SIGUSR2)
statm = lambda: [int(x) for x in open("/proc/self/statm").read().split()]
base = statm()
data = workloads.strings(160_000)
survivors = workloads.keep_every(data, 50)
del data
peak = statm()
page = os.sysconf("SC_PAGESIZE")
print("READY", os.getpid(), (base[1] - base[2]) * page, (peak[1] - peak[2]) * page, flush=True)
end = time.monotonic() + 120
while time.monotonic() < end and not os.path.exists(STOP):
    time.sleep(0.05)
"""


def anon(pid: int) -> int:
    with open(f"/proc/{pid}/statm") as f:
        fields = f.read().split()
    return (int(fields[1]) - int(fields[2])) * PAGE


def wait_for(what: str, condition: Callable[[], bool], deadline: float = 60.0) -> None:
    end = time.monotonic() + deadline
    while not condition():
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {deadline:g} s waiting for {what}")
        time.sleep(0.05)


class Target:
    def __init__(self, proc: subprocess.Popen[str], stop: Path, stderr: Path) -> None:
        self.proc = proc
        self.stop = stop
        self.stderr = stderr
        line = self._readline(180)
        assert line.startswith("READY"), f"target did not start: {line!r}\n{self.log()}"
        _, pid, base, peak = line.split()
        self.pid, self.base, self.peak = int(pid), int(base), int(peak)
        assert self.peak - self.base > 200 * MiB, "the spike did not stay resident"

    def _readline(self, deadline: float) -> str:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], deadline)
        if not ready:
            raise AssertionError(f"target printed nothing within {deadline} s")
        return self.proc.stdout.readline()

    def log(self) -> str:
        """What the target has written to its stderr so far (its log)."""
        return self.stderr.read_text(errors="replace")

    def close(self) -> str:
        self.stop.touch()
        try:
            self.proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate(timeout=60)
        return self.log()


@pytest.fixture
def spiking(tmp_path: Path) -> Iterator[Callable[..., Target]]:
    targets: list[Target] = []

    def start(handler: bool = True, argv: list[str] | None = None) -> Target:
        stop = tmp_path / f"stop-{len(targets)}"
        code = f"HANDLER = {handler!r}\nSTOP = {str(stop)!r}\n" + TARGET
        # stderr goes to a file: a test can wait for a log line while the target runs
        stderr = tmp_path / f"stderr-{len(targets)}"
        with open(stderr, "w") as err:
            proc = subprocess.Popen(
                [*(argv or [sys.executable]), "-c", code],
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
            )
        target = Target(proc, stop, stderr)
        targets.append(target)
        return target

    yield start
    for target in targets:
        target.close()


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "memreclaim", *args],
        capture_output=True,
        text=True,
        timeout=180,
    )


def test_cli_trim_pid_through_the_signal_handler(spiking: Callable[..., Target]) -> None:
    target = spiking()
    before = anon(target.pid)
    proc = cli("trim", "--pid", str(target.pid), "--json", "--method", "signal")
    assert proc.returncode == 0, proc.stderr
    answer = json.loads(proc.stdout)
    assert answer["via"] == "signal" and answer["pid"] == target.pid
    assert answer["result"]["released"] > 100 * MiB
    # The memory is given back, seen from outside: most of the spike above the baseline.
    spike = before - target.base
    wait_for(
        "the target's anonymous RSS to drop", lambda: anon(target.pid) < target.base + spike / 2
    )
    stats = cli("stats", "--pid", str(target.pid), "--json")
    assert stats.returncode == 0, stats.stderr
    figures = json.loads(stats.stdout)["result"]
    assert figures["rss_anon"] < target.base + spike / 2
    assert figures["python"] == sys.version.split()[0]


def test_unknown_allocator_is_said_not_hidden(spiking: Callable[..., Target]) -> None:
    hide = ["env", "MEMRECLAIM_TEST_HIDE_SYMBOLS=malloc_trim", sys.executable]
    target = spiking(argv=hide)
    proc = cli("trim", "--pid", str(target.pid), "--method", "signal")
    assert proc.returncode == 1
    assert "allocator was not detected (unknown): nothing was trimmed" in proc.stderr


def test_bare_signal_trims_and_logs(spiking: Callable[..., Target]) -> None:
    target = spiking()
    spike = anon(target.pid) - target.base
    os.kill(target.pid, signal.SIGUSR2)
    # The helper thread logs once trim() has returned: wait for the line, not for the RSS drop
    # (which shows while malloc_trim still works: stopping the target then lost the log line).
    wait_for("the target to log 'trimmed on signal'", lambda: "trimmed on signal" in target.log())
    assert anon(target.pid) < target.base + spike / 2, target.log()
    target.close()


def test_no_way_in_is_a_clear_error(spiking: Callable[..., Target], tmp_path: Path) -> None:
    if hasattr(sys, "remote_exec"):
        pytest.skip("with sys.remote_exec there is a way in")
    target = spiking(handler=False)
    proc = cli("trim", "--pid", str(target.pid))
    assert proc.returncode == 1
    assert "sys.remote_exec needs Python 3.14+" in proc.stderr
    assert "install_signal_handler" in proc.stderr
    # A marker left by an earlier process with the same pid is not believed.
    directory = remote.state_dir(target.pid)
    directory.mkdir(mode=0o700)
    try:
        (directory / "handler.json").write_text(
            json.dumps({"pid": target.pid, "signal": 12, "start_time": 1})
        )
        with pytest.raises(remote.RemoteError, match="no memreclaim signal handler"):
            remote.request(target.pid, method="signal")
    finally:
        (directory / "handler.json").unlink()
        directory.rmdir()
    assert target.proc.poll() is None  # the stale marker's signal was never sent


def test_request_bad_arguments() -> None:
    done = subprocess.run(["true"], check=True)
    assert done.returncode == 0
    gone = subprocess.Popen(["true"])
    gone.wait()
    with pytest.raises(ProcessLookupError):
        remote.request(gone.pid)
    with pytest.raises(ValueError, match="command"):
        remote.request(os.getpid(), "purge")
    with pytest.raises(ValueError, match="method"):
        remote.request(os.getpid(), method="ptrace")
    with pytest.raises(ValueError):
        remote.request(0)
    with pytest.raises(TypeError):
        remote.request("1")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        remote.request(os.getpid(), timeout=0)
    assert cli("trim").returncode == 2  # --pid is required
    assert cli("trim", "--pid", "-3").returncode == 2


def test_install_signal_handler_failure_modes(run_python: Callable[..., dict[str, Any]]) -> None:
    with pytest.raises(TypeError):
        memreclaim.install_signal_handler("SIGUSR2")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        memreclaim.install_signal_handler(True)
    for bad in (0, 4096, signal.SIGKILL, signal.SIGSTOP, signal.SIGSEGV, signal.SIGTERM, 9):
        with pytest.raises(ValueError):
            memreclaim.install_signal_handler(bad)
    errors: list[BaseException] = []

    def in_thread() -> None:
        try:
            memreclaim.install_signal_handler(signal.SIGUSR2)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=in_thread)
    thread.start()
    thread.join(30)
    assert len(errors) == 1 and isinstance(errors[0], ValueError)
    assert "main thread" in str(errors[0])
    assert signal.getsignal(signal.SIGUSR2) == signal.SIG_DFL  # nothing changed

    out = run_python(
        """
        import signal
        first = memreclaim.install_signal_handler(signal.SIGUSR2)
        again = memreclaim.install_signal_handler(signal.SIGUSR2)
        try:
            memreclaim.install_signal_handler(signal.SIGUSR1)
            other = "installed"
        except RuntimeError as exc:
            other = str(exc)
        marker = json.load(open(first / "handler.json"))
        pid = os.fork()
        if pid == 0:  # a forked child: its inherited handler does nothing
            os.kill(os.getpid(), signal.SIGUSR2)
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        emit(same=first == again, other=other, marker=marker, child=status, pid=os.getpid(),
             directory=str(first))
        """
    )
    assert out["same"]
    assert "already installed for signal" in out["other"]
    assert out["marker"]["pid"] == out["pid"] and out["marker"]["signal"] == signal.SIGUSR2
    assert out["child"] == 0
    assert not os.path.exists(out["directory"])  # removed at exit


# ------------------------------------------------------------------------------------------------
# sys.remote_exec on Python 3.14


@pytest.mark.skipif(
    not hasattr(sys, "remote_exec"),
    reason="sys.remote_exec needs Python 3.14+ (CI runs this file on forky's 3.14 in the"
    " matrix step)",
)
def test_cli_trim_pid_through_remote_exec(spiking: Callable[..., Target]) -> None:
    target = spiking(handler=False)
    before = anon(target.pid)
    proc = cli("trim", "--pid", str(target.pid), "--json")
    assert proc.returncode == 0, proc.stderr
    answer = json.loads(proc.stdout)
    assert answer["via"] == "remote_exec" and answer["pid"] == target.pid, answer
    assert answer["result"]["allocator"] == "glibc", answer
    assert answer["result"]["released"] > 100 * MiB
    spike = before - target.base
    wait_for(
        "the 3.14 target's anonymous RSS to drop",
        lambda: anon(target.pid) < target.base + spike / 2,
    )


def test_remote_answers_have_the_local_keys(spiking: Callable[..., Target]) -> None:
    """``stats --pid --json``'s result is the document ``stats --json`` prints; ``trim --pid``'s
    is every TrimResult field (both built with memreclaim.asdict)."""
    target = spiking()
    local = cli("stats", "--json")
    assert local.returncode == 0, local.stderr
    remote_stats = cli("stats", "--pid", str(target.pid), "--json")
    assert remote_stats.returncode == 0, remote_stats.stderr
    figures = json.loads(remote_stats.stdout)["result"]
    assert list(figures) == list(json.loads(local.stdout))
    assert figures["pid"] == target.pid
    text = cli("stats", "--pid", str(target.pid))
    assert text.returncode == 0, text.stderr
    assert text.stdout.startswith(f"pid {target.pid}, Python {sys.version.split()[0]}")
    assert "rss_anon" in text.stdout
    trimmed = cli("trim", "--pid", str(target.pid), "--json", "--method", "signal")
    assert trimmed.returncode == 0, trimmed.stderr
    result = json.loads(trimmed.stdout)["result"]
    assert list(result) == list(memreclaim.TrimResult.__match_args__)
