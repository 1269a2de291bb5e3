"""Hardening of the C core: refcount discipline, concurrency, and faults.

Every check runs in a subprocess (a script under tests/stress/), so a crash, a leak or a hang is
a failed test with the child's output, not a dead pytest. The same scripts, run longer, are the
stress job (docs/hardening.md).

Fault tests: /proc missing or unreadable (under ``unshare -m``, root only), an unknown allocator
(a malloc shim built here with cc), and a dlsym miss for every optional symbol through the
MEMRECLAIM_TEST_HIDE_SYMBOLS seam of alloc.c; fork in the middle of trimming, and interpreter exit
with a trimmer, a watchdog and trimming threads still running.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest
from conftest import allocator_lib, run_child, shared_library

import memreclaim

STRESS = Path(__file__).resolve().parent / "stress"
LIBDIR = Path("/usr/lib/x86_64-linux-gnu")
PRELOADS = {
    "jemalloc": LIBDIR / "libjemalloc.so.2",
    "mimalloc": LIBDIR / "libmimalloc.so.2",
    "tcmalloc": LIBDIR / "libtcmalloc_minimal.so.4",
}
# The allocator this interpreter runs on (glibc normally; under the sanitizer job too, through
# its MEMRECLAIM_TEST_MALLOC_SYMBOL seam).
NATIVE = memreclaim.allocator()
# ASan (and valgrind) interpose malloc themselves: an LD_PRELOADed allocator cannot serve it.
# ASan also defines mallopt and mallinfo: dlsym finds those, not libc's, so under ASan the glibc
# knobs raise UnsupportedAllocatorError and mallinfo is no fallback for mallinfo2.
UNDER_ASAN = "libasan" in os.environ.get("LD_PRELOAD", "")
KNOBS = NATIVE == "glibc" and not UNDER_ASAN
needs_native_glibc = pytest.mark.skipif(NATIVE != "glibc", reason=f"malloc is {NATIVE}, not glibc")
no_preload_under_asan = pytest.mark.skipif(
    UNDER_ASAN, reason="ASan serves malloc: an LD_PRELOADed allocator would not"
)


def run(
    args: list[str],
    *,
    env: dict[str, str] | None = None,
    timeout: float = 120,
    preload: str | None = None,
    **options: Any,
) -> subprocess.CompletedProcess[str]:
    """The interpreter with ``args``, this environment (LD_PRELOAD included: the sanitizer
    runtime) plus ``env`` and ``preload``; a hang fails with its output (see run_child)."""
    env = {**(env or {}), **({"LD_PRELOAD": preload} if preload is not None else {})}
    return run_child(args, env=env, timeout=timeout, keep_preload=True, **options)


def script(name: str, *args: str) -> list[str]:
    return [str(STRESS / name), *args]


def last_json(proc: subprocess.CompletedProcess[str]) -> Any:
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert lines, f"no JSON output (exit {proc.returncode})\n{proc.stdout}\n{proc.stderr}"
    return json.loads(lines[-1])


def explain(proc: subprocess.CompletedProcess[str]) -> str:
    return f"exit {proc.returncode}\nstdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"


# ---- refcount and allocation discipline --------------------------------------------------------


def discipline(*args: str, env: dict[str, str] | None = None) -> list[dict[str, Any]]:
    # sys.getallocatedblocks() counts pymalloc's blocks only: keep pymalloc on even where the
    # sanitizer job sets PYTHONMALLOC=malloc.
    env = {**(env or {}), "PYTHONMALLOC": "pymalloc"}
    # a bound for a hang, not a timing: 100k calls per case take minutes on a loaded machine
    proc = run(script("discipline.py", *args), env=env, timeout=900)
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert lines and lines[-1].get("summary"), explain(proc)
    assert proc.returncode == (1 if lines[-1]["failed"] else 0), explain(proc)
    return lines


@pytest.mark.timeout(960)
@pytest.mark.parametrize("hide", ["", "malloc_trim"], ids=["native-allocator", "unknown-allocator"])
def test_every_call_100k_times_leaves_blocks_objects_and_refs_flat(hide: str) -> None:
    """Each public call, success and error paths, 100,000 times (arenas() and the Python
    set_arena_max 20,000: they parse XML in Python): no growth of allocated blocks, GC objects or
    the reference counts of what the core hands out. With malloc_trim hidden the allocator is
    'unknown', so the same cases run the UnsupportedAllocatorError paths."""
    lines = discipline(env={"MEMRECLAIM_TEST_HIDE_SYMBOLS": hide} if hide else None)
    cases, summary = lines[:-1], lines[-1]
    assert summary["allocator"] == ("unknown" if hide else NATIVE)
    assert len(cases) >= 39
    over = [f"{case['case']}: {case['over']}" for case in cases if case["over"]]
    assert not over, "grew:\n" + "\n".join(over)
    assert min(case["calls"] for case in cases) >= 20_000
    outcomes = {case["case"]: case["outcome"] for case in cases}
    # The error cases did take their error paths (a case that silently succeeded tests nothing).
    for name, outcome in outcomes.items():
        expected = name.rsplit(" ", 1)[-1]
        if expected.endswith("Error"):
            assert outcome == expected, (name, outcome)
    if hide:
        for name in ("heap_stats()", "malloc_info()", "pin_mmap_threshold(128 KiB)"):
            assert outcomes[name] == "UnsupportedAllocatorError", (name, outcomes[name])


@pytest.mark.timeout(960)
def test_stats_with_tracemalloc_on_stays_flat() -> None:
    """stats() takes its traced-memory branch (the tuple from _tracemalloc) when tracing."""
    lines = discipline("--tracemalloc", "--only", "stats(", "--scale", "0.3")
    assert len(lines) == 5
    assert all(not case["over"] for case in lines[:-1]), lines


@pytest.mark.timeout(960)
def test_discipline_check_catches_a_leak() -> None:
    """The check can fail: a call leaking one object (or one reference) per call is reported."""
    lines = discipline("--canary", "--only", "canary")
    cases = lines[:-1]
    assert len(cases) == 2 and lines[-1]["failed"] == 2
    assert cases[0]["growth"]["blocks"] >= 90_000
    assert cases[1]["growth"]["refs TrimResult"] >= 90_000


# ---- concurrency -------------------------------------------------------------------------------


def _concurrency_params() -> list[Any]:
    params = [
        pytest.param("", "", id="native-allocator"),
        pytest.param("", "malloc_trim", id="unknown-allocator"),
    ]
    for name in PRELOADS:
        params.append(pytest.param(name, "", id=name, marks=no_preload_under_asan))
    return params


@pytest.mark.timeout(180)
@pytest.mark.parametrize(("preload", "hide"), _concurrency_params())
def test_16_callers_4_churners_no_crash_no_deadlock(preload: str, hide: str) -> None:
    """16 threads call trim/rss/stats/the knobs (and now and then the heap walkers) while 4
    threads allocate and free 1-5 MiB and 1-4 KiB objects, for 3 s (2 s under a preloaded
    allocator). The child dumps its stacks and exits if a thread is stuck 30 s past the end;
    this test kills it after 120 s."""
    env = {"MEMRECLAIM_TEST_HIDE_SYMBOLS": hide} if hide else None
    library = str(allocator_lib(preload)) if preload else None
    seconds = "2" if preload else "3"
    proc = run(
        script("concurrency.py", "--seconds", seconds, "--grace", "30"),
        env=env,
        preload=library,
        timeout=120,
    )
    assert proc.returncode == 0, explain(proc)
    summary = last_json(proc)
    assert summary["errors"] == []
    assert summary["allocator"] == (preload or ("unknown" if hide else NATIVE))
    expected = {"trim", "rss", "stats", "pin_mmap_threshold", "set_trim_threshold", "set_arena_max"}
    if summary["allocator"] in ("glibc", "jemalloc", "mimalloc", "tcmalloc"):
        expected |= {"heap_stats", "stats(heap=True)"}
    if summary["allocator"] == "glibc":
        expected |= {"malloc_info", "arenas"}
    assert set(summary["calls"]) == expected
    assert all(count > 0 for count in summary["calls"].values()), summary["calls"]
    assert summary["allocations"]["large"] > 0 and summary["allocations"]["small"] > 0


# ---- fork and exit while busy ------------------------------------------------------------------


@pytest.mark.timeout(180)
def test_fork_in_the_middle_of_trimming_children_work_and_exit() -> None:
    """30 forks while a BackgroundTrimmer, 4 threads calling trim/stats/rss and 2 churners run:
    every child reads its own RSS, trims, runs a trimmer of its own and exits 0 (one stuck on an
    inherited lock would be killed after 20 s and counted as hung)."""
    proc = run(script("lifecycle.py", "fork", "--forks", "30"), timeout=150)
    assert proc.returncode == 0, explain(proc)
    report = last_json(proc)
    assert report == {**report, "forks": 30, "ok": 30, "failed": 0, "hung": 0}
    assert "Traceback" not in proc.stderr, proc.stderr


@pytest.mark.timeout(180)
def test_exit_with_trimmer_watchdog_and_trimming_threads_running_is_clean() -> None:
    """The interpreter exits while a BackgroundTrimmer, an asyncio Watchdog and daemon threads
    are inside trim()/stats(): exit 0, nothing on stderr, every time (10 runs)."""
    for attempt in range(10):
        proc = run(script("lifecycle.py", "exit"), timeout=60)
        assert proc.returncode == 0, f"run {attempt}: {explain(proc)}"
        assert proc.stderr == "", f"run {attempt}: {proc.stderr}"
        assert last_json(proc)["exiting"] is True


# ---- faults: /proc -----------------------------------------------------------------------------


def _can_unshare() -> str | None:
    """None when `unshare -m` with a tmpfs over /proc works here, else the reason it does not."""
    if shutil.which("unshare") is None:
        return "unshare(1) is not installed"
    if os.geteuid() != 0:
        return "mounting a tmpfs over /proc needs root"
    probe = subprocess.run(
        ["unshare", "-m", "sh", "-c", "mount -t tmpfs none /proc"],
        capture_output=True,
        text=True,
        check=False,
    )
    if probe.returncode != 0:
        return f"unshare -m / mount not permitted: {probe.stderr.strip()}"
    return None


UNSHARE_PROBLEM = _can_unshare()
needs_unshare = pytest.mark.skipif(UNSHARE_PROBLEM is not None, reason=UNSHARE_PROBLEM or "")

# Under ASan the sanitizer runtime reads its options from /proc/self/environ: an empty /proc
# would silently turn leak detection back on (and fail at exit). So under ASan, /proc/self keeps
# links to the real entries the runtime needs, and only statm/status are missing or fake.
_FAKE_PROC = r"""
set -e
# Helpers run without a preloaded sanitizer runtime (it would fail at their exit without /proc);
# the interpreter exec'd at the end gets it back.
MR_PRELOAD="${LD_PRELOAD-}"
unset LD_PRELOAD
mount -t tmpfs none /proc
if [ -n "$MR_REAL_PROC_LINKS" ]; then
    mkdir -p /run/mr-realproc && mount -t proc proc /run/mr-realproc
    mkdir /proc/self
    for entry in environ maps exe cmdline auxv task fd stat; do
        ln -s "/run/mr-realproc/$$/$entry" "/proc/self/$entry"
    done
