"""Retention benchmarks: the seed workloads under each allocator and knob, side by side.

    python benchmarks/run.py            # full run (~5 min): writes docs/benchmarks/retention.*
    python benchmarks/run.py --quick    # small sizes, one repetition, into a temporary folder

Every variant runs in a fresh process (allocators are chosen with LD_PRELOAD, knobs with their
environment variables), several times, interleaved (repetition 1 of every variant, then
repetition 2, ...), so slow drift of the machine hits all variants alike. The tables quote the
median and the min-max over the repetitions. Outputs: ``retention.md`` (tables, machine,
commands), ``retention.json`` (every raw result) and one PNG per case.

Cases:
  spike    seed 000: 160,000 strings of 600-4,000 bytes, every 50th kept; glibc, PYTHONMALLOC=
           malloc, MALLOC_MMAP_THRESHOLD_=512, jemalloc (default and decay 0), mimalloc (default,
           MIMALLOC_DECOMMIT_DELAY=0, and MIMALLOC_PURGE_DELAY=0 which 2.0.9 ignores), tcmalloc;
           each trimmed with memreclaim.trim() after the free.
  dicts    seed 003: a dict of 1,000,000 dicts, freed entirely or keeping every 1000th.
  buffers  seed 004: 20 rounds of 1-5 MiB buffers; RSS per round for default glibc, a pinned mmap
           threshold, trim per round, jemalloc and mimalloc; outputs dropped each round or kept
           for 3 rounds.
  shrink   seed 002 in C (benchmarks/shrink.c, built with cc): 1,000,000 blocks of 100 bytes,
           every 1000th kept, 1 and 8 threads, with and without malloc_trim(0); madvise calls
           counted with strace when it is installed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from service_bench import plot_service, run_service, service_argvs

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CASES = HERE / "cases"
LIBDIR = Path("/usr/lib/x86_64-linux-gnu")
LIBS = {
    "jemalloc": LIBDIR / "libjemalloc.so.2",
    "mimalloc": LIBDIR / "libmimalloc.so.2",
    "tcmalloc": LIBDIR / "libtcmalloc_minimal.so.4",
}
PACKAGES = {
    "glibc": "libc6",
    "jemalloc": "libjemalloc2",
    "mimalloc": "libmimalloc2.0",
    "tcmalloc": "libtcmalloc-minimal4",
}
MiB = 1 << 20


@dataclass
class Variant:
    """One configuration of one case: a command, its environment, and the allocator it needs."""

    case: str
    label: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    allocator: str = "glibc"
    group: str = ""
    results: list[dict[str, Any]] = field(default_factory=list)

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        for name in list(env):  # start from a clean allocator configuration
            if name.startswith(("MALLOC_", "MIMALLOC_", "TCMALLOC_", "PYTHONMALLOC")):
                del env[name]
        env.pop("LD_PRELOAD", None)
        if self.allocator != "glibc":
            env["LD_PRELOAD"] = str(LIBS[self.allocator])
        env.update(self.env)
        return env

    def shown_command(self) -> str:
        env = dict(self.env)
        if self.allocator != "glibc":
            env = {"LD_PRELOAD": str(LIBS[self.allocator]), **env}
        words = [f"{k}={v}" for k, v in env.items()] + [
            "python" if a == sys.executable else a for a in self.argv
        ]
        return " ".join(str(w).replace(str(ROOT) + "/", "") for w in words)


def run_python_case(variant: Variant) -> dict[str, Any]:
    proc = subprocess.run(
        variant.argv, capture_output=True, text=True, env=variant.environment(), timeout=600
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{variant.case}/{variant.label} failed:\n{proc.stderr}")
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("RESULT "):
            result: dict[str, Any] = json.loads(line[len("RESULT ") :])
            return result
    raise RuntimeError(f"{variant.case}/{variant.label} printed no RESULT:\n{proc.stdout}")


# ------------------------------------------------------------------------------ variants


def spike_variants(quick: bool) -> list[Variant]:
    argv = [sys.executable, str(CASES / "spike.py")]
    if quick:
        argv += ["--count", "20000"]
    table: list[tuple[str, str, dict[str, str]]] = [
        ("glibc", "glibc default", {}),
        ("glibc", "glibc PYTHONMALLOC=malloc", {"PYTHONMALLOC": "malloc"}),
        ("glibc", "glibc MALLOC_MMAP_THRESHOLD_=512", {"MALLOC_MMAP_THRESHOLD_": "512"}),
        ("glibc", "glibc, spike in 16 threads", {}),
        ("glibc", "glibc, 16 threads, MALLOC_ARENA_MAX=2", {"MALLOC_ARENA_MAX": "2"}),
        ("jemalloc", "jemalloc default", {}),
        (
            "jemalloc",
            "jemalloc decay 0",
            {"MALLOC_CONF": "dirty_decay_ms:0,muzzy_decay_ms:0"},
        ),
        ("mimalloc", "mimalloc default", {}),
        ("mimalloc", "mimalloc MIMALLOC_DECOMMIT_DELAY=0", {"MIMALLOC_DECOMMIT_DELAY": "0"}),
        ("mimalloc", "mimalloc MIMALLOC_PURGE_DELAY=0", {"MIMALLOC_PURGE_DELAY": "0"}),
        ("tcmalloc", "tcmalloc default", {}),
    ]
    if quick:
        table = [row for row in table if row[1] in {"glibc default", "jemalloc decay 0"}]
    return [
        Variant(
            "spike",
            label,
            argv + (["--threads", "16"] if "16 threads" in label else []),
            env,
            alloc,
        )
        for alloc, label, env in table
    ]


def dicts_variants(quick: bool) -> list[Variant]:
    out = []
    for keep in (0, 1000):
        argv = [sys.executable, str(CASES / "dicts.py"), "--keep-every", str(keep)]
        if quick:
            argv += ["--count", "200000"]
        group = "free all" if keep == 0 else "keep every 1000th"
        rows: list[tuple[str, str, list[str], dict[str, str]]] = [
            ("glibc", "glibc default", [], {}),
            ("glibc", "glibc PYTHONMALLOC=malloc", [], {"PYTHONMALLOC": "malloc"}),
            ("glibc", "glibc, enable_pool_reclaim() + trim(pools=True)", ["--pools"], {}),
            (
                "jemalloc",
                "jemalloc decay 0",
                [],
                {"MALLOC_CONF": "dirty_decay_ms:0,muzzy_decay_ms:0"},
            ),
            (
                "mimalloc",
                "mimalloc MIMALLOC_DECOMMIT_DELAY=0",
                [],
                {"MIMALLOC_DECOMMIT_DELAY": "0"},
            ),
            ("tcmalloc", "tcmalloc default", [], {}),
        ]
        if quick:
            rows = rows[:2]
        out += [
            Variant("dicts", label, argv + extra, env, alloc, group)
            for alloc, label, extra, env in rows
        ]
    return out


def buffers_variants(quick: bool) -> list[Variant]:
    out = []
    for live in (0, 3):
        base = [sys.executable, str(CASES / "buffers.py"), "--live-rounds", str(live)]
        if quick:
            base += ["--rounds", "6"]
        group = "outputs dropped each round" if live == 0 else "outputs kept 3 rounds"
        rows: list[tuple[str, str, list[str], dict[str, str]]] = [
            ("glibc", "glibc default", [], {}),
            ("glibc", "glibc pin_mmap_threshold(64 KiB)", ["--mode", "pin"], {}),
            ("glibc", "glibc trim() per round", ["--mode", "trim"], {}),
            ("jemalloc", "jemalloc default", [], {}),
            ("mimalloc", "mimalloc default", [], {}),
        ]
        if quick:
            rows = rows[:2]
        out += [
            Variant("buffers", label, base + extra, env, alloc, group)
            for alloc, label, extra, env in rows
        ]
    return out


def service_variants(quick: bool) -> list[Variant]:
    return [
        Variant("service", label, argv, env, alloc)
        for label, argv, alloc, env in service_argvs(quick)
    ]


def shrink_variants(quick: bool, binary: Path) -> list[Variant]:
    out = []
    configs = [(1, 0), (1, 1), (8, 0), (8, 1)]
    for threads, trim in configs:
        what = "malloc_trim(0)" if trim else "no trim"
        label = f"{threads} thread{'s' if threads > 1 else ''}, {what}"
        out.append(Variant("shrink", label, [str(binary), str(threads), "1000", str(trim)]))
    if not quick:
        out.append(
            Variant(
                "shrink",
                "8 threads, MALLOC_ARENA_MAX=1, malloc_trim(0)",
                [str(binary), "8", "1000", "1"],
                {"MALLOC_ARENA_MAX": "1"},
            )
        )
    return out


def run_shrink(variant: Variant) -> dict[str, Any]:
    env = variant.environment()
    strace = shutil.which("strace")
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace.txt"
        argv = variant.argv
        if strace is not None:
            argv = [strace, "-f", "-qq", "-e", "trace=madvise,write", "-o", str(trace), *argv]
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)
        if proc.returncode != 0:
            raise RuntimeError(f"shrink {variant.label} failed:\n{proc.stderr}")
        result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
        if strace is not None:
            inside = False
            total = during_trim = 0
            for line in trace.read_text().splitlines():
                if "MARK trim" in line:
                    inside = True
                elif "MARK done" in line:
                    inside = False
                elif "madvise(" in line:
                    total += 1
                    during_trim += inside
            result["madvise_total"] = total
            result["madvise_during_trim"] = during_trim
    return result


def build_shrink(workdir: Path) -> Path | None:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    binary = workdir / "shrink"
    subprocess.run([cc, "-O2", "-pthread", "-o", str(binary), str(HERE / "shrink.c")], check=True)
    return binary


# ------------------------------------------------------------------------------ statistics


def values(variant: Variant, key: str) -> list[float]:
    return [float(r[key]) for r in variant.results if r.get(key) is not None]


def mib(variant: Variant, key: str) -> str:
    """Median and min-max of ``key`` in MiB, e.g. ``57.1 (56.8-57.4)``."""
    vals = values(variant, key)
    if not vals:
        return "-"
    med = statistics.median(vals) / MiB
    if len(vals) == 1:
        return f"{med:.1f}"
    return f"{med:.1f} ({min(vals) / MiB:.1f}-{max(vals) / MiB:.1f})"


def secs(variant: Variant, key: str, scale: float = 1.0, digits: int = 2) -> str:
    vals = [v * scale for v in values(variant, key)]
    if not vals:
        return "-"
    med = statistics.median(vals)
    if len(vals) == 1:
        return f"{med:.{digits}f}"
    return f"{med:.{digits}f} ({min(vals):.{digits}f}-{max(vals):.{digits}f})"


def count(variant: Variant, key: str) -> str:
    vals = values(variant, key)
    if not vals:
        return "-"
    med = statistics.median(vals)
    return (
        f"{med:.0f}" if min(vals) == max(vals) else f"{med:.0f} ({min(vals):.0f}-{max(vals):.0f})"
    )


def median(variant: Variant, key: str) -> float:
    vals = values(variant, key)
    return statistics.median(vals) if vals else float("nan")


# ------------------------------------------------------------------------------ plots


def plot_bars(variants: Sequence[Variant], title: str, path: Path, floors: bool) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    groups = list(dict.fromkeys(v.group for v in variants))
    fig, axes = plt.subplots(
        len(groups),
        1,
        figsize=(12, 1.2 + 0.55 * len(variants) + 0.6 * len(groups)),
        dpi=100,
        squeeze=False,
    )
    keys = [
        ("peak", "peak", "#c44e52"),
        ("after_free", "after free", "#dd8452"),
        ("after_trim", "after trim()", "#4c72b0"),
    ]
    for ax, group in zip(axes[:, 0], groups, strict=True):
        rows = [v for v in variants if v.group == group]
        height = 0.8 / len(keys)
        for k, (key, name, color) in enumerate(keys):
            ys = [i + (k - 1) * height for i in range(len(rows))]
            ax.barh(
                ys, [median(v, key) / MiB for v in rows], height=height, label=name, color=color
            )
        if floors:
            base = rows[0]
            ax.axvline(
                median(base, "physical_floor") / MiB,
                color="black",
                linestyle="--",
                linewidth=1,
                label="physical floor (baseline + live bytes)",
            )
            ax.axvline(
                median(base, "page_floor") / MiB,
                color="green",
                linestyle=":",
                linewidth=1.5,
                label="page floor (pages holding a live byte)",
            )
        ax.set_yticks(range(len(rows)), [v.label for v in rows], fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("RSS, MiB (median)")
        ax.set_title(f"{title}: {group}" if group else title, fontsize=10)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, format="png")
    plt.close(fig)
    return True


def plot_rounds(variants: Sequence[Variant], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import MaxNLocator
    except ImportError:
        return False
    groups = list(dict.fromkeys(v.group for v in variants))
    fig, axes = plt.subplots(
        1,
        len(groups),
        figsize=(12, 4.5),
        dpi=100,
        squeeze=False,
    )
    top = max(max(r["per_round"]) for v in variants for r in v.results) / MiB
    for ax, group in zip(axes[0], groups, strict=True):
        styles = ["-", "--", ":", "-.", (0, (5, 1, 1, 1))]
        for i, v in enumerate(v for v in variants if v.group == group):
            # the per-round curve of the run whose final RSS is the median one
            runs = sorted(v.results, key=lambda r: r["final"])
            mid = runs[len(runs) // 2]["per_round"]
            ax.plot(
                range(1, len(mid) + 1),
                [r / MiB for r in mid],
                marker=".",
                linestyle=styles[i % len(styles)],
                label=v.label,
            )
        ax.set_title(f"seed 004 buffers: {group}", fontsize=10)
        ax.set_xlabel("round")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylim(0, top * 1.1)
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("RSS after the round, MiB (median run)")
    fig.tight_layout()
    fig.savefig(path, format="png")
    plt.close(fig)
    return True


# ------------------------------------------------------------------------------ report


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "python": platform.python_version(),
        "kernel": platform.release(),
        "cpus": os.cpu_count(),
        "glibc": platform.libc_ver()[1],
    }
    dpkg = shutil.which("dpkg-query")
    for name, package in PACKAGES.items():
        if dpkg is None:
            break
        proc = subprocess.run(
            [dpkg, "-W", "-f", "${Version}", package], capture_output=True, text=True
        )
        if proc.returncode == 0 and proc.stdout:
            info[f"{name}_package"] = f"{package} {proc.stdout.strip()}"
    return info


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def commands(variants: Sequence[Variant]) -> list[str]:
    """The command of every variant, as a list to copy from."""
    lines = ["", "Commands (from the repository root, after `pip install -e .`):", ""]
    lines += [f"    {v.shown_command()}" for v in variants]
    return lines


Column = tuple[str, Callable[[Variant], str]]


def mib_col(title: str, key: str) -> Column:
    return (f"{title} MiB", lambda v: mib(v, key))


def ms_col(title: str, key: str, scale: float = 1000, digits: int = 1) -> Column:
    return (f"{title} ms", lambda v: secs(v, key, scale, digits))


LABEL: Column = ("variant", lambda v: v.label)
SHAPE: Column = ("shape", lambda v: v.group)

# Per case: title, explanation, the table's columns, the plot's alt text, a closing paragraph.
SECTIONS: dict[str, tuple[str, list[str], list[Column], str, list[str]]] = {
    "spike": (
        "Seed 000: a spike of strings, 2 % kept",
        [
            "160,000 strings of 600-4,000 bytes (`random.Random(0)`), every 50th kept with its",
            "tuple and float, the rest freed, then `memreclaim.trim()` (which calls the serving",
            "allocator's own release: malloc_trim(0), jemalloc `arena.<all>.purge`, `mi_collect`,",
            "tcmalloc `ReleaseFreeMemory`). Physical floor: baseline RSS + bytes of the live",
            "objects; page floor: baseline RSS + pages that hold at least one live byte (from the",
            "objects' addresses) - no allocator can go below it without moving objects.",
        ],
        [
            LABEL,
            mib_col("baseline", "baseline"),
            mib_col("peak", "peak"),
            mib_col("after free", "after_free"),
            mib_col("after trim", "after_trim"),
            ms_col("trim", "trim_seconds"),
            ("build s", lambda v: secs(v, "build_seconds")),
            mib_col("physical floor", "physical_floor"),
            mib_col("page floor", "page_floor"),
        ],
        "seed 000 spike",
        [],
    ),
    "dicts": (
        "Seed 003: a dict of a million dicts",
        [
            "`{i: {} for i in range(1_000_000)}`, then freed entirely or keeping every 1000th",
            "inner dict, then `memreclaim.trim()`. The inner dicts live in pymalloc arenas (1 MiB",
            "each, from mmap), which pymalloc frees only when every pool in the arena is empty;",
            "`enable_pool_reclaim()` (at start-up) lets `trim(pools=True)` give back the pages of",
            "the empty 16 KiB pools inside such arenas.",
        ],
        [
            SHAPE,
            LABEL,
            mib_col("baseline", "baseline"),
            mib_col("peak", "peak"),
            mib_col("after free", "after_free"),
            mib_col("after trim", "after_trim"),
            ms_col("trim", "trim_seconds"),
            mib_col("page floor", "page_floor"),
            ("pymalloc pools released", lambda v: count(v, "pools_released")),
        ],
        "seed 003 dicts",
        [],
    ),
    "buffers": (
        "Seed 004: many 1-5 MiB buffers per round",
        [
            "Each round allocates 12 buffers of 1-5 MiB, each followed by 40 temporary strings",
            "and one string that survives; the round's temporaries are then freed. glibc's",
            "adaptive mmap threshold rises after the first large free, so later buffers land on",
            "the heap between survivors. Wall time includes the re-faults that giving pages back",
            "costs.",
        ],
        [
            SHAPE,
            LABEL,
            mib_col("baseline", "baseline"),
            mib_col("highest round", "max_round"),
            mib_col("last round", "final"),
            ("wall s", lambda v: secs(v, "wall_seconds")),
            (
                "time in trim ms",
                lambda v: secs(v, "trim_seconds", 1000, 1) if "trim" in v.argv else "-",
            ),
        ],
        "seed 004 buffers",
        [],
    ),
    "shrink": (
        "Seed 002: the same in C",
        [
            "`benchmarks/shrink.c`: 1,000,000 blocks of 100 bytes, each thread allocating and",
            "freeing its share, every 1000th kept. madvise calls counted with",
            "`strace -f -e trace=madvise,write` (inside malloc_trim: between two marker writes).",
        ],
        [
            LABEL,
            mib_col("start", "start"),
            mib_col("after malloc", "after_malloc"),
            mib_col("after free", "after_free"),
            mib_col("after trim", "after_trim"),
            ("madvise in trim", lambda v: count(v, "madvise_during_trim")),
            ("madvise total", lambda v: count(v, "madvise_total")),
        ],
        "",
        [
            "The binary is built at run time; by hand:",
            "",
            "    cc -O2 -pthread -o shrink benchmarks/shrink.c",
            "    strace -f -qq -e trace=madvise,write -o trace.txt ./shrink 1 1000 1",
        ],
    ),
    "service": (
        "A real service: burst of large responses, then light traffic",
        [
            "`benchmarks/cases/service.py`: a stdlib `ThreadingHTTPServer` on 127.0.0.1 whose",
            "`/report` builds a response from thousands of 600-4,000-byte strings and caches 2 %",
            "of them. The client (in `benchmarks/service_bench.py`) sends a burst of concurrent",
            "`/report` requests, then one `/ping` every 20 ms for 10 s, timing each; the server's",
            'VmRSS is read from /proc every 50 ms. RSS "end" is at the end of the light traffic.',
            '"memreclaim run" is `python -m memreclaim run --interval 0.5 --slack 32MiB --',
            "service.py`: the service with the command line's periodic trimmer.",
            "`MALLOC_MMAP_THRESHOLD_=131072` is glibc's default value, but fixed: setting it turns",
            "off the adaptive mmap threshold, and with it the trim threshold's rise to twice the",
            "mmap threshold (the 18 MB response bodies would raise them to 18 and 36 MB).",
        ],
        [
            LABEL,
            mib_col("baseline", "baseline"),
            mib_col("peak", "peak"),
            mib_col("after burst", "after_burst"),
            mib_col("end", "end"),
            ms_col("/report p50", "report_ms_p50", 1, 0),
            ms_col("/ping p50", "ping_ms_p50", 1, 2),
            ms_col("/ping p99", "ping_ms_p99", 1, 2),
            ms_col("/ping max", "ping_ms_max", 1, 1),
            ("trimmer (a median run)", lambda v: trimmer_summary(v)),
        ],
        "service RSS over time",
        [
            "Each command starts the service alone; the driver is",
            "`python benchmarks/run.py --cases service`.",
        ],
    ),
}


def trimmer_summary(variant: Variant) -> str:
    """``N trim(s) released X in Y ms`` from the median run's ``memreclaim run`` report."""
    reports = sorted(r["trimmer_report"] for r in variant.results if r["trimmer_report"])
    if not reports:
        return "-"
    median_report: str = reports[len(reports) // 2]
    return median_report.split("; ", 1)[1].split(" (")[0]


def report(
    cases: dict[str, list[Variant]],
    info: dict[str, Any],
    quick: bool,
    repeat: int,
    plots: dict[str, str],
    notes: list[str],
) -> str:
    """The markdown report: the machine, then one section (table, commands, plot) per case."""
    versions = {}
    for variants in cases.values():
        for v in variants:
            for r in v.results:
                if r.get("allocator_version"):
                    versions[r["allocator"]] = r["allocator_version"]
    lines = [
        "# Retention benchmarks",
        "",
        "Generated by `python benchmarks/run.py" + (" --quick" if quick else "") + "`; do not "
        "edit by hand. Every variant ran in a fresh process, "
        f"{repeat} time(s) (the service case at most 3), interleaved; figures are the median"
        " and (min-max).",
        "",
        f"- Machine: {info['date']}, Linux {info['kernel']}, {info['cpus']} CPUs (shared)",
        f"- Python {info['python']}, glibc {info['glibc']}",
    ]
    for name in ("glibc", "jemalloc", "mimalloc", "tcmalloc"):
        pkg = info.get(f"{name}_package")
        seen = versions.get(name)
        if pkg or seen:
            lines.append(f"- {name}: {pkg or ''}{f' (reports {seen})' if seen else ''}")
    lines += [f"- Note: {n}" for n in notes]
    lines.append("")
    for name, (title, text, columns, alt, closing) in SECTIONS.items():
        if name not in cases:
            continue
        vs = cases[name]
        lines += [f"## {title}", "", *text, ""]
        lines += table([c[0] for c in columns], [[c[1](v) for c in columns] for v in vs])
        if name != "shrink":
            lines += commands(vs)
        if closing:
            lines += ["", *closing]
        if name in plots:
            lines += ["", f"![{alt}]({plots[name]})"]
        lines.append("")
    return "\n".join(lines)


# ------------------------------------------------------------------------------ main


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument(
        "--quick",
        action="store_true",
        help="small sizes, few variants, one repetition (for the test suite)",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=None,
        help="repetitions of each variant (default 5, or 1 with --quick)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="output folder (default docs/benchmarks, or a temporary folder with --quick)",
    )
    parser.add_argument(
        "--cases",
        nargs="+",
        choices=("spike", "dicts", "buffers", "shrink", "service"),
        default=["spike", "dicts", "buffers", "shrink", "service"],
    )
    args = parser.parse_args(argv)
    repeat = args.repeat if args.repeat is not None else (1 if args.quick else 5)
    if repeat < 1:
        parser.error("--repeat must be at least 1")
    out: Path = args.out or (
        Path(tempfile.mkdtemp(prefix="memreclaim-bench-"))
        if args.quick
        else ROOT / "docs" / "benchmarks"
    )
    out.mkdir(parents=True, exist_ok=True)
    notes: list[str] = []
    workdir = Path(tempfile.mkdtemp(prefix="memreclaim-build-"))
    builders: dict[str, Callable[[bool], list[Variant]]] = {
        "spike": spike_variants,
        "dicts": dicts_variants,
        "buffers": buffers_variants,
        "service": service_variants,
    }
    cases: dict[str, list[Variant]] = {}
    for name in args.cases:
        if name == "shrink":
            binary = build_shrink(workdir)
            if binary is None:
                notes.append("no C compiler: the seed 002 case was skipped")
                continue
            if shutil.which("strace") is None:
                notes.append("strace is not installed: madvise calls were not counted")
            cases[name] = shrink_variants(args.quick, binary)
        else:
            variants = builders[name](args.quick)
            missing = sorted(
                {
                    v.allocator
                    for v in variants
                    if v.allocator != "glibc" and not LIBS[v.allocator].exists()
                }
            )
            for lib in missing:
                notes.append(f"{LIBS[lib]} is not installed: its variants were skipped")
            cases[name] = [v for v in variants if v.allocator not in missing]
    started = time.perf_counter()
    for name, variants in cases.items():
        runner: Callable[[Variant], dict[str, Any]] = run_python_case
        if name == "shrink":
            runner = run_shrink
        elif name == "service":
            runner = lambda v: run_service(v.argv, v.environment(), args.quick)  # noqa: E731
        reps = min(repeat, 3) if name == "service" else repeat  # ~15 s per service run
        for rep in range(reps):
            print(
                f"[{time.perf_counter() - started:6.1f} s] {name}: repetition {rep + 1}/{reps}"
                f" of {len(variants)} variants",
                file=sys.stderr,
                flush=True,
            )
            for v in variants:
                v.results.append(runner(v))
    shutil.rmtree(workdir, ignore_errors=True)
    plots: dict[str, str] = {}
    if "spike" in cases and plot_bars(cases["spike"], "seed 000 spike", out / "spike.png", True):
        plots["spike"] = "spike.png"
    if "dicts" in cases and plot_bars(cases["dicts"], "seed 003 dicts", out / "dicts.png", False):
        plots["dicts"] = "dicts.png"
    if "buffers" in cases and plot_rounds(cases["buffers"], out / "buffers.png"):
        plots["buffers"] = "buffers.png"
    if "service" in cases and plot_service(
        [(v.label, v.results) for v in cases["service"]], out / "service.png"
    ):
        plots["service"] = "service.png"
    if not plots:
        notes.append("matplotlib is not installed: no plots (pip install 'memreclaim[bench]')")
    info = machine()
    (out / "retention.md").write_text(report(cases, info, args.quick, repeat, plots, notes))
    raw = {
        "machine": info,
        "quick": args.quick,
        "repeat": repeat,
        "cases": {
            name: [
                {
                    "label": v.label,
                    "group": v.group,
                    "command": v.shown_command(),
                    "results": v.results,
                }
                for v in vs
            ]
            for name, vs in cases.items()
        },
    }
    (out / "retention.json").write_text(json.dumps(raw, separators=(",", ":")) + "\n")
    print(f"wrote {out / 'retention.md'} in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
