#!/usr/bin/env python3
"""Mutation check: apply named source edits one at a time and see whether the tests notice.

Each mutant is one (file, old, new) replacement in the source (``old`` must occur exactly
once). For each mutant the script edits the file in place, rebuilds the extension when a .c file
changed, runs the mutant's test files, and writes the original text back (in a ``finally``, so
an interrupted run leaves no mutant behind; a rebuild then puts the original extension back).
Run it in a scratch copy (``git archive HEAD | tar -x -C DIR``) to keep working meanwhile.
A mutant is *killed* when the tests fail, *survived* when they pass.

    python tools/mutate.py                 # every mutant
    python tools/mutate.py --list          # names, files, tests
    python tools/mutate.py trim-released-from-total-rss units-kib-is-1000
    python tools/mutate.py --json out.json

Exit status: 0 when every mutant was killed, 1 when one survived, 2 on a usage error or when a
mutant no longer applies (its ``old`` text is gone: the source changed; update the mutant).

Mutants marked ``depends`` target code that other work is rewriting (the pacing policy, the
pytest plugin): when their ``old`` text is gone they are reported as ``stale``, not run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PKG = "src/memreclaim/"


@dataclass(frozen=True)
class Mutant:
    name: str
    file: str
    old: str
    new: str
    tests: tuple[str, ...]
    depends: bool = False  # on code another change is rewriting: stale, not failed, if gone


SEMANTICS = "tests/test_core_semantics.py"
MUTANTS = [
    # --- the four mutants of issue 16
    Mutant(
        "trim-released-from-total-rss",
        PKG + "heap.c",
        "return before->anon > after->anon ? before->anon - after->anon : 0;",
        "return before->resident > after->resident ? before->resident - after->resident : 0;",
        (SEMANTICS,),
    ),
    Mutant(
        "pin-mmap-threshold-ignores-value",
        PKG + "knobs.c",
        "err = mr_glibc_mallopt(param, (int)v);",
        "err = param == MR_M_MMAP_THRESHOLD ? 0 : mr_glibc_mallopt(param, (int)v);",
        (SEMANTICS,),
    ),
    Mutant(
        "trim-async-on-loop-thread",
        PKG + "__init__.py",
        "return await asyncio.to_thread(trim, pools=pools)",
        "return trim(pools=pools)",
        (SEMANTICS,),
    ),
    Mutant(
        "trim-seconds-always-zero",
        PKG + "heap.c",
        "(item = PyFloat_FromDouble(run->seconds)) == NULL",
        "(item = PyFloat_FromDouble(0.0 * run->seconds)) == NULL",
        (SEMANTICS,),
    ),
    # --- trim
    Mutant(
        "trim-released-may-be-negative",
        PKG + "heap.c",
        "return before->anon > after->anon ? before->anon - after->anon : 0;",
        "return before->anon - after->anon;",
        (SEMANTICS,),
    ),
    Mutant(
        "trim-not-accounted",
        PKG + "heap.c",
        "totals_add(run_released(run), run->seconds);",
        "(void)0;",
        (SEMANTICS, "tests/test_validate.py"),
    ),
    # --- trim accounting (the process totals, heap.c)
    Mutant(
        "accounting-unknown-release-is-productive",
        PKG + "heap.c",
        "if (released < MR_UNPRODUCTIVE_BELOW) {",
        "if (released >= 0 && released < MR_UNPRODUCTIVE_BELOW) {",
        (SEMANTICS,),
    ),
    Mutant(
        "accounting-released-overwritten",
        PKG + "heap.c",
        "account.released += released;",
        "account.released = released;",
        (SEMANTICS,),
    ),
    Mutant(
        "accounting-seconds-overwritten",
        PKG + "heap.c",
        "account.seconds += seconds;",
        "account.seconds = seconds;",
        (SEMANTICS,),
    ),
    Mutant(
        "accounting-bucket-bound-exclusive",
        PKG + "heap.c",
        "!(seconds <= seconds_bounds[slot])",
        "!(seconds < seconds_bounds[slot])",
        (SEMANTICS,),
    ),
    Mutant(
        "accounting-not-reset-in-fork-child",
        PKG + "heap.c",
        "    memset(&account, 0, sizeof(account));\n",
        "",
        (SEMANTICS,),
    ),
    # --- rss() and stats()
    Mutant(
        "rss-is-anonymous-only",
        PKG + "heap.c",
        "return PyLong_FromLongLong((long long)sample.resident);",
        "return PyLong_FromLongLong((long long)sample.anon);",
        (SEMANTICS, "tests/test_core.py"),
    ),
    Mutant(
        "stats-anon-file-swapped",
        PKG + "heap.c",
        "int64_t figures[6] = {status.rss,       status.rss_anon, status.rss_file,",
        "int64_t figures[6] = {status.rss,       status.rss_file, status.rss_anon,",
        (SEMANTICS, "tests/test_core.py"),
    ),
    Mutant(
        "stats-peak-swap-swapped",
        PKG + "heap.c",
        "status.rss_shmem, status.peak_rss, status.swap};",
        "status.rss_shmem, status.swap, status.peak_rss};",
        (SEMANTICS, "tests/test_core.py"),
    ),
    Mutant(
        "stats-shmem-is-file",
        PKG + "heap.c",
        "status.rss_shmem, status.peak_rss, status.swap};",
        "status.rss_file, status.peak_rss, status.swap};",
        (SEMANTICS, "tests/test_core.py"),
    ),
    Mutant(
        "stats-peak-is-current",
        PKG + "procfs.c",
        'KB_FIELD("VmHWM:", mr_status, peak_rss),',
        'KB_FIELD("VmRSS:", mr_status, peak_rss),',
        (SEMANTICS, "tests/test_core.py"),
    ),
    # --- heap_stats() on glibc
    Mutant(
        "heap-in-use-without-mmapped",
        PKG + "backends.c",
        "out->in_use = (int64_t)(mi.uordblks + mi.hblkhd);",
        "out->in_use = (int64_t)mi.uordblks;",
        (SEMANTICS, "tests/test_core.py"),
    ),
    Mutant(
        "heap-free-is-fastbins",
        PKG + "backends.c",
        "out->free = (int64_t)mi.fordblks;",
        "out->free = (int64_t)mi.fsmblks;",
        (SEMANTICS, "tests/test_core.py"),
    ),
    Mutant(
        "heap-mapped-without-mmapped",
        PKG + "backends.c",
        "out->mapped = (int64_t)(mi.arena + mi.hblkhd);",
        "out->mapped = (int64_t)mi.arena;",
        (SEMANTICS, "tests/test_core.py"),
    ),
    # --- units.parse_bytes
    Mutant(
        "units-kib-is-1000",
        PKG + "units.py",
        '"kib": 1024,',
        '"kib": 1000,',
        ("tests/test_core.py", "tests/test_validate.py"),
    ),
    Mutant(
        "units-mb-is-binary",
        PKG + "units.py",
        '"mb": 1000**2,',
        '"mb": 1024**2,',
        ("tests/test_core.py", "tests/test_validate.py"),
    ),
    Mutant(
        "units-fraction-truncated",
        PKG + "units.py",
        "return int(float(number) * factor)",
        "return int(float(number)) * factor",
        ("tests/test_core.py", "tests/test_validate.py"),
    ),
    Mutant(
        "units-negative-int-accepted",
        PKG + "units.py",
        "if value < 0:",
        "if value < -1:",
        ("tests/test_core.py", "tests/test_validate.py"),
    ),
    # --- memreclaim._validate
    Mutant(
        "validate-zero-seconds-accepted",
        PKG + "_validate.py",
        "if result < 0 or (result == 0 and not allow_zero):",
        "if result < 0:",
        ("tests/test_validate.py",),
    ),
    Mutant(
        "validate-bool-is-seconds",
        PKG + "_validate.py",
        "if isinstance(value, bool) or not isinstance(value, int | float):\n"
        '        raise TypeError(\n            f"{name} must be a number of seconds',
        "if not isinstance(value, int | float):\n"
        '        raise TypeError(\n            f"{name} must be a number of seconds',
        ("tests/test_validate.py",),
    ),
    Mutant(
        "validate-integer-minimum-off-by-one",
        PKG + "_validate.py",
        "if value < minimum:",
        "if value < minimum - 1:",
        ("tests/test_validate.py",),
    ),
    Mutant(
        "validate-integer-no-maximum",
        PKG + "_validate.py",
        "if maximum is not None and value > maximum:",
        "if False:",
        ("tests/test_validate.py",),
    ),
    Mutant(
        "validate-fraction-above-one",
        PKG + "_validate.py",
        "if not (0.0 <= result <= 1.0) or",
        "if not (0.0 <= result <= 2.0) or",
        ("tests/test_validate.py",),
    ),
    Mutant(
        "validate-flag-takes-ints",
        PKG + "_validate.py",
        "if not isinstance(value, bool):",
        "if not isinstance(value, int):",
        ("tests/test_validate.py",),
    ),
    # --- the pacing policy, the runners near a limit, and the plugin's thresholds
    Mutant(
        "pacing-trims-at-the-slack",
        PKG + "policy.py",
        "if grown > slack:",
        "if grown >= 0:",
        ("tests/test_policy.py",),
    ),
    Mutant(
        "pacing-ignores-rising",
        PKG + "policy.py",
        "if rising and not settled and in_flight != 0:",
        "if False:",
        ("tests/test_policy.py",),
    ),
    Mutant(
        "pacing-ignores-min-interval",
        PKG + "policy.py",
        "if self._last_trim is not None and now < self._last_trim + wait:",
        "if False:",
        ("tests/test_policy.py",),
    ),
    Mutant(
        "pacing-ignores-freed-at-the-limit",
        PKG + "policy.py",
        "if freed > self._min_release:",
        "if False:",
        ("tests/test_policy.py",),
    ),
    Mutant(
        "pacing-slow-readings-near-the-limit",
        PKG + "policy.py",
        "if held or self._near_limit(self._previous, self._level):",
        "if False:",
        ("tests/test_policy.py",),
    ),
    Mutant(
        "runner-ignores-the-usage-alarm",
        PKG + "watchdog.py",
        "alarm, why = usage_alarm(mark)",
        'alarm, why = None, "mutant"',
        ("tests/test_limits.py",),
    ),
    Mutant(
        "plugin-leak-limit-ignored",
        PKG + "pytest_plugin.py",
        "if leak is not None and report.leak_per_iteration > leak:",
        "if False:",
        ("tests/test_plugin.py", "-k", "not test_scenarios_through_marker_and_fixture"),
        depends=True,
    ),
    Mutant(
        "plugin-retained-limit-ignored",
        PKG + "pytest_plugin.py",
        "if retained is not None and report.retained > retained:",
        "if False:",
        ("tests/test_plugin.py", "-k", "not test_scenarios_through_marker_and_fixture"),
        depends=True,
    ),
    # --- diagnosis and plugin additions (issue 14)
    Mutant(
        "plugin-marker-trace-ignored",
        PKG + "pytest_plugin.py",
        "before: Snapshot = snapshot(trace=spec.trace, frames=spec.frames)",
        "before: Snapshot = snapshot()",
        ("tests/test_plugin.py", "-k", "not test_scenarios_through_marker_and_fixture"),
    ),
    Mutant(
        "diagnosis-mapped-files-ignored",
        PKG + "diagnosis/_judge.py",
        "return (self.outside.private_leak or 0) + shared.shmem_leak + shared.file_leak",
        "return (self.outside.private_leak or 0) + shared.shmem_leak",
        ("tests/test_diagnose.py",),
    ),
    Mutant(
        "diagnosis-report-trim-dropped",
        PKG + "diagnosis/__init__.py",
        "        trim=ctx.after.trim,\n",
        "        trim=None,\n",
        ("tests/test_diagnose.py", "tests/test_cli.py"),
    ),
    Mutant(
        "diagnosis-own-sites-listed",
        PKG + "diagnosis/report.py",
        "        if _hidden_site(frame.filename):\n            continue\n",
        "",
        ("tests/test_diagnose.py",),
    ),
    Mutant(
        "diagnosis-workload-sites-dropped",
        PKG + "diagnosis/report.py",
        "    return _own(filename) or filename == _TRACEMALLOC",
        "    return filename.startswith(_PACKAGE) or filename == _TRACEMALLOC",
        ("tests/test_diagnose.py",),
    ),
    Mutant(
        "pressure-empty-read-resets-counters",
        PKG + "pressure.py",
        "counters = {**src.counters, **_counters(_pread(src.fd))}",
        "counters = _counters(_pread(src.fd))",
        ("tests/test_pressure.py",),
    ),
    Mutant(
        "mimalloc-walk-small-large-swapped",
        PKG + "backends.c",
        "if (a->block_size <= out->small_max) {",
        "if (a->block_size > out->small_max) {",
        ("tests/test_core.py",),
    ),
]


def build() -> None:
    """Rebuild the extension (``pip install -e .``: the build needs pip's isolated setuptools)."""
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "-e", "."],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"build failed:\n{proc.stdout}\n{proc.stderr}")