fi
if [ -n "$MR_FAKE" ]; then
    mkdir -p /proc/self
    printf '%s' "$MR_STATM" > /proc/self/statm
    printf '%s' "$MR_STATUS" > /proc/self/status
fi
if [ -n "$MR_PRELOAD" ]; then export LD_PRELOAD="$MR_PRELOAD"; fi
exec "$@"
"""


def under_fake_proc(
    argv: list[str], *, statm: str | None = None, status: str = ""
) -> subprocess.CompletedProcess[str]:
    """Run argv with a tmpfs over /proc: empty, or (statm given) with fake statm and status."""
    env = {
        "MR_FAKE": "" if statm is None else "1",
        "MR_STATM": statm or "",
        "MR_STATUS": status,
        "MR_REAL_PROC_LINKS": "1" if UNDER_ASAN else "",
    }
    prefix = ["unshare", "-m", "sh", "-c", _FAKE_PROC, "sh"]
    return run(argv, prefix=prefix, env=env, timeout=60)


def probe_json(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert proc.returncode == 0, explain(proc)
    result: dict[str, Any] = last_json(proc)
    return result


def assert_trim_unmeasured(outcome: dict[str, Any]) -> None:
    assert "ok" in outcome, outcome
    result = outcome["ok"]
    for field in ("released", "rss_before", "rss_after", "anon_before", "anon_after"):
        assert result[field] is None, result
    assert result["allocator"] == NATIVE
    assert result["method"] == ("malloc_trim(0)" if NATIVE == "glibc" else "none")
    assert isinstance(result["seconds"], float) and result["seconds"] >= 0


@needs_unshare
@pytest.mark.timeout(120)
def test_no_proc_rss_and_stats_raise_oserror_trim_still_trims() -> None:
    out = probe_json(under_fake_proc(script("probe.py")))
    for call, path in (
        ("rss", "/proc/self/statm"),
        ("stats", "/proc/self/status"),
        ("stats_heap", "/proc/self/status"),
    ):
        assert out[call]["exc"] == "FileNotFoundError", (call, out[call])
        assert out[call]["errno"] == errno.ENOENT
        assert out[call]["filename"] == path
        assert path in out[call]["msg"] and "No such file" in out[call]["msg"]
    assert_trim_unmeasured(out["trim"])
    # What does not need /proc keeps working.
    assert out["allocator"] == {"ok": NATIVE}
    if NATIVE == "glibc":
        assert out["heap_stats"]["ok"]["allocator"] == "glibc"
        assert out["malloc_info"]["ok"].startswith("<malloc")
    if KNOBS:
        assert out["pin_mmap_threshold"] == {"ok": None}
    assert out["bad_pin_type"]["exc"] == "TypeError"


@needs_unshare
@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("statm", "status"),
    [
        ("garbage\n", "Name:\tpython\nState:\tR\n"),  # no numbers; no VmRSS line
        ("", ""),  # empty files
        ("12", "VmRSS:"),  # truncated
    ],
    ids=["garbage", "empty", "truncated"],
)
def test_unreadable_proc_files_raise_eio(statm: str, status: str) -> None:
    out = probe_json(under_fake_proc(script("probe.py"), statm=statm, status=status))
    for call, path in (("rss", "/proc/self/statm"), ("stats", "/proc/self/status")):
        assert out[call]["exc"] == "OSError", (call, out[call])
        assert out[call]["errno"] == errno.EIO
        assert out[call]["filename"] == path
    assert_trim_unmeasured(out["trim"])


_HIDE_PROC_LATER = textwrap.dedent(
    """
    import json, os, subprocess, sys
    import memreclaim

    before = memreclaim.rss()
    subprocess.run(["mount", "-t", "tmpfs", "none", "/proc"], check=True)
    report = {"before": before}
    # The kept /proc/self/statm descriptor still names the real procfs.
    report["rss_after_hiding"] = memreclaim.rss()
    report["trim_released"] = memreclaim.trim().released
    try:
        memreclaim.stats()
    except OSError as exc:
        report["stats"] = [type(exc).__name__, exc.errno, exc.filename]
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child must not read its parent's figures: it reopens, and that fails
        child = {}
        try:
            memreclaim.rss()
            child["rss"] = "no error"
        except OSError as exc:
            child["rss"] = [type(exc).__name__, exc.errno, exc.filename]
        child["trim_released"] = memreclaim.trim().released
        os.write(write, json.dumps(child).encode())
        os._exit(0)
    os.close(write)
    _, status = os.waitpid(pid, 0)
    report["child"] = json.loads(os.read(read, 65536).decode())
    report["child_status"] = status
    print(json.dumps(report))
    """
)


@needs_unshare
@pytest.mark.timeout(120)
def test_proc_hidden_after_import_kept_descriptor_then_fork() -> None:
    proc = run([], code=_HIDE_PROC_LATER, prefix=["unshare", "-m"], timeout=60)
    assert proc.returncode == 0, explain(proc)
    report = last_json(proc)
    assert report["before"] > 0 and report["rss_after_hiding"] > 0
    assert report["trim_released"] is not None and report["trim_released"] >= 0
    assert report["stats"] == ["FileNotFoundError", errno.ENOENT, "/proc/self/status"]
    assert report["child_status"] == 0
    assert report["child"]["rss"] == ["FileNotFoundError", errno.ENOENT, "/proc/self/statm"]
    assert report["child"]["trim_released"] is None


_FD_REUSE = textwrap.dedent(
    """
    import json, os, socket, tempfile
    import memreclaim

    def statm_fd():
        for name in os.listdir("/proc/self/fd"):
            try:
                if os.readlink(f"/proc/self/fd/{name}").endswith("/statm"):
                    return int(name)
            except OSError:
                pass
        raise AssertionError("memreclaim keeps no /proc/self/statm descriptor")

    report = {}
    true_rss = memreclaim.rss()
    # A daemoniser closes every descriptor; the program's next socket gets the same number.
    fd = statm_fd()
    os.close(fd)
    ours, theirs = socket.socketpair()
    os.dup2(ours.fileno(), fd)
    report["rss_over_socket"] = memreclaim.rss()
    os.fstat(fd)  # raises if memreclaim closed the program's socket
    report["socket_still_open"] = True
    # Same again with the program's log file: it must not be read as our RSS.
    fd = statm_fd()
    os.close(fd)
    with tempfile.TemporaryFile() as fake:
        fake.write(b"2026-11-30 08:00:01 worker 12 started\\n")
        fake.flush()
        os.dup2(fake.fileno(), fd)
        report["rss_over_file"] = memreclaim.rss()
        report["trim_rss_after"] = memreclaim.trim().rss_after
        os.fstat(fd)
    # And a file of the program's that reads like statm (7 numbers): identity, not content.
    fd = statm_fd()
    os.close(fd)
    with tempfile.TemporaryFile() as fake:
        fake.write(b"9 2 1 1 0 1 0\\n")
        fake.flush()
        os.dup2(fake.fileno(), fd)
        report["rss_over_statm_like"] = memreclaim.rss()
        os.fstat(fd)
    report["true_rss"] = true_rss
    print(json.dumps(report))
    """
)


@pytest.mark.timeout(60)
def test_statm_descriptor_closed_and_reused_behind_our_back() -> None:
    """The program closes the kept /proc/self/statm descriptor and reuses its number: rss() must
    neither close the program's descriptor nor read it as RSS."""
    proc = run([], code=_FD_REUSE, timeout=60)
    assert proc.returncode == 0, explain(proc)
    report = last_json(proc)
    assert report["socket_still_open"] is True
    page = os.sysconf("SC_PAGESIZE")
    for key in ("rss_over_socket", "rss_over_file", "trim_rss_after", "rss_over_statm_like"):
        # Within a factor of 4 of the true figure: not the fake file's 2 pages.
        assert report[key] > 2 * page, (key, report)
        assert report["true_rss"] / 4 < report[key] < report["true_rss"] * 4, (key, report)


