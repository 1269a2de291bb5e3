"""memreclaim.limits: cgroup v2 from fixture trees, cgroup v1 and RLIMIT_AS for real, and the
Done-when OOM scenario in a real 512 MiB cgroup v1."""

from __future__ import annotations

import contextlib
import errno
import os
import resource
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import memreclaim
from memreclaim import memlimits as limits_mod
from memreclaim._limits import UNLIMITED, Limits, read_limits

MiB = 1 << 20
V1_ROOT = Path("/sys/fs/cgroup/memory")


@pytest.fixture
def no_rlimits(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fixture trees test the cgroup reader alone: the rlimits read as unlimited."""
    infinity = (resource.RLIM_INFINITY, resource.RLIM_INFINITY)
    monkeypatch.setattr(limits_mod.resource, "getrlimit", lambda which: infinity)


def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def _v2(root: Path, cgroup: str, mount_root: str = "/", **files: str) -> Path:
    mountinfo = (
        "22 1 0:21 / /proc rw - proc proc rw\n"
        f"30 22 0:26 {mount_root} /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
    )
    return _tree(
        root,
        {"proc/self/cgroup": f"0::{cgroup}\n", "proc/self/mountinfo": mountinfo, **files},
    )


EVENTS = "low 0\nhigh 17\nmax 3\noom 1\noom_kill 1\noom_group_kill 0\n"


def test_cgroup2_tightest_ancestor_wins(tmp_path: Path, no_rlimits: None) -> None:
    cg = "sys/fs/cgroup/kubepods/pod1/ctr"
    _v2(
        tmp_path,
        "/kubepods/pod1/ctr",
        **{
            "sys/fs/cgroup/kubepods/memory.max": "max\n",
            "sys/fs/cgroup/kubepods/pod1/memory.max": f"{512 * MiB}\n",
            f"{cg}/memory.max": f"{1024 * MiB}\n",
            f"{cg}/memory.high": f"{400 * MiB}\n",
            f"{cg}/memory.current": f"{123 * MiB}\n",
            f"{cg}/memory.swap.max": "0\n",
            f"{cg}/memory.events": EVENTS,
        },
    )
    lim = read_limits(str(tmp_path))
    assert lim.source == "cgroup2"
    assert lim.limit == 512 * MiB
    assert lim.path == str(tmp_path / "sys/fs/cgroup/kubepods/pod1")
    assert lim.cgroup == str(tmp_path / cg)
    assert lim.high == 400 * MiB
    assert lim.current == 123 * MiB
    assert lim.swap_limit == 0
    assert lim.events["high"] == 17 and lim.events["oom_kill"] == 1
    assert lim.target() == 400 * MiB  # memory.high is below 90% of the limit
    assert lim.target(0.5) == 256 * MiB


def test_cgroup2_namespace_and_mount_root(tmp_path: Path, no_rlimits: None) -> None:
    # In a cgroup namespace the process sees "0::/" and the mount is its own cgroup.
    ns = _v2(tmp_path / "ns", "/", **{"sys/fs/cgroup/memory.max": f"{256 * MiB}\n"})
    lim = read_limits(str(ns))
    assert (lim.source, lim.limit) == ("cgroup2", 256 * MiB)
    assert lim.target() == int(256 * MiB * 0.9)
    # Without a namespace, a container's mount can be a subtree: paths are relative to it.
    sub = _v2(
        tmp_path / "sub",
        "/docker/abc/inner",
        mount_root="/docker/abc",
        **{"sys/fs/cgroup/inner/memory.max": f"{300 * MiB}\n"},
    )
    assert read_limits(str(sub)).limit == 300 * MiB


def test_cgroup2_unlimited_high_only_and_no_controller(tmp_path: Path, no_rlimits: None) -> None:
    unlimited = _v2(
        tmp_path / "a",
        "/x",
        **{"sys/fs/cgroup/x/memory.max": "max\n", "sys/fs/cgroup/x/memory.current": "4096\n"},
    )
    lim = read_limits(str(unlimited))
    assert (lim.source, lim.limit, lim.target()) == ("none", None, None)
    assert lim.current == 4096  # the usage is still reported
    high = _v2(
        tmp_path / "b",
        "/x",
        **{
            "sys/fs/cgroup/x/memory.max": "max\n",
            "sys/fs/cgroup/x/memory.high": f"{200 * MiB}\n",
        },
    )
    lim = read_limits(str(high))
    assert (lim.source, lim.limit) == ("cgroup2", None)
    assert lim.high == lim.target() == 200 * MiB
    no_memory = _v2(tmp_path / "c", "/x", **{"sys/fs/cgroup/x/cpu.max": "max 100000\n"})
    assert read_limits(str(no_memory)).source == "none"


def test_cgroup1_fixture_huge_is_none(tmp_path: Path, no_rlimits: None) -> None:
    mountinfo = "35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
    base = "sys/fs/cgroup/memory/app"
    _tree(
        tmp_path,
        {
            "proc/self/cgroup": "4:memory:/app\n1:cpu:/\n",
            "proc/self/mountinfo": mountinfo,
            f"{base}/memory.limit_in_bytes": "9223372036854771712\n",
            f"{base}/memory.soft_limit_in_bytes": "9223372036854771712\n",
            f"{base}/memory.usage_in_bytes": "1000\n",
            f"{base}/memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n",
            f"{base}/memory.failcnt": "5\n",
        },
    )
    lim = read_limits(str(tmp_path))
    assert (lim.source, lim.limit, lim.high) == ("none", None, None)
    assert dict(lim.events) == {"failcnt": 5, "oom_kill": 2}
    assert UNLIMITED <= 9223372036854771712


def test_nothing_readable(tmp_path: Path, no_rlimits: None) -> None:
    lim = read_limits(str(tmp_path))
    assert lim == Limits(source="none", limit=None, notes=("/proc/self/cgroup is not readable",))


def test_bad_arguments() -> None:
    with pytest.raises(TypeError, match="refresh"):
        memreclaim.limits(refresh="yes")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="root"):
        read_limits(42)  # type: ignore[arg-type]
    lim = Limits(source="cgroup1", limit=100 * MiB)
    with pytest.raises(ValueError, match="fraction"):
        lim.target(0)
    with pytest.raises(ValueError, match="fraction"):
        lim.target(1.5)
    with pytest.raises(TypeError, match="fraction"):
        lim.target("0.9")  # type: ignore[arg-type]
    with pytest.raises(AttributeError):
        lim.limit = 5  # type: ignore[misc]


def test_cached_and_refreshable() -> None:
    first = memreclaim.limits()
    assert memreclaim.limits() is first
    again = memreclaim.limits(refresh=True)
    assert again is not first and again.source == first.source
    assert memreclaim.limits() is again


def test_rlimit_as_for_real(run_python: Callable[..., dict[str, Any]]) -> None:
    out = run_python(
        """
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (LIMIT, resource.RLIM_INFINITY))
        lim = memreclaim.limits()
        emit(source=lim.source, limit=lim.limit, path=lim.path, target=lim.target())
        """,
        params={"LIMIT": 8 << 30},
    )
    assert out["limit"] <= 8 << 30  # a tighter cgroup would win: then it is not the rlimit
    if out["limit"] == 8 << 30:
        assert (out["source"], out["path"]) == ("rlimit_as", "RLIMIT_AS")
        assert out["target"] == int((8 << 30) * 0.9)


# ------------------------------------------------------------------------------------------------
# cgroup v1, for real


def _v1_writable() -> str | None:
    """Why a real cgroup v1 memory controller cannot be used here, or None when it can."""
    if os.geteuid() != 0:
        return "not root: creating a cgroup v1 needs root"
    if not (V1_ROOT / "memory.limit_in_bytes").exists():
        return f"no cgroup v1 memory controller mounted at {V1_ROOT}"
    if not os.access(V1_ROOT, os.W_OK):
        return f"{V1_ROOT} is not writable"
    return None


_counter = iter(range(1_000_000))


@pytest.fixture
def v1_cgroup() -> Iterator[Path]:
    """A fresh cgroup v1 memory cgroup, removed afterwards even when the test fails."""
    why = _v1_writable()
    if why:
        pytest.skip(why)
    path = V1_ROOT / f"memreclaim-test-{os.getpid()}-{next(_counter)}"
    try:
        path.mkdir()
    except OSError as exc:
        pytest.skip(f"cannot create a cgroup v1 at {path}: {exc}")
    try:
        yield path
    finally:
        # Move any survivor out, then remove; a dying process may take a moment to leave.
        deadline = time.monotonic() + 30
        while True:
            for pid in (path / "cgroup.procs").read_text().split():
                with contextlib.suppress(OSError):  # it exited meanwhile
                    (V1_ROOT / "cgroup.procs").write_text(pid)
            try:
                path.rmdir()
                break
            except OSError as exc:
                if time.monotonic() > deadline:
                    raise AssertionError(f"could not remove the test cgroup {path}: {exc}") from exc
                time.sleep(0.1)


JOIN = """
with open(CGROUP + "/cgroup.procs", "w") as f:
    f.write(str(os.getpid()))
