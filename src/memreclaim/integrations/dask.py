"""Dask distributed: one :class:`~memreclaim.watchdog.BackgroundTrimmer` in every worker.

Enable it with one line, either way (both build the same runner, :func:`make_trimmer`):

- a worker plugin, registered from the client and re-applied by the scheduler to every worker
  that joins or restarts later::

      from memreclaim.integrations.dask import MemreclaimPlugin

      client.register_plugin(MemreclaimPlugin())

- a preload, started by each worker before it takes tasks (this module defines ``dask_setup``
  and ``dask_teardown``): ``dask worker --preload memreclaim.integrations.dask``,
  ``LocalCluster(preload=["memreclaim.integrations.dask"])`` or the
  ``distributed.worker.preload`` config.

In each worker the trimmer:

- takes its soft limit from the worker's own ``memory_limit`` and Dask's thresholds: its mark
  (where trims stop waiting for anything, :class:`~memreclaim.policy.PacingPolicy`'s limit
  stage) is the lower of ``distributed.worker.memory.spill`` and ``.pause`` (70 % of the limit
  at Dask's defaults), so it trims before the worker spills or pauses, and works harder as RSS
  approaches that mark (readings every 20 ms); with no memory limit it uses the cgroup's, like
  any trimmer;
- knows when tasks execute (the plugin's ``transition`` hook: a task entering ``executing``
  counts as work in flight until it leaves it), so it does not trim in the middle of a burst;
- stops with the worker (``teardown``);
- logs each trim on the worker's own logger (``distributed.worker.memreclaim``), so the lines
  show in ``client.get_worker_logs()``, with the unmanaged memory the trim could not return:
  memory *pinned by live blocks* (what live objects keep in use, in the diagnosis' words: no
  trim returns it; if it grows run after run, that is the leak to look for), as opposed to the
  allocator retention the trims give back;
- exports its figures as worker metrics the scheduler receives with each heartbeat
  (``memreclaim_trims``, ``memreclaim_released_bytes``, ``memreclaim_pinned_bytes``,
  ``memreclaim_limit_mark_bytes``: numbers, so the dashboard's workers table shows them as
  columns), and, where ``prometheus_client`` is installed, on the worker's Prometheus endpoint
  (``/metrics``: :mod:`memreclaim.integrations.prometheus`'s table, plus
  ``memreclaim_dask_pinned_bytes``).

Importing this module imports ``distributed``; ``import memreclaim`` does not.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable
from typing import Any

from distributed import Worker, WorkerPlugin

from ..policy import PacingPolicy
from ..runners import autostart
from ..runners._base import TrimEvent
from ..units import format_bytes
from ..watchdog import BackgroundTrimmer

__all__ = [
    "PLUGIN_NAME",
    "MemreclaimPlugin",
    "dask_setup",
    "dask_teardown",
    "limit_for",
    "make_trimmer",
]

PLUGIN_NAME = "memreclaim"
"""The name the plugin is registered under in each worker (the preload uses it too, so the two
routes together still make one trimmer)."""

log = logging.getLogger("distributed.worker.memreclaim")

_POLICY_SHORTCUTS = ("slack", "min_interval")
_METRICS = ("trims", "released_bytes", "pinned_bytes", "limit_mark_bytes")


def limit_for(worker: Any) -> tuple[int, float] | None:
    """(limit, fraction) for the trimmer of ``worker``: its ``memory_limit`` and the lower of
    Dask's ``spill`` and ``pause`` fractions (the trimmer's mark is ``limit * fraction``); None
    when the worker has no memory limit, or neither threshold is on.

    Raises:
        TypeError: ``worker`` has no ``memory_manager`` (not a distributed Worker).
    """
    manager = getattr(worker, "memory_manager", None)
    if manager is None:
        raise TypeError(f"worker must be a distributed Worker, not {type(worker).__name__}")
    limit = manager.memory_limit
    fractions = [
        fraction
        for fraction in (manager.memory_spill_fraction, manager.memory_pause_fraction)
        if fraction is not False and fraction is not None and 0 < fraction <= 1
    ]
    if not limit or not fractions:
        return None
    return int(limit), float(min(fractions))


class _Figures:
    """What the worker's metrics and log lines report, updated by each trim."""

    def __init__(self, worker: Any, trimmer_ref: list[BackgroundTrimmer]) -> None:
        self.worker = worker
        self.trimmer_ref = trimmer_ref
        self.pinned = 0
        self.mark = 0

    def managed(self) -> int:
        state = getattr(self.worker, "state", None)
        return int(getattr(state, "nbytes", 0) or 0)

    def on_trim(self, event: TrimEvent) -> None:
        rss_after = event.result.rss_after
        managed = self.managed()
        pinned = None if rss_after is None else max(0, rss_after - managed)
        if pinned is not None:
            self.pinned = pinned
        log.info(
            "memreclaim: trim released %s in %.1f ms (%s); unmanaged memory left %s"
            " (RSS %s, managed %s): pinned by live blocks, not returned by trim",
            format_bytes(event.released),
            event.seconds * 1000.0,
            event.reason,
            "unknown" if pinned is None else format_bytes(pinned),
            "unknown" if rss_after is None else format_bytes(rss_after),
            format_bytes(managed),
        )

    def metric(self, name: str) -> Callable[[Any], int]:
        def read(worker: Any) -> int:
            counters = self.trimmer_ref[0].counters
            return {
                "trims": counters.trims,
                "released_bytes": counters.bytes_released,
                "pinned_bytes": self.pinned,
                "limit_mark_bytes": self.mark,
            }[name]

        return read