# ---- faults: an unknown allocator --------------------------------------------------------------

_SHIM = r"""
/* A malloc that memreclaim does not know: glibc's own, under other names. It also defines
 * malloc_trim and mallopt, counting calls, to prove memreclaim calls neither. */
#include <errno.h>
#include <stddef.h>

extern void *__libc_malloc(size_t);
extern void __libc_free(void *);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);
extern void *__libc_valloc(size_t);
extern void *__libc_pvalloc(size_t);

static int trim_calls, mallopt_calls;

void *malloc(size_t n) { return __libc_malloc(n); }
void free(void *p) { __libc_free(p); }
void *calloc(size_t n, size_t size) { return __libc_calloc(n, size); }
void *realloc(void *p, size_t n) { return __libc_realloc(p, n); }
void *memalign(size_t align, size_t n) { return __libc_memalign(align, n); }
void *aligned_alloc(size_t align, size_t n) { return __libc_memalign(align, n); }
void *valloc(size_t n) { return __libc_valloc(n); }
void *pvalloc(size_t n) { return __libc_pvalloc(n); }
int posix_memalign(void **out, size_t align, size_t n)
{
    void *p;
    if (align < sizeof(void *) || (align & (align - 1)) != 0) return EINVAL;
    p = __libc_memalign(align, n);
    if (p == NULL) return ENOMEM;
    *out = p;
    return 0;
}
int malloc_trim(size_t pad) { (void)pad; __atomic_add_fetch(&trim_calls, 1, 0); return 0; }
int mallopt(int param, int value)
{
    (void)param; (void)value;
    __atomic_add_fetch(&mallopt_calls, 1, 0);
    return 1;
}
int shim_trim_calls(void) { return trim_calls; }
int shim_mallopt_calls(void) { return mallopt_calls; }
"""

