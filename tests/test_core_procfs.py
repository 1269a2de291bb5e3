"""The core's readers of a process's /proc files (``_core.process_status``, ``process_rollup``,
``process_heap_mapping``, ``process_identity``): the one place /proc figures are parsed
(``inspect PID`` and ``trim --pid`` use them). Figures are checked against the kernel's own
files read here, and every failure mode."""

from __future__ import annotations

import errno
import mmap
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import ready_child, run_child, skip_unless_user_runs_python

import memreclaim
from memreclaim import _core

MiB = 1 << 20
READERS = (_core.process_status, _core.process_rollup, _core.process_heap_mapping)


def oracle_heap(pid: int) -> int | None:
    """The [heap] mapping's size, from the test's own reading of /proc/PID/maps."""
    total = None
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        if line.endswith("[heap]"):
            start, end = (int(x, 16) for x in line.split()[0].split("-"))
            total = (total or 0) + end - start
    return total


@pytest.fixture
def holder() -> Iterator[subprocess.Popen[str]]:
    """A child holding ~64 MiB of anonymous and ~16 MiB of shared memory, until the test ends."""
    code = textwrap.dedent(
        """
        import mmap, time
        b = b'x' * (64 << 20)
        shm = mmap.mmap(-1, 16 << 20)
        shm.write(b'y' * (16 << 20))
        print('ready', flush=True)
        time.sleep(120)
        """
    )
    with ready_child(code) as proc:
        yield proc


def test_status_of_another_process(holder: subprocess.Popen[str]) -> None:
    st = memreclaim.asdict(_core.process_status(holder.pid))
    assert st["name"] == Path(f"/proc/{holder.pid}/comm").read_text().strip()
    assert st["threads"] == len(os.listdir(f"/proc/{holder.pid}/task"))
    assert st["rss_anon"] > 60 * MiB
    assert st["rss_shmem"] > 15 * MiB
    assert st["rss"] == st["rss_anon"] + st["rss_file"] + st["rss_shmem"]
    assert st["peak_rss"] >= st["rss"]
    assert st["virtual"] > st["rss"]
    assert st["swap"] is not None and st["swap"] >= 0


def test_status_of_self_agrees_with_stats() -> None:
    st = memreclaim.asdict(_core.process_status(os.getpid()))
    own = memreclaim.stats()
    assert st["name"] == Path("/proc/self/comm").read_text().strip()
    # the same parser reads /proc/self/status for stats(): the slow-moving fields agree
    assert st["rss_shmem"] == own.rss_shmem
    assert st["swap"] == own.swap
    assert st["peak_rss"] <= own.peak_rss


def test_rollup_of_another_process(holder: subprocess.Popen[str]) -> None:
    rollup = memreclaim.asdict(_core.process_rollup(holder.pid))
    assert set(rollup) == {"pss", "private_dirty", "shared_clean", "anonymous", "anon_huge_pages"}
    assert rollup["anonymous"] > 60 * MiB
    assert rollup["private_dirty"] > 60 * MiB
    assert rollup["pss"] > 60 * MiB
    assert all(v is not None and v >= 0 for v in rollup.values())


def test_heap_mapping_matches_maps_with_many_long_lines(tmp_path: Path) -> None:
    # Hundreds of mappings of files with long names: /proc/self/maps is read in several chunks,
    # with lines cut at chunk boundaries.
    maps = []
    for i in range(300):
        path = tmp_path / (f"{i:04d}" + "n" * 200)
        path.write_bytes(b"\0" * mmap.PAGESIZE)
        with path.open("rb") as f:
            maps.append(mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ))
    try:
        assert len(Path("/proc/self/maps").read_bytes()) > 4 * 8192
        assert _core.process_heap_mapping(os.getpid()) == oracle_heap(os.getpid())
    finally:
        for m in maps:
            m.close()


def test_heap_mapping_of_another_process(holder: subprocess.Popen[str]) -> None:
    size = _core.process_heap_mapping(holder.pid)
    assert size == oracle_heap(holder.pid)
    assert size is None or size > 0


def test_a_process_without_memory_has_none_figures() -> None:
    kthreadd = Path("/proc/2/status")
    if not kthreadd.exists() or "kthreadd" not in kthreadd.read_text():
        pytest.skip("no kernel thread visible in this PID namespace")
    st = memreclaim.asdict(_core.process_status(2))
    assert st["name"] == "kthreadd"
    assert st["rss"] is None and st["rss_anon"] is None


@pytest.mark.parametrize("reader", READERS, ids=lambda r: r.__name__)
def test_missing_process_is_process_lookup_error(reader: object) -> None:
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())  # never handed out
    with pytest.raises(ProcessLookupError) as info:
        reader(pid_max)  # type: ignore[operator]
    assert info.value.errno == errno.ESRCH
    assert info.value.filename.startswith(f"/proc/{pid_max}/")


