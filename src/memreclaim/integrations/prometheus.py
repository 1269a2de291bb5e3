"""Prometheus metrics for memreclaim (``pip install 'memreclaim[prometheus]'``).

    >>> from prometheus_client import start_http_server
    >>> from memreclaim.integrations import prometheus
    >>> prometheus.register()            # into prometheus_client's default REGISTRY
    >>> start_http_server(9100)

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

The counters come from :func:`memreclaim._accounting.totals`, where each trim records itself
once: they agree with the runners' own counters and never count a release twice.

Multiprocess mode (gunicorn with ``PROMETHEUS_MULTIPROC_DIR``): prometheus_client's
``MultiProcessCollector`` aggregates only metrics kept in its per-process files; a custom
collector such as this one reports the process that answers the scrape, not the fleet. See
``docs/containers.md`` for what to do there.
"""

from __future__ import annotations

import tracemalloc
from collections.abc import Iterator

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


class MemreclaimCollector:
    """A ``prometheus_client`` collector of this process's memreclaim figures (see the module
    docstring). ``refresh_limits=True`` re-reads the cgroup limit at every scrape (a few small
    file reads) instead of using :func:`memreclaim.limits`' cached value."""

    def __init__(self, *, refresh_limits: bool = False) -> None:
        from .._validate import flag

        self._refresh_limits = flag("refresh_limits", refresh_limits)

    def describe(self) -> Iterator[Metric]:
        """The metric names, without values (lets a registry refuse a second registration)."""
        for name in ("rss_bytes", "rss_anon_bytes", "traced_bytes", "limit_bytes"):
            yield GaugeMetricFamily(f"memreclaim_{name}", "")
        yield GaugeMetricFamily("memreclaim_limit_target_bytes", "")
        for name in ("trims", "trims_unproductive", "released_bytes"):
            yield CounterMetricFamily(f"memreclaim_{name}", "")
        yield HistogramMetricFamily("memreclaim_trim_seconds", "")

    def collect(self) -> Iterator[Metric]:
        """The metrics, read now."""
        st = memreclaim.stats()
        yield GaugeMetricFamily(
            "memreclaim_rss_bytes", "Resident set size of the process.", value=st.rss
        )
        if st.rss_anon is not None:
            yield GaugeMetricFamily(
                "memreclaim_rss_anon_bytes",
                "Anonymous resident bytes (the memory a trim can give back).",
                value=st.rss_anon,
            )
        if tracemalloc.is_tracing():
            yield GaugeMetricFamily(
                "memreclaim_traced_bytes",
                "Bytes traced by tracemalloc (live Python allocations).",
                value=tracemalloc.get_traced_memory()[0],
            )
        totals = _accounting.totals()
        yield CounterMetricFamily(
            "memreclaim_trims", "Trims made in this process.", value=totals.trims
        )
        yield CounterMetricFamily(
            "memreclaim_trims_unproductive",
            f"Trims that gave back less than {_accounting.UNPRODUCTIVE_BELOW} bytes.",
            value=totals.unproductive,
        )
        yield CounterMetricFamily(
            "memreclaim_released_bytes",
            "Bytes given back to the OS by trims.",
            value=totals.released_bytes,
        )
        cumulative, buckets = 0, []
        for bound, count in zip(
            (*(repr(float(b)) for b in _accounting.SECONDS_BUCKETS), "+Inf"),
            totals.seconds_buckets,
            strict=True,
        ):
            cumulative += count
            buckets.append((bound, cumulative))
        yield HistogramMetricFamily(
            "memreclaim_trim_seconds",
            "How long trims took.",
            buckets=buckets,
            sum_value=totals.seconds,
        )
        lim = memreclaim.limits(refresh=self._refresh_limits)
        if lim.limit is not None:
            limit = GaugeMetricFamily(
                "memreclaim_limit_bytes",
                "The process's memory limit (cgroup or rlimit).",
                labels=["source"],
            )
            limit.add_metric([lim.source], lim.limit)
            yield limit
        target = lim.target()
        if target is not None:
            yield GaugeMetricFamily(
                "memreclaim_limit_target_bytes",
                "The RSS memreclaim keeps under (90% of the limit, or memory.high).",
                value=target,
            )


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

    Mirrored: ``memreclaim_trims_total``, ``memreclaim_trims_unproductive_total``,
    ``memreclaim_released_bytes_total``, ``memreclaim_trim_seconds_total`` (the sum of trim
    durations: the histogram's buckets cannot be rebuilt from totals) as counters summed over
    workers, dead ones included; ``memreclaim_rss_bytes`` and ``memreclaim_rss_anon_bytes`` as
    gauges with a ``pid`` label per live worker (``multiprocess_mode="liveall"``); the limit as
    ``memreclaim_limit_bytes`` (``"liveMax"``). Not mirrored: ``memreclaim_traced_bytes``.

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
        self._trims = Counter("memreclaim_trims", "Trims made.", registry=registry)
        self._unproductive = Counter(
            "memreclaim_trims_unproductive",
            "Trims that gave back less than 1 MiB.",
            registry=registry,
        )
        self._released = Counter(
            "memreclaim_released_bytes",
            "Bytes given back by trims.",
            registry=registry,
        )
        self._seconds = Counter(
            "memreclaim_trim_seconds",
            "Seconds spent trimming.",
            registry=registry,
        )
        self._rss = Gauge(
            "memreclaim_rss_bytes",
            "Resident set size.",
            multiprocess_mode="liveall",
            registry=registry,
        )
        self._anon = Gauge(
            "memreclaim_rss_anon_bytes",
            "Anonymous resident bytes.",
            multiprocess_mode="liveall",
            registry=registry,
        )
        self._limit = Gauge(
            "memreclaim_limit_bytes",
            "The memory limit (0: none).",
            multiprocess_mode="livemax",
            registry=registry,
        )
        self._seen = _accounting.TrimTotals(0, 0, 0, 0.0, ())

    def update(self) -> None:
        """Add the trims made since the last call, and set the gauges to the figures now."""
        totals = _accounting.totals()
        seen = self._seen
        if totals.trims < seen.trims:  # totals restarted (a fork): count from zero again
            seen = _accounting.TrimTotals(0, 0, 0, 0.0, ())
        self._trims.inc(totals.trims - seen.trims)
        self._unproductive.inc(totals.unproductive - seen.unproductive)
        self._released.inc(totals.released_bytes - seen.released_bytes)
        self._seconds.inc(max(0.0, totals.seconds - seen.seconds))
        self._seen = totals
        st = memreclaim.stats()
        self._rss.set(st.rss)
        if st.rss_anon is not None:
            self._anon.set(st.rss_anon)
        self._limit.set(memreclaim.limits().limit or 0)
