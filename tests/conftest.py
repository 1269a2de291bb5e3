"""Shared test helpers.

Memory is process-global state: every test that measures it runs its workload in a fresh
interpreter (``run_python``), so one test's heap cannot decide another's.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

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

# Prelude for workload scripts: the seed 000 spike and an independent /proc reader.
PRELUDE = '''
import gc, json, os, random, sys
import memreclaim

PAGE = os.sysconf("SC_PAGESIZE")

def statm():
    """(resident, anonymous) bytes read from /proc/self/statm without memreclaim."""
    with open("/proc/self/statm") as f:
        fields = f.read().split()
    return int(fields[1]) * PAGE, (int(fields[1]) - int(fields[2])) * PAGE

def seed000_spike(keep_every=50):
    """160,000 strings of 600-4,000 bytes (malloc's, not pymalloc's); keep every 50th."""
    r = random.Random(0)
    data = [("x" * r.randint(600, 4000), r.random()) for _ in range(160_000)]
    survivors = data[::keep_every]
    return data, survivors

def emit(**values):
    print("RESULT " + json.dumps(values))
'''


def _run(
    code: str,
    env: dict[str, str] | None = None,
    timeout: float = 180,
    params: dict[str, Any] | None = None,
    prelude: bool = True,
) -> dict[str, Any]:
    header = "".join(f"{name} = {value!r}\n" for name, value in (params or {}).items())
    full_env = dict(os.environ)
    full_env.pop("LD_PRELOAD", None)
    if env:
        full_env.update(env)
    proc = subprocess.run(
        [sys.executable, "-c", (PRELUDE if prelude else "") + header + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
    )
    assert proc.returncode == 0, f"workload failed ({proc.returncode}):\n{proc.stderr}"
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("RESULT "):
            result: dict[str, Any] = json.loads(line[len("RESULT ") :])
            return result
    raise AssertionError(f"workload printed no RESULT line:\n{proc.stdout}\n{proc.stderr}")


@pytest.fixture
def run_python() -> Callable[..., dict[str, Any]]:
    """Run workload code in a fresh interpreter; it reports with ``emit(key=value, ...)``.

    ``params`` become module-level constants of the workload. ``prelude=False`` runs the code
    in a bare interpreter (no PRELUDE, no memreclaim): it prints its own ``RESULT {json}`` line.
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
