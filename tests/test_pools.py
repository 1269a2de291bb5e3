"""Tests of memreclaim._pools (empty pymalloc pool reclaim).

Every test that enables the feature or measures memory runs in a fresh interpreter
(``sys.executable -c ...``): enabling installs a process-wide arena-allocator wrapper, and RSS
figures are only meaningful in a process that did nothing else.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import textwrap
from typing import Any

import pytest

IS_LINUX_CPYTHON_311 = (
    sys.platform.startswith("linux")
    and platform.python_implementation() == "CPython"
    and sys.version_info[:2] == (3, 11)
)

pytestmark = pytest.mark.skipif(
    not IS_LINUX_CPYTHON_311,
    reason="pool reclaim is implemented for CPython 3.11 on Linux only",
)

if IS_LINUX_CPYTHON_311:
    # On the supported platform the module must build and import: a failure here is a failure.
    from memreclaim import _pools, pools

    TESTED = platform.python_version() in _pools.TESTED_VERSIONS
else:  # pragma: no cover
    TESTED = False

needs_tested_version = pytest.mark.skipif(
    not TESTED, reason=f"CPython {platform.python_version()} is not on the tested allow-list"
)

# Helpers pasted into every child script.
PRELUDE = textwrap.dedent(
    """
    import ctypes, gc, json, sys
    import memreclaim
    from memreclaim import _pools, pools

    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096

    def malloc_trim():
        # the core's plain trim(): malloc_trim(0) on glibc
        memreclaim.trim()

    def report(**values):
        print("RESULT " + json.dumps(values))
    """
)


def run_child(
    *parts: str,
    env: dict[str, str] | None = None,
    args: tuple[str, ...] = (),
    timeout: float = 240,
) -> dict[str, Any]:
    """Run PRELUDE + parts in a fresh interpreter; return what it passed to report()."""
    code = "".join(textwrap.dedent(part) for part in parts)
    child_env = dict(os.environ)
    child_env.pop("PYTHONMALLOC", None)
    child_env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    if env:
        child_env.update(env)
    proc = subprocess.run(
        [sys.executable, *args, "-c", PRELUDE + code],
        env=child_env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert proc.returncode == 0, (
        f"child exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, f"child reported nothing\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    result: dict[str, Any] = json.loads(lines[-1][len("RESULT ") :])
    return result


DICT_WORKLOAD = """
    d = {i: {} for i in range(1_000_000)}
    keep = [d[i] for i in range(0, 1_000_000, 1000)]
    for k in keep:
        k["alive"] = id(k)
    del d
    gc.collect()
    malloc_trim()
