"""Prometheus metrics for memreclaim (``pip install 'memreclaim[prometheus]'``).

    >>> from prometheus_client import start_http_server
    >>> from memreclaim.integrations import prometheus
    >>> prometheus.register()            # into prometheus_client's default REGISTRY
    >>> start_http_server(9100, addr="127.0.0.1")   # loopback: scraped by a local agent

Every scrape reads the figures fresh (``/proc/self/statm``-cheap):

==================================== ======= ====================================================
``memreclaim_rss_bytes``             gauge   resident set size
``memreclaim_rss_anon_bytes``        gauge   anonymous resident bytes (what trimming gives back)
``memreclaim_traced_bytes``          gauge   tracemalloc's traced bytes, only while it traces
``memreclaim_trims_total``           counter every :func:`memreclaim.trim` in the process, direct
                                             or made by a runner
``memreclaim_trims_unproductive_total`` counter trims that gave back under 1 MiB
``memreclaim_released_bytes_total``  counter bytes those trims gave back
``memreclaim_trim_seconds``          histo.  how long the trims took
``memreclaim_limit_bytes``           gauge   the memory limit (:func:`memreclaim.limits`), label
                                             ``source``; absent when there is none
``memreclaim_limit_target_bytes``    gauge   the RSS the runners keep under (``limits().target()``)
==================================== ======= ====================================================

The counters come from the process-wide trim totals (``memreclaim.totals()``), where each trim
records itself once: they agree with the runners' own counters and never count a release twice.
In the code this table is ``_METRICS``, one row per metric, which both the collector and
:class:`MultiprocessMirror` read.

For an ASGI app, mount prometheus_client's ASGI app on the app itself (no second listener)::

    app.mount("/metrics", make_asgi_app())      # after register(); see docs/integrations.md

``start_http_server(port)`` listens on every interface unless given ``addr="127.0.0.1"``.

Multiprocess mode (gunicorn with ``PROMETHEUS_MULTIPROC_DIR``): prometheus_client's
``MultiProcessCollector`` aggregates only metrics kept in its per-process files; a custom
collector such as this one reports the process that answers the scrape, not the fleet. See
``docs/containers.md`` for what to do there.
"""

from __future__ import annotations

import tracemalloc
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import REGISTRY, CollectorRegistry

import memreclaim

from .. import _accounting

__all__ = ["MemreclaimCollector", "MultiprocessMirror", "register"]


@dataclass(frozen=True)
class _Metric:
    """One row of the metrics table: the collector reports it, the mirror copies it (or not)."""

    name: str
    kind: str  # "gauge", "counter" or "histogram"
    help: str
    mirror: Literal["liveall", "livemax", "counter"] | None = None
    """How :class:`MultiprocessMirror` copies it: a gauge's ``multiprocess_mode``, ``"counter"``
    for a counter (a histogram's sum, for the histogram), None: not mirrored."""


_METRICS: tuple[_Metric, ...] = (
    _Metric("memreclaim_rss_bytes", "gauge", "Resident set size of the process.", "liveall"),
    _Metric(
        "memreclaim_rss_anon_bytes",
        "gauge",
        "Anonymous resident bytes (the memory a trim can give back).",
        "liveall",
    ),
    _Metric(
        "memreclaim_traced_bytes", "gauge", "Bytes traced by tracemalloc (live Python allocations)."
    ),
    _Metric("memreclaim_trims", "counter", "Trims made in this process.", "counter"),
    _Metric(
        "memreclaim_trims_unproductive",
        "counter",
        f"Trims that gave back less than {_accounting.UNPRODUCTIVE_BELOW} bytes.",
        "counter",
    ),
    _Metric(
        "memreclaim_released_bytes", "counter", "Bytes given back to the OS by trims.", "counter"
    ),
    _Metric("memreclaim_trim_seconds", "histogram", "How long trims took.", "counter"),
    _Metric(
        "memreclaim_limit_bytes",
        "gauge",
        "The process's memory limit (cgroup or rlimit).",
        "livemax",
    ),
    _Metric(
        "memreclaim_limit_target_bytes",
        "gauge",
        "The RSS memreclaim keeps under (90% of the limit, or memory.high).",
    ),
)
"""Every metric, once: name (counters without ``_total``), kind, help, and how the mirror
copies it."""


def _read(refresh_limits: bool) -> dict[str, Any]:
    """Every metric's value now, by name; None: not reported (no figure)."""
    st = memreclaim.stats()
    totals = _accounting.totals()
    lim = memreclaim.limits(refresh=refresh_limits)
    traced = tracemalloc.get_traced_memory()[0] if tracemalloc.is_tracing() else None
    return {
        "memreclaim_rss_bytes": st.rss,
        "memreclaim_rss_anon_bytes": st.rss_anon,
        "memreclaim_traced_bytes": traced,
        "memreclaim_trims": totals.trims,
        "memreclaim_trims_unproductive": totals.unproductive,
        "memreclaim_released_bytes": totals.released_bytes,
        "memreclaim_trim_seconds": (totals.seconds, totals.seconds_buckets),
        "memreclaim_limit_bytes": None if lim.limit is None else (lim.source, lim.limit),
        "memreclaim_limit_target_bytes": lim.target(),
    }


