"""memreclaim.integrations.prometheus: a real prometheus_client registry, scraped over HTTP on
loopback around a trim of a 300 MiB spike; the limit gauge in a real cgroup v1."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from test_limits import JOIN, v1_cgroup  # noqa: F401  (a fixture: a fresh cgroup v1)

from memreclaim.integrations import prometheus

MiB = 1 << 20

# Scrape over HTTP, parse with prometheus_client's own parser.
SCRAPE = """
import urllib.request
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.parser import text_string_to_metric_families
from memreclaim.integrations import prometheus

registry = CollectorRegistry()
prometheus.register(registry)
server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
url = f"http://127.0.0.1:{server.server_port}/metrics"

def scrape():
    with urllib.request.urlopen(url, timeout=30) as response:
        text = response.read().decode()
    values = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = sample.name
            if sample.labels:
                key += "{" + ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items())) + "}"
            values[key] = sample.value
    return values
"""


def test_http_scrape_around_a_300mib_trim(run_python: Callable[..., dict[str, Any]]) -> None:
    out = run_python(
        SCRAPE
        + """
from memreclaim import workloads
data = workloads.strings(140_000)          # ~300 MiB of malloc'd strings
survivors = workloads.keep_every(data, 50)
del data
before = scrape()
result = memreclaim.trim()
after = scrape()
server.shutdown()
emit(before=before, after=after, released=result.released)
"""
    )
    before, after = out["before"], out["after"]
    assert after["memreclaim_trims_total"] - before["memreclaim_trims_total"] == 1
    gained = after["memreclaim_released_bytes_total"] - before["memreclaim_released_bytes_total"]
    assert gained == out["released"]  # the metric is the trim's own figure
    assert gained > 100 * MiB
    assert after["memreclaim_trim_seconds_count"] == before["memreclaim_trim_seconds_count"] + 1
    assert (
        after["memreclaim_trim_seconds_bucket{le=+Inf}"] == after["memreclaim_trim_seconds_count"]
    )
    assert (
        after["memreclaim_trims_unproductive_total"]
        == before["memreclaim_trims_unproductive_total"]
    )
    assert after["memreclaim_rss_anon_bytes"] < before["memreclaim_rss_anon_bytes"] - 100 * MiB
    assert after["memreclaim_rss_bytes"] < before["memreclaim_rss_bytes"]
    assert "memreclaim_traced_bytes" not in after  # tracemalloc is not running


def test_traced_bytes_only_while_tracing(run_python: Callable[..., dict[str, Any]]) -> None:
    out = run_python(
        SCRAPE
        + """
import tracemalloc
off = scrape()
tracemalloc.start()
held = [bytes(1000) for _ in range(20_000)]   # ~20 MB traced
on = scrape()
server.shutdown()
emit(off="memreclaim_traced_bytes" in off, traced=on.get("memreclaim_traced_bytes"))
"""
    )
    assert out["off"] is False
    assert out["traced"] > 19_000_000


def test_limit_gauge_in_a_real_cgroup(
    v1_cgroup: Path,  # noqa: F811
    run_python: Callable[..., dict[str, Any]],
) -> None:
    (v1_cgroup / "memory.limit_in_bytes").write_text(str(512 * MiB))
    out = run_python(JOIN + SCRAPE + "emit(values=scrape())", params={"CGROUP": str(v1_cgroup)})
    values = out["values"]
    assert values["memreclaim_limit_bytes{source=cgroup1}"] == 512 * MiB
    assert values["memreclaim_limit_target_bytes"] == int(512 * MiB * 0.9)


def test_generate_latest_agrees_with_the_totals(
    run_python: Callable[..., dict[str, Any]],
) -> None:
    # In a fresh interpreter: runners other tests left in this worker would trim in between.
    out = run_python(
        """
from prometheus_client import CollectorRegistry, generate_latest
from memreclaim import _accounting
from memreclaim.integrations import prometheus
memreclaim.trim()
registry = CollectorRegistry()
prometheus.register(registry)
text = generate_latest(registry).decode()
totals = _accounting.totals()
emit(text=text, trims=totals.trims, released=totals.released_bytes)
"""
    )
    text = out["text"]
    assert out["trims"] == 1
    assert f"memreclaim_trims_total {float(out['trims'])}" in text
    assert f"memreclaim_released_bytes_total {float(out['released'])}" in text
    for name in (
        "memreclaim_rss_bytes",
        "memreclaim_rss_anon_bytes",
        "memreclaim_trims_unproductive_total",
        "memreclaim_trim_seconds_bucket",
    ):
        assert f"\n{name}" in text


def test_register_failure_modes() -> None:
    registry = CollectorRegistry()
    prometheus.register(registry)
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        prometheus.register(registry)
    with pytest.raises(TypeError, match="CollectorRegistry"):
        prometheus.register("default")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="refresh_limits"):
        prometheus.MemreclaimCollector(refresh_limits=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="CollectorRegistry or None"):
        prometheus.MultiprocessMirror("default")  # type: ignore[arg-type]
    mirror = prometheus.MultiprocessMirror(CollectorRegistry())
    mirror.update()
    mirror.update()  # no new trims: adds nothing, raises nothing


def test_multiprocess_mirror_sums_workers(
    run_python: Callable[..., dict[str, Any]], tmp_path: Path
) -> None:
    """prometheus_client's multiprocess mode, as under gunicorn: two forked workers each trim
    a spike and mirror their figures; the scrape side sums them from the files."""
    out = run_python(
        """
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client import multiprocess
from prometheus_client.parser import text_string_to_metric_families
from memreclaim import workloads
from memreclaim.integrations.prometheus import MultiprocessMirror

released = []
pids = []
for worker in range(2):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        mirror = MultiprocessMirror()   # after the fork, as in gunicorn's post_fork
        data = workloads.strings(100_000)
        survivors = workloads.keep_every(data, 50)
        del data
        result = memreclaim.trim()
        mirror.update()
        os.write(w, str(result.released).encode())
        os._exit(0)
    os.close(w)
    released.append(int(os.read(r, 100)))
    os.waitpid(pid, 0)
    pids.append(pid)
registry = CollectorRegistry()
multiprocess.MultiProcessCollector(registry)
values = {}
for family in text_string_to_metric_families(generate_latest(registry).decode()):
    for sample in family.samples:
        values[sample.name + repr(sorted(sample.labels.items()))] = sample.value
emit(values=values, released=released, pids=pids)
""",
        env={"PROMETHEUS_MULTIPROC_DIR": str(tmp_path)},
    )
    values = out["values"]
    assert values["memreclaim_trims_total[]"] == 2
    assert values["memreclaim_released_bytes_total[]"] == sum(out["released"])
    assert min(out["released"]) > 100 * MiB
    # "liveall" gauges: the workers have exited, but nobody called mark_process_dead, so their
    # files are still read; one series per pid.
    for pid in out["pids"]:
        assert values[f"memreclaim_rss_bytes[('pid', '{pid}')]"] > 0
