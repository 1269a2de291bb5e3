"""Ready-made wiring of memreclaim's background reclaim into servers and workers.

- :mod:`memreclaim.integrations.gunicorn`: ``post_fork`` / ``worker_exit`` / ``post_request``
  hooks starting one :class:`~memreclaim.watchdog.BackgroundTrimmer` per worker.
- :mod:`memreclaim.integrations.asgi`: a lifespan for Starlette / FastAPI, and a raw ASGI
  middleware, running a :class:`~memreclaim.watchdog.Watchdog` for the app's lifetime.
- :mod:`memreclaim.integrations.celery`: ``worker_process_init`` / ``task_postrun`` /
  ``worker_process_shutdown`` signal handlers.

None of these modules imports its server at import time; they use memreclaim's policy layer
only.
"""

from __future__ import annotations

__all__: list[str] = []
