"""The module under subinterpreters (isolated, with their own GIL, on 3.12+) and free-threading.

Every case runs in a child interpreter (the ``run_python`` fixture): a subinterpreter shares the
process, and a crash must fail this test only.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "memreclaim"

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
    # (On 3.13+ the config is the evidence: 3.15's _testcapi, for one, loads in isolation.)
    if result["config"] is not None:
        assert result["config"] == {"gil": "own", "check": True}, result["config"]
    else:
        assert result["refused"], f"none of {SINGLE_PHASE} found to check isolation with"
        for name, error in result["refused"].items():
            assert error is not None and "subinterpreters" in error, (name, error)


# A thread reads statm through one kept descriptor with no GIL (as on a free-threaded build) while
# the main thread forks; every child reads it too. A child that inherited the statm lock held would
# hang: the parent kills it after a deadline and the program fails. Pure C (procfs.c needs no
# libpython), so it runs the way a free-threaded build would, on any interpreter.
STATM_FORK_C = r"""
#include "memreclaim.h"
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static mr_statm shared;
static atomic_int stop;
static atomic_long reads;

static void *reader(void *arg)
{
    mr_rss_sample sample;
    (void)arg;
    while (!atomic_load(&stop)) {
        if (mr_statm_read(&shared, &sample) != 0 || sample.resident <= 0) {
            fprintf(stderr, "reader: statm read failed\n");
            _exit(4);
        }
        atomic_fetch_add(&reads, 1);
    }
    return NULL;
}

int main(void)
{
    pthread_t thread;
    int hung = 0, failed = 0;
    mr_statm_init(&shared);
    mr_procfs_global_init();
    if (pthread_create(&thread, NULL, reader, NULL) != 0) {
        return 5;
    }
    time_t give_up = time(NULL) + 120;
    while (atomic_load(&reads) == 0) {
        if (time(NULL) > give_up) {
            fprintf(stderr, "the reader thread made no read in 120 s\n");
            return 6;
        }
        sched_yield();
    }
    for (int i = 0; i < FORKS && !hung; i++) { /* one hung child is enough */
        pid_t pid = fork();
        if (pid == 0) {
            mr_rss_sample sample;
            _exit(mr_statm_read(&shared, &sample) == 0 && sample.resident > 0 ? 0 : 3);
        }
        int status = 0;
        for (int waited_ms = 0;; waited_ms++) {
            if (waitpid(pid, &status, WNOHANG) == pid) {
                failed += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
                break;
            }
            if (waited_ms > 30000) {
                kill(pid, SIGKILL);
                waitpid(pid, &status, 0);
                hung++;
                break;
            }
            struct timespec ms = {0, 1000000};
            nanosleep(&ms, NULL);
        }
    }
    atomic_store(&stop, 1);
    pthread_join(thread, NULL);
    mr_statm_close(&shared);
    printf("forks=%d hung=%d failed=%d reads=%ld\n", FORKS, hung, failed, atomic_load(&reads));
    return hung || failed ? 1 : 0;
}
"""


def test_statm_lock_survives_fork_with_a_reader_thread(tmp_path: Path) -> None:
    include = sysconfig.get_paths()["include"]
    compiler = shutil.which(os.environ.get("CC", "cc"))
    if compiler is None or not Path(include, "Python.h").exists():
        pytest.skip(f"needs a C compiler and Python.h in {include} (the extension's build needs)")
    source = tmp_path / "statm_fork.c"
    source.write_text(STATM_FORK_C)
    program = tmp_path / "statm_fork"
    subprocess.run(
        [compiler, "-std=c11", "-Wall", "-Werror", "-DFORKS=100", f"-I{SRC}", f"-I{include}",
         str(source), str(SRC / "procfs.c"), "-pthread", "-o", str(program)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    proc = subprocess.run([str(program)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.fullmatch(r"forks=100 hung=0 failed=0 reads=[1-9]\d*\n", proc.stdout), proc.stdout


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
