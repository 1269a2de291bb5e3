"""What `import memreclaim` costs over a bare interpreter, per Python version, in one run.

    python benchmarks/bench_import.py [--rounds 15] [--python PATH ...] [--out FILE.md]

For each interpreter (default: pyenv's 3.11/3.12/3.13 under ~/.pyenv/versions and Debian's
/usr/bin/python3, those present), memreclaim is built from the working tree's tracked files
(a clean copy: no in-tree build/ or .so) into a venv of that interpreter. Then two child scripts
run alternately in that venv, ``--rounds`` times each:

- bare: reads /proc/self/statm and exits;
- memreclaim: the same, then ``import memreclaim; trim(); stats(); rss()`` and reads it again.

Reported: RSS added by the import (and by import + trim/stats/rss), read in the child before and
after; modules the import added; the import's own time; and the whole process's wall time with
the import vs bare (a ratio from the same run). RSS figures are medians, times medians too.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# Modules `import memreclaim` must not pull in (tests/test_import_cost.py checks the same list).
FORBIDDEN = ("asyncio", "ssl", "concurrent.futures", "xml")


def forbidden(modules: list[str]) -> list[str]:
    """The modules among ``modules`` that are, or are inside, one of FORBIDDEN."""
    return [m for m in modules if any(m == f or m.startswith(f + ".") for f in FORBIDDEN)]


# The child: a bare interpreter (site only) reads its resident size from /proc/self/statm, then
# (with IMPORT true) imports memreclaim, calls trim/stats/rss and reads it again. Shared with
# tests/test_import_cost.py (run with IMPORT = True there): one probe for the figure the test
# bounds and the benchmark reports.
CHILD = """
import os, sys, time
PAGE = os.sysconf("SC_PAGESIZE")


def resident():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


resident()  # the reader's own first-call costs belong to the baseline
before_modules = set(sys.modules)
bare = resident()
out = {"bare": bare}
if IMPORT:
    t0 = time.perf_counter()
    import memreclaim

    out["import_s"] = time.perf_counter() - t0
    out["imported"] = resident()
    memreclaim.trim()
    memreclaim.stats()
    memreclaim.rss()
    out["used"] = resident()
    out["modules"] = sorted(set(sys.modules) - before_modules)
import json

