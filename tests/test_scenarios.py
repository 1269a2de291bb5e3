"""The labelled scenarios of tests/scenarios through ``measure()``, under glibc and the preloaded
allocators, each in a fresh interpreter.

By default one scenario of each label runs under each allocator (the scenarios marked
``default``); ``MEMRECLAIM_SCENARIOS=all`` runs the whole matrix (CI's diagnosis step). Leak
scenarios must be named first with the right kind; retention, caches and clean workloads must
get no leak at all. The same scenarios through the marker and the fixture are in
tests/test_plugin.py.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from conftest import allocator_lib
from scenarios import LABELS, SCENARIOS, judged, measure_code

pytestmark = pytest.mark.slow  # CI's `slow` step (.ci/run)
ALLOCATORS = ("glibc", "jemalloc", "tcmalloc", "mimalloc")


def _params() -> Iterator[Any]:
    full = os.environ.get("MEMRECLAIM_SCENARIOS") == "all"
    for alloc in ALLOCATORS:
        for name, scenario in SCENARIOS.items():
            if full or scenario.default:
                yield pytest.param(alloc, name, id=f"{alloc}-{name}")


def test_default_group_covers_every_label() -> None:
    assert {s.label for s in SCENARIOS.values() if s.default} == set(LABELS)


@pytest.mark.timeout(900)
@pytest.mark.parametrize(("alloc", "name"), list(_params()))
def test_scenario(run_python: Callable[..., dict[str, Any]], alloc: str, name: str) -> None:
    scenario = SCENARIOS[name]
    env = None if alloc == "glibc" else {"LD_PRELOAD": str(allocator_lib(alloc))}
    r = run_python(measure_code(scenario), env=env, timeout=800)
    assert r["allocator"] == alloc
    assert judged(scenario.label, r["kind"], r["leaks"]), f"{name} ({scenario.label}):\n{r['text']}"