def _family(metric: _Metric, value: Any) -> Metric:
    """The prometheus_client metric family of one table row with its value."""
    if metric.kind == "counter":
        return CounterMetricFamily(metric.name, metric.help, value=value)
    if metric.kind == "histogram":
        total, counts = value
        cumulative, buckets = 0, []
        bounds = (*(repr(float(b)) for b in _accounting.SECONDS_BUCKETS), "+Inf")
        for bound, count in zip(bounds, counts, strict=True):
            cumulative += count
            buckets.append((bound, cumulative))
        return HistogramMetricFamily(metric.name, metric.help, buckets=buckets, sum_value=total)
    if isinstance(value, tuple):  # (source, limit): the one labelled gauge
        family = GaugeMetricFamily(metric.name, metric.help, labels=["source"])
        family.add_metric([value[0]], value[1])
        return family
    return GaugeMetricFamily(metric.name, metric.help, value=value)


class MemreclaimCollector:
    """A ``prometheus_client`` collector of this process's memreclaim figures (see the module
    docstring). ``refresh_limits=True`` re-reads the cgroup limit at every scrape (a few small
    file reads) instead of using :func:`memreclaim.limits`' cached value."""

    def __init__(self, *, refresh_limits: bool = False) -> None:
        from .._validate import flag

        self._refresh_limits = flag("refresh_limits", refresh_limits)

    def describe(self) -> Iterator[Metric]:
        """The metric names, without values (lets a registry refuse a second registration)."""
        kinds = {
            "gauge": GaugeMetricFamily,
            "counter": CounterMetricFamily,
            "histogram": HistogramMetricFamily,
        }
        for metric in _METRICS:
            yield kinds[metric.kind](metric.name, "")

    def collect(self) -> Iterator[Metric]:
        """The metrics, read now; a gauge without a figure is left out."""
        values = _read(self._refresh_limits)
        for metric in _METRICS:
            if values[metric.name] is not None:
                yield _family(metric, values[metric.name])


def register(
    registry: CollectorRegistry = REGISTRY, *, refresh_limits: bool = False
) -> MemreclaimCollector:
    """Register a :class:`MemreclaimCollector` into ``registry`` (default: prometheus_client's
    global one) and return it. Registering twice into one registry raises prometheus_client's
    ValueError (duplicated timeseries)."""
    if not isinstance(registry, CollectorRegistry):
        raise TypeError(
            f"registry must be a prometheus_client CollectorRegistry, not {type(registry).__name__}"
        )
    collector = MemreclaimCollector(refresh_limits=refresh_limits)
    registry.register(collector)
    return collector


class MultiprocessMirror:
    """Copies this process's figures into prometheus_client metric objects, which its
    multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``, e.g. under gunicorn) aggregates over every
    worker. Create one per worker (after the fork) and call :meth:`update` now and then, e.g. in
    gunicorn's ``post_request`` hook or from a thread; each call costs a ``/proc/self/statm``
    read and a few file writes.

    Mirrored (the rows of ``_METRICS`` with a ``mirror``): ``memreclaim_trims_total``,
    ``memreclaim_trims_unproductive_total``, ``memreclaim_released_bytes_total``,
    ``memreclaim_trim_seconds_total`` (the sum of trim durations: the histogram's buckets cannot
    be rebuilt from totals) as counters summed over workers, dead ones included;
    ``memreclaim_rss_bytes`` and ``memreclaim_rss_anon_bytes`` as gauges with a ``pid`` label
    per live worker (``multiprocess_mode="liveall"``); the limit as ``memreclaim_limit_bytes``
    with its ``source`` label, as the collector reports it (``"livemax"``; absent when there is
    none, so a headroom query divides by nothing rather than by 0). Not mirrored:
    ``memreclaim_traced_bytes``, ``memreclaim_limit_target_bytes``.

    ``registry=None`` leaves the metrics unregistered (multiprocess mode collects them from the
    files, not from a registry); tests pass their own registry.
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        from prometheus_client import Counter, Gauge

        if registry is not None and not isinstance(registry, CollectorRegistry):
            raise TypeError(
                "registry must be a prometheus_client CollectorRegistry or None,"
                f" not {type(registry).__name__}"
            )
        self._counters: dict[str, Any] = {}
        self._gauges: dict[str, Any] = {}
        for metric in _METRICS:
            if metric.mirror == "counter":
                self._counters[metric.name] = Counter(metric.name, metric.help, registry=registry)
            elif metric.mirror is not None:
                # the limit keeps the collector's ``source`` label: a labelled gauge has no
                # sample until it is set, so with no limit the series is absent, not 0
                labels = ("source",) if metric.name == "memreclaim_limit_bytes" else ()
                self._gauges[metric.name] = Gauge(
                    metric.name,
                    metric.help,
                    labels,
                    multiprocess_mode=metric.mirror,
                    registry=registry,
                )
        self._seen: dict[str, float] = {}

    def update(self) -> None:
        """Add the trims made since the last call, and set the gauges to the figures now."""
        values = _read(False)
        totals = {name: values[name] for name in self._counters}
        totals["memreclaim_trim_seconds"] = values["memreclaim_trim_seconds"][0]
        if totals["memreclaim_trims"] < self._seen.get("memreclaim_trims", 0):
            self._seen = {}  # totals restarted (a fork): count from zero again
        for name, counter in self._counters.items():
            counter.inc(max(0, totals[name] - self._seen.get(name, 0)))
        self._seen = totals
        for name, gauge in self._gauges.items():
            value = values[name]
            if isinstance(value, tuple):  # (source, limit)
                gauge.labels(value[0]).set(value[1])
            elif value is not None:
                gauge.set(value)
