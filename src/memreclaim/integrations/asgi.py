"""Run a :class:`~memreclaim.watchdog.Watchdog` for the lifetime of an ASGI application.

Starlette / FastAPI, with the ``lifespan`` argument::

    from memreclaim.integrations.asgi import watchdog_lifespan

    app = Starlette(routes=routes, lifespan=watchdog_lifespan(interval=1.0, slack="64 MiB"))
    # FastAPI(lifespan=watchdog_lifespan(...)) works the same way

An existing lifespan is wrapped with ``watchdog_lifespan(my_lifespan, ...)``; its state is kept.
The watchdog is put in the lifespan state under ``"memreclaim_watchdog"``
(``request.state.memreclaim_watchdog.counters`` in Starlette).

Any other ASGI app (one without a lifespan hook of its own) can be wrapped instead::

    app = WatchdogMiddleware(app, interval=1.0)

Both start the watchdog at ``lifespan.startup`` and stop it at ``lifespan.shutdown``; the server
must run the lifespan protocol (uvicorn and hypercorn do by default; with uvicorn
``--lifespan off`` nothing starts). One process, one watchdog: with ``uvicorn --workers N`` or
gunicorn's ``-k uvicorn_worker.UvicornWorker`` (the ``uvicorn-worker`` package; uvicorn's own
``uvicorn.workers.UvicornWorker`` is deprecated) each worker process runs its own lifespan, hence
its own watchdog. Which to prefer, this or ``memreclaim run``: docs/integrations.md.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, MutableMapping
from contextlib import AbstractAsyncContextManager
from typing import Any

from ..watchdog import Watchdog

__all__ = ["WatchdogMiddleware", "watchdog_lifespan"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
Lifespan = Callable[[Any], AbstractAsyncContextManager[Mapping[str, Any] | None]]

STATE_KEY = "memreclaim_watchdog"


def watchdog_lifespan(
    inner: Lifespan | None = None, **watchdog_args: Any
) -> Callable[[Any], AbstractAsyncContextManager[dict[str, Any]]]:
    """Return a lifespan (``app -> async context manager``) that runs a Watchdog.

    Args:
        inner: an existing lifespan to run inside (its yielded state is merged).
        **watchdog_args: passed to :class:`Watchdog` (checked now, not at startup).

    Raises:
        TypeError, ValueError: for bad watchdog arguments or a non-callable ``inner``.
    """
    if inner is not None and not callable(inner):
        raise TypeError(f"inner must be a lifespan callable or None, not {type(inner).__name__}")
    watchdog = Watchdog(**watchdog_args)

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[dict[str, Any]]:
        async with watchdog:
            if inner is None:
                yield {STATE_KEY: watchdog}
            else:
                async with inner(app) as state:
                    yield {**(state or {}), STATE_KEY: watchdog}

    lifespan.watchdog = watchdog  # type: ignore[attr-defined]
    return lifespan


class WatchdogMiddleware:
    """ASGI middleware running a :class:`Watchdog` between lifespan startup and shutdown.

    Every scope is passed to the wrapped app. For ``lifespan``, the watchdog starts once the
    app has reported startup complete and stops when shutdown is requested. When no lifespan
    ever arrives (``uvicorn --lifespan off``, or ``--lifespan auto`` with an app that fails the
    lifespan scope), it starts at the first request instead. HTTP and websocket requests are
    counted in flight (:meth:`Watchdog.request_started`), so the policy trims when a burst is
    over, not in the middle of it. ``middleware.watchdog.counters`` reports what it did.

    Raises:
        TypeError, ValueError: for a non-callable app or bad watchdog arguments.
    """

    def __init__(self, app: ASGIApp, **watchdog_args: Any) -> None:
        if not callable(app):
            raise TypeError(f"app must be an ASGI callable, not {type(app).__name__}")
        self.app = app
        self.watchdog = Watchdog(**watchdog_args)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Handle one ASGI connection (lifespan included)."""
        watchdog = self.watchdog
        if scope.get("type") != "lifespan":
            if not watchdog.running:  # no lifespan came: start on the first request
                with contextlib.suppress(RuntimeError):  # another request started it meanwhile
                    watchdog.start()
            watchdog.request_started()
            try:
                await self.app(scope, receive, send)
            finally:
                watchdog.request_finished()
            return

        async def wrapped_receive() -> Message:
            message = await receive()
            if message.get("type") == "lifespan.shutdown":
                await watchdog.stop()
            return message

        async def wrapped_send(message: Message) -> None:
            if message.get("type") == "lifespan.startup.complete" and not watchdog.running:
                watchdog.start()
            await send(message)

        try:
            await self.app(scope, wrapped_receive, wrapped_send)
        finally:
            await watchdog.stop()