class NoTests(Exception):
    """pytest selected no test for a mutant (exit status 5): neither killed nor survived."""


def run_tests(tests: tuple[str, ...], workers: int, timeout: float) -> tuple[bool, str]:
    """(passed, last lines of the output) of pytest on ``tests``."""
    # -m "": the slow tests (the plugin's) are the mutants' tests too; the default -m of the
    # configuration would deselect them, and an empty run must not count as a kill.
    argv = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-m", "", *tests]
    if workers > 1:
        argv[3:3] = ["-n", str(workers)]
    try:
        proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return False, f"pytest still running after {timeout:g} s (counted as killed: a hang)"
    tail = "\n".join(proc.stdout.strip().splitlines()[-3:])
    if proc.returncode == 5:  # pytest collected nothing: the mutant's test list is wrong
        raise NoTests(f"no tests ran for {' '.join(tests)}:\n{tail}")
    return proc.returncode == 0, tail


def apply(mutant: Mutant, original: str) -> bool:
    """Edit the file; False when the mutant no longer applies (``old`` is not there once)."""
    if original.count(mutant.old) != 1:
        return False
    (ROOT / mutant.file).write_text(original.replace(mutant.old, mutant.new))
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="mutants to run (default: all)")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument("--json", metavar="FILE", help="write the results as JSON")
    parser.add_argument("-n", "--workers", type=int, default=1, help="pytest -n (default 1)")
    parser.add_argument(
        "--timeout", type=float, default=900, help="seconds allowed per mutant's test run"
    )
    args = parser.parse_args(argv)
    by_name = {m.name: m for m in MUTANTS}
    unknown = [n for n in args.names if n not in by_name]
    if unknown:
        parser.error(f"unknown mutant(s): {', '.join(unknown)} (see --list)")
    chosen = [by_name[n] for n in args.names] if args.names else MUTANTS
    if args.list:
        for m in chosen:
            mark = " [depends on code being rewritten]" if m.depends else ""
            print(f"{m.name:<42} {m.file:<32} {' '.join(m.tests)}{mark}")
        return 0
    results: list[dict[str, object]] = []
    for m in chosen:
        start = time.monotonic()
        rebuilt = m.file.endswith(".c")
        original = (ROOT / m.file).read_text()
        try:
            if not apply(m, original):
                status, tail = ("stale" if m.depends else "no-match"), "old text not found once"
            else:
                try:
                    if rebuilt:
                        build()
                    passed, tail = run_tests(m.tests, args.workers, args.timeout)
                    status = "survived" if passed else "killed"
                except RuntimeError as exc:  # the mutant does not compile: not a test's merit
                    status, tail = "no-build", str(exc)[-500:]
                except NoTests as exc:
                    status, tail = "no-tests", str(exc)[-500:]
        finally:
            (ROOT / m.file).write_text(original)  # restored before anything else runs
            if rebuilt:
                build()
        seconds = time.monotonic() - start
        results.append(
            {
                "name": m.name,
                "file": m.file,
                "status": status,
                "tests": m.tests,
                "depends": m.depends,
                "seconds": round(seconds, 1),
                "output": tail,
            }
        )
        print(f"{status:<9} {m.name:<42} ({seconds:.0f} s)", flush=True)
        if status == "survived":
            print("          " + tail.replace("\n", "\n          "), flush=True)
    counted = [r for r in results if r["status"] in ("killed", "survived")]
    killed = sum(r["status"] == "killed" for r in counted)
    rate = killed / len(counted) if counted else 0.0
    print(
        f"\nkilled {killed} of {len(counted)} mutants ({rate:.0%});"
        f" {len(results) - len(counted)} not run (stale/no-match/no-build/no-tests)"
    )
    if args.json:
        Path(args.json).write_text(json.dumps({"kill_rate": rate, "results": results}, indent=2))
    if any(r["status"] in ("no-match", "no-build", "no-tests") for r in results):
        return 2
    return 0 if killed == len(counted) else 1


if __name__ == "__main__":
    os.environ.pop("LD_PRELOAD", None)
    sys.exit(main())
