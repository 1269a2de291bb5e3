"""Reports that say which library leaks: C code built here for the purpose, measured in a fresh
interpreter through ``measure()`` (trace="auto").

* a refcount leak in a C extension (``mr_refleak.make`` returns a bytes object with one reference
  too many): a Python leak whose allocating frame is the caller's line; the report names the
  extension;
* a native leak in a shared library (``leaky_keep_record`` mallocs 1 KiB and never frees it,
  called 2,048 times per call of ``leaky_call``): the report names the function and the shared
  object (memray's native traces; skipped without memray), and the bytes per call.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import shared_library

pytestmark = pytest.mark.timeout(600)

C_SOURCES = Path(__file__).resolve().parent / "c"  # mr_refleak.c, mr_leaky.c


def _extension(folder: Path) -> Path:
    compiler = shutil.which("cc") or shutil.which("gcc")
    include = sysconfig.get_paths()["include"]
    if compiler is None or not Path(include, "Python.h").exists():
        pytest.skip("no C compiler or Python headers to build the extension")
    source = C_SOURCES / "mr_refleak.c"
    target = folder / ("mr_refleak" + sysconfig.get_config_var("EXT_SUFFIX"))
    proc = subprocess.run(
        [compiler, "-O1", "-shared", "-fPIC", f"-I{include}", "-o", str(target), str(source)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return target


def _run(run_python: Callable[..., dict[str, Any]], folder: Path, module: str) -> dict[str, Any]:
    (folder / "workmod.py").write_text(module)
    code = f"""
import sys
sys.path.insert(0, {str(folder)!r})
import memreclaim, workmod
report = memreclaim.measure(workmod.work, repeat=3, warmup=1, calls=workmod.CALLS)
emit(kind=report.kind, verdict=report.verdict, text=report.format(),
     native_owner=report.native_owner, per_call=report.leak_per_call,
     sites=[str(s) for s in report.top_sites])
"""
    return run_python(code, timeout=550)


def test_a_refcount_leak_in_a_c_extension_names_the_extension(
    run_python: Callable[..., dict[str, Any]], tmp_path: Path
) -> None:
    _extension(tmp_path)
    r = _run(
        run_python,
        tmp_path,
        "import mr_refleak\nCALLS = 2000\n"
        "def work():\n    for _ in range(CALLS):\n        mr_refleak.make(1000)\n",
    )
    assert r["kind"] == "python_leak", r["text"]
    assert "allocated inside mr_refleak" in r["verdict"], r["text"]
    assert "C extension mr_refleak" in r["verdict"], r["text"]
    assert 1000 <= r["per_call"] <= 1200, r["text"]  # 1,000 bytes + a bytes object's header
    assert any("workmod.py:5" in s and "[inside mr_refleak" in s for s in r["sites"]), r["text"]


def test_a_native_leak_names_the_function_and_shared_object(
    run_python: Callable[..., dict[str, Any]], tmp_path: Path
) -> None:
    pytest.importorskip("memray", reason="memray names the allocating function")
    library = shared_library((C_SOURCES / "mr_leaky.c").read_text(), tmp_path, "mrnativeleak")
    r = _run(
        run_python,
        tmp_path,
        f"import ctypes\nlib = ctypes.CDLL({str(library)!r})\nCALLS = 1\n"
        "def work():\n    lib.leaky_call(2048)\n",
    )
    assert r["kind"] == "native_leak", r["text"]
    assert r["native_owner"] == f"leaky_keep_record in {library}", r["text"]
    assert f"allocated in leaky_keep_record in {library}" in r["verdict"], r["text"]
    assert "called from leaky_call" in r["text"], r["text"]
    assert 2 * 1024 * 1024 <= r["per_call"] <= 2.4 * 1024 * 1024, r["text"]


def test_a_leak_memray_cannot_see_names_no_function(
    run_python: Callable[..., dict[str, Any]], tmp_path: Path
) -> None:
    # ctypes calls libc's malloc through a pointer memray's hooks do not patch: its traces hold
    # other blocks (pymalloc's arenas...), which must not be named as the leak's allocator.
    # libc.so.6's own malloc: CDLL(None) would find a non-PIE interpreter's PLT entry for malloc
    # (Debian's /usr/bin/python3), whose GOT slot memray does patch.
    pytest.importorskip("memray", reason="the extra pass needs memray")
    r = _run(
        run_python,
        tmp_path,
        "import ctypes\nlibc = ctypes.CDLL('libc.so.6')\nlibc.malloc.restype = ctypes.c_void_p\n"
        "libc.malloc.argtypes = [ctypes.c_size_t]\nCALLS = 1\n"
        "def work():\n    ctypes.memset(libc.malloc(1 << 20), 1, 1 << 20)\n",
    )
    assert r["kind"] == "native_leak", r["text"]
    assert r["native_owner"] is None, r["text"]
    assert "memray's traces did not see most of the leaked blocks" in r["text"], r["text"]


def test_without_memray_the_native_pass_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    from memreclaim.diagnosis._native import NativeTrace, library_of

    monkeypatch.setitem(sys.modules, "memray", None)  # import memray -> ImportError
    trace = NativeTrace("glibc")
    with trace:
        assert trace.reason is not None
    assert trace.sites() == "memray is not installed: the allocating function is not named"
    assert library_of("no_such_function_anywhere_xyz") is None
    assert library_of("malloc") is not None  # libc's, found by dladdr


@pytest.mark.parametrize("allocator", ["jemalloc", "tcmalloc", "mimalloc", "unknown"])
def test_the_native_pass_runs_under_glibc_malloc_only(
    allocator: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # memray's mmap hook allocates inside jemalloc while it holds an arena lock: a hang (CI's
    # matrix, 3.13 + jemalloc). The tracker must not even be created under another allocator.
    from memreclaim.diagnosis._native import NativeTrace

    class Refused:
        def __getattr__(self, name: str) -> object:
            raise AssertionError(f"memray.{name} used under {allocator}")

    monkeypatch.setitem(sys.modules, "memray", Refused())
    trace = NativeTrace(allocator)
    with trace:
        assert trace.reason is not None
    found = trace.sites()
    assert isinstance(found, str)
    assert found.startswith("memray's native tracker is run under glibc's malloc only"), found
    assert f"here {allocator}" in found, found
