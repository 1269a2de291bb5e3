"""mr_alloc_symbol, the C core's one symbol rule (memreclaim.h), seen from the extension's own
exported symbol: a name resolves in the object that serves malloc, by detection's rule, and is
NULL when that object lacks it, when it is another allocator's, or when detection hides it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from conftest import allocator_lib

PROBE = """
import ctypes
from memreclaim import _core
lib = ctypes.CDLL(_core.__file__)
lookup = lib.mr_alloc_symbol
lookup.restype = ctypes.c_void_p
lookup.argtypes = [ctypes.c_char_p]
names = ["malloc", "malloc_trim", "mallinfo2", "mallopt", "mallctl", "mi_collect",
         "MallocExtension_ReleaseFreeMemory", "memreclaim_no_such_symbol"]
emit(allocator=_core.allocator(), found={n: bool(lookup(n.encode())) for n in names},
     null=lookup(None))
"""

EXPECTED = {
    "glibc": {"malloc", "malloc_trim", "mallinfo2", "mallopt"},
    "jemalloc": {"malloc", "mallctl"},
    "mimalloc": {"malloc", "mi_collect"},
    "tcmalloc": {"malloc", "MallocExtension_ReleaseFreeMemory"},
}


@pytest.mark.parametrize("allocator", sorted(EXPECTED))
def test_a_name_resolves_in_the_allocator_serving_malloc(
    run_python: Callable[..., dict[str, Any]], allocator: str
) -> None:
    env = {} if allocator == "glibc" else {"LD_PRELOAD": str(allocator_lib(allocator))}
    out = run_python(PROBE, env=env)
    assert out["allocator"] == allocator, out
    found = {name for name, present in out["found"].items() if present}
    # glibc's own names are absent under another allocator even where glibc is loaded.
    assert found == EXPECTED[allocator], out
    assert out["null"] is None, out


def test_a_hidden_name_is_null(run_python: Callable[..., dict[str, Any]]) -> None:
    out = run_python(PROBE, env={"MEMRECLAIM_TEST_HIDE_SYMBOLS": "mallinfo2"})
    assert out["allocator"] == "glibc", out
    assert out["found"]["mallinfo2"] is False and out["found"]["malloc_trim"] is True, out
