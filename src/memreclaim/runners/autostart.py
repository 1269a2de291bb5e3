"""Zero-code activation: a :class:`~memreclaim.watchdog.BackgroundTrimmer` in this process and in
every process it forks or spawns, from ``memreclaim run`` or from the ``MEMRECLAIM`` variable.

Two ways in, one mechanism:

- ``python -m memreclaim run -m gunicorn ...`` calls :func:`activate` with its options and
  ``export=True``;
- ``MEMRECLAIM=1`` in the environment: the ``memreclaim-autostart.pth`` start-up hook the
  package installs calls :func:`from_environment` when the interpreter starts (before
  ``__main__`` runs). With the variable unset, the hook is one dictionary look-up and imports
  nothing.

Either way the process gets one trimmer, and:

- **every process it forks** gets its own trimmer, started in the child by an
  ``os.register_at_fork(after_in_child=...)`` handler (gunicorn's sync, gthread and
  uvicorn-worker workers, Celery's prefork pool processes, ``multiprocessing``'s fork method):
  a thread does not survive a fork, so the parent's trimmer is forgotten there and a new one,
  with the same settings and counters from zero, starts in its place;
- **every Python it spawns** (``uvicorn --workers N``, ``multiprocessing``'s spawn and
  forkserver methods, a ``subprocess`` running Python) gets one through the start-up hook: with
  ``export=True`` the settings are written into ``os.environ`` (``MEMRECLAIM=1`` and the
  ``MEMRECLAIM_*`` options), which the spawned interpreter inherits;
- each trimmer reads its own process's RSS (``/proc/self/statm``) and trims only its own heap:
  a pre-fork master trims itself, each worker itself.

Why the thread runner everywhere, asyncio servers included: it is the runner that can start
before any event loop exists (at interpreter start, in a fork handler), and its trims release the
GIL, so the loop keeps running during one. What it lacks next to the
:class:`~memreclaim.watchdog.Watchdog` is the loop's idle gate and the request count; an app
that wants those uses the hooks (:mod:`memreclaim.integrations`) instead: docs/integrations.md
says which to prefer.

Variables (read once, when the process starts; a forked child keeps its parent's settings):

=========================== ====================================================================
``MEMRECLAIM``              ``1`` (or ``on``, ``true``, ``yes``): start; unset, empty, ``0``,
                            ``off``, ``false``, ``no``: do nothing; anything else: a
                            RuntimeWarning naming the value, and nothing starts
``MEMRECLAIM_INTERVAL``     seconds between two checks (``run --interval``; default 1)
``MEMRECLAIM_SLACK``        growth over the learned level that triggers a trim, a size such as
                            ``64MiB`` (``run --slack``; default: the pacing policy's,
                            ``max(8 MiB, level / 8)``, as the hooks use)
``MEMRECLAIM_MIN_INTERVAL`` seconds between two trims at least (``run --min-interval``; default:
                            the pacing policy's)
``MEMRECLAIM_LIMIT``        the soft limit the trimmer works harder near, a size such as ``700MiB``
                            (``run --limit``); ``auto`` or unset: the cgroup's, where there is
                            one; ``none``: no limit (see :class:`~memreclaim.policy.PacingPolicy`)
``MEMRECLAIM_LOG``          ``info`` or ``debug`` (also ``warning``): add a stderr handler at that
                            level to the ``memreclaim`` logger, once per process (a forked child
                            keeps its parent's); unset or empty: leave logging alone
=========================== ====================================================================

A bad option value is said once per process, as a RuntimeWarning naming the variable, and no
trimmer starts in that process (a half-configured trimmer would be a surprise).

Helper processes that hold no user data start no trimmer: multiprocessing's resource tracker
(nothing), and its forkserver, which only follows forks (the processes it forks for the pool
start theirs). They are told by the command multiprocessing starts them with
(``sys.orig_argv``: ``-c "from multiprocessing.resource_tracker import main..."``); the
``memreclaim`` logger says which (INFO), as it says where a trimmer started.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .. import _validate
from ..units import format_bytes
from ._base import logger
from .thread import BackgroundTrimmer

__all__ = [
    "ENV",
    "ENV_INTERVAL",
    "ENV_LIMIT",
    "ENV_LOG",
    "ENV_MIN_INTERVAL",
    "ENV_SLACK",
    "Settings",
    "activate",
    "current",
    "deactivate",
    "from_environment",
    "helper_process",
    "parse_limit",
    "settings_from_environment",
]

ENV = "MEMRECLAIM"
ENV_INTERVAL = "MEMRECLAIM_INTERVAL"
ENV_SLACK = "MEMRECLAIM_SLACK"
ENV_MIN_INTERVAL = "MEMRECLAIM_MIN_INTERVAL"
ENV_LOG = "MEMRECLAIM_LOG"
ENV_LIMIT = "MEMRECLAIM_LIMIT"
_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING}

_ON = ("1", "on", "true", "yes")
_OFF = ("", "0", "off", "false", "no")

DEFAULT_INTERVAL = 1.0

RUNNER_NAME = "memreclaim-autostart"

# The commands multiprocessing starts its helpers with (``python -c CMD``, 3.11-3.15): what each
# holds, and whether it forks the processes that hold the user's data.
_HELPERS = (
    ("from multiprocessing.resource_tracker import", "multiprocessing's resource tracker", False),
    ("from multiprocessing.semaphore_tracker import", "multiprocessing's semaphore tracker", False),
    ("from multiprocessing.forkserver import", "multiprocessing's forkserver", True),
)


@dataclass(frozen=True)
class Settings:
    """What ``memreclaim run`` and ``MEMRECLAIM`` configure: the trimmer of each process."""

    interval: float = DEFAULT_INTERVAL
    """Seconds between two checks."""
    slack: int | None = None
    """Bytes of growth over the learned level that trigger a trim; None: the pacing policy's
    (``max(8 MiB, level / 8)``). A fixed slack larger than that can leave a level learned by a
    trim in the middle of a burst (this runner knows no requests in flight) above what the
    burst then leaves: under ``uvicorn --workers 2`` with 64 MiB, a worker stayed at its
    189 MiB peak for 90 s after two trims in the middle of its burst."""
    min_interval: float | None = None
    """Seconds between two trims at least; None: the pacing policy's default."""
    log: str | None = None
    """``"debug"``, ``"info"`` or ``"warning"``: a stderr handler at that level on the
    ``memreclaim`` logger; None: logging left alone."""
    limit: int | str | None = "auto"
    """The soft limit in bytes; ``"auto"``: the cgroup's, where there is one; None: no limit."""

    def __post_init__(self) -> None:
        _validate.seconds("interval", self.interval)
        if self.slack is not None:
            _validate.size("slack", self.slack)
        if self.min_interval is not None:
            _validate.seconds("min_interval", self.min_interval)
        if self.log is not None:
            _validate.instance("log", self.log, str)
            if self.log not in _LEVELS:
                choices = ", ".join(_LEVELS)
                raise ValueError(f"log must be one of {choices} or None, got {self.log!r}")
        if not (self.limit is None or (isinstance(self.limit, str) and self.limit == "auto")):
            object.__setattr__(self, "limit", _validate.size("limit", self.limit))

    def environment(self) -> dict[str, str]:
        """These settings as the variables that give them to a spawned interpreter."""
        env = {ENV: "1", ENV_INTERVAL: repr(self.interval)}
        env[ENV_SLACK] = "" if self.slack is None else str(self.slack)
        env[ENV_MIN_INTERVAL] = "" if self.min_interval is None else repr(self.min_interval)
        env[ENV_LOG] = self.log or ""
        env[ENV_LIMIT] = "none" if self.limit is None else str(self.limit)
        return env

    def describe(self) -> str:
        """One line for logs: ``interval 1 s, slack the policy's, min interval 1 s``."""
        trimmer_min = "the policy's" if self.min_interval is None else f"{self.min_interval:g} s"
        slack = "the policy's" if self.slack is None else format_bytes(self.slack)
        if self.limit is None:
            limit = "none"
        else:
            limit = "the cgroup's" if self.limit == "auto" else format_bytes(int(self.limit))
        return (
            f"interval {self.interval:g} s, slack {slack}, min interval {trimmer_min},"
            f" limit {limit}"
        )


