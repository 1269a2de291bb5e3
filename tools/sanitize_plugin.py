"""pytest plugin for tools/sanitize.sh: deselect tests that cannot run under a preloaded ASan.

tests/conftest.py's ``run_python`` fixture starts its workloads with LD_PRELOAD removed (so an
allocator test cannot leak its preload into another); an ASan-built extension then refuses to
load ("ASan runtime does not come first"). Those tests are deselected here, by fixture, and
listed (visible without xdist), rather than failing for a reason that is no sanitizer report.
"""

from __future__ import annotations

import pytest

INCOMPATIBLE_FIXTURES = {"run_python"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    keep: list[pytest.Item] = []
    drop: list[pytest.Item] = []
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        (drop if names & INCOMPATIBLE_FIXTURES else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(
                f"sanitize: deselected {len(drop)} test(s) using run_python (it drops LD_PRELOAD):"
            )
            for item in drop:
                reporter.write_line(f"  {item.nodeid}")
