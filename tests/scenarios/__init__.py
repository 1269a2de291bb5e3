"""Labelled leak/retention/cache/clean scenarios for the diagnosis engine.

Each :class:`Scenario` is a workload (module-level ``setup`` code and a ``work()`` function) and
the label it must get:

* ``python_leak``, ``native_leak``, ``mapped_leak``: the report must name this leak first
  (``report.kind``);
* ``retention``, ``cache``, ``clean``: the report must name no leak at all.

The registry is shared by tests/test_scenarios.py (a fresh interpreter per scenario, under glibc
and the preloaded allocators) and benchmarks/bench_diagnosis.py (the accuracy table in
docs/pytest-plugin.md).
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

LEAK_LABELS = ("python_leak", "native_leak", "mapped_leak")
OK_LABELS = ("retention", "cache", "clean")
LABELS = LEAK_LABELS + OK_LABELS


@dataclass(frozen=True)
class Scenario:
    name: str
    label: str
    work: str  # defines work(); may use the names of _COMMON and its own setup
    setup: str = ""
    repeat: int = 5
    warmup: int = 1
    #: run by the default suite (one per label is enough there; the rest with the full matrix)
    default: bool = False

    def code(self) -> str:
        """Module-level code that defines ``work`` (and whatever it needs)."""
        return _COMMON + textwrap.dedent(self.setup) + "\n" + textwrap.dedent(self.work)


_COMMON = """
import ctypes, gc, mmap, random, tempfile, threading, queue
from memreclaim import workloads
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.memset.restype = ctypes.c_void_p
libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
MiB = 1 << 20
LEAK = []
SLOT = []
CALLS = [0]

def cmalloc(n):
    p = libc.malloc(n)
    libc.memset(p, 1, n)
    return p

class Worker:
    '''A long-lived thread that runs what it is given (its mallocs use its own glibc arena).'''
    def __init__(self):
        self.jobs = queue.Queue()
        self.done = queue.Queue()
        threading.Thread(target=self._run, daemon=True).start()
    def _run(self):
        while True:
            job = self.jobs.get()
            job()
            self.done.put(1)
    def call(self, job):
        self.jobs.put(job)
        self.done.get(timeout=60)