_PROBE_WITH_SHIM = textwrap.dedent(
    """
    import ctypes, json, sys
    sys.path.insert(0, sys.argv[1])
    import probe
    out = probe.probe()
    libc = ctypes.CDLL(None)
    out["shim"] = {"trim": libc.shim_trim_calls(), "mallopt": libc.shim_mallopt_calls()}
    print(json.dumps(out))
    """
)


@pytest.fixture(scope="module")
def malloc_shim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return shared_library(_SHIM, tmp_path_factory.mktemp("shim"), "shim")


@no_preload_under_asan
@pytest.mark.timeout(120)
def test_unknown_allocator_trims_nothing_and_knobs_raise(malloc_shim: Path) -> None:
    proc = run([str(STRESS)], code=_PROBE_WITH_SHIM, preload=str(malloc_shim))
    out = probe_json(proc)
    assert out["allocator"] == {"ok": "unknown"}
    assert out["allocator_version"] == {"ok": None}
    trim = out["trim"]["ok"]
    assert trim["method"] == "none" and trim["allocator"] == "unknown"
    assert trim["released"] >= 0 and trim["rss_after"] > 0
    assert out["rss"]["ok"] > 0 and out["stats"]["ok"]["allocator"] == "unknown"
    for call in (
        "heap_stats",
        "stats_heap",
        "malloc_info",
        "arenas",
        "pin_mmap_threshold",
        "set_trim_threshold",
        "core_set_arena_max",
        "set_arena_max",
    ):
        assert out[call]["exc"] == "UnsupportedAllocatorError", (call, out[call])
        assert "unknown" in out[call]["msg"], out[call]
    # A bad argument is the same error on every allocator.
    assert out["bad_pin_type"]["exc"] == "TypeError"
    assert out["bad_pin_value"]["exc"] == "ValueError"
    assert out["bad_trim_threshold"]["exc"] == "ValueError"
    assert out["bad_arena_max"]["exc"] == "OverflowError"
    # The shim's malloc_trim and mallopt were never called: detection did not take them for
    # glibc's (gnu_get_libc_version lives in another object).
    assert out["shim"] == {"trim": 0, "mallopt": 0}