def make_trimmer(worker: Any, **trimmer_args: Any) -> BackgroundTrimmer:
    """The trimmer of one worker (not started): the limit from :func:`limit_for` unless
    ``trimmer_args`` gives ``limit=`` or ``policy=``; trims logged on the worker's logger;
    its figures registered in ``worker.metrics`` (``memreclaim_*``).

    Args:
        worker: the ``distributed.Worker``.
        **trimmer_args: passed to :class:`BackgroundTrimmer` (``interval``, ``slack``,
            ``min_interval``, ``limit``, ``policy``, ``on_trim``...); an ``on_trim`` of
            yours is called after the worker's log line.

    Raises:
        TypeError, ValueError: for a bad argument, naming it.
    """
    return _build(worker, trimmer_args)[0]


def _build(worker: Any, trimmer_args: dict[str, Any]) -> tuple[BackgroundTrimmer, _Figures]:
    args = dict(trimmer_args)
    user_on_trim = args.pop("on_trim", None)
    if user_on_trim is not None and not callable(user_on_trim):
        raise TypeError(f"on_trim must be callable, not {type(user_on_trim).__name__}")
    ref: list[BackgroundTrimmer] = []
    figures = _Figures(worker, ref)
    if "policy" not in args and "limit" not in args:
        found = limit_for(worker)
        if found is not None:
            limit, fraction = found
            shortcuts = {key: args.pop(key) for key in _POLICY_SHORTCUTS if key in args}
            shortcuts = {key: value for key, value in shortcuts.items() if value is not None}
            args["policy"] = PacingPolicy(limit=limit, limit_fraction=fraction, **shortcuts)

    def on_trim(event: TrimEvent) -> None:
        figures.on_trim(event)
        if user_on_trim is not None:
            user_on_trim(event)

    args.setdefault("name", "memreclaim-dask")
    trimmer = BackgroundTrimmer(on_trim=on_trim, **args)
    ref.append(trimmer)
    figures.mark = trimmer.policy.limit_mark or 0
    for name in _METRICS:
        worker.metrics[f"memreclaim_{name}"] = figures.metric(name)
    return trimmer, figures


def _register_prometheus(figures: _Figures) -> None:
    """Put memreclaim's figures on the worker's ``/metrics`` (prometheus_client's global
    registry, which Dask's endpoint serves), once per process; nothing without prometheus_client."""
    global _prometheus_figures
    try:
        from prometheus_client.core import GaugeMetricFamily
        from prometheus_client.registry import REGISTRY

        from . import prometheus
    except ImportError:
        return
    if _prometheus_figures is None:
        # registered already by the application (ValueError): its figures are there
        with contextlib.suppress(ValueError):
            prometheus.register(REGISTRY)

        class _DaskCollector:
            def collect(self) -> Any:
                current = _prometheus_figures
                if current is not None:
                    yield GaugeMetricFamily(
                        "memreclaim_dask_pinned_bytes",
                        "Unmanaged memory the last trim could not return: pinned by live blocks.",
                        value=current.pinned,
                    )

        REGISTRY.register(_DaskCollector())
    _prometheus_figures = figures


