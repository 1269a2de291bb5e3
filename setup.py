"""Build the C extension; all metadata lives in pyproject.toml."""

import sys

from setuptools import Extension, setup

LIMITED_API = 0x030A0000  # abi3 floor: CPython 3.10

core = Extension(
    "memreclaim._core",
    sources=[
        "src/memreclaim/_core.c",
        "src/memreclaim/procfs.c",
        "src/memreclaim/alloc.c",
    ],
    depends=["src/memreclaim/memreclaim.h"],
    define_macros=[("Py_LIMITED_API", hex(LIMITED_API))],
    py_limited_api=True,
    libraries=["dl"],
    extra_compile_args=["-std=c11", "-Wall", "-Wextra"],
)

# Pool reclaim uses the arena-allocator API, which is outside the limited API: its own module,
# Linux only (mincore, madvise, dladdr), never an abi3 build.
pools = Extension(
    "memreclaim._pools",
    sources=["src/memreclaim/_pools.c"],
    depends=["src/memreclaim/memreclaim.h"],
    libraries=["dl"],
    extra_compile_args=["-std=c11", "-Wall", "-Wextra"],
)

ext_modules = [core]
if sys.platform.startswith("linux"):
    ext_modules.append(pools)

setup(
    ext_modules=ext_modules,
    options={"bdist_wheel": {"py_limited_api": "cp310"}},
)
