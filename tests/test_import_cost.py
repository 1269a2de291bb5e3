"""`import memreclaim` stays light: the api layer costs <= 1 MiB of RSS and imports no asyncio, ssl,
concurrent.futures or xml; the rest of the public names load on first use."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import bench_import
import pytest

import memreclaim

LIMIT = 1 << 20

# Runs without the workload prelude: the baseline is a bare interpreter (site only), read from
# /proc/self/statm in the same process before and after the import. The probe is the one
# benchmarks/bench_import.py reports from.
BARE_CHILD = bench_import.child_code(True)


def test_import_and_use_cost_at_most_1_mib(run_python: Callable[..., dict[str, Any]]) -> None:
    out = run_python(BARE_CHILD, prelude=False)
    import_cost = out["imported"] - out["bare"]
    use_cost = out["used"] - out["bare"]
    detail = f"(bare {out['bare']} B; new modules: {' '.join(out['modules'])})"
    # Checked before trim() too, so that what trim() gives back cannot hide an import's cost.
    assert import_cost <= LIMIT, f"import memreclaim costs {import_cost} B of RSS {detail}"
    assert use_cost <= LIMIT, f"import + trim/stats/rss costs {use_cost} B of RSS {detail}"
    assert bench_import.forbidden(out["modules"]) == [], detail
    assert "memreclaim._core" in out["modules"], detail  # the child really imported memreclaim


def test_forbidden_module_check_sees_them() -> None:
    """The module filter used above does flag what it must (and not look-alikes)."""
    modules = ["xml.etree", "asyncio", "ssl", "concurrent.futures.thread", "xmlrpc"]
    assert bench_import.forbidden(modules) == [
        "xml.etree",
        "asyncio",
        "ssl",
        "concurrent.futures.thread",
    ]


@pytest.mark.parametrize("name", memreclaim.__all__)
def test_every_public_name_still_resolves(name: str) -> None:
    """Names loaded on first use are still there, by attribute and by `from ... import`."""
    value = getattr(memreclaim, name)
    namespace: dict[str, Any] = {}
    exec(f"from memreclaim import {name}", namespace)
    assert namespace[name] is value


@pytest.mark.parametrize("name", ["_pools", "glibc", "pools", "units"])
def test_submodules_once_imported_eagerly_are_still_attributes(
    run_python: Callable[..., dict[str, Any]], name: str
) -> None:
    """trim(pools=True) reaches _pools by PyCapsule_Import: getattr(memreclaim, '_pools')."""
    out = run_python(f"emit(ok=memreclaim.{name}.__name__)")
    assert out["ok"] == f"memreclaim.{name}"


def test_unknown_attribute_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        memreclaim.no_such_name  # noqa: B018


