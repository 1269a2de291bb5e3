"""gunicorn hooks: one :class:`~memreclaim.watchdog.BackgroundTrimmer` per worker.

In ``gunicorn.conf.py``::

    from memreclaim.integrations.gunicorn import make_hooks

    _memreclaim = make_hooks(interval=1.0, slack="64 MiB")
    post_fork = _memreclaim.post_fork          # start the trimmer in each worker
    worker_exit = _memreclaim.worker_exit      # stop it when the worker exits
    pre_request = _memreclaim.pre_request      # count requests in flight
    post_request = _memreclaim.post_request    # check right after each request

The trimmer is built (and its arguments checked) when the config is loaded, in the master; it
runs only in the workers, started by ``post_fork`` after the fork (a thread does not survive a
fork, and the trimmer knows it: see :class:`~memreclaim.watchdog.BackgroundTrimmer`).
``pre_request`` / ``post_request`` count the requests in flight; ``post_request`` then runs one
policy check in the worker thread right after the response was written: with no other request
in flight (sync workers always; gthread when the burst is over) a big request's memory goes back
at once; with requests still in flight and RSS rising, the policy waits for the burst to end (a
trim in the middle of a burst would only stall it). It costs one RSS read when there is nothing
to do. With gevent/eventlet workers, threads are green: prefer ``post_request`` alone
(``make_hooks(..., thread=False)``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from ..watchdog import BackgroundTrimmer

__all__ = ["GunicornHooks", "make_hooks"]


class GunicornHooks(NamedTuple):
    """gunicorn server hooks sharing one trimmer; assign the ones you want in the config."""

    post_fork: Callable[[Any, Any], None]
    """``post_fork(server, worker)``: starts the trimmer thread in the new worker."""
    worker_exit: Callable[[Any, Any], None]
    """``worker_exit(server, worker)``: stops it."""
    post_request: Callable[[Any, Any, Any, Any], None]
    """``post_request(worker, req, environ, resp)``: request done; one policy check."""
    trimmer: BackgroundTrimmer
    """The trimmer (read ``trimmer.counters`` in a worker to see what it did)."""
    pre_request: Callable[[Any, Any], None]
    """``pre_request(worker, req)``: counts the request in flight."""


def make_hooks(*, thread: bool = True, **trimmer_args: Any) -> GunicornHooks:
    """Build gunicorn hooks around one :class:`BackgroundTrimmer`.

    Args:
        thread: start the trimmer thread in ``post_fork`` (True) or only check in
            ``post_request`` (False, for green-thread workers).
        **trimmer_args: passed to :class:`BackgroundTrimmer` (``interval``, ``slack``,
            ``min_interval``, ``policy``, ``on_trim``...).

    Raises:
        TypeError, ValueError: for bad trimmer arguments, at config load time.
    """
    if not isinstance(thread, bool):
        raise TypeError(f"thread must be a bool, not {type(thread).__name__}")
    trimmer = BackgroundTrimmer(**trimmer_args)

    def post_fork(server: Any, worker: Any) -> None:
        if thread:
            if trimmer.running:  # only if a hook was called twice in the same process
                return
            trimmer.start()
        else:
            trimmer.tick()  # sets the floor

    def worker_exit(server: Any, worker: Any) -> None:
        trimmer.stop(timeout=1.0)

    def pre_request(worker: Any, req: Any) -> None:
        trimmer.request_started()

    def post_request(worker: Any, req: Any, environ: Any, resp: Any) -> None:
        trimmer.request_finished()
        trimmer.tick()

    return GunicornHooks(post_fork, worker_exit, post_request, trimmer, pre_request)