def _seconds_variable(name: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{name}={text!r} is not a number of seconds") from None
    try:
        return _validate.seconds(name, value)
    except ValueError as exc:
        raise ValueError(f"{name}={text!r}: {exc}") from None


def helper_process(argv: Sequence[str] | None = None) -> tuple[str, bool] | None:
    """(what, forks) when ``argv`` (default ``sys.orig_argv``) is a helper process that holds
    no user data: multiprocessing's resource tracker (forks nothing) or forkserver (forks the
    pool's processes); None for any other process.

    Raises:
        TypeError: ``argv`` is not a sequence of str.
    """
    if argv is None:
        argv = getattr(sys, "orig_argv", None) or []
    if isinstance(argv, str) or not isinstance(argv, Sequence):
        raise TypeError(f"argv must be a sequence of str, not {type(argv).__name__}")
    args = list(argv)
    for arg in args:
        _validate.instance("argv item", arg, str)
    command = ""
    rest = iter(args[1:])
    for arg in rest:  # the interpreter's options, up to -c (a script's own -c does not count)
        if arg == "-c":
            command = next(rest, "")
            break
        if not arg.startswith("-"):
            break  # a script
        if arg in ("-X", "-W", "-Q"):
            next(rest, None)  # an option with its value apart
    for prefix, what, forks in _HELPERS:
        if command.startswith(prefix):
            return what, forks
    return None


def settings_from_environment(environ: Mapping[str, str] | None = None) -> Settings | None:
    """The settings ``environ`` (default ``os.environ``) asks for, or None when it asks for none.

    ``MEMRECLAIM_*`` options count only with ``MEMRECLAIM`` on; an empty option is its default.

    Raises:
        TypeError: ``environ`` is not a mapping.
        ValueError: a value that is not understood, naming the variable and the value.
    """
    if environ is None:
        environ = os.environ
    if not isinstance(environ, Mapping):
        raise TypeError(f"environ must be a mapping, not {type(environ).__name__}")
    switch = environ.get(ENV, "").strip().lower()
    if switch in _OFF:
        return None
    if switch not in _ON:
        raise ValueError(
            f"{ENV}={environ[ENV]!r} is not understood (1, on, true or yes to start the trimmer;"
            " 0, off, false, no or unset to leave it off)"
        )
    interval = DEFAULT_INTERVAL
    slack: int | None = None
    min_interval: float | None = None
    text = environ.get(ENV_INTERVAL, "").strip()
    if text:
        interval = _seconds_variable(ENV_INTERVAL, text)
    text = environ.get(ENV_SLACK, "").strip()
    if text:
        try:
            slack = _validate.size(ENV_SLACK, text)
        except ValueError as exc:
            raise ValueError(f"{ENV_SLACK}={text!r}: {exc}") from None
    text = environ.get(ENV_MIN_INTERVAL, "").strip()
    if text:
        min_interval = _seconds_variable(ENV_MIN_INTERVAL, text)
    log = environ.get(ENV_LOG, "").strip().lower() or None
    if log is not None and log not in _LEVELS:
        raise ValueError(f"{ENV_LOG}={environ[ENV_LOG]!r} is not one of {', '.join(_LEVELS)}")
    limit = parse_limit(ENV_LIMIT, environ.get(ENV_LIMIT, ""))
    return Settings(interval=interval, slack=slack, min_interval=min_interval, log=log, limit=limit)


def parse_limit(name: str, text: str) -> int | str | None:
    """A soft limit as ``MEMRECLAIM_LIMIT`` and ``run --limit`` spell it: a size (``700MiB``),
    ``auto`` or empty (the cgroup's), ``none`` (no limit).

    Raises:
        TypeError: ``text`` is not a str.
        ValueError: anything else, naming ``name`` and the value.
    """
    _validate.instance(name, text, str)
    word = text.strip().lower()
    if word in ("", "auto"):
        return "auto"
    if word == "none":
        return None
    try:
        return _validate.size(name, text.strip())
    except ValueError as exc:
        raise ValueError(f"{name}={text!r}: {exc} (or auto, or none)") from None


# ---- the one activation of this process -----------------------------------------------------

_settings: Settings | None = None
_runner: BackgroundTrimmer | None = None
_pid: int | None = None  # the process _runner was started in
_fork_handler_registered = False
_handler: logging.Handler | None = None  # the MEMRECLAIM_LOG handler (inherited by forks)
_helper_pid: int | None = None  # the helper process already said it starts no trimmer


def _set_up_logging(level: str | None) -> None:
    global _handler
    if level is None or _handler is not None:
        return
    _handler = logging.StreamHandler()
    _handler.setFormatter(
        logging.Formatter("%(asctime)s [%(process)d] %(name)s %(levelname)s: %(message)s")
    )
    _handler.setLevel(_LEVELS[level])
    logger.addHandler(_handler)
    if logger.getEffectiveLevel() > _LEVELS[level]:
        logger.setLevel(_LEVELS[level])


def _new_runner(settings: Settings) -> BackgroundTrimmer:
    return BackgroundTrimmer(
        interval=settings.interval,
        slack=settings.slack,
        min_interval=settings.min_interval,
        limit=settings.limit,
        name=RUNNER_NAME,
    )


def _after_fork_in_child() -> None:
    """In a forked child of an activated process: start the child's own trimmer.

    Runs after :mod:`memreclaim.runners._base`'s own child handler (registered earlier, at its
    import), so the parent's trimmer is already marked not running here. Never raises: an
    exception in a fork handler would only be printed as unraisable, and the child must run on.
    """
    global _runner, _pid
    settings = _settings
    if settings is None:
        return
    try:
        runner = _new_runner(settings)
        runner.start()
    except Exception as exc:  # the child runs on without one, and says why, once
        _runner, _pid = None, os.getpid()
        logger.warning("memreclaim: no trimmer in forked process %d: %s", os.getpid(), exc)
        return
    _runner, _pid = runner, os.getpid()
    logger.info(
        "memreclaim: trimmer started in forked process %d (parent %d; %s)",
        os.getpid(),
        os.getppid(),
        settings.describe(),
    )


def activate(settings: Settings | None = None, *, export: bool = False) -> BackgroundTrimmer:
    """Start this process's trimmer, and one in every process it forks from now on.

    A trimmer started here before (by the ``MEMRECLAIM`` hook, or an earlier call) is stopped
    and replaced: the last settings win. ``export=True`` also writes the settings into
    ``os.environ`` (:meth:`Settings.environment`), so interpreters this process spawns start
    theirs through the start-up hook. Returns the running trimmer.

    Raises:
        TypeError: ``settings`` is not a :class:`Settings` or None, or ``export`` not a bool.
        RuntimeError: the trimmer thread cannot start (e.g. at interpreter shutdown).
    """
    global _runner, _pid
    if settings is None:
        settings = Settings()
    _validate.instance("settings", settings, Settings)
    _validate.flag("export", export)
    deactivate()
    _set_up_logging(settings.log)
    runner = _new_runner(settings)
    runner.start()
    _follow_forks(settings)
    _runner, _pid = runner, os.getpid()
    if export:
        os.environ.update(settings.environment())
    return runner


def _follow_forks(settings: Settings) -> None:
    """Start a trimmer in every process this one forks from now on (not in this one)."""
    global _settings, _fork_handler_registered
    _settings = settings
    if not _fork_handler_registered:
        os.register_at_fork(after_in_child=_after_fork_in_child)
        _fork_handler_registered = True


def _skip_helper(settings: Settings) -> bool:
    """In a helper process of multiprocessing's (:func:`helper_process`): start no trimmer here,
    follow forks where it forks the pool's processes, say so once (INFO); True. Else False."""
    helper = helper_process()
    if helper is None:
        return False
    global _helper_pid
    what, forks = helper
    if _helper_pid == os.getpid():  # site runs a venv's .pth files twice
        return True
    _helper_pid = os.getpid()
    _set_up_logging(settings.log)
    if forks:
        _follow_forks(settings)
    logger.info(
        "memreclaim: no trimmer in process %d, %s: it holds no user data%s",
        os.getpid(),
        what,
        " (the processes it forks start theirs)" if forks else "",
    )
    return True


def deactivate(timeout: float | None = 5.0) -> bool:
    """Stop this process's trimmer and stop following forks; True when it has stopped.

    Does not touch ``os.environ``: interpreters spawned later still start theirs while
    ``MEMRECLAIM`` is set there. Safe to call when nothing is active.

    Raises:
        TypeError, ValueError: a ``timeout`` that is not a number of seconds >= 0 or None.
    """
    global _settings, _runner, _pid
    if timeout is not None:
        timeout = _validate.seconds("timeout", timeout, allow_zero=True)
    runner = _runner
    _settings, _runner, _pid = None, None, None
    if runner is None:
        return True
    return runner.stop(timeout)


def current() -> BackgroundTrimmer | None:
    """The trimmer activated in this process (forked children have their own), or None."""
    if _pid != os.getpid():
        return None
    return _runner


def from_environment() -> BackgroundTrimmer | None:
    """The start-up hook's entry: :func:`activate` what ``MEMRECLAIM`` asks for, if anything.

    Never raises (it runs while the interpreter starts): a value it does not understand is a
    RuntimeWarning naming the variable, and nothing starts. The settings stay in the
    environment as they were, so spawned interpreters read them too. Returns the trimmer, or
    None.

    Under ``python -I`` or ``-E`` (``sys.flags.isolated`` / ``ignore_environment``) it does
    nothing: the interpreter was asked to ignore its environment, ``MEMRECLAIM`` included.
    """
    if sys.flags.isolated or sys.flags.ignore_environment:
        return None
    try:
        settings = settings_from_environment()
    except ValueError as exc:
        warnings.warn(f"memreclaim: {exc}: no trimmer started", RuntimeWarning, stacklevel=2)
        return None
    if settings is None or _skip_helper(settings):
        return None
    active = current()
    if active is not None and _settings == settings:  # site runs a venv's .pth files twice
        return active
    try:
        runner = activate(settings)
    except Exception as exc:  # never break the interpreter's start
        warnings.warn(
            f"memreclaim: {ENV}=1 but the trimmer could not start: {exc}",
            RuntimeWarning,
            stacklevel=2,
        )
        return None
    logger.info(
        "memreclaim: trimmer started by %s=1 in process %d (%s)",
        ENV,
        os.getpid(),
        settings.describe(),
    )
    return runner
