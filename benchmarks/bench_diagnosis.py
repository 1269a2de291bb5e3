"""Accuracy of the diagnosis engine on the labelled scenarios, per allocator, and its cost.

    python benchmarks/bench_diagnosis.py                      # every scenario, every allocator
    python benchmarks/bench_diagnosis.py --allocators glibc --scenarios python_steady,mmap_shared
    python benchmarks/bench_diagnosis.py --table-only         # rebuild the table from the JSON

Each scenario of tests/scenarios runs in a fresh interpreter (tests/conftest.py's runner, with
LD_PRELOAD for jemalloc/tcmalloc/mimalloc) through ``memreclaim.measure()``. A leak scenario is
counted correct when the report names that leak first (``report.kind``); a retention, cache or
clean scenario when the report names no leak. Results accumulate in
docs/benchmarks/diagnosis-<allocator>.json (one entry per scenario, the latest run wins, so
allocators can run in parallel processes); the
table, with the cost of measuring (the measured iterations' time over the untraced warm-up's,
median per allocator), is written between the ``diagnosis-table`` markers of
docs/pytest-plugin.md.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from conftest import ALLOCATOR_LIBS, _run  # noqa: E402 (tests/ is put on the path above)
from scenarios import LABELS, SCENARIOS, judged, measure_code  # noqa: E402

ALLOCATORS = ("glibc", "jemalloc", "tcmalloc", "mimalloc")
RESULTS = ROOT / "docs" / "benchmarks"  # diagnosis-<allocator>.json, one file per allocator
DOC = ROOT / "docs" / "pytest-plugin.md"
BEGIN, END = "<!-- diagnosis-table: begin -->", "<!-- diagnosis-table: end -->"


def run_one(alloc: str, name: str) -> dict[str, Any]:
    """Run one scenario under one allocator; the verdict and whether it is right."""
    scenario = SCENARIOS[name]
    env = None if alloc == "glibc" else {"LD_PRELOAD": str(ALLOCATOR_LIBS[alloc])}
    try:
        out = _run(measure_code(scenario), env=env, timeout=900)
    except (AssertionError, OSError) as exc:  # the child failed: counted as wrong, with why
        return {"label": scenario.label, "ok": False, "error": str(exc)[-500:]}
    return {
        "label": scenario.label,
        "ok": judged(scenario.label, out["kind"], out["leaks"]) and out["allocator"] == alloc,
        "kind": out["kind"],
        "allocator": out["allocator"],
        "verdict": out["verdict"],
        "slowdown": out["slowdown"],
    }


def interleaved() -> list[str]:
    """Every scenario, the default group first, then one of each label in turn (a run cut short
    still covers every label)."""
    by_label = {
        label: [n for n, s in SCENARIOS.items() if s.label == label and not s.default]
        for label in LABELS
    }
    order = [n for n, s in SCENARIOS.items() if s.default]
    while any(by_label.values()):
        for names in by_label.values():
            if names:
                order.append(names.pop(0))
    return order


def table(results: dict[str, dict[str, dict[str, Any]]]) -> str:
    """The markdown accuracy table: correct/run per label and allocator, and the cost row."""
    allocs = [a for a in ALLOCATORS if a in results]
    lines = [
        "| label | " + " | ".join(allocs) + " |",
        "|---|" + "---|" * len(allocs),
    ]
    for label in LABELS:
        row = [label]
        for alloc in allocs:
            runs = [r for r in results[alloc].values() if r["label"] == label]
            row.append(f"{sum(r['ok'] for r in runs)}/{len(runs)}" if runs else "-")
        lines.append("| " + " | ".join(row) + " |")
    cost = ["measured / untraced time (median)"]
    for alloc in allocs:
        factors = [r["slowdown"] for r in results[alloc].values() if r.get("slowdown")]
        cost.append(f"{statistics.median(factors):.1f}x" if factors else "-")
    lines.append("| " + " | ".join(cost) + " |")
    wrong = [
        f"- {alloc} `{name}` ({r['label']}): {r.get('kind', 'error')}: "
        f"{r.get('verdict', r.get('error', ''))[:160]}"
        for alloc in allocs
        for name, r in sorted(results[alloc].items())
        if not r["ok"]
    ]
    if wrong:
        lines += ["", "Wrong or failed runs:", "", *wrong]
    return "\n".join(lines)


def write_doc(text: str) -> None:
    doc = DOC.read_text()
    if BEGIN not in doc or END not in doc:
        raise SystemExit(f"{DOC} has no {BEGIN} ... {END} block")
    head, rest = doc.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    DOC.write_text(f"{head}{BEGIN}\n{text}\n{END}{tail}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--allocators", default=",".join(ALLOCATORS))
    parser.add_argument("--scenarios", default="")
    parser.add_argument("--table-only", action="store_true")
    parser.add_argument("--no-doc", action="store_true", help="do not rewrite the doc's table")
    args = parser.parse_args(argv)
    results: dict[str, dict[str, dict[str, Any]]] = {}
    for alloc in ALLOCATORS:
        path = RESULTS / f"diagnosis-{alloc}.json"
        if path.exists():
            results[alloc] = json.loads(path.read_text())["results"]
    if not args.table_only:
        allocs = [a for a in args.allocators.split(",") if a]
        names = [n for n in args.scenarios.split(",") if n] or interleaved()
        for alloc in allocs:
            if alloc != "glibc" and not ALLOCATOR_LIBS[alloc].exists():
                print(f"{alloc}: {ALLOCATOR_LIBS[alloc]} missing, skipped", flush=True)
                continue
            for name in names:
                result = run_one(alloc, name)
                results.setdefault(alloc, {})[name] = result
                mark = "ok   " if result["ok"] else "WRONG"
                print(f"{alloc:9} {name:36} {mark} {result.get('kind', 'error')}", flush=True)
                saved = {"python": platform.python_version(), "results": results[alloc]}
                path = RESULTS / f"diagnosis-{alloc}.json"
                path.write_text(json.dumps(saved, indent=1, sort_keys=True) + "\n")
    text = table(results)
    print(text)
    if not args.no_doc:
        write_doc(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