"""

SCENARIOS: dict[str, Scenario] = {}


def _add(*items: Scenario) -> None:
    for item in items:
        assert item.label in LABELS, item
        SCENARIOS[item.name] = item


_add(
    # ---- Python leaks
    Scenario(
        "python_steady",
        "python_leak",
        """
        def work():
            LEAK.extend({"n": i, "s": "v" * 40} for i in range(20_000))
        """,
        default=True,
    ),
    Scenario(
        "python_every_third_call",
        "python_leak",
        """
        def work():
            CALLS[0] += 1
            if CALLS[0] % 3 == 0:   # ~4.6 MB kept on every third call only
                LEAK.extend(b"k" * 1000 + i.to_bytes(4, "little") for i in range(4_500))
        """,
    ),
    Scenario(
        "python_leak_in_thread",
        "python_leak",
        """
        W = Worker()
        def work():
            W.call(lambda: LEAK.extend(str(i) * 30 for i in range(30_000)))
        """,
    ),
    Scenario(
        "python_leak_with_spike",
        "python_leak",
        """
        def work():
            data = workloads.strings(30_000)
            SLOT[:] = workloads.keep_every(data, 50)
            del data
            LEAK.extend({"n": i} for i in range(15_000))
        """,
    ),
    Scenario(
        "python_big_objects",
        "python_leak",
        """
        def work():
            LEAK.append(bytearray(3 * MiB))
        """,
    ),
    # ---- native leaks (malloc)
    Scenario(
        "native_steady",
        "native_leak",
        """
        def work():
            cmalloc(MiB)
        """,
        default=True,
    ),
    Scenario(
        "native_every_third_call",
        "native_leak",
        """
        def work():
            CALLS[0] += 1
            if CALLS[0] % 3 == 0:
                cmalloc(4 * MiB)
        """,
    ),
    Scenario(
        "native_small_blocks",
        "native_leak",
        """
        def work():
            for _ in range(10_000):
                cmalloc(200)
        """,
    ),
    Scenario(
        "native_netted_by_python_shrink",
        "native_leak",
        """
        OLD = [b"o" * 2000 + i.to_bytes(4, "little") for i in range(12_000)]  # before tracing
        def work():
            del OLD[-1000:]       # ~2 MB of old Python objects released...
            cmalloc(2 * MiB)      # ...while 2 MiB of C memory leaks
        """,
    ),
    Scenario(
        "native_netted_small_python_shrink",
        "native_leak",
        """
        OLD = [{"n": i} for i in range(200_000)]
        def work():
            del OLD[-20_000:]
            for _ in range(64):
                cmalloc(32 * 1024)
        """,
    ),
    Scenario(
        "native_in_thread_arena",
        "native_leak",
        """
        W = Worker()
        def work():
            W.call(lambda: [cmalloc(64 * 1024) for _ in range(24)])
        """,
    ),
    Scenario(
        "native_leak_with_spike",
        "native_leak",
        """
        def work():
            data = workloads.strings(30_000)
            SLOT[:] = workloads.keep_every(data, 50)
            del data
            cmalloc(2 * MiB)
        """,
    ),
    # ---- outside malloc
    Scenario(
        "mmap_private",
        "mapped_leak",
        """
        def work():
            m = mmap.mmap(-1, 2 * MiB, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            m.write(b"m" * (2 * MiB))
            LEAK.append(m)
        """,
        default=True,
    ),
    Scenario(
        "mmap_shared",
        "mapped_leak",
        """
        def work():
            m = mmap.mmap(-1, 2 * MiB)   # MAP_SHARED: RssShmem, not RssAnon
            m.write(b"s" * (2 * MiB))
            LEAK.append(m)
        """,
    ),
    Scenario(
        "mmap_private_every_third_call",
        "mapped_leak",
        """
        def work():
            CALLS[0] += 1
            if CALLS[0] % 3 == 0:
                m = mmap.mmap(-1, 5 * MiB, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
                m.write(b"m" * (5 * MiB))
                LEAK.append(m)
        """,
    ),
    Scenario(
        "mmap_file_kept",
        "mapped_leak",
        """
        def work():
            # A file mapped per call and kept (RssFile, neither anonymous nor shared memory).
            with tempfile.TemporaryFile() as f:
                f.truncate(2 * MiB)
                m = mmap.mmap(f.fileno(), 2 * MiB)
            m.write(b"f" * (2 * MiB))
            LEAK.append(m)
        """,
    ),
    # ---- retention (not leaks)
    Scenario(
        "strings_spike",
        "retention",
        """
        def work():
            data = workloads.strings(40_000)
            SLOT[:] = workloads.keep_every(data, 50)   # survivors live until the next call
            del data
        """,
        default=True,
    ),
    Scenario(
        "dicts_spike",
        "retention",
        """
        def work():
            data = workloads.dicts(300_000)
            SLOT[:] = workloads.keep_every(list(data.values()), 1000)
            del data
        """,
    ),
    Scenario(
        "buffers_seed004",
        "retention",
        """
        def work():
            SLOT[:] = workloads.buffers(2, per_round=8, live_rounds=1)
        """,
    ),
    Scenario(
        "spike_in_thread",
        "retention",
        """
        W = Worker()
        def job():
            data = workloads.strings(30_000)
            SLOT[:] = workloads.keep_every(data, 50)
        def work():
            W.call(job)
        """,
    ),
    Scenario(
        "temporary_mmap",
        "retention",
        """
        def work():
            m = mmap.mmap(-1, 64 * MiB)
            m.write(b"t" * (64 * MiB))
            m.close()
        """,
    ),
    # ---- caches (warm-up growth, not leaks)
    Scenario(
        "cache_filled_on_first_call",
        "cache",
        """
        CACHE = {}
        def work():
            if not CACHE:
                CACHE.update((i, str(i) * 20) for i in range(100_000))
        """,
        warmup=0,
        default=True,
    ),
    Scenario(
        "native_cache_on_first_call",
        "cache",
        """
        BUF = []
        def work():
            if not BUF:
                BUF.append(cmalloc(8 * MiB))
        """,
        warmup=0,
    ),
    Scenario(
        "bounded_lru_cache",
        "cache",
        """
        import functools
        @functools.lru_cache(maxsize=2000)
        def render(i):
            return ("r%d" % i) * 200
        def work():
            CALLS[0] += 1
            for i in range(1000):
                render(i + 500 * min(CALLS[0], 2))
        """,
    ),
    # ---- clean
    Scenario(
        "clean_compute",
        "clean",
        """
        def work():
            total = 0
            for i in range(200_000):
                total += len(str(i))
            return total
        """,
        default=True,
    ),
    Scenario(
        "clean_temporaries",
        "clean",
        """
        def work():
            rows = [{"id": i, "name": "n" * 50} for i in range(50_000)]
            blob = bytearray(30 * MiB)
            del rows, blob
        """,
    ),
    Scenario(
        "clean_malloc_free",
        "clean",
        """
        libc.free.argtypes = [ctypes.c_void_p]
        def work():
            ps = [cmalloc(64 * 1024) for _ in range(200)]
            for p in ps:
                libc.free(p)
        """,
    ),
    Scenario(
        "clean_file_mapping",
        "clean",
        """
        def work():
            # A file mapped, read and unmapped each call: its pages leave RSS with the mapping.
            with tempfile.TemporaryFile() as f:
                f.truncate(8 * MiB)
                with mmap.mmap(f.fileno(), 8 * MiB) as m:
                    m.write(b"c" * (8 * MiB))
                    assert m[4 * MiB] == ord("c")
        """,
    ),
)


def measure_code(scenario: Scenario) -> str:
    """Code for ``run_python``: run the scenario through ``memreclaim.measure`` and ``emit`` the
    report's kind, leaks, verdict and text."""
    return scenario.code() + textwrap.dedent(
        f"""
            report = memreclaim.measure(work, repeat={scenario.repeat}, warmup={scenario.warmup})
            emit(
                kind=report.kind,
                leaks=report.leaks(),
                verdict=report.verdict,
                text=report.format(),
                allocator=report.allocator,
                slowdown=report.slowdown,
            )
            """
    )


def judged(label: str, kind: str, leaks: dict[str, int]) -> bool:
    """Whether a report's kind and leaks are right for ``label``."""
    if label in LEAK_LABELS:
        return kind == label
    return not leaks


#: How the plugin's failure line names each leak kind ("leaked 1.0 MiB per run (Python), ...").
PLUGIN_WORDS = {
    "python_leak": "(Python",
    "native_leak": "(native, malloc",
    "mapped_leak": "(native, outside malloc",
}


def pytest_code(scenario: Scenario, limit: str = "1 B") -> str:
    """A test module running the scenario through the ``no_leak`` marker and through the
    ``memory`` fixture's ``measure()``, both with a leak limit of ``limit``."""
    return scenario.code() + textwrap.dedent(
        f"""
            import pytest

            @pytest.mark.no_leak(limit={limit!r}, repeat={scenario.repeat},
                                 warmup={scenario.warmup})
            def test_marker():
                work()

            def test_fixture(memory):
                memory.measure(work, repeat={scenario.repeat}, warmup={scenario.warmup},
                               leak={limit!r})
            """
    )
