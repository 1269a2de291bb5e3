"""Build the C extension; all metadata lives in pyproject.toml."""

import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_py import build_py

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

# The start-up hook (docs/integrations.md, "One variable"): one line that site runs at every
# interpreter start; with MEMRECLAIM unset it is one dict look-up and imports nothing. It sits at
# the top of site-packages, beside the package, in wheels and in editable installs alike.
HOOK = Path(__file__).parent / "src" / "memreclaim-autostart.pth"


class build_py_with_hook(build_py):
    """build_py, plus the start-up hook at the root of the build (so of the wheel)."""

    def run(self) -> None:
        super().run()
        self.copy_file(str(HOOK), str(Path(self.build_lib, HOOK.name)), preserve_mode=False)


cmdclass: dict[str, type] = {"build_py": build_py_with_hook}

try:  # an editable wheel holds a path hook, not build_lib: add the start-up hook to it too
    from setuptools.command.editable_wheel import editable_wheel
except ImportError:  # a setuptools without PEP 660 editable installs
    pass
else:

    class _WithHook:
        """Wraps setuptools' editable strategy: writes the start-up hook beside its own .pth."""

        def __init__(self, inner: object) -> None:
            self.inner = inner

        def __enter__(self) -> "_WithHook":
            self.inner.__enter__()  # type: ignore[attr-defined]
            return self

        def __exit__(self, *exc: object) -> object:
            return self.inner.__exit__(*exc)  # type: ignore[attr-defined]

        def __call__(self, wheel: object, files: object, mapping: object) -> None:
            self.inner(wheel, files, mapping)  # type: ignore[operator]
            wheel.writestr(HOOK.name, HOOK.read_bytes())  # type: ignore[attr-defined]

    class editable_wheel_with_hook(editable_wheel):  # type: ignore[misc]
        """editable_wheel, plus the start-up hook (setuptools >= 64 selects a strategy)."""

        def _select_strategy(self, *args: object, **kwargs: object) -> object:
            return _WithHook(super()._select_strategy(*args, **kwargs))

    cmdclass["editable_wheel"] = editable_wheel_with_hook

setup(
    ext_modules=[core, pools] if with_pools else [core],
    cmdclass=cmdclass,
)
