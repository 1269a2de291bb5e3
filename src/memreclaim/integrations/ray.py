"""Ray: one :class:`~memreclaim.watchdog.BackgroundTrimmer` in each of the job's worker processes.

Ray calls a worker setup hook in every worker process it starts for the job (task workers and
actors), after the worker starts and before it runs anything; never in the driver, nor in Ray's
own daemons (GCS, raylet, dashboard)::

    import ray

    ray.init(runtime_env={"worker_process_setup_hook": "memreclaim.integrations.ray.setup"})

:func:`setup` starts the trimmer the way ``MEMRECLAIM=1`` would
(:func:`memreclaim.runners.autostart.activate`), with the ``MEMRECLAIM_*`` settings the worker's
environment gives (``MEMRECLAIM_LIMIT``, ``MEMRECLAIM_SLACK``...; ``runtime_env={"env_vars":
{...}}`` sets them for the job's workers only), and also in the processes a worker forks.

The variable alone is the other route: ``runtime_env={"env_vars": {"MEMRECLAIM": "1"}}`` reaches
the job's workers only (the start-up hook the package installs starts the trimmer when the
interpreter starts). ``MEMRECLAIM=1`` exported in the shell that starts the driver reaches the
driver and Ray's Python daemons too.

This module does not import ray.
"""

from __future__ import annotations

import os
import warnings

from ..runners import autostart
from ..runners._base import logger
from ..watchdog import BackgroundTrimmer

__all__ = ["setup"]


def setup() -> BackgroundTrimmer | None:
    """Ray's ``worker_process_setup_hook``: start this worker's trimmer (once per process).

    Returns the running trimmer, or None when the ``MEMRECLAIM*`` variables in the worker's
    environment are malformed (a RuntimeWarning names the variable, as at start-up) or say
    ``MEMRECLAIM=0`` (asked for no trimmer).

    Raises:
        RuntimeError: the trimmer thread cannot start.
    """
    running = autostart.current()
    if running is not None and running.running:  # MEMRECLAIM=1 started it already
        return running
    if os.environ.get(autostart.ENV, "").strip().lower() in ("0", "off", "false", "no"):
        logger.info("memreclaim: Ray worker %d: MEMRECLAIM=0, no trimmer", os.getpid())
        return None
    env = dict(os.environ)
    env[autostart.ENV] = "1"
    try:
        settings = autostart.settings_from_environment(env)
    except ValueError as exc:
        warnings.warn(f"memreclaim: {exc}: no trimmer started", RuntimeWarning, stacklevel=2)
        return None
    assert settings is not None
    runner = autostart.activate(settings)
    logger.info(
        "memreclaim: trimmer started in Ray worker %d (%s)", os.getpid(), settings.describe()
    )
    return runner
