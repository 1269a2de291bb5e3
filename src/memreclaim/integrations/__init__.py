"""Ready-made wiring of memreclaim's background reclaim into servers and workers.

- :mod:`memreclaim.integrations.gunicorn`: ``post_fork`` / ``worker_exit`` / ``post_request``
  hooks starting one :class:`~memreclaim.watchdog.BackgroundTrimmer` per worker.
- :mod:`memreclaim.integrations.asgi`: a lifespan for Starlette / FastAPI, and a raw ASGI
  middleware, running a :class:`~memreclaim.watchdog.Watchdog` for the app's lifetime.
- :mod:`memreclaim.integrations.celery`: ``worker_process_init`` / ``task_postrun`` /
  ``worker_process_shutdown`` signal handlers.
- :mod:`memreclaim.integrations.dask`: a Dask ``WorkerPlugin`` and preload (``dask_setup``)
  running one trimmer per worker, under the worker's own memory limit and thresholds.
- :mod:`memreclaim.integrations.ray`: Ray's ``worker_process_setup_hook``, a trimmer in each of
  the job's worker processes.

None of these modules imports its server at import time (but ``dask``, which subclasses
``distributed.WorkerPlugin``: it is imported only by whoever names it); they use memreclaim's
policy layer only.
"""

from __future__ import annotations

__all__: list[str] = []