"""


@needs_tested_version
def test_dict_workload_gives_back_memory() -> None:
    result = run_child(
        "pools.enable_pool_reclaim()\n",
        DICT_WORKLOAD,
        """
        rss_trim = rss()
        estimate = pools.estimate_pool_reclaim()
        r = pools.reclaim_pools()
        malloc_trim()
        rss_pools = rss()
        after = pools.estimate_pool_reclaim()
        intact = all(k == {"alive": id(k)} for k in keep) and len(keep) == 1000
        report(rss_trim=rss_trim, rss_pools=rss_pools, result=list(r), intact=intact,
               estimate=list(estimate), after=list(after), status=pools.pool_reclaim_status())
        """,
    )
    pools_released, bytes_released, _scanned, skipped, complete, _ns = result["result"]
    assert result["intact"]
    assert complete
    assert skipped == 0
    assert pools_released > 1000
    assert bytes_released > 30 * 2**20
    assert result["rss_pools"] <= 0.6 * result["rss_trim"], result
    assert result["status"]["enabled"] is True
    assert result["status"]["reason"] is None
    # The dry run predicted the release (give or take a pool or two that the Python code in
    # between took back from the free-pool list), and finds nothing left afterwards.
    assert abs(result["estimate"][0] - pools_released) <= 3
    assert abs(result["estimate"][1] - bytes_released) <= 3 * 12 * 1024
    assert result["after"][0] <= 3


@needs_tested_version
def test_core_trim_with_pools() -> None:
    result = run_child(
        "pools.enable_pool_reclaim()\n",
        DICT_WORKLOAD,
        """
        plain = memreclaim.trim()
        both = memreclaim.trim(pools=True)
        intact = all(k == {"alive": id(k)} for k in keep)
        report(plain_after=plain.rss_after, both_after=both.rss_after, intact=intact,
               pools_released=both.pools_released, pools_bytes=both.pools_bytes,
               plain_pools=plain.pools_released)
        """,
    )
    assert result["intact"]
    assert result["plain_pools"] == 0
    assert result["pools_released"] > 1000
    assert result["pools_bytes"] > 30 * 2**20
    assert result["both_after"] <= 0.6 * result["plain_after"], result


def test_core_trim_with_pools_not_enabled() -> None:
    result = run_child(
        """
        try:
            memreclaim.trim(pools=True)
            error = ""
        except pools.PoolReclaimUnavailable as e:
            error = str(e)
        report(error=error)
        """
    )
    assert "not enabled" in result["error"]


def test_without_enabling_nothing_changes() -> None:
    result = run_child(
        """
        class ArenaAllocator(ctypes.Structure):
            _fields_ = [("ctx", ctypes.c_void_p), ("alloc", ctypes.c_void_p),
                        ("free", ctypes.c_void_p)]
        def arena_allocator():
            a = ArenaAllocator()
            ctypes.pythonapi.PyObject_GetArenaAllocator(ctypes.byref(a))
            return (a.ctx, a.alloc, a.free)
        before = arena_allocator()
        """,
        DICT_WORKLOAD,
        """
        rss_trim = rss()
        try:
            pools.reclaim_pools()
            refused = ""
        except pools.PoolReclaimUnavailable as e:
            refused = str(e)
        malloc_trim()
        report(rss_trim=rss_trim, rss_after=rss(), refused=refused,
               same_allocator=arena_allocator() == before, status=pools.pool_reclaim_status())
        """,
    )
    assert "not enabled" in result["refused"]
    assert result["same_allocator"]
    status = result["status"]
    assert status["enabled"] is False
    assert status["arenas_tracked"] == 0 and status["arenas_recorded"] == 0
    assert status["reclaim_calls"] == 0
    assert abs(result["rss_after"] - result["rss_trim"]) < 2 * 2**20, result


TORTURE = """
    import random

    rng = random.Random(int(sys.argv[1]))
    gc.disable()  # collections happen where this script says, not inside a measurement

    def make(kind, i, n):
        # Deterministic objects of many pymalloc size classes (all <= 512 bytes).
        if kind == 0:
            return (i.to_bytes(4, "little") * (n // 4 + 1))[:n]
        if kind == 1:
            return tuple(range(i, i + n % 60))
        if kind == 2:
            return {j: i for j in range(n % 6)}
        if kind == 3:
            return [i] * (n % 50)
        if kind == 4:
            return float(i) + n / 7
        return "s%d-" % i + "x" * (n % 400)

    def batch(count):
        items = []
        for _ in range(count):
            key = (rng.randrange(6), rng.randrange(10**6), rng.randrange(1, 470))
            items.append((key, make(*key)))
        return items

    def blocks_delta(call):
        gab = sys.getallocatedblocks
        control0 = gab(); control1 = gab()
        base = control1 - control0  # the int holding control0 is itself a block
        before = gab()
        call()
        after = gab()
        return after - before - base

    def verify(items):
        return all(obj == make(*key) for key, obj in items)

    survivors = []
    ok = True
    deltas = []
    for rnd in range(ROUNDS):
        items = batch(60_000)
        # Per kind: none survive (whole pools empty out) or a few (pools pinned).
        rates = [rng.choice([0.0, 0.0, 0.002, 0.01, 0.05]) for _ in range(6)]
        survivors.extend(it for it in items if rng.random() < rates[it[0][0]])
        del items
        gc.collect()
        budget = rng.choice([None, None, 1, 3, 10])
        def call():
            # Results are dropped at once: nothing this loop allocates outlives it.
            while not _pools.reclaim(budget)[4]:
                pass

        delta = blocks_delta(call)
        deltas.append(delta)
        ok = ok and verify(survivors)
        fresh = batch(40_000)  # re-allocate into the released pools
        ok = ok and verify(fresh) and verify(survivors)
        del fresh
        if len(survivors) > 20_000:
            rng.shuffle(survivors)
            del survivors[10_000:]
    st = pools.pool_reclaim_status()
    report(ok=ok, deltas=deltas, released=st["pools_released"],
           skipped=st["arenas_skipped"], survivors=len(survivors))
"""


@needs_tested_version
@pytest.mark.parametrize(
    ("label", "env", "args"),
    [
        ("pymalloc", {}, ()),
        ("pymalloc_debug", {"PYTHONMALLOC": "pymalloc_debug"}, ()),
        ("tracemalloc", {}, ("-X", "tracemalloc")),
    ],
)
def test_torture(label: str, env: dict[str, str], args: tuple[str, ...]) -> None:
    seed = str(sum(map(ord, label)))
    result = run_child(
        "pools.enable_pool_reclaim()\nROUNDS = 6\n",
        TORTURE.replace("int(sys.argv[1])", seed),
        env=env,
        args=args,
    )
    assert result["ok"], result
    assert result["deltas"] == [0] * 6, result
    assert result["skipped"] == 0, result
    assert result["released"] > 100, result


def test_pythonmalloc_malloc_is_refused() -> None:
    result = run_child(
        """
        try:
            pools.enable_pool_reclaim()
            refused = ""
        except pools.PoolReclaimUnavailable as e:
            refused = str(e)
        report(refused=refused, status=pools.pool_reclaim_status())
        """,
        env={"PYTHONMALLOC": "malloc"},
    )
    reason = result["refused"]
    if TESTED:
        assert "pymalloc is not active" in reason and "malloc" in reason
    assert reason
    assert result["status"]["enabled"] is False
    assert result["status"]["reason"] == reason


@needs_tested_version
def test_replaced_arena_allocator_disables() -> None:
    result = run_child(
        """
        class ArenaAllocator(ctypes.Structure):
            _fields_ = [("ctx", ctypes.c_void_p), ("alloc", ctypes.c_void_p),
                        ("free", ctypes.c_void_p)]
        cpython_default = ArenaAllocator()
        ctypes.pythonapi.PyObject_GetArenaAllocator(ctypes.byref(cpython_default))
        pools.enable_pool_reclaim()
        first = list(pools.reclaim_pools())
        ctypes.pythonapi.PyObject_SetArenaAllocator(ctypes.byref(cpython_default))
        errors = []
        for _ in range(2):
            try:
                pools.reclaim_pools()
                errors.append("")
            except pools.PoolReclaimUnavailable as e:
                errors.append(str(e))
        try:
            pools.enable_pool_reclaim()
            errors.append("")
        except pools.PoolReclaimUnavailable as e:
            errors.append(str(e))
        report(first=first, errors=errors, status=pools.pool_reclaim_status())
        """
    )
    assert all("arena allocator was replaced" in e for e in result["errors"]), result
    assert result["status"]["enabled"] is False
    assert "arena allocator was replaced" in result["status"]["reason"]


@needs_tested_version
def test_frame_stack_chunk_is_left_untouched() -> None:
    # 3.11 gives a frame of ~70,000 locals a 1 MiB data-stack chunk from the arena allocator.
    # It is not a pymalloc arena: it must be ignored, and the frame's locals must survive.
    result = run_child(
        """
        pools.enable_pool_reclaim()
        n = 70_000
        src = ("def f(reclaim):\\n"
               + "".join(f"    v{i} = {i} * 1000003 + 7\\n" for i in range(n))
               + "    r = reclaim()\\n"
               + "    return r, [" + ", ".join(f"v{i}" for i in range(n)) + "]\\n")
        ns = {}
        exec(compile(src, "many_locals", "exec"), ns)
        garbage = [{} for _ in range(200_000)][::1000]  # some empty pools to release
        gc.collect()
        foreign_before = pools.pool_reclaim_status()["foreign_blocks"]
        r, values = ns["f"](pools.reclaim_pools)
        st = pools.pool_reclaim_status()
        report(intact=values == [i * 1000003 + 7 for i in range(n)], result=list(r),
               foreign=st["foreign_blocks"] - foreign_before, skipped=st["arenas_skipped"])
        """
    )
    assert result["intact"]
    assert result["foreign"] >= 1, "the 1 MiB chunk did not go through the arena allocator"
    assert result["skipped"] == 0


def test_bad_arguments() -> None:
    for bad in ("3", 1.5, True, [1], b"1"):
        with pytest.raises(TypeError, match="budget_arenas must be None or an int"):
            _pools.reclaim(bad)
        with pytest.raises(TypeError, match="budget_arenas must be None or an int"):
            pools.reclaim_pools(bad)  # type: ignore[arg-type]
    for bad_value in (0, -1, -(2**70)):
        with pytest.raises(ValueError, match="at least 1"):
            _pools.reclaim(bad_value)
    with pytest.raises(TypeError):
        _pools.reclaim(1, 2)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        _pools.reclaim(budget=1)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        _pools.enable(1)  # type: ignore[call-arg]


def test_reclaim_before_enable_raises() -> None:
    # This test process never enables pool reclaim.
    with pytest.raises(pools.PoolReclaimUnavailable, match="not enabled"):
        pools.reclaim_pools()
    with pytest.raises(pools.PoolReclaimUnavailable, match="not enabled"):
        _pools.reclaim(2**70)  # huge budgets are clamped, not refused
    with pytest.raises(pools.PoolReclaimUnavailable, match="not enabled"):
        pools.estimate_pool_reclaim()
    assert issubclass(pools.PoolReclaimUnavailable, RuntimeError)
    status = pools.pool_reclaim_status()
    assert status["enabled"] is False and status["reason"]


@needs_tested_version
def test_capsule_reclaim() -> None:
    result = run_child(
        """
        class Result(ctypes.Structure):
            _fields_ = [("pools_released", ctypes.c_longlong),
                        ("bytes_released", ctypes.c_longlong)]
        RECLAIM = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.POINTER(Result))
        class CAPI(ctypes.Structure):
            _fields_ = [("version", ctypes.c_int), ("reclaim", RECLAIM)]
        get = ctypes.pythonapi.PyCapsule_GetPointer
        get.restype = ctypes.c_void_p
        get.argtypes = [ctypes.py_object, ctypes.c_char_p]
        capi = CAPI.from_address(get(_pools._C_API, b"memreclaim._pools._C_API"))
        out = Result()
        try:
            capi.reclaim(ctypes.byref(out))
            before_enable = ""
        except pools.PoolReclaimUnavailable as e:
            before_enable = str(e)
        pools.enable_pool_reclaim()
        garbage = [{} for _ in range(300_000)][::1000]
        gc.collect()
        rc = capi.reclaim(ctypes.byref(out))
        report(version=capi.version, before_enable=before_enable, rc=rc,
               pools_released=out.pools_released, bytes_released=out.bytes_released)
        """
    )
    assert result["version"] == 1
    assert "not enabled" in result["before_enable"]
    assert result["rc"] == 0
    assert result["pools_released"] > 0
    assert result["bytes_released"] >= result["pools_released"] * 4096


@pytest.mark.skipif(TESTED, reason="checks the refusal on versions off the allow-list")
def test_refused_off_allow_list() -> None:  # pragma: no cover - runs on other 3.11 micros
    result = run_child(
        """
        try:
            pools.enable_pool_reclaim()
            refused = ""
        except pools.PoolReclaimUnavailable as e:
            refused = str(e)
        report(refused=refused)
        """
    )
    assert "allow-list" in result["refused"]