"""


def test_cgroup1_for_real(v1_cgroup: Path, run_python: Callable[..., dict[str, Any]]) -> None:
    (v1_cgroup / "memory.limit_in_bytes").write_text(str(512 * MiB))
    (v1_cgroup / "memory.soft_limit_in_bytes").write_text(str(384 * MiB))
    out = run_python(
        JOIN
        + """
lim = memreclaim.limits()
emit(source=lim.source, limit=lim.limit, high=lim.high, path=lim.path, current=lim.current,
     events=dict(lim.events), target=lim.target(), rss=memreclaim.rss())
""",
        params={"CGROUP": str(v1_cgroup)},
    )
    assert out["source"] == "cgroup1"
    assert out["limit"] == 512 * MiB
    assert out["high"] == 384 * MiB
    assert out["path"] == str(v1_cgroup)
    assert out["target"] == 384 * MiB
    assert out["events"]["failcnt"] == 0
    assert 0 < out["current"] < 512 * MiB


OOM_WORKLOAD = (
    JOIN
    + """
import time
from memreclaim import workloads

events = []

def wait_for(what, check):  # bounded: fails the workload with a message, never hangs
    end = time.monotonic() + 120
    while not check():
        if time.monotonic() > end:
            emit(completed=False, waited_for=what, events=len(events))
            raise SystemExit(0)
        time.sleep(0.05)

