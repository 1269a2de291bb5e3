"""memreclaim_limit_bytes in MultiprocessMirror: absent without a limit (it was exported as 0,
so the documented headroom query divided by zero), the collector's ``source`` label with one."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("prometheus_client")

from prometheus_client import CollectorRegistry, generate_latest

from memreclaim.integrations import prometheus


def _samples(registry: CollectorRegistry) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    values = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            values[f"{sample.name}{{{labels}}}"] = sample.value
    return values


def _with_limit(monkeypatch: pytest.MonkeyPatch, limit: tuple[str, int] | None) -> None:
    real = prometheus._read

    def read(refresh_limits: bool) -> dict[str, Any]:
        values = real(refresh_limits)
        values["memreclaim_limit_bytes"] = limit
        return values

    monkeypatch.setattr(prometheus, "_read", read)


def test_no_limit_no_limit_series(monkeypatch: pytest.MonkeyPatch) -> None:
    _with_limit(monkeypatch, None)
    registry = CollectorRegistry()
    prometheus.MultiprocessMirror(registry).update()
    values = _samples(registry)
    assert not [name for name in values if name.startswith("memreclaim_limit_bytes")], values
    assert values["memreclaim_rss_bytes{}"] > 0  # the mirror did export the others


def test_a_limit_is_exported_with_its_source(monkeypatch: pytest.MonkeyPatch) -> None:
    _with_limit(monkeypatch, ("cgroup2", 512 << 20))
    registry = CollectorRegistry()
    prometheus.MultiprocessMirror(registry).update()
    assert _samples(registry)["memreclaim_limit_bytes{source=cgroup2}"] == 512 << 20
