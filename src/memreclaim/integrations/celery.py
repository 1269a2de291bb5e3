"""Celery signal handlers: a :class:`~memreclaim.watchdog.BackgroundTrimmer` per pool process.

In the module that creates the Celery app::

    from memreclaim.integrations.celery import install

    install(interval=1.0, slack="64 MiB")

This connects four handlers:

- ``worker_process_init`` (sent in each prefork pool process after the fork): start the trimmer;
- ``task_prerun`` / ``task_postrun``: count tasks in flight, and one policy check right after
  each task (one RSS read when nothing is due), so a big task's memory goes back without
  waiting for the next tick (with the threads pool, once no other task is still allocating);
- ``worker_process_shutdown``: stop the trimmer.

With the ``solo`` or ``threads`` pool there are no pool processes and ``worker_process_init`` is
not sent; ``install(main_process=True)`` also starts the trimmer on ``worker_ready`` in the main
worker process. With gevent/eventlet pools, use ``install(thread=False)``: only the
``task_postrun`` check runs. The handlers are plain methods of :class:`CeleryTrimming` and can be
connected by hand.
"""

from __future__ import annotations

import importlib
from typing import Any

from ..watchdog import BackgroundTrimmer

__all__ = ["CeleryTrimming", "install"]


class CeleryTrimming:
    """The handlers, sharing one trimmer. Build it with :func:`install` or by hand.

    Raises:
        TypeError, ValueError: for bad trimmer arguments.
    """

    def __init__(self, *, thread: bool = True, **trimmer_args: Any) -> None:
        if not isinstance(thread, bool):
            raise TypeError(f"thread must be a bool, not {type(thread).__name__}")
        self.thread = thread
        self.trimmer = BackgroundTrimmer(**trimmer_args)
        self._connected: list[tuple[Any, Any]] = []

    def on_worker_process_init(self, **kwargs: Any) -> None:
        """``worker_process_init`` / ``worker_ready`` handler: start the trimmer here."""
        if not self.thread:
            self.trimmer.tick()  # sets the floor
        elif not self.trimmer.running:
            self.trimmer.start()

    def on_task_prerun(self, **kwargs: Any) -> None:
        """``task_prerun`` handler: count the task in flight."""
        self.trimmer.request_started()

    def on_task_postrun(self, **kwargs: Any) -> None:
        """``task_postrun`` handler: the task is done; one policy check, trimming if due."""
        self.trimmer.request_finished()
        self.trimmer.tick()

    def on_worker_process_shutdown(self, **kwargs: Any) -> None:
        """``worker_process_shutdown`` / ``worker_shutdown`` handler: stop the trimmer."""
        self.trimmer.stop(timeout=1.0)

    def connect(self, *, main_process: bool = False) -> None:
        """Connect the handlers to Celery's signals (imports celery)."""
        signals: Any = importlib.import_module("celery.signals")

        pairs: list[tuple[Any, Any]] = [
            (signals.worker_process_init, self.on_worker_process_init),
            (signals.task_prerun, self.on_task_prerun),
            (signals.task_postrun, self.on_task_postrun),
            (signals.worker_process_shutdown, self.on_worker_process_shutdown),
        ]
        if main_process:
            pairs += [
                (signals.worker_ready, self.on_worker_process_init),
                (signals.worker_shutdown, self.on_worker_process_shutdown),
            ]
        for signal, handler in pairs:
            signal.connect(handler, weak=False)
        self._connected += pairs

    def disconnect(self) -> None:
        """Disconnect the handlers connected by :meth:`connect` and stop the trimmer."""
        for signal, handler in self._connected:
            signal.disconnect(handler)
        self._connected.clear()
        self.trimmer.stop(timeout=1.0)


def install(
    *, main_process: bool = False, thread: bool = True, **trimmer_args: Any
) -> CeleryTrimming:
    """Build a :class:`CeleryTrimming` and connect it to Celery's signals.

    Args:
        main_process: also start the trimmer in the main worker process (solo/threads pools).
        thread: run the trimmer thread (False: only check after each task).
        **trimmer_args: passed to :class:`BackgroundTrimmer`.

    Raises:
        TypeError, ValueError: for bad arguments. ImportError if celery is not installed.
    """
    if not isinstance(main_process, bool):
        raise TypeError(f"main_process must be a bool, not {type(main_process).__name__}")
    trimming = CeleryTrimming(thread=thread, **trimmer_args)
    trimming.connect(main_process=main_process)
    return trimming
