"""memreclaim's pytest plugin side by side with pytest-memray and psleak on the same tests.

Each case is one workload (``work()``) with a known answer: three leaks made in C or Python (a
native ``malloc`` never freed in a C library this script builds, Python objects leaked by a C
extension it builds that takes a reference and never gives it back, a module-level list that
grows) and four real libraries' retention, which is not a
leak (numpy tiles, a pandas groupby, a 4.5 MB JSON document, a Pillow pipeline). Each tool runs
each case in a pytest process of its own, written from that tool's docs:

* memreclaim: ``@pytest.mark.no_leak(limit="1 MiB", repeat=5, warmup=1)``;
* pytest-memray: ``@pytest.mark.limit_leaks("1 MB")`` under ``--memray``;
* psleak: ``MemoryLeakTestCase.execute(work, warmup_times=1, times=5, retries=3,
  tolerance=1 MiB)`` under ``PYTHONMALLOC=malloc`` (without it psleak skips).

A verdict is right when a leak case fails and a control passes. Wall time is the pytest
process's, from start to exit, so each tool pays its own start-up. ``--table`` writes
docs/benchmarks/plugin-peers.md with the load (``os.getloadavg()``) before and after.

    python benchmarks/bench_plugin_peers.py --repeat 1 --table
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "benchmarks" / "plugin-peers.md"

SETUP = """
import ctypes, gc, json, sys
sys.path.insert(0, {folder!r})
KEEP = []
"""

# The leaks in C, built by this script (a C compiler and Python's headers are needed); the
# attribution tests build the same sources.
C_SOURCES = ROOT / "tests" / "c"


def build(folder: Path) -> str | None:
    """Build libmrleaky.so and the mr_refleak extension in ``folder``; None, or why not."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    include = sysconfig.get_paths()["include"]
    if compiler is None or not Path(include, "Python.h").exists():
        return "no C compiler or Python headers"
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    for source, target in (
        ("mr_leaky.c", "libmrleaky.so"),
        ("mr_refleak.c", "mr_refleak" + suffix),
    ):
        args = [compiler, "-O1", "-shared", "-fPIC", f"-I{include}", "-o", target]
        args.append(str(C_SOURCES / source))
        proc = subprocess.run(args, cwd=folder, capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            return f"{source} did not compile: {proc.stderr[-300:]}"
    return None


@dataclass(frozen=True)
class Case:
    name: str
    leaks: bool
    needs: str | None  # an importable module the case needs ("C": the C built here)
    code: str  # defines work()
    names: str | None = None  # the word a failure report that names the culprit contains


CASES = (
    Case(
        "native malloc leak in a C library (2 MiB per call)",
        True,
        "C",
        """
        import os
        LIB = ctypes.CDLL(os.path.join(sys.path[0], "libmrleaky.so"))
        def work():
            LIB.leaky_call(2048)
        """,
        "leaky_keep_record",
    ),
    Case(
        "refcount leak in a C extension (2 MiB per call)",
        True,
        "C",
        """
        import mr_refleak
        def work():
            for _ in range(2048):
                mr_refleak.make(1000)
        """,
        "mr_refleak",
    ),
    Case(
        "pure-Python leak (module list, 2 MiB per call)",
        True,
        None,
        """
        def work():
            KEEP.extend({"n": i, "s": "x" * 40} for i in range(8_000))
        """,
    ),
    Case(
        "numpy tiles (retention control)",
        False,
        "numpy",
        """
        import numpy
        def work():
            tiles = [numpy.ones((256, 256)) * i for i in range(200)]
            total = sum(float(t[0, 0]) for t in tiles)
            del tiles
            return total
        """,
    ),
    Case(
        "pandas groupby (retention control)",
        False,
        "pandas",
        """
        import numpy, pandas
        FRAME = pandas.DataFrame({"k": numpy.arange(400_000) % 1000,
                                  "v": numpy.arange(400_000, dtype=float)})
        def work():
            return FRAME.groupby("k")["v"].agg(["sum", "mean", "max"]).shape
        """,
    ),
    Case(
        "4.5 MB JSON document (retention control)",
        False,
        None,
        """
        DOCUMENT = json.dumps([{"id": i, "name": "item%d" % i, "tags": ["a", "b", "c"],
                                "v": i * 0.5} for i in range(60_000)])
        def work():
            return len(json.loads(DOCUMENT))
        """,
    ),
    Case(
        "Pillow pipeline (retention control)",
        False,
        "PIL",
        """
        import io
        from PIL import Image, ImageFilter
        def work():
            image = Image.new("RGB", (1600, 1200), (10, 20, 30))
            out = image.filter(ImageFilter.GaussianBlur(2)).resize((800, 600)).rotate(10)
            buffer = io.BytesIO()
            out.save(buffer, "PNG")
            return len(buffer.getvalue())
        """,
    ),
)

TOOLS: dict[str, tuple[str, str | None]] = {
    # tool: (test module body, module it needs)
    "memreclaim": (
        """
        import pytest
        @pytest.mark.no_leak(limit="1 MiB", repeat=5, warmup=1)
        def test_case():
            work()
        """,
        None,
    ),
    "pytest-memray": (
        """
        import pytest
        @pytest.mark.limit_leaks("1 MB")
        def test_case():
            work()
        """,
        "pytest_memray",
    ),
    "psleak": (
        """
        import psleak
        class TestCase(psleak.MemoryLeakTestCase):
            def test_case(self):
                self.execute(work, warmup_times=1, times=5, retries=3, tolerance=1024 * 1024)
        """,
        "psleak",
    ),
}


def _command(tool: str, path: Path) -> tuple[list[str], dict[str, str]]:
    env = dict(os.environ)
    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist"]
    args += ["-p", "no:randomly", "-o", "addopts=", str(path)]
    if tool == "pytest-memray":
        args.append("--memray")
    if tool == "psleak":
        env["PYTHONMALLOC"] = "malloc"
    return args, env


def run_one(tool: str, case: Case, folder: Path) -> tuple[str, float, bool]:
    """(outcome: passed/failed/skipped/error, wall seconds, whether the output names the
    culprit) of one tool on one case."""
    body, _ = TOOLS[tool]
    path = folder / f"test_{tool.replace('-', '_')}.py"
    setup = SETUP.format(folder=str(folder))
    path.write_text(setup + textwrap.dedent(case.code) + textwrap.dedent(body))
    args, env = _command(tool, path)
    start = time.perf_counter()
    proc = subprocess.run(args, env=env, cwd=folder, capture_output=True, text=True, timeout=900)
    seconds = time.perf_counter() - start
    tail = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    named = case.names is not None and case.names in proc.stdout
    for outcome in ("failed", "passed", "skipped"):
        if f"1 {outcome}" in tail:
            return outcome, seconds, named
    return f"error ({tail[-60:]!r})", seconds, named


def _available(module: str | None) -> bool:
    return module is None or importlib.util.find_spec(module) is not None


def measure(repeat: int) -> list[dict[str, object]]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        no_c = build(Path(tmp))
        for case in CASES:
            if case.needs == "C" and no_c is not None:
                print(f"skip {case.name}: {no_c}", file=sys.stderr)
                continue
            if case.needs != "C" and not _available(case.needs):
                print(f"skip {case.name}: {case.needs} not installed", file=sys.stderr)
                continue
            for tool, (_, needs) in TOOLS.items():
                if not _available(needs):
                    continue
                outcomes, times, named = [], [], []
                for _ in range(repeat):  # the tools alternate per case: same load for each
                    outcome, seconds, names = run_one(tool, case, Path(tmp))
                    outcomes.append(outcome)
                    times.append(seconds)
                    named.append(names)
                right = sum(
                    (o == "failed") == case.leaks and o in ("failed", "passed") for o in outcomes
                )
                rows.append(
                    {
                        "case": case.name,
                        "leaks": case.leaks,
                        "tool": tool,
                        "outcomes": outcomes,
                        "right": right,
                        "runs": repeat,
                        "seconds": statistics.median(times),
                        "named": case.names is not None and all(named),
                    }
                )
                print(
                    f"{case.name:50} {tool:14} {outcomes} {statistics.median(times):6.1f} s",
                    file=sys.stderr,
                    flush=True,
                )
    return rows


def table(rows: list[dict[str, object]], repeat: int, load: tuple[str, str]) -> str:
    tools = [t for t in TOOLS if any(r["tool"] == t for r in rows)]
    lines = [
        "# memreclaim's pytest plugin vs pytest-memray and psleak",
        "",
        "Written by `python benchmarks/bench_plugin_peers.py --table` (the module docstring says",
        "how each tool is used). Each cell: right verdicts / runs, median wall time of the pytest",
        f"process (start-up included); {repeat} run(s) per cell. Load average (1 min) before:",
        f"{load[0]}, after: {load[1]} (2 cores).",
        "",
        "How each tool's limit applies: memreclaim's is the steady leak per run (all sites",
        "together, Python + native + outside malloc); pytest-memray's `limit_leaks` is per",
        "allocation location (a leak spread over several stacks, each under the limit, passes);",
        'psleak\'s `tolerance` is the RSS/heap growth over `times` calls, retried. "names it":',
        "the failure output names the C culprit (`leaky_keep_record`, `mr_refleak`).",
        "",
        "| case | leaks? | " + " | ".join(tools) + " |",
        "|---|---|" + "---|" * len(tools),
    ]
    cases = list(dict.fromkeys(str(r["case"]) for r in rows))
    totals = dict.fromkeys(tools, 0.0)
    for case in cases:
        cells = []
        for tool in tools:
            row = next(r for r in rows if r["case"] == case and r["tool"] == tool)
            totals[tool] += float(row["seconds"])  # type: ignore[arg-type]
            mark = "" if row["right"] == row["runs"] else f" ({'/'.join(row['outcomes'])})"  # type: ignore[arg-type]
            named = ", names it" if row.get("named") else ""
            cells.append(
                f"{row['right']}/{row['runs']}{mark}, {float(row['seconds']):.1f} s{named}"
            )  # type: ignore[arg-type]
        leaks = next(r["leaks"] for r in rows if r["case"] == case)
        lines.append(f"| {case} | {'yes' if leaks else 'no'} | " + " | ".join(cells) + " |")
    lines.append(
        "| **total wall time** | | " + " | ".join(f"{totals[t]:.1f} s" for t in tools) + " |"
    )
    if totals.get("pytest-memray"):
        ratio = totals["memreclaim"] / totals["pytest-memray"]
        lines += ["", f"memreclaim / pytest-memray total wall time: {ratio:.2f}x."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs per tool and case")
    parser.add_argument("--table", action="store_true", help=f"write {DOC.relative_to(ROOT)}")
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be >= 1")
    before = f"{os.getloadavg()[0]:.2f}"
    rows = measure(args.repeat)
    text = table(rows, args.repeat, (before, f"{os.getloadavg()[0]:.2f}"))
    print(text)
    if args.table:
        DOC.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