_prometheus_figures: _Figures | None = None


def _start(worker: Any, trimmer_args: dict[str, Any]) -> BackgroundTrimmer:
    trimmer, figures = _build(worker, trimmer_args)
    if autostart.current() is not None:  # MEMRECLAIM=1 reached the worker too: one trimmer
        autostart.deactivate(timeout=1.0)
        log.info("memreclaim: the MEMRECLAIM=1 trimmer of this worker stopped; the plugin's runs")
    trimmer.start()
    _register_prometheus(figures)
    log.info(
        "memreclaim: trimmer started in worker %s (pid %d; limit %s, mark %s)",
        getattr(worker, "address", "?"),
        os.getpid(),
        format_bytes(trimmer.policy.limit) if trimmer.policy.limit else "none",
        format_bytes(trimmer.policy.limit_mark) if trimmer.policy.limit_mark else "none",
    )
    return trimmer


class MemreclaimPlugin(WorkerPlugin):
    """A worker plugin running one trimmer per worker:
    ``client.register_plugin(MemreclaimPlugin())``.

    The arguments are checked here, in the client, then sent to the workers with the plugin.

    Args:
        **trimmer_args: passed to :class:`BackgroundTrimmer` in each worker (see
            :func:`make_trimmer`).

    Raises:
        TypeError, ValueError: for a bad argument, naming it.
    """

    name = PLUGIN_NAME
    idempotent = False

    def __init__(self, **trimmer_args: Any) -> None:
        check = {k: v for k, v in trimmer_args.items() if k != "on_trim"}
        if "policy" not in check:
            check.setdefault("limit", None)
        BackgroundTrimmer(**check)  # raises for a bad argument, here rather than in each worker
        on_trim = trimmer_args.get("on_trim")
        if on_trim is not None and not callable(on_trim):
            raise TypeError(f"on_trim must be callable, not {type(on_trim).__name__}")
        self.trimmer_args = trimmer_args
        self.trimmer: BackgroundTrimmer | None = None

    def setup(self, worker: Any) -> None:
        """Start the worker's trimmer (Dask calls it in each worker, restarted ones included)."""
        if self.trimmer is not None and self.trimmer.running:
            return
        self.trimmer = _start(worker, self.trimmer_args)

    def teardown(self, worker: Any) -> None:
        """Stop the trimmer and take its metrics off the worker."""
        trimmer, self.trimmer = self.trimmer, None
        if trimmer is not None:
            trimmer.stop(timeout=1.0)
        for name in _METRICS:
            worker.metrics.pop(f"memreclaim_{name}", None)

    def transition(self, key: Any, start: str, finish: str, **kwargs: Any) -> None:
        """Count tasks executing: work in flight for the trimmer's policy."""
        trimmer = self.trimmer
        if trimmer is None or start == finish:
            return
        if finish == "executing":
            trimmer.request_started()
        elif start == "executing":
            trimmer.request_finished()


async def dask_setup(server: Any) -> None:
    """The preload's entry (``--preload memreclaim.integrations.dask``): in a worker, add
    :class:`MemreclaimPlugin` to it; in a scheduler or a nanny (``--preload-nanny``), which run
    no tasks, do nothing and say so."""
    if not isinstance(server, Worker):
        log.info(
            "memreclaim: preload in a %s, which runs no tasks: no trimmer here",
            type(server).__name__,
        )
        return
    await server.plugin_add(MemreclaimPlugin(), name=PLUGIN_NAME)


async def dask_teardown(server: Any) -> None:
    """The preload's exit: remove the plugin if the worker has not already (it removes its
    plugins before its preloads' teardown)."""
    plugins = getattr(server, "plugins", None)
    if plugins is not None and PLUGIN_NAME in plugins:
        await server.plugin_remove(PLUGIN_NAME)
