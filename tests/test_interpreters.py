"""The module under subinterpreters (isolated, with their own GIL, on 3.12+) and free-threading.

Every case runs in a child interpreter (the ``run_python`` fixture): a subinterpreter shares the
process, and a crash must fail this test only.
"""

from __future__ import annotations

import sys
import sysconfig
from collections.abc import Callable
from typing import Any

import pytest

# Run in the subinterpreter: the whole public surface that touches the module state.
SUB_CODE = """
import memreclaim
assert memreclaim.rss() > 0
result = memreclaim.trim()
assert result.allocator == memreclaim.allocator(), result
assert memreclaim.stats().rss > 0
assert memreclaim._core.rss() > 0
"""

# Modules that refuse isolated subinterpreters (single-phase init, or no per-interpreter-GIL
# slot): importing one of them must fail in the same subinterpreter, which proves it is isolated
# (a shared-GIL subinterpreter would load them and the memreclaim check would prove nothing).
SINGLE_PHASE = ["_testsinglephase", "xxlimited_35", "_testcapi", "readline", "_curses"]

# How the child creates an isolated subinterpreter and runs code in it, per Python version.
# run(code) returns None or an error text; isolated_config() is None where it cannot be read.
RUNNERS = {
    # 3.12: _xxsubinterpreters.create() makes an isolated interpreter (own GIL, strict
    # extension checks) by default; run_string raises RunFailedError.
    (3, 12): """
import _xxsubinterpreters as _xi
interp = _xi.create()
def run(code):
    try:
        _xi.run_string(interp, code)
    except _xi.RunFailedError as exc:
        return str(exc)
    return None
def isolated_config():
    return None
def close():
    _xi.destroy(interp)
""",
    # 3.13: _interpreters.create("isolated"); exec() returns an exception snapshot or None.
    (3, 13): """
import _interpreters as _xi
interp = _xi.create("isolated")
def run(code):
    failure = _xi.exec(interp, code)
    return None if failure is None else f"{failure.type.__name__}: {failure.msg}"
def isolated_config():
    config = _xi.get_config(interp)
    return {"gil": config.gil, "check": config.check_multi_interp_extensions}
def close():
    _xi.destroy(interp)
""",
    # 3.14+: the public concurrent.interpreters (PEP 734): isolated, own GIL.
    (3, 14): """
import concurrent.interpreters as _ci
interp = _ci.create()
def run(code):
    try:
        interp.exec(code)
    except _ci.ExecutionFailed as exc:
        return str(exc)
    return None
def isolated_config():
    import _interpreters
    config = _interpreters.get_config(interp.id)
    return {"gil": config.gil, "check": config.check_multi_interp_extensions}
def close():
    interp.close()
""",
}


def _runner() -> str:
    if sys.version_info < (3, 12):
        pytest.skip(
            "isolated subinterpreters (own GIL, Py_mod_multiple_interpreters) need CPython 3.12+; "
            f"this is {sys.version.split()[0]} (the shared-GIL 3.11 case is tested below)"
        )
    return RUNNERS[min(sys.version_info[:2], (3, 14))]


def test_import_in_an_isolated_subinterpreter(run_python: Callable[..., dict[str, Any]]) -> None:
    runner = _runner()
    code = """
import importlib.util
errors = []
for _ in range(2):  # a module state per import, freed with its interpreter
    exec(RUNNER)  # defines interp, run(), isolated_config(), close()
    errors.append(run(SUB_CODE))
    config = isolated_config()
    close()
refused = {}
for name in SINGLE_PHASE:
    if importlib.util.find_spec(name) is not None:
        exec(RUNNER)
        refused[name] = run("import " + name)
        close()
emit(errors=errors, refused=refused, config=config, rss=memreclaim.rss())
"""
    result = run_python(
        code, params={"SUB_CODE": SUB_CODE, "SINGLE_PHASE": SINGLE_PHASE, "RUNNER": runner}
    )
    assert result["errors"] == [None, None], result["errors"]
    assert result["rss"] > 0  # the main interpreter's module still works after both were freed
    # The subinterpreter was isolated: its config says so (3.13+), and every module that needs a
    # shared GIL was refused in it (3.12 has no get_config: there the control must exist).
    if result["config"] is not None:
        assert result["config"] == {"gil": "own", "check": True}, result["config"]
    else:
        assert result["refused"], f"none of {SINGLE_PHASE} found to check isolation with"
    for name, error in result["refused"].items():
        assert error is not None and "subinterpreters" in error, (name, error)


def test_import_in_a_shared_gil_subinterpreter_311(
    run_python: Callable[..., dict[str, Any]],
) -> None:
    if sys.version_info[:2] != (3, 11):
        pytest.skip("3.11's _xxsubinterpreters (shared GIL); 3.12+ is tested isolated above")
    code = """
import _xxsubinterpreters as interpreters
errors = []
for _ in range(2):
    interp = interpreters.create()
    try:
        interpreters.run_string(interp, SUB_CODE)
        errors.append(None)
    except interpreters.RunFailedError as exc:
        errors.append(str(exc))
    interpreters.destroy(interp)
emit(errors=errors, rss=memreclaim.rss())
"""
    result = run_python(code, params={"SUB_CODE": SUB_CODE})
    assert result["errors"] == [None, None], result["errors"]
    assert result["rss"] > 0


def test_free_threaded_build_keeps_the_gil_off(run_python: Callable[..., dict[str, Any]]) -> None:
    if not sysconfig.get_config_var("Py_GIL_DISABLED"):
        pytest.skip(
            "not a free-threaded interpreter (Py_GIL_DISABLED unset); the free-threaded build "
            "path is checked by tools/freethreaded_build.sh"
        )
    # The prelude has imported memreclaim already: the GIL must still be off.
    result = run_python(
        """
import sys, threading
rss = [memreclaim.rss() for _ in range(3)]
threads = [threading.Thread(target=lambda: [memreclaim.rss() for _ in range(2000)])
           for _ in range(4)]
for t in threads:
    t.start()
for t in threads:
    t.join(60)
emit(after=sys._is_gil_enabled(), alive=[t.is_alive() for t in threads],
     trimmed=memreclaim.trim().allocator == memreclaim.allocator())
"""
    )
    assert result["after"] is False, "importing memreclaim re-enabled the GIL"
    assert result["alive"] == [False] * 4
    assert result["trimmed"]