# ---- faults: a dlsym miss for every optional symbol --------------------------------------------

OPTIONAL_SYMBOLS = [
    "malloc_trim",
    "mallinfo2",
    "mallinfo",
    "mallopt",
    "malloc_info",
    "gnu_get_libc_version",
    "mallctl",
    "mi_collect",
    "mi_process_info",
    "mi_version",
    "mi_heap_get_backing",
    "mi_heap_visit_blocks",
    "MallocExtension_ReleaseFreeMemory",
    "MallocExtension_GetNumericProperty",
    "tc_version",
]
# The symbol without which each allocator is not recognised at all.
ESSENTIAL = {
    "glibc": {"malloc_trim", "gnu_get_libc_version"},
    "jemalloc": {"mallctl"},
    "mimalloc": {"mi_collect"},
    "tcmalloc": {"MallocExtension_ReleaseFreeMemory"},
}
# Symbols whose absence leaves the allocator recognised but without statistics.
STATS_SYMBOLS = {
    "glibc": set(),  # mallinfo2 falls back to mallinfo; both hidden is tested below
    "jemalloc": set(),
    "mimalloc": {"mi_process_info"},
    "tcmalloc": {"MallocExtension_GetNumericProperty"},
}
VERSION_SYMBOLS = {
    "glibc": set(),  # gnu_get_libc_version is essential
    "jemalloc": set(),
    "mimalloc": {"mi_version"},
    "tcmalloc": {"tc_version"},
}


