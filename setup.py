"""Build the C extension; all metadata lives in pyproject.toml."""

import sys

from setuptools import Extension, setup

# Linux only (procfs, glibc's malloc_trim, madvise): stop a build elsewhere with one message
# before the compiler's errors would (an sdist can still be made anywhere).
if not sys.platform.startswith("linux") and "sdist" not in sys.argv[1:]:
    sys.exit(
        f"memreclaim supports Linux only (it reads /proc and drives the C allocator through "
        f"glibc/jemalloc/mimalloc/tcmalloc); this platform is {sys.platform!r}, nothing was built."
    )

# No limited API (abi3): one wheel per interpreter, like numpy and psutil where the ABI needs it.
# Free-threaded builds reject the limited API (Python.h #errors on Py_LIMITED_API with
# Py_GIL_DISABLED), and the per-interpreter-GIL slot is hidden below limited API 3.12.
core = Extension(
    "memreclaim._core",
    sources=[
        "src/memreclaim/module.c",
        "src/memreclaim/heap.c",
        "src/memreclaim/inspect.c",
        "src/memreclaim/knobs.c",
        "src/memreclaim/procfs.c",
        "src/memreclaim/detect.c",
        "src/memreclaim/backends.c",
        "src/memreclaim/thp.c",
        "src/memreclaim/diag.c",
    ],
    depends=["src/memreclaim/memreclaim.h", "src/memreclaim/diag.h"],
    libraries=["dl"],
    extra_compile_args=["-std=c11", "-Wall", "-Wextra"],
)

# Pool reclaim uses the arena-allocator API, which is outside the limited API: its own module,
# Linux only (mincore, madvise, dladdr), never an abi3 build, built for each CPython from 3.11
# (the module refuses, with the reason, builds whose pymalloc layout it does not know).
pools = Extension(
    "memreclaim._pools",
    sources=[
        "src/memreclaim/_pools.c",
        "src/memreclaim/_pools_table.c",
        "src/memreclaim/_pools_validate.c",
        "src/memreclaim/_pools_reclaim.c",
        "src/memreclaim/_pools_selftest.c",
    ],
    depends=[
        "src/memreclaim/memreclaim.h",
        "src/memreclaim/_pools.h",
        "src/memreclaim/_pools_layout.h",
    ],
    libraries=["dl", "pthread"],
    extra_compile_args=["-std=c11", "-Wall", "-Wextra"],
)

with_pools = (
    sys.platform.startswith("linux")
    and sys.implementation.name == "cpython"
    and sys.version_info[:2] >= (3, 11)
)

setup(
    ext_modules=[core, pools] if with_pools else [core],
)