def test_exited_process_is_process_lookup_error() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()  # reaped: its pid names no process (until reused, which takes pid_max forks)
    with pytest.raises(ProcessLookupError):
        _core.process_status(proc.pid)


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="needs root and setpriv to read a process's files as another user",
)
def test_unreadable_files_are_permission_errors() -> None:
    code = textwrap.dedent(
        f"""
        from memreclaim import _core
        print(_core.process_status({os.getpid()}).rss > 0)
        for reader in (_core.process_rollup, _core.process_heap_mapping):
            try:
                reader({os.getpid()})
            except PermissionError as exc:
                print(type(exc).__name__, exc.filename)
        """
    )
    skip_unless_user_runs_python("65534")
    # keep_preload: under the sanitizers the child needs the ASan runtime preloaded too
    proc = run_child(code=code, user="65534", cwd=Path("/"), keep_preload=True)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "True"  # status is world-readable
    assert lines[1:] == [
        f"PermissionError /proc/{os.getpid()}/smaps_rollup",
        f"PermissionError /proc/{os.getpid()}/maps",
    ]


BAD_PIDS = [
    (0, ValueError),
    (-1, ValueError),
    (1 << 40, ValueError),
    (True, TypeError),
    ("1", TypeError),
    (1.0, TypeError),
    (None, TypeError),
]


@pytest.mark.parametrize("reader", READERS, ids=lambda r: r.__name__)
@pytest.mark.parametrize(("pid", "error"), BAD_PIDS)
def test_bad_pid(reader: object, pid: object, error: type[Exception]) -> None:
    with pytest.raises(error, match="pid"):
        reader(pid)  # type: ignore[operator]


def test_readers_return_struct_sequences_whose_dicts_keep_the_old_keys() -> None:
    # process_status/process_rollup returned dicts before 0.3: asdict() gives those keys back.
    st = _core.process_status(os.getpid())
    rollup = _core.process_rollup(os.getpid())
    assert isinstance(st, _core.ProcessStatus) and isinstance(st, tuple)
    assert isinstance(rollup, _core.ProcessRollup) and isinstance(rollup, tuple)
    assert list(memreclaim.asdict(st)) == [
        "name",
        "threads",
        "rss",
        "rss_anon",
        "rss_file",
        "rss_shmem",
        "swap",
        "peak_rss",
        "virtual",
    ]
    assert list(memreclaim.asdict(rollup)) == [
        "pss",
        "private_dirty",
        "shared_clean",
        "anonymous",
        "anon_huge_pages",
    ]
    assert st.name == Path("/proc/self/comm").read_text().strip()
    assert st.threads == len(os.listdir("/proc/self/task"))
    assert rollup.anonymous is not None and rollup.anonymous > 0


# ---- process_identity: who a process is (the remote command's trust in a pid) ------------------


def oracle_start_time(pid: int) -> int:
    """Field 22 of /proc/PID/stat, read here: the fields after the last ')' (the command may
    hold ')' and blanks). Read relative to the open /proc/PID directory, as the C core reads it:
    qemu-user (the arm64 wheels' tests) answers a path naming the emulated process itself
    (/proc/self/stat, /proc/OWNPID/stat) with a stat of its own making, whose start time can be a
    tick off the kernel's."""
    directory = os.open(f"/proc/{pid}", os.O_RDONLY | os.O_DIRECTORY)
    try:
        fd = os.open("stat", os.O_RDONLY, dir_fd=directory)
    finally:
        os.close(directory)
    with os.fdopen(fd) as f:
        text = f.read()
    return int(text.rsplit(")", 1)[1].split()[19])


def test_identity_of_self() -> None:
    identity = _core.process_identity(os.getpid())
    assert isinstance(identity, _core.ProcessIdentity) and isinstance(identity, tuple)
    assert memreclaim.asdict(identity) == {
        "uid": os.geteuid(),
        "start_time": oracle_start_time(os.getpid()),
    }


def test_identity_of_a_child_whose_command_holds_parentheses_and_blanks() -> None:
    # The command (stat's field 2) is whatever the process names itself: ") 1 2 (" must not shift
    # the fields counted after it.
    code = "open('/proc/self/comm', 'w').write(') 1 2 ) x (')\nprint('ready', flush=True)\n"
    code += "import time\ntime.sleep(120)\n"
    with ready_child(code) as proc:
        assert Path(f"/proc/{proc.pid}/comm").read_text().strip() == ") 1 2 ) x ("
        identity = _core.process_identity(proc.pid)
        assert identity.start_time == oracle_start_time(proc.pid)
        assert identity.start_time >= _core.process_identity(os.getpid()).start_time
        assert identity.uid == os.geteuid()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a child another effective uid")
def test_identity_is_the_effective_uid() -> None:
    code = "import os\nos.setresuid(0, 65534, 0)\nprint('ready', flush=True)\n"
    code += "import time\ntime.sleep(120)\n"
    with ready_child(code) as proc:
        uids = Path(f"/proc/{proc.pid}/status").read_text().split("Uid:")[1].split()[:4]
        assert uids == ["0", "65534", "0", "65534"]  # real, effective, saved, filesystem
        assert _core.process_identity(proc.pid).uid == 65534


def test_identity_of_a_missing_process() -> None:
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())  # never handed out
    with pytest.raises(ProcessLookupError) as info:
        _core.process_identity(pid_max)
    assert info.value.errno == errno.ESRCH
    assert info.value.filename == f"/proc/{pid_max}"
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()  # reaped: its pid names no process (until reused, which takes pid_max forks)
    with pytest.raises(ProcessLookupError):
        _core.process_identity(proc.pid)


@pytest.mark.parametrize(("pid", "error"), BAD_PIDS)
def test_identity_bad_pid(pid: object, error: type[Exception]) -> None:
    with pytest.raises(error, match="pid"):
        _core.process_identity(pid)  # type: ignore[arg-type]