print("RESULT " + json.dumps(out))
"""


def child_code(do_import: bool) -> str:
    """The child script, with or without the import."""
    return f"IMPORT = {do_import}\n" + CHILD


def default_pythons() -> list[Path]:
    found = []
    pyenv = Path.home() / ".pyenv" / "versions"
    for minor in ("3.11", "3.12", "3.13"):
        versions = sorted(pyenv.glob(f"{minor}.*/bin/python3"), key=lambda p: p.parts[-3])
        if versions:
            found.append(versions[-1])
    found.append(Path("/usr/bin/python3"))
    return found


def export_tree(dest: Path) -> str:
    """Copy the tracked files as they are now; returns a description of the revision."""
    files = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, check=True, capture_output=True
    ).stdout.split(b"\0")
    for name in filter(None, files):
        src = ROOT / os.fsdecode(name)
        if src.is_file():
            target = dest / os.fsdecode(name)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target)
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    dirty = subprocess.run(["git", "diff", "--quiet", "HEAD"], cwd=ROOT).returncode != 0
    return head + (" + uncommitted changes" if dirty else "")


def build_venv(python: Path, tree: Path, where: Path) -> Path:
    """A venv of ``python`` with memreclaim installed from ``tree`` (not editable)."""
    subprocess.run([str(python), "-m", "venv", str(where)], check=True)
    venv_python = where / "bin" / "python"
    subprocess.run(
        [str(venv_python), "-m", "pip", "install", "-q", "--no-deps", str(tree)],
        check=True,
        env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
    )
    return venv_python


@dataclass
class Result:
    version: str
    bare_rss: float  # bytes, medians from here on
    added: float  # RSS the import added
    added_used: float  # ... the import plus trim(), stats(), rss()
    import_ms: float  # the import statement's own time
    bare_wall_ms: float  # whole process, bare
    import_wall_ms: float  # whole process, with the import
    modules: list[str]

    @property
    def forbidden(self) -> list[str]:
        return forbidden(self.modules)


def child(python: Path, do_import: bool) -> tuple[dict[str, Any], float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "LD_PRELOAD"))}
    start = time.perf_counter()
    proc = subprocess.run(
        [str(python), "-c", child_code(do_import)],
        capture_output=True,
        text=True,
        env=env,
        cwd="/",
        timeout=120,
        check=True,
    )
    wall = time.perf_counter() - start
    out: dict[str, Any] = json.loads(proc.stdout.removeprefix("RESULT "))
    return out, wall


def measure(python: Path, rounds: int) -> Result:
    bare_walls, import_walls, import_s, added, added_used, bare_rss = [], [], [], [], [], []
    modules: list[str] = []
    child(python, True)  # warm the page cache and the .pyc files
    for _ in range(rounds):
        bare, wall = child(python, False)
        bare_walls.append(wall)
        bare_rss.append(bare["bare"])
        out, wall = child(python, True)
        import_walls.append(wall)
        import_s.append(out["import_s"])
        added.append(out["imported"] - out["bare"])
        added_used.append(out["used"] - out["bare"])
        modules = out["modules"]
    version = subprocess.run(
        [str(python), "-c", "import platform; print(platform.python_version())"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    return Result(
        version=version,
        bare_rss=statistics.median(bare_rss),
        added=statistics.median(added),
        added_used=statistics.median(added_used),
        import_ms=statistics.median(import_s) * 1e3,
        bare_wall_ms=statistics.median(bare_walls) * 1e3,
        import_wall_ms=statistics.median(import_walls) * 1e3,
        modules=modules,
    )


def render(rows: list[tuple[str, Result]], revision: str, rounds: int) -> str:
    lines = [
        "# Import cost",
        "",
        f"Measured {time.strftime('%Y-%m-%d')} on {platform.machine()}, {os.cpu_count()} cores, "
        f"memreclaim at {revision}. Command: `python benchmarks/bench_import.py` "
        f"({rounds} alternating rounds per interpreter; medians).",
        "",
        "RSS is read from /proc/self/statm inside the child, before and after; "
        "the wall times are whole processes (start, run, exit), bare and with the import, "
        "alternating in the same run.",
        "",
        "| interpreter | Python | bare RSS | + import | + import, trim, stats, rss "
        "| import | process: bare | with import | ratio |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in rows:
        lines.append(
            f"| {name} | {r.version} | {r.bare_rss / 2**20:.1f} MiB | {r.added / 1024:.0f} KiB "
            f"| {r.added_used / 1024:.0f} KiB | {r.import_ms:.1f} ms | {r.bare_wall_ms:.1f} ms "
            f"| {r.import_wall_ms:.1f} ms | {r.import_wall_ms / r.bare_wall_ms:.2f}x |"
        )
    lines += ["", "Modules the import adds:", ""]
    for name, r in rows:
        lines.append(f"- {name}: {' '.join(r.modules)}")
    bad = [f"{name}: {' '.join(r.forbidden)}" for name, r in rows if r.forbidden]
    lines += [
        "",
        "Forbidden modules (asyncio, ssl, concurrent.futures, xml) imported: "
        + ("; ".join(bad) if bad else "none."),
    ]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--python", type=Path, action="append", help="an interpreter (repeatable)")
    parser.add_argument("--out", type=Path, help="write the Markdown table here")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-import-") as tmp:
        tree = Path(tmp) / "tree"
        revision = export_tree(tree)
        for i, python in enumerate(args.python or default_pythons()):
            if not python.exists():
                print(f"skip {python}: not installed", file=sys.stderr)
                continue
            name = str(python)
            print(f"== {name}: building", file=sys.stderr)
            venv_python = build_venv(python, tree, Path(tmp) / f"venv{i}")
            rows.append((name, measure(venv_python, args.rounds)))
            print(
                f"   {rows[-1][1].version}: +{rows[-1][1].added_used / 1024:.0f} KiB",
                file=sys.stderr,
            )
    if not rows:
        print("no interpreter to measure", file=sys.stderr)
        return 1
    text = render(rows, revision, args.rounds)
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