def _allocator_params() -> list[Any]:
    params = []
    for allocator in ("glibc", "jemalloc", "mimalloc", "tcmalloc"):
        marks = []
        if allocator == "glibc":
            marks.append(needs_native_glibc)
        else:
            marks.append(no_preload_under_asan)  # a missing library: allocator_lib() decides
        params.append(pytest.param(allocator, marks=marks, id=allocator))
    return params


def probe_hiding(allocator: str, hidden: str) -> dict[str, Any]:
    preload = str(allocator_lib(allocator)) if allocator in PRELOADS else None
    env = {"MEMRECLAIM_TEST_HIDE_SYMBOLS": hidden}
    return probe_json(run(script("probe.py"), env=env, preload=preload, timeout=60))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("allocator", _allocator_params())
def test_every_optional_symbol_missing(allocator: str) -> None:
    """Hide each optional symbol in turn (the alloc.c seam makes dlsym miss it) under each
    allocator: detection degrades to the documented answer and every call still returns or
    raises an ordinary exception."""
    for hidden in OPTIONAL_SYMBOLS:
        out = probe_hiding(allocator, hidden)
        where = f"{allocator} without {hidden}"
        detected = "unknown" if hidden in ESSENTIAL[allocator] else allocator
        assert out["allocator"] == {"ok": detected}, where
        assert out["trim"]["ok"]["allocator"] == detected, where
        assert out["trim"]["ok"]["released"] >= 0, where
        if detected == "unknown":
            assert out["trim"]["ok"]["method"] == "none", where
        assert out["rss"]["ok"] > 0, where
        # Statistics: present unless the allocator or its statistics call is missing.
        no_fallback = UNDER_ASAN and hidden == "mallinfo2"  # ASan's mallinfo is not libc's
        if detected == "unknown" or hidden in STATS_SYMBOLS[allocator] or no_fallback:
            assert out["heap_stats"]["exc"] == "UnsupportedAllocatorError", where
            assert out["stats_heap"]["exc"] == "UnsupportedAllocatorError", where
        else:
            assert out["heap_stats"]["ok"]["allocator"] == detected, where
            assert out["stats_heap"]["ok"]["heap"]["allocator"] == detected, where
        if detected == "unknown" or hidden in VERSION_SYMBOLS[allocator]:
            assert out["allocator_version"] == {"ok": None}, where
        else:
            assert isinstance(out["allocator_version"]["ok"], str), where
        # glibc knobs and malloc_info: only on glibc with the call present.
        knobs_work = detected == "glibc" and hidden != "mallopt" and KNOBS
        for knob in ("pin_mmap_threshold", "set_trim_threshold", "core_set_arena_max"):
            if knobs_work:
                assert out[knob] == {"ok": None}, (where, knob)
            else:
                assert out[knob]["exc"] == "UnsupportedAllocatorError", (where, knob)
        info_works = detected == "glibc" and hidden != "malloc_info"
        if info_works:
            assert out["malloc_info"]["ok"].startswith("<malloc"), where
            assert out["arenas"]["ok"] >= 1, where
        else:
            assert out["malloc_info"]["exc"] == "UnsupportedAllocatorError", where
            assert out["arenas"]["exc"] == "UnsupportedAllocatorError", where
        # mimalloc's heap walk: only with both of its symbols (3.6 no longer exports one).
        walk = {"mi_heap_get_backing", "mi_heap_visit_blocks"}
        if detected == "mimalloc" and hidden not in walk and out["mimalloc_walk_exported"]["ok"]:
            assert out["mimalloc_areas"]["ok"] == [
                "addresses",
                "areas",
                "committed",
                "large",
                "small",
            ], where
        else:
            assert out["mimalloc_areas"]["exc"] == "UnsupportedAllocatorError", where
        assert out["bad_pin_value"]["exc"] == "ValueError", where
        assert out["bad_trim_flag"]["exc"] == "TypeError", where


