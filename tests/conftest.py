"""Shared test helpers.

Memory is process-global state: every test that measures it runs its workload in a fresh
interpreter (``run_python``), so one test's heap cannot decide another's. ``run_child`` is the
one way to start such an interpreter: ``run_python`` and every test that runs the command line,
a benchmark or a stress script go through it.
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import json
import os
import re
import select
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

# Each test process (each xdist worker) has a temporary directory of its own, made here before
# any test module reads tempfile.gettempdir() and passed on to every process the tests start
# ($TMPDIR). The remote-trim handlers publish there (memreclaim-PID): a directory left by a
# killed target can then only meet a later process of the same worker, never another worker's
# test or a later run, and it is removed after the test that left it (_no_stale_handler_dirs).
# Sticky and world-writable like /tmp: the attack tests' second user creates files in it too.
# Made beside, not inside, the controller's (workers inherit its $TMPDIR), with a short name:
# Ray puts AF_UNIX sockets under $TMPDIR, and their paths must stay under 108 bytes.
_TMP_BASE = os.environ.setdefault("PYTEST_MEMRECLAIM_TMP_BASE", tempfile.gettempdir())
_OWN_TMP = tempfile.mkdtemp(
    prefix=f"mrt-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}-", dir=_TMP_BASE
)
os.chmod(_OWN_TMP, 0o1777)
os.environ["TMPDIR"] = _OWN_TMP
tempfile.tempdir = None  # gettempdir() reads $TMPDIR again
atexit.register(shutil.rmtree, _OWN_TMP, True)
_HANDLER_DIR = re.compile(r"^memreclaim-(\d+)(-[^/]*)?$")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@pytest.fixture(autouse=True)
def _no_stale_handler_dirs() -> Iterator[None]:
    """After each test, remove the handler directories its processes left behind: those of a
    process that is gone (killed targets run no exit handler). A later process given the same
    pid would find them in the way of a test that makes that directory itself."""
    yield
    for name in os.listdir(_OWN_TMP):
        match = _HANDLER_DIR.match(name)
        if match and not _pid_alive(int(match.group(1))):
            shutil.rmtree(os.path.join(_OWN_TMP, name), ignore_errors=True)


# The allocators' runtime libraries, found by soname (any major version: mimalloc is
# libmimalloc.so.2 in Debian 12, libmimalloc.so.3 in 13+), never by a hard-coded path.
_ALLOCATOR_SONAMES = {
    "jemalloc": re.compile(r"libjemalloc\.so\.(\d+)$"),
    "mimalloc": re.compile(r"libmimalloc\.so\.(\d+)$"),
    "tcmalloc": re.compile(r"libtcmalloc_minimal\.so\.(\d+)$"),
}
_INSTALL_HINT = (
    "apt-get install libjemalloc2 libmimalloc3 (or libmimalloc2.0) libtcmalloc-minimal4t64"
)


def _find_allocator_libs() -> dict[str, Path | None]:
    """Each allocator's library with the highest major version: from the dynamic linker's cache
    (``ldconfig -p``), else from the multiarch library folders."""
    candidates: list[Path] = []
    ldconfig = shutil.which("ldconfig") or next(
        (p for p in ("/sbin/ldconfig", "/usr/sbin/ldconfig") if os.path.exists(p)), None
    )
    if ldconfig is not None:
        try:
            listing = subprocess.run(
                [ldconfig, "-p"], capture_output=True, text=True, timeout=30, check=False
            ).stdout
        except (OSError, subprocess.TimeoutExpired):
            listing = ""
        for line in listing.splitlines():
            if "=>" in line and ("x86-64" in line or "64bit" in line or "(libc6)" in line):
                candidates.append(Path(line.split("=>", 1)[1].strip()))
    for folder in sorted({*glob.glob("/usr/lib/*-linux-gnu"), *glob.glob("/lib/*-linux-gnu")}):
        candidates.extend(Path(p) for p in glob.glob(f"{folder}/lib*malloc*.so.*"))
    found: dict[str, Path | None] = {}
    for name, pattern in _ALLOCATOR_SONAMES.items():
        best: tuple[int, Path] | None = None
        for path in candidates:
            match = pattern.match(path.name)
            if match and path.exists() and (best is None or int(match[1]) > best[0]):
                best = (int(match[1]), path)
        found[name] = best[1] if best else None
    return found


ALLOCATOR_LIBS = _find_allocator_libs()

# benchmarks/ sits beside tests/ (in the checkout and the sdist) and is importable by the tests:
# a benchmark and the tests of the same thing share one copy of its probe or plumbing there
# (bench_import.CHILD, bench_servers.launch/stop_server). Appended, so it shadows nothing.
BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.append(str(BENCHMARKS))

# Prelude for workload scripts: the burst spike (memreclaim.workloads) and an independent
# /proc reader.
PRELUDE = '''
import gc, json, os, random, sys
import memreclaim
from memreclaim import workloads

PAGE = os.sysconf("SC_PAGESIZE")

def statm():
    """(resident, anonymous) bytes read from /proc/self/statm without memreclaim."""
    with open("/proc/self/statm") as f:
        fields = f.read().split()
    return int(fields[1]) * PAGE, (int(fields[1]) - int(fields[2])) * PAGE

def seed000_spike(keep_every=50):
    """workloads.strings(): 160,000 strings of 600-4,000 bytes; keep every 50th."""
    data = workloads.strings()
    return data, workloads.keep_every(data, keep_every)

def emit(**values):
    print("RESULT " + json.dumps(values), flush=True)
'''


def run_child(
    args: Sequence[str] = (),
    *,
    code: str | None = None,
    env: Mapping[str, str] | None = None,
    keep_preload: bool = False,
    timeout: float = 180,
    cwd: Path | str | None = None,
    user: str | None = None,
    stdout: int | None = None,
    prefix: Sequence[str] = (),
) -> subprocess.CompletedProcess[str]:
    """Run ``[prefix] sys.executable [-c code] *args``; return its CompletedProcess (text).

    The child gets this environment without ``LD_PRELOAD`` (unless ``keep_preload``: e.g. under
    the sanitizers) and without ``PYTHONUNBUFFERED`` (it buffers its output as a user's
    interpreter does), plus ``env``. ``prefix`` is a command that runs the interpreter
    (``unshare -m``); ``user`` runs it as that uid/gid via setpriv. ``stdout`` is a file
    descriptor for its standard output (``.stdout`` is then None); by default it is captured.
    Raises AssertionError, saying what was run, if it is still running after ``timeout`` s.
    """
    full_env = dict(os.environ)
    if not keep_preload:
        full_env.pop("LD_PRELOAD", None)
    full_env.pop("PYTHONUNBUFFERED", None)
    full_env.update(env or {})
    command = [*prefix, sys.executable, *(["-c", code] if code is not None else []), *args]
    if user is not None:
        command = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", *command]
    try:
        return subprocess.run(
            command,
            stdout=subprocess.PIPE if stdout is None else stdout,
            stderr=subprocess.PIPE,
            text=True,
            env=full_env,
            cwd=cwd,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as exc:
        shown = " ".join(
            command if code is None else [*prefix, sys.executable, "-c", "<code>", *args]
        )
        raise AssertionError(
            f"{shown} still running after {timeout:g} s; its output so far:\n"
            f"{_text(exc.stdout)}\n{_text(exc.stderr)}"
        ) from None


def skip_unless_user_runs_python(user: str) -> None:
    """Skip the test when ``user`` cannot start this interpreter (a pyenv build whose libpython
    lies under /root, mode 0700), saying why; the one probe every test that runs as another
    user shares."""
    probe = run_child(code="pass", user=user, cwd=Path("/"), keep_preload=True)
    if probe.returncode != 0:
        pytest.skip(f"user {user} cannot run this interpreter: {probe.stderr.strip()}")


def _text(data: str | bytes | None) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else (data or "")


def _run(
    code: str,
    env: Mapping[str, str] | None = None,
    timeout: float = 180,
    params: Mapping[str, Any] | None = None,
    prelude: bool = True,
    *,
    keep_preload: bool = False,
    check: bool = True,
) -> dict[str, Any]:
    """Run a workload (PRELUDE + params + code) in a fresh interpreter; return what it emitted.

    With ``check=False`` a non-zero exit is allowed: the result then also holds the child's
    ``returncode``, ``stdout`` and ``stderr`` (and the emitted values, if any).
    """
    header = "".join(f"{name} = {value!r}\n" for name, value in (params or {}).items())
    proc = run_child(
        code=(PRELUDE if prelude else "") + header + textwrap.dedent(code),
        env=env,
        keep_preload=keep_preload,
        timeout=timeout,
    )
    emitted: dict[str, Any] | None = None
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("RESULT "):
            emitted = json.loads(line[len("RESULT ") :])
            break
    if not check:
        raw = {"returncode": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr}
        return {**(emitted or {}), **raw}
    assert proc.returncode == 0, f"workload failed ({proc.returncode}):\n{proc.stderr}"
    if emitted is None:
        raise AssertionError(f"workload printed no RESULT line:\n{proc.stdout}\n{proc.stderr}")
    return emitted


@contextlib.contextmanager
def ready_child(code: str, deadline: float = 120.0) -> Iterator[subprocess.Popen[str]]:
    """A child interpreter running ``code`` for the length of the ``with`` block, once it has
    printed ``ready`` (within ``deadline`` seconds, or the test fails saying so); killed after.
    For tests that look at another live process (its /proc files, a signal, a trim from outside).
    """
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], deadline)
        line = proc.stdout.readline() if ready else ""
        if line.strip() != "ready":
            proc.kill()
            _, err = proc.communicate(timeout=60)
            raise AssertionError(f"the child did not print 'ready' within {deadline} s: {err}")
        yield proc
    finally:
        proc.kill()
        proc.wait()


def shared_library(source: str, folder: Path, name: str) -> Path:
    """Compile C ``source`` into ``folder/lib<name>.so`` (an LD_PRELOAD shim), or skip."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip(f"no C compiler to build lib{name}.so")
    c_file = folder / f"{name}.c"
    c_file.write_text(source)
    library = folder / f"lib{name}.so"
    proc = subprocess.run(
        [compiler, "-O1", "-shared", "-fPIC", "-o", str(library), str(c_file), "-ldl"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, f"lib{name}.so did not compile:\n{proc.stderr}"
    return library


def pytest_report_header() -> str:
    seed = os.environ.get("MEMRECLAIM_FUZZ_SEED", "0")
    return f"memreclaim fuzz seed: {seed} (MEMRECLAIM_FUZZ_SEED)"


@pytest.fixture
def run_python() -> Callable[..., dict[str, Any]]:
    """Run workload code in a fresh interpreter; it reports with ``emit(key=value, ...)``.

    ``params`` become module-level constants of the workload. ``prelude=False`` runs the code
    in a bare interpreter (no PRELUDE, no memreclaim): it prints its own ``RESULT {json}`` line.
    ``env`` is added to the
    environment (``LD_PRELOAD`` is dropped unless ``keep_preload=True``); ``timeout`` bounds the
    run; ``check=False`` returns ``returncode``/``stdout``/``stderr`` too, for workloads that are
    expected to fail.
    """
    return _run


def allocator_lib(name: str) -> Path:
    """The installed library of an allocator, or skip (fail in CI, where they must be
    installed)."""
    lib = ALLOCATOR_LIBS[name]
    if lib is None:
        pattern = _ALLOCATOR_SONAMES[name].pattern
        if os.environ.get("MEMRECLAIM_REQUIRE_ALLOCATORS"):
            pytest.fail(f"no {pattern} found but MEMRECLAIM_REQUIRE_ALLOCATORS is set")
        pytest.skip(f"no library matching {pattern} is installed ({_INSTALL_HINT})")
    return lib


def peak_rss(pid: int) -> int:
    """VmHWM of process pid: its peak resident size, which proves a spike happened even if a
    trimmer already gave part of it back before the test looked."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmHWM in /proc/{pid}/status")
