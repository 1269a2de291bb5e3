"""pytest plugin: fail a test that leaks, pass (and explain) one whose memory is only retained.

Loaded automatically through the ``pytest11`` entry point ``memreclaim``. It provides

* the ``memory`` fixture: ``with memory.check(leak="1 MiB"): work()`` for one run of a block,
  ``memory.measure(work, repeat=5, warmup=1)`` (and ``await memory.ameasure(...)``) to judge
  growth per iteration;
* the markers ``@pytest.mark.no_leak(limit=..., repeat=..., warmup=..., trace=...,
  frames=...)`` (the test's steady leak per run must stay under ``limit``) and
  ``@pytest.mark.reclaims(limit=...)`` (what a trim cannot give back after the test -- leaks
  plus unreclaimed retention -- must stay under ``limit``), on plain and async test functions;
* ``--memreclaim-*`` options and ``memreclaim_*`` ini keys for the defaults.

See docs/pytest-plugin.md. This is a face: it uses :mod:`memreclaim.diagnosis` and the units.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import os
from collections.abc import Awaitable, Callable, Generator, Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest

from . import _validate
from .diagnosis import (
    DEFAULT_FRAMES,
    MAX_RUNS,
    Report,
    _Protocol,
    ameasure,
    calls_per_run,
    diagnose,
    measure,
    snapshot,
)
from .units import format_bytes

__all__ = ["LeakError", "MemoryFixture", "RetentionError"]

_SECTION = "memreclaim"
_LEAK_WORDS = {
    "python_leak": "Python",
    "native_leak": "native, malloc",
    "mapped_leak": "native, outside malloc",
}


class LeakError(AssertionError):
    """A measured block leaked more than its limit; the message is the full diagnosis."""

    record: _Record | None = None


class RetentionError(AssertionError):
    """More memory than allowed stayed resident after a trim; the message is the diagnosis."""

    record: _Record | None = None


# ---- settings ---------------------------------------------------------------------------------

_OPTIONS: dict[str, tuple[str, str]] = {
    # name: (default, help)
    "leak_limit": (
        "1 MiB",
        "default leak allowed per run for @no_leak and memory.check/measure (e.g. '1 MiB')",
    ),
    "retained_limit": (
        "4 MiB",
        "default for @reclaims: memory a trim may leave behind after the test (leaks + "
        "unreclaimed retention)",
    ),
    "repeat": ("1", "default measured runs of a @no_leak/@reclaims test"),
    "warmup": ("0", "default unmeasured warm-up runs before them"),
    "noise_floor": ("256 KiB", "components under this size are reported as noise"),
    "note_threshold": (
        "10 MiB",
        "under -v, print a one-line note for passing tests retaining at least this much",
    ),
    "strict": (
        "false",
        "fail a steady leak under the limit too (by default it passes and is listed in the "
        "'memreclaim: leaks under the limit' summary)",
    ),
}


@dataclass(frozen=True)
class _Settings:
    leak_limit: int
    retained_limit: int
    repeat: int
    warmup: int
    noise_floor: int
    note_threshold: int
    strict: bool = False


_SETTINGS = pytest.StashKey[_Settings]()
_RECORDS = pytest.StashKey[list["_Record"]]()


@dataclass
class _Record:
    report: Report
    source: str
    failure: str | None = None
    forced: bool = False
    location: str | None = None
    limit: int | None = None  # the leak limit judged against (for the near-miss summary)


def _caller() -> str | None:
    """``file:line`` of the test code that called the fixture (not the plugin, not contextlib)."""
    skip = (os.path.abspath(__file__), contextlib.__file__)
    frame = inspect.currentframe()
    while frame is not None:
        name = frame.f_code.co_filename
        if name not in skip and not name.startswith("<frozen"):
            return f"{name}:{frame.f_lineno}"
        frame = frame.f_back
    return None


def _count(value: object, name: str, minimum: int) -> int:
    """A whole number; ini values arrive as strings."""
    if isinstance(value, str):
        text = value.strip()
        if not text.isdigit():
            raise ValueError(f"{name} must be a whole number, got {value!r}")
        value = int(text)
    return _validate.integer(name, value, minimum=minimum, maximum=MAX_RUNS)


def _flag(value: object, name: str) -> bool:
    """A boolean; ini and command-line values arrive as strings."""
    if isinstance(value, str):
        text = value.strip().lower()
        if text not in ("true", "false", "1", "0", "yes", "no", "on", "off"):
            raise ValueError(f"{name} must be true or false, got {value!r}")
        return text in ("true", "1", "yes", "on")
    return _validate.flag(name, value)


def _size(value: object, name: str) -> int:
    return _validate.size(name, value, allow_zero=True)


def pytest_addoption(parser: pytest.Parser) -> None:
    """Register ``--memreclaim-*`` options and their ``memreclaim_*`` ini keys."""
    group = parser.getgroup("memreclaim", "memory leaks vs allocator retention (memreclaim)")
    for name, (default, text) in _OPTIONS.items():
        flag = "--memreclaim-" + name.replace("_", "-")
        group.addoption(flag, dest="memreclaim_" + name, default=None, help=text)
        parser.addini("memreclaim_" + name, f"{text} (default {default!r})", default=default)


def _read_settings(config: pytest.Config) -> _Settings:
    values: dict[str, Any] = {}
    for name in _OPTIONS:
        raw = config.getoption("memreclaim_" + name)
        where = "--memreclaim-" + name.replace("_", "-")
        if raw is None:
            raw = config.getini("memreclaim_" + name)
            where = f"ini memreclaim_{name}"
        try:
            if name in ("repeat", "warmup"):
                values[name] = _count(raw, where, 1 if name == "repeat" else 0)
            elif name == "strict":
                values[name] = _flag(raw, where)
            else:
                values[name] = _size(raw, where)
        except (TypeError, ValueError) as exc:
            raise pytest.UsageError(f"memreclaim: {exc}") from None
    return _Settings(**values)


def pytest_configure(config: pytest.Config) -> None:
    """Register the markers and validate the options (junk -> a usage error)."""
    config.addinivalue_line(
        "markers",
        "no_leak(limit=None, repeat=None, warmup=None, noise_floor=None, trace='auto', "
        f"frames={DEFAULT_FRAMES}, calls=None, strict=None): "
        "fail the test if its steady leak (Python objects still referenced + native allocations "
        "never freed) exceeds limit per run; runs the test warmup + repeat times; trace='auto' "
        "measures untraced and re-runs under tracemalloc only when something grew, trace=False "
        "never traces (no Python component), frames sets the traceback depth of the allocation "
        "sites, calls the calls per run (the leak per call), strict=True fails a steady leak "
        "under the limit too. memreclaim.",
    )
    config.addinivalue_line(
        "markers",
        "reclaims(limit=None, repeat=None, warmup=None, noise_floor=None, trace='auto', "
        f"frames={DEFAULT_FRAMES}, calls=None, strict=None): fail the test if, "
        "after it and a trim, more than limit of its memory stays resident (leaks + unreclaimed "
        "retention); memory the trim gives back is fine. memreclaim.",
    )
    config.stash[_SETTINGS] = _read_settings(config)


# ---- the fixture ------------------------------------------------------------------------------


@dataclass
class CheckResult:
    """What ``memory.check()`` yields; ``report`` is set when the block has finished."""

    report: Report | None = None


@dataclass
class MemoryFixture:
    """The ``memory`` fixture: measure blocks or callables, fail on leaks, record diagnoses."""

    settings: _Settings
    node: pytest.Item | None = None
    records: list[_Record] = field(default_factory=list)

    @property
    def last(self) -> Report | None:
        """The most recent report of this test, if any."""
        return self.records[-1].report if self.records else None

    def _limits(
        self, leak: int | str | None, retained: int | str | None, noise_floor: int | str | None
    ) -> tuple[int, int | None, int]:
        leak_limit = self.settings.leak_limit if leak is None else _size(leak, "leak")
        retained_limit = None if retained is None else _size(retained, "retained")
        floor = self.settings.noise_floor if noise_floor is None else _size(noise_floor, "floor")
        return leak_limit, retained_limit, floor

    def _judge(self, report: Report, leak: int, retained: int | None, source: str) -> None:
        failure = _failure(report, leak, retained, self.settings.strict)
        record = _Record(report, source, failure, location=_caller(), limit=leak)
        self.records.append(record)
        if self.node is not None:
            self.node.stash.setdefault(_RECORDS, []).append(record)
        if failure is not None:
            error = (LeakError if failure.startswith("leak") else RetentionError)(
                f"memreclaim: {failure}\n{report.format()}"
            )
            error.record = record
            raise error

    @contextmanager
    def check(
        self,
        leak: int | str | None = None,
        retained: int | str | None = None,
        *,
        noise_floor: int | str | None = None,
        trace: bool = True,
        frames: int = DEFAULT_FRAMES,
        calls: int | None = None,
    ) -> Iterator[CheckResult]:
        """Measure one run of the ``with`` block and fail on a leak over ``leak`` bytes.

        ``retained`` (optional) also fails when more than that stays resident after a trim
        (leaks + unreclaimed retention). Sizes are bytes or strings like ``"1 MiB"``; bad ones
        raise TypeError/ValueError before the block runs. A block cannot be re-run: for repeat
        mode use :meth:`measure`. Raises :class:`LeakError` / :class:`RetentionError`.
        ``trace=False`` measures without tracemalloc (no Python component), ``frames`` sets
        the depth of the allocation sites (see :func:`memreclaim.diagnosis.measure`); a single
        run is traced from the start (it cannot be measured again). ``calls``: calls of the
        code under test in the block (the report gives the leak per call).
        """
        leak_limit, retained_limit, floor = self._limits(leak, retained, noise_floor)
        per_run = calls_per_run(calls)
        result = CheckResult()
        before = snapshot(trace=trace, frames=frames)
        try:
            yield result
        except BaseException:
            before.close()
            raise
        result.report = dataclasses.replace(diagnose(before, noise_floor=floor), calls=per_run)
        self._judge(result.report, leak_limit, retained_limit, "memory.check()")

    def measure(
        self,
        workload: Callable[[], object],
        *,
        repeat: int = 5,
        warmup: int = 1,
        leak: int | str | None = None,
        retained: int | str | None = None,
        noise_floor: int | str | None = None,
        trace: bool | str = "auto",
        frames: int = DEFAULT_FRAMES,
        calls: int | None = None,
    ) -> Report:
        """Run ``workload`` ``warmup`` + ``repeat`` times, judge the steady leak per run.

        Returns the :class:`~memreclaim.diagnosis.Report`; raises :class:`LeakError` when the
        leak per run exceeds ``leak`` and :class:`RetentionError` when ``retained`` is given and
        exceeded. Bad arguments raise TypeError/ValueError before anything runs. ``trace``
        (``"auto"``: untraced first, traced again only when something grew), ``frames`` and
        ``calls`` (calls per run: the leak per call) are those of
        :func:`memreclaim.diagnosis.measure`.
        """
        limits = self._limits(leak, retained, noise_floor)
        run = _run_kwargs(repeat, warmup, trace, frames, calls)
        return self._judged(
            measure(workload, noise_floor=limits[2], **run), limits, "memory.measure()"
        )

    async def ameasure(
        self,
        workload: Callable[[], Awaitable[object]],
        *,
        repeat: int = 5,
        warmup: int = 1,
        leak: int | str | None = None,
        retained: int | str | None = None,
        noise_floor: int | str | None = None,
        trace: bool | str = "auto",
        frames: int = DEFAULT_FRAMES,
        calls: int | None = None,
    ) -> Report:
        """:meth:`measure` for a coroutine function (``await workload()`` per run)."""
        limits = self._limits(leak, retained, noise_floor)
        run = _run_kwargs(repeat, warmup, trace, frames, calls)
        return self._judged(
            await ameasure(workload, noise_floor=limits[2], **run), limits, "memory.ameasure()"
        )

    def _judged(self, report: Report, limits: tuple[int, int | None, int], source: str) -> Report:
        """Judge ``report`` against ``(leak, retained, noise floor)``; return it if it passes."""
        self._judge(report, limits[0], limits[1], source)
        return report


def _run_kwargs(
    repeat: int, warmup: int, trace: bool | str, frames: int, calls: int | None
) -> dict[str, Any]:
    """The run arguments the fixture passes on to :func:`memreclaim.diagnosis.measure`."""
    return {"repeat": repeat, "warmup": warmup, "trace": trace, "frames": frames, "calls": calls}


def _short(location: str) -> str:
    cwd = os.getcwd() + os.sep
    return location[len(cwd) :] if location.startswith(cwd) else location


def _leaked(report: Report) -> str:
    """``1.0 MiB per run, 80 B per call (native, malloc)``: the leak in the failure line."""
    per = " per run" if report.iterations > 1 else ""
    if report.leak_per_call is not None:
        per += f", {format_bytes(report.leak_per_call)} per call ({report.calls} per run)"
    kinds = " + ".join(_LEAK_WORDS[k] for k in report.leaks())
    return f"leaked {format_bytes(report.leak_per_iteration)}{per} ({kinds})"


def _failure(
    report: Report, leak: int | None, retained: int | None, strict: bool = False
) -> str | None:
    if leak is not None and report.leak_per_iteration > leak:
        return f"{_leaked(report)}, over the {format_bytes(leak)} limit"
    if leak is not None and strict and report.leaks():
        return f"{_leaked(report)}: a steady leak under the {format_bytes(leak)} limit (strict)"
    if retained is not None and report.retained > retained:
        return (
            f"{format_bytes(report.retained)} stayed resident after trim, over the "
            f"{format_bytes(retained)} limit for @reclaims/retained"
        )
    return None


@pytest.fixture
def memory(request: pytest.FixtureRequest) -> Generator[MemoryFixture, None, None]:
    """Measure memory in a test: ``with memory.check(leak="1 MiB"): work()``,
    ``memory.measure(work, repeat=5, warmup=1)``; see :class:`MemoryFixture`."""
    node = request.node if isinstance(request.node, pytest.Item) else None
    yield MemoryFixture(request.config.stash[_SETTINGS], node)


# ---- the markers ------------------------------------------------------------------------------


@dataclass(frozen=True)
class _MarkerSpec:
    leak: int | None
    retained: int | None
    repeat: int
    warmup: int
    noise_floor: int
    trace: bool | str = "auto"
    frames: int = DEFAULT_FRAMES
    calls: int | None = None
    strict: bool = False


_SPEC = pytest.StashKey[_MarkerSpec]()
_KWARGS = ("limit", "repeat", "warmup", "noise_floor", "trace", "frames", "calls", "strict")


def _marker_spec(item: pytest.Item, settings: _Settings) -> _MarkerSpec | None:
    no_leak = item.get_closest_marker("no_leak")
    reclaims = item.get_closest_marker("reclaims")
    if no_leak is None and reclaims is None:
        return None
    leak = retained = None
    repeat, warmup, floor = settings.repeat, settings.warmup, settings.noise_floor
    trace: bool | str = "auto"
    frames, calls, strict = DEFAULT_FRAMES, None, settings.strict
    for mark in (reclaims, no_leak):  # no_leak's repeat/warmup win when both are given
        if mark is None:
            continue
        where = f"@pytest.mark.{mark.name}"
        if len(mark.args) > 1:
            raise TypeError(f"{where} takes at most one positional argument (limit)")
        unknown = set(mark.kwargs) - set(_KWARGS)
        if unknown:
            raise TypeError(f"{where}: unknown argument(s) {sorted(unknown)}; use {_KWARGS}")
        kwargs = dict(mark.kwargs)
        if mark.args:
            kwargs["limit"] = mark.args[0]
        default = settings.leak_limit if mark.name == "no_leak" else settings.retained_limit
        limit = default if kwargs.get("limit") is None else _size(kwargs["limit"], "limit")
        if mark.name == "no_leak":
            leak = limit
        else:
            retained = limit
        if kwargs.get("repeat") is not None:
            repeat = _count(kwargs["repeat"], "repeat", 1)
        if kwargs.get("warmup") is not None:
            warmup = _count(kwargs["warmup"], "warmup", 0)
        if kwargs.get("noise_floor") is not None:
            floor = _size(kwargs["noise_floor"], "noise_floor")
        trace, frames, calls, strict = _run_options(kwargs, trace, frames, calls, strict)
    return _MarkerSpec(leak, retained, repeat, warmup, floor, trace, frames, calls, strict)


def _run_options(
    kwargs: dict[str, Any], trace: bool | str, frames: int, calls: int | None, strict: bool
) -> tuple[bool | str, int, int | None, bool]:
    """A marker's ``trace``, ``frames``, ``calls`` and ``strict`` (the given ones validated)."""
    if kwargs.get("trace") is not None:
        trace = (
            kwargs["trace"]
            if kwargs["trace"] == "auto"
            else _validate.flag("trace", kwargs["trace"])
        )
    if kwargs.get("frames") is not None:
        frames = _validate.integer("frames", kwargs["frames"], minimum=1, maximum=1000)
    if kwargs.get("calls") is not None:
        calls = calls_per_run(kwargs["calls"])
    if kwargs.get("strict") is not None:
        strict = _validate.flag("strict", kwargs["strict"])
    return trace, frames, calls, strict


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Validate the markers before the test runs: bad arguments are a usage error."""
    problem = None
    try:
        spec = _marker_spec(item, item.config.stash[_SETTINGS])
    except (TypeError, ValueError) as exc:
        problem, spec = str(exc), None
    if problem is not None:
        pytest.fail(f"memreclaim usage error: {problem}", pytrace=False)
    if spec is not None:
        item.stash[_SPEC] = spec


def _test_arguments(item: pytest.Function) -> dict[str, object]:
    """The arguments pytest passes to the test function: those of its parameters that are
    fixtures or parametrized (in ``item.funcargs``); a parameter with a default that is neither
    keeps its default, as pytest does."""
    names = inspect.signature(item.obj).parameters.values()
    plain = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return {
        p.name: item.funcargs[p.name] for p in names if p.kind in plain and p.name in item.funcargs
    }


def _call_again(item: pytest.Function) -> None:
    """Run the test function once more, outside the hook chain (warm-up and extra runs)."""
    result = item.obj(**_test_arguments(item))
    if inspect.isawaitable(result):  # an async test no plugin turned into a sync one
        if inspect.iscoroutine(result):
            result.close()
        pytest.fail("memreclaim: repeat/warmup on an async test needs pytest-asyncio")


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> Generator[None, object, object]:
    """Around a marked test: warm-up runs, a snapshot, the measured runs, the diagnosis."""
    spec = pyfuncitem.stash.get(_SPEC, None)
    if spec is None:
        return (yield)
    # pytest's own call is the last run of the first measured pass; the warm-up, the other runs
    # and a traced pass (trace="auto", when the first found growth) call the function again.
    args = (spec.repeat, spec.warmup, spec.noise_floor, spec.trace, spec.frames, 10, spec.calls)
    protocol = _Protocol(pyfuncitem.obj, *args)
    result: object = None
    with closing(protocol.runs()) as runs:
        for pytest_call in runs:
            if pytest_call:
                result = yield
            else:
                _call_again(pyfuncitem)
    report = protocol.report()
    marks = " + ".join(
        f"@{name}" for name in ("no_leak", "reclaims") if pyfuncitem.get_closest_marker(name)
    )
    failure = _failure(report, spec.leak, spec.retained, spec.strict)
    record = _Record(report, marks, failure, forced=True, limit=spec.leak)
    pyfuncitem.stash.setdefault(_RECORDS, []).append(record)
    return result


# ---- reporting --------------------------------------------------------------------------------


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Attach diagnoses as a ``memreclaim`` section; fail marked tests that leaked."""
    report = yield
    records = item.stash.get(_RECORDS, None)
    if not records or report.when != "call":
        return report
    settings = item.config.stash[_SETTINGS]
    raised = call.excinfo.value if call.excinfo is not None else None
    mine = raised.record if isinstance(raised, LeakError | RetentionError) else None
    if mine is not None and report.failed:
        where = f"{_short(mine.location)}: " if mine.location else ""
        report.longrepr = (
            f"{where}memreclaim ({mine.source}): {mine.failure}\n{mine.report.format()}"
        )
    for record in records:
        if not (record.failure is not None and not record.forced):  # else: in the error message
            title = f"{_SECTION}: {record.source}"
            report.sections.append((title, record.report.format()))
        if record.failure is not None and record.forced and report.passed:
            report.outcome = "failed"
            report.longrepr = (
                f"memreclaim ({record.source}): {record.failure}\n"
                f"verdict: {record.report.verdict}\n"
                f"(the diagnosis is in the '{_SECTION}: {record.source}' section below)"
            )
        elif record.failure is None and record.limit is not None and record.report.leaks():
            near = (
                f"{item.nodeid}: {_leaked(record.report)}, under the {format_bytes(record.limit)}"
            )
            near += f" limit; {record.report.verdict.split('; ')[0]}"
            report.user_properties.append(("memreclaim_near_miss", near))
        if record.failure is None:
            r = record.report
            kept = r.allocator_retention + r.pymalloc_retention + r.unreclaimed_retention
            if kept >= settings.note_threshold:
                note = f"{item.nodeid}: {record.report.verdict}"
                report.user_properties.append(("memreclaim_note", note))
    return report


def _properties(terminalreporter: Any, key: str) -> list[str]:
    """The ``key`` user properties of every report, once each, in order (xdist workers' reports
    carry them too)."""
    found: dict[str, None] = {}
    for reports in terminalreporter.stats.values():
        for report in reports:
            for name, value in getattr(report, "user_properties", ()):
                if name == key:
                    found[str(value)] = None
    return list(found)


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """Always: the steady leaks that stayed under their limit (a section of their own, so a
    near miss is seen without -rA; ``strict`` fails them). Under -v, one line per passing test
    that retained notable memory."""
    near = _properties(terminalreporter, "memreclaim_near_miss")
    if near:
        terminalreporter.section("memreclaim: leaks under the limit")
        for line in near:
            terminalreporter.write_line(line)
        terminalreporter.write_line(
            "(steady growth per run, passed; @pytest.mark.no_leak(strict=True) or the "
            "memreclaim_strict ini key fails them)"
        )
    if config.get_verbosity() < 1:
        return
    notes = _properties(terminalreporter, "memreclaim_note")
    if notes:
        terminalreporter.section("memreclaim: retention notes")
        for note in notes:
            terminalreporter.write_line(note)