@needs_native_glibc
@pytest.mark.skipif(UNDER_ASAN, reason="ASan defines mallinfo: dlsym does not find libc's")
@pytest.mark.timeout(60)
def test_glibc_without_mallinfo2_falls_back_to_mallinfo_and_without_both_has_no_stats() -> None:
    fallback = probe_hiding("glibc", "mallinfo2")
    heap = fallback["heap_stats"]["ok"]
    assert heap["allocator"] == "glibc" and heap["in_use"] > 0 and heap["mapped"] > 0
    assert set(heap["figures"]) >= {"arena", "uordblks", "fordblks", "hblkhd"}
    neither = probe_hiding("glibc", "mallinfo2,mallinfo")
    assert neither["heap_stats"]["exc"] == "UnsupportedAllocatorError"
    assert neither["stats"]["ok"]["heap"] is None  # stats() without heap=True is unaffected
    assert neither["trim"]["ok"]["method"] == "malloc_trim(0)"


@no_preload_under_asan
@pytest.mark.timeout(60)
def test_everything_hidden_under_each_preload_is_unknown() -> None:
    everything = ",".join(OPTIONAL_SYMBOLS)
    for allocator in ("glibc", *PRELOADS):
        if allocator == "glibc" and NATIVE != "glibc":
            continue
        out = probe_hiding(allocator, everything)
        assert out["allocator"] == {"ok": "unknown"}, allocator
        assert out["trim"]["ok"]["method"] == "none", allocator
        assert out["set_arena_max"]["exc"] == "UnsupportedAllocatorError", allocator