if TRIM:  # the runner at its defaults (limit="auto" reads this cgroup's limit)
    runner = memreclaim.BackgroundTrimmer(on_trim=events.append)
    runner.start()
    cache = [bytes(4096) for _ in range(12_000)]  # 48 MiB that stays live: trims give nothing
    wait_for("an unproductive trim before the spike", lambda: any(not e.productive for e in events))
unproductive_before = sum(1 for e in events if not e.productive)
data = workloads.strings(150_000)            # ~330 MiB of malloc'd strings
survivors = workloads.keep_every(data, 50)   # keep 2%: the heap is fragmented
del data
if TRIM:  # between the two phases of the service the runner gets its turn (bounded, not timed)
    mark = len(events)
    wait_for("a productive trim after the free", lambda: any(e.productive for e in events[mark:]))
buffers = [bytearray(10 << 20) for _ in range(30)]   # 300 MiB of fresh buffers, touched
for b in buffers:
    b[::4096] = b"x" * len(b[::4096])
if TRIM:
    runner.stop()
emit(completed=True, trims=len(events), unproductive=unproductive_before,
     released=sum(e.released for e in events),
     limit=runner.policy.limit if TRIM else None)
"""
)


@pytest.mark.parametrize("trim", [False, True], ids=["no-trim", "trim"])
def test_oom_scenario_cgroup1(
    v1_cgroup: Path, run_python: Callable[..., dict[str, Any]], trim: bool
) -> None:
    """Done when: 512 MiB limit, fragmented 330 MiB spike, 2% kept, then 300 MiB of buffers."""
    (v1_cgroup / "memory.limit_in_bytes").write_text(str(512 * MiB))
    memsw = v1_cgroup / "memory.memsw.limit_in_bytes"
    if memsw.exists():  # no swapping out of the problem
        memsw.write_text(str(512 * MiB))
    params = {"CGROUP": str(v1_cgroup), "TRIM": trim}

    def oom_kills() -> int:
        for line in (v1_cgroup / "memory.oom_control").read_text().splitlines():
            if line.startswith("oom_kill "):
                return int(line.split()[1])
        return -1

    if not trim:
        with pytest.raises(AssertionError, match=r"workload failed \(-9\)"):
            run_python(OOM_WORKLOAD, params=params)
        assert oom_kills() >= 1, "killed by SIGKILL but the cgroup counted no OOM kill"
    else:
        out = run_python(OOM_WORKLOAD, params=params)
        assert out["completed"], f"the runner never made {out.get('waited_for')}"
        assert out["limit"] == 512 * MiB  # limit="auto" found the cgroup's limit
        assert out["unproductive"] >= 1  # the trims before the spike gave nothing back
        assert out["released"] > 200 * MiB
        assert oom_kills() == 0


# ---- the usage alarm (cgroup v1 thresholds) ----------------------------------------------------


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_usage_alarm_failure_modes(tmp_path: Path) -> None:
    """No cgroup files: OSError with errno, nothing left open; bad thresholds: clear errors."""
    before = _open_fds()
    with pytest.raises(OSError) as info:
        limits_mod.UsageAlarm(str(tmp_path), 64 * MiB)
    assert info.value.errno == errno.ENOENT
    assert _open_fds() == before
    with pytest.raises(ValueError, match="threshold"):
        limits_mod.UsageAlarm(str(tmp_path), 0)
    with pytest.raises(TypeError, match="threshold"):
        limits_mod.UsageAlarm(str(tmp_path), 1.5)  # type: ignore[arg-type]
    assert _open_fds() == before


ALARM = (
    JOIN
    + """
