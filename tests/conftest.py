"""Shared test helpers.

Memory is process-global state: every test that measures it runs its workload in a fresh
interpreter (``run_python``), so one test's heap cannot decide another's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

LIBDIR = Path("/usr/lib/x86_64-linux-gnu")
ALLOCATOR_LIBS = {
    "jemalloc": LIBDIR / "libjemalloc.so.2",
    "mimalloc": LIBDIR / "libmimalloc.so.2",
    "tcmalloc": LIBDIR / "libtcmalloc_minimal.so.4",
}

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
    """The Debian library of an allocator, or skip (fail in CI, where they must be installed)."""
    lib = ALLOCATOR_LIBS[name]
    if not lib.exists():
        if os.environ.get("MEMRECLAIM_REQUIRE_ALLOCATORS"):
            pytest.fail(f"{lib} is missing but MEMRECLAIM_REQUIRE_ALLOCATORS is set")
        pytest.skip(
            f"{lib} is not installed (apt-get install libjemalloc2 libmimalloc2.0 "
            "libtcmalloc-minimal4)"
        )
    return lib