import select, time
from memreclaim._limits import UsageAlarm
usage = lambda: int(open(CGROUP + "/memory.usage_in_bytes").read())
alarm = UsageAlarm(CGROUP, usage() + 64 * MiB)
quiet = alarm.wait(0)
blocks = [bytearray(8 * MiB) for _ in range(16)]      # 128 MiB, touched: crosses the threshold
for b in blocks:
    b[::4096] = b"x" * len(b[::4096])
fired = alarm.wait(60)                                # bounded; the kernel says at once
alarm.poke()
poked = alarm.wait(0)
fd = alarm.fileno()
alarm.close()
alarm.close()                                         # idempotent
emit(quiet=quiet, fired=fired, poked=poked, after_close=alarm.wait(0), fileno=alarm.fileno(),
     fd_open=os.path.exists(f"/proc/self/fd/{fd}"))
"""
)


def test_usage_alarm_fires_when_usage_crosses(
    v1_cgroup: Path, run_python: Callable[..., dict[str, Any]]
) -> None:
    (v1_cgroup / "memory.limit_in_bytes").write_text(str(1024 * MiB))
    out = run_python(ALARM, params={"CGROUP": str(v1_cgroup), "MiB": MiB})
    assert out == {
        "quiet": False,
        "fired": True,
        "poked": True,
        "after_close": False,
        "fileno": -1,
        "fd_open": False,
    }


ALARM_RUNNER = (
    JOIN
    + """
import asyncio, time
from memreclaim import workloads
usage = lambda: int(open(CGROUP + "/memory.usage_in_bytes").read())
data = workloads.strings(150_000)            # ~330 MiB, 2 % kept: retained by the allocator
survivors = workloads.keep_every(data, 50)
del data
events = []
# A soft limit whose mark (90 %) is 64 MiB above the usage now, and a tick interval far longer
# than this test's deadline: only the alarm at the mark can wake the runner in time.
options = dict(interval=120, limit=int((usage() + 64 * MiB) / 0.9), on_trim=events.append)

def burst():                                  # 128 MiB of fresh buffers cross the mark
    blocks = [bytearray(8 * MiB) for _ in range(16)]
    for b in blocks:
        b[::4096] = b"x" * len(b[::4096])
    return blocks

if KIND == "thread":
    runner = memreclaim.BackgroundTrimmer(**options)
    runner.start()
    armed = runner.limit_alarm is not None
    blocks = burst()
    end = time.monotonic() + 60
    while not events and time.monotonic() < end:
        time.sleep(0.05)
    stopped = runner.stop()
else:
    async def main():
        runner = memreclaim.Watchdog(**options)
        runner.start()
        await asyncio.sleep(0)                # the task starts and registers the alarm
        armed = runner.limit_alarm is not None
        blocks = burst()
        end = time.monotonic() + 60
        while not events and time.monotonic() < end:
            await asyncio.sleep(0.05)
        await runner.stop()
        return runner, armed
    runner, armed = asyncio.run(main())
    stopped = not runner.running
emit(armed=armed, trims=len(events), released=sum(e.released for e in events),
     reason=events[0].reason if events else None, gate=events[0].gate if events else None,
     stopped=stopped, alarm_after_stop=runner.limit_alarm is not None)
"""
)


@pytest.mark.parametrize("kind", ["thread", "asyncio"])
def test_runner_wakes_at_the_limit_mark_through_the_alarm(
    v1_cgroup: Path, run_python: Callable[..., dict[str, Any]], kind: str
) -> None:
    """Between two ticks (120 s apart), a burst crossing the soft limit's mark is trimmed;
    the asyncio Watchdog does not wait for an idle loop there."""
    (v1_cgroup / "memory.limit_in_bytes").write_text(str(1024 * MiB))
    params = {"CGROUP": str(v1_cgroup), "MiB": MiB, "KIND": kind}
    out = run_python(ALARM_RUNNER, params=params, timeout=180)
    assert out["armed"], "no usage alarm was registered in the cgroup v1"
    assert out["trims"] >= 1, "the runner did not wake at the mark within 60 s (ticks: 120 s)"
    assert out["released"] > 150 * MiB
    assert "limit" in out["reason"]
    assert out["gate"] in ("thread", "ungated")
    assert out["stopped"] and not out["alarm_after_stop"]
