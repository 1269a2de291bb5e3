"""Tests of memreclaim.watchdog: PacingPolicy, Watchdog (asyncio) and BackgroundTrimmer (thread).

Memory behaviour is tested in subprocesses (one fresh heap each) with the seed-000 spike:
160,000 strings of 600-4,000 bytes from random.Random(0), every 50th kept, the rest freed:
~370 MiB retained by glibc until a trim. Assertions are ratios against a baseline taken in the
same process, and counts of ticks, never timings.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import textwrap
import threading
from typing import Any

import pytest

import memreclaim
from memreclaim import BackgroundTrimmer, Counters, PacingPolicy, TrimEvent, Watchdog
from memreclaim.policy import TrimOutcome

MiB = 2**20

glibc_only = pytest.mark.skipif(
    memreclaim.allocator() != "glibc", reason="the retained-spike shape is glibc's"
)

PRELUDE = textwrap.dedent(
    """
    import asyncio, gc, json, os, random, sys, threading, time
    import memreclaim
    from memreclaim import BackgroundTrimmer, Watchdog, rss, workloads

    MiB = 2**20

    def spike(keep_every=50):
        data = workloads.strings(160_000)
        kept = workloads.keep_every(data, keep_every)
        del data
        gc.collect()
        return kept

    def live(n=160_000):
        return workloads.strings(n)

    def spike_holding_the_gil():
        # The spike is pure Python: with a long switch interval no other thread (a trimmer)
        # gets the GIL until it is over, so "retained" is measured before any trim can run.
        previous = sys.getswitchinterval()
        sys.setswitchinterval(30.0)
        try:
            kept = spike()
            return kept, rss()
        finally:
            sys.setswitchinterval(previous)

    def out(**fields):
        print("RESULT " + json.dumps(fields), flush=True)
    """
)


def run_script(body: str, timeout: float = 60.0) -> tuple[dict[str, Any], str]:
    """Run PRELUDE + body in a fresh interpreter; return its RESULT json and its stderr."""
    proc = subprocess.run(
        [sys.executable, "-X", "dev", "-c", PRELUDE + textwrap.dedent(body)],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert proc.returncode == 0, f"script failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, f"no RESULT line:\n{proc.stdout}\n{proc.stderr}"
    return json.loads(lines[-1][len("RESULT ") :]), proc.stderr


# PacingPolicy's own tests are in tests/test_policy.py.


# ---- argument checks of the runners ---------------------------------------------------------


@pytest.mark.parametrize("cls", [Watchdog, BackgroundTrimmer])
@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"interval": -1}, ValueError, "interval must be > 0"),
        ({"interval": 0}, ValueError, "interval must be > 0"),
        ({"interval": float("inf")}, ValueError, "finite"),
        ({"interval": "1s"}, TypeError, "interval must be a number"),
        ({"interval": None}, TypeError, "interval"),
        ({"slack": 0}, ValueError, "slack must be > 0"),
        ({"slack": []}, TypeError, "slack"),
        ({"pools": "yes"}, TypeError, "pools must be a bool"),
        ({"on_trim": 42}, TypeError, "on_trim must be a callable"),
        ({"policy": "fast"}, TypeError, "policy must be a PacingPolicy"),
        ({"policy": PacingPolicy(), "slack": "1 MiB"}, TypeError, "not both"),
        ({"interval": 1e10}, ValueError, "interval must be at most"),
        ({"thresholds": "auto"}, TypeError, "thresholds must be a bool"),
        ({"limit": "lots"}, ValueError, "limit"),
        ({"name": 3}, TypeError, "name must be a str"),
    ],
)
def test_runner_bad_arguments(
    cls: type[Watchdog | BackgroundTrimmer],
    kwargs: dict[str, Any],
    error: type[Exception],
    match: str,
) -> None:
    with pytest.raises(error, match=match):
        cls(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"busy_lag": 0}, ValueError, "busy_lag must be > 0"),
        ({"quiet": -0.1}, ValueError, "quiet"),
        ({"idle_deadline": -1}, ValueError, "idle_deadline must be >= 0"),
        ({"idle_gating": None}, TypeError, "idle_gating must be a bool"),
        ({"quiet": 0.5, "long_quiet": 0.1}, ValueError, "long_quiet"),
    ],
)
def test_watchdog_bad_gating_arguments(
    kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        Watchdog(**kwargs)


def test_bad_stop_timeout() -> None:
    trimmer = BackgroundTrimmer()
    with pytest.raises(ValueError, match="timeout"):
        trimmer.stop(timeout=-1)


def test_watchdog_start_needs_a_running_loop() -> None:
    with pytest.raises(RuntimeError, match="no running event loop"):
        Watchdog().start()


def test_exports() -> None:
    assert memreclaim.Watchdog is Watchdog
    assert memreclaim.BackgroundTrimmer is BackgroundTrimmer
    assert memreclaim.PacingPolicy is PacingPolicy
    assert memreclaim.Counters is Counters
    assert memreclaim.TrimEvent is TrimEvent
    with pytest.raises(AttributeError):
        _ = memreclaim.NoSuchThing


# ---- Watchdog: in-process behaviour (no memory ratios) --------------------------------------


def test_watchdog_stop_start_twice_and_two_watchdogs() -> None:
    async def main() -> tuple[Counters, Counters, bool]:
        first = Watchdog(interval=0.005)
        second = Watchdog(interval=0.005, name="second")
        first.start()
        with pytest.raises(RuntimeError, match="already running"):
            first.start()
        async with second:
            await asyncio.sleep(0.05)
            assert first.running and second.running
            await first.stop()
            await first.stop()  # twice is fine
            assert not first.running
            ticks = first.counters.ticks
            first.start()  # and it starts again
            await asyncio.sleep(0.05)
            assert first.counters.ticks > ticks  # counters are cumulative across restarts
        assert not second.running
        await first.stop()
        return first.counters, second.counters, first.task is None

    first, second, cleared = asyncio.run(main())
    assert first.ticks > 0 and second.ticks > 0
    assert first.trims == 0 and second.trims == 0
    assert cleared


def test_watchdog_as_a_task_and_run_twice_rejected() -> None:
    async def main() -> int:
        watchdog = Watchdog(interval=0.005)
        task = asyncio.create_task(watchdog.run())
        await asyncio.sleep(0.03)
        assert watchdog.running and watchdog.task is task
        with pytest.raises(RuntimeError, match="already running"):
            await watchdog.run()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert not watchdog.running
        return watchdog.counters.ticks

    assert asyncio.run(main()) > 0


def test_watchdog_stop_from_own_task_rejected() -> None:
    async def main() -> None:
        watchdog = Watchdog(interval=0.005)
        errors: list[BaseException] = []

        async def inside() -> None:
            try:
                await watchdog.stop()
            except RuntimeError as exc:
                errors.append(exc)

        watchdog._task = asyncio.current_task()  # pretend we are the watchdog's task
        await inside()
        watchdog._task = None
        assert errors and "own task" in str(errors[0])

    asyncio.run(main())


def test_watchdog_callback_exception_is_logged_not_fatal(caplog: pytest.LogCaptureFixture) -> None:
    calls: list[TrimEvent] = []

    def bad_callback(event: TrimEvent) -> None:
        calls.append(event)
        raise ZeroDivisionError("callback bug")

    async def main() -> Counters:
        async with Watchdog(
            interval=0.005, slack="8 MiB", min_interval=0.005, on_trim=bad_callback
        ) as watchdog:
            await asyncio.sleep(0.02)
            blob = b"x" * (64 * MiB)  # live growth: one (unproductive) trim
            while watchdog.counters.trims == 0:
                await asyncio.sleep(0.005)
            ticks = watchdog.counters.ticks
            while watchdog.counters.ticks < ticks + 5:  # still ticking after the error
                await asyncio.sleep(0.005)
            assert watchdog.running
            del blob
            return watchdog.counters

    with caplog.at_level(logging.INFO, logger="memreclaim"):
        counters = asyncio.run(main())
    assert counters.callback_errors >= 1
    assert len(calls) == counters.trims >= 1
    assert calls[0].gate in ("idle", "deadline")
    assert calls[0].growth > 8 * MiB
    assert "on_trim callback raised" in caplog.text
    assert "ZeroDivisionError: callback bug" in caplog.text
    assert "trim released" in caplog.text


def test_watchdog_trim_error_is_logged_not_fatal(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken_trim(*, pools: bool = False) -> memreclaim.TrimResult:
        raise OSError("simulated")

    monkeypatch.setattr(memreclaim, "trim", broken_trim)

    async def main() -> Counters:
        async with Watchdog(interval=0.005, slack="8 MiB", min_interval=0.005) as watchdog:
            await asyncio.sleep(0.02)
            blob = b"x" * (64 * MiB)
            while watchdog.counters.trim_errors < 2:
                await asyncio.sleep(0.005)
            assert watchdog.running
            del blob
            return watchdog.counters

    with caplog.at_level(logging.ERROR, logger="memreclaim"):
        counters = asyncio.run(main())
    assert counters.trims == 0
    assert "OSError: simulated" in caplog.text


def test_tick_errors_are_logged_not_fatal(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    import memreclaim.runners._base as wd

    real_sample = wd.sample
    failures = {"left": 3}

    def flaky_sample() -> Any:
        if failures["left"] > 0:
            failures["left"] -= 1
            raise OSError("statm unreadable")
        return real_sample()

    async def main() -> Counters:
        async with Watchdog(interval=0.005) as watchdog:
            while watchdog.counters.ticks < 1:  # started: the floor is set
                await asyncio.sleep(0.005)
            monkeypatch.setattr(wd, "sample", flaky_sample)
            for _ in range(2000):  # bounded
                if not failures["left"] and watchdog.counters.ticks >= 3:
                    break
                await asyncio.sleep(0.005)
            assert watchdog.running
            return watchdog.counters

    with caplog.at_level(logging.ERROR, logger="memreclaim"):
        counters = asyncio.run(main())
    assert counters.ticks >= 3
    assert "tick failed" in caplog.text and "OSError: statm unreadable" in caplog.text


# ---- Watchdog: memory, in subprocesses -------------------------------------------------------


@glibc_only
@pytest.mark.timeout(120)
def test_watchdog_returns_a_spike_within_a_few_ticks() -> None:
    result, _ = run_script(
        """
        events = []
        async def main():
            base = rss()
            async with Watchdog(interval=0.05, slack="64 MiB", min_interval=0.05,
                                on_trim=events.append) as wd:
                while wd.counters.ticks < 10:
                    await asyncio.sleep(0.01)
                trims_before = wd.counters.trims
                kept = spike()                  # synchronous: no tick can run meanwhile
                retained = rss()
                ticks_at_spike = wd.counters.ticks
                while wd.counters.trims == trims_before and wd.counters.ticks < ticks_at_spike + 40:
                    await asyncio.sleep(0.01)
                after = rss()
                out(base=base, retained=retained, after=after, trims_before=trims_before,
                    ticks_to_trim=wd.counters.ticks - ticks_at_spike,
                    trims=wd.counters.trims, released=wd.counters.bytes_released,
                    gate=events[0].gate if events else None, kept=len(kept))
        asyncio.run(main())
        """
    )
    spike_size = result["retained"] - result["base"]
    assert spike_size > 300 * MiB, result  # the spike really is retained without a trim
    assert result["trims_before"] == 0
    assert result["trims"] == 1
    # Within the bounded window of 40 ticks (a tick count, not a time: under load the policy's
    # rising check may wait a few more ticks for RSS to settle).
    assert result["ticks_to_trim"] < 40, result
    assert result["after"] - result["base"] < 0.25 * spike_size, result
    assert result["released"] > 0.7 * spike_size
    assert result["gate"] in ("idle", "deadline")  # deadline: a starved machine looks busy


@pytest.mark.timeout(60)
def test_watchdog_without_a_spike_never_trims() -> None:
    result, _ = run_script(
        """
        async def main():
            async with Watchdog(interval=0.005, slack="64 MiB", min_interval=0.005) as wd:
                while wd.counters.ticks < 200:
                    churn = [bytes(2000) for _ in range(5000)]   # ~10 MiB allocated and freed
                    del churn
                    await asyncio.sleep(0.002)
                out(ticks=wd.counters.ticks, trims=wd.counters.trims)
        asyncio.run(main())
        """
    )
    assert result["ticks"] >= 200
    assert result["trims"] == 0


@glibc_only
@pytest.mark.timeout(120)
def test_watchdog_backs_off_when_memory_is_live() -> None:
    result, _ = run_script(
        """
        async def main():
            base = rss()
            # min_interval of 25 ticks: unproductive trims at most at ticks 0, 50, 150...
            # (long_quiet short: time spent waiting for idle does not count as ticks). The
            # rising check looks back one reading (settle_window 10 ms): with its default 1 s
            # window, the 50 ticks (0.5 s on an idle machine) would all see the build "rising".
            policy = memreclaim.PacingPolicy(slack="64 MiB", min_interval=0.25, backoff_max=10.0,
                                             settle_window=0.01)
            async with Watchdog(interval=0.01, policy=policy, quiet=0.01, long_quiet=0.01) as wd:
                await asyncio.sleep(0.03)
                held = live()                       # ~370 MiB, all of it live
                grown = rss() - base
                start = wd.counters.ticks
                while wd.counters.ticks < start + 50:
                    held.append("y" * 3000)         # and a little live growth on top
                    await asyncio.sleep(0.005)
                c = wd.counters
                out(grown=grown, trims=c.trims, unproductive=c.unproductive_trims,
                    released=c.bytes_released, ticks=c.ticks - start)
        asyncio.run(main())
        """
    )
    assert result["grown"] > 300 * MiB
    assert result["ticks"] >= 50
    assert 1 <= result["trims"] <= 2, result
    assert result["unproductive"] == result["trims"]
    assert result["released"] < 0.05 * result["grown"]


@glibc_only
@pytest.mark.timeout(120)
def test_watchdog_defers_while_busy_then_trims_at_deadline() -> None:
    result, _ = run_script(
        """
        state = {"busy": False, "busy_at_trim": None}
        events = []
        def on_trim(event):
            state["busy_at_trim"] = state["busy"]
            events.append(event)

        async def busy_loop(stop):
            state["busy"] = True
            while not stop.is_set():
                end = time.perf_counter() + 0.005
                while time.perf_counter() < end:   # 5 ms of work between yields
                    pass
                await asyncio.sleep(0)
            state["busy"] = False

        async def main():
            base = rss()
            async with Watchdog(interval=0.02, slack="64 MiB", min_interval=0.02,
                                idle_deadline=0.5, on_trim=on_trim) as wd:
                await asyncio.sleep(0.05)
                stop = asyncio.Event()
                kept = spike()
                retained = rss()
                busy = asyncio.create_task(busy_loop(stop))
                for _ in range(2000):                # bounded: ~10 s of busy work at most
                    if wd.counters.trims:
                        break
                    await asyncio.sleep(0.005)
                stop.set()
                await busy
                c = wd.counters
                out(base=base, retained=retained, after=rss(), trims=c.trims,
                    skipped_busy=c.skipped_busy, deadline_trims=c.deadline_trims,
                    gate=events[0].gate if events else None, busy_at_trim=state["busy_at_trim"],
                    lag_max=c.lag_max)
        asyncio.run(main())
        """
    )
    assert result["retained"] - result["base"] > 300 * MiB
    assert result["trims"] == 1
    assert result["skipped_busy"] > 0  # it deferred...
    assert result["gate"] == "deadline" and result["deadline_trims"] == 1  # ...then trimmed
    assert result["busy_at_trim"] is True  # while the loop was still busy
    assert result["lag_max"] > 0.002  # and it saw the loop lag
    assert result["after"] - result["base"] < 0.25 * (result["retained"] - result["base"])


@glibc_only
@pytest.mark.timeout(120)
def test_watchdog_waits_for_idle_when_busy_ends_before_deadline() -> None:
    result, _ = run_script(
        """
        state = {"busy": False, "busy_at_trim": None}
        def on_trim(event):
            state["busy_at_trim"] = state["busy"]
            state["gate"] = event.gate

        async def busy_for(n):
            state["busy"] = True
            for _ in range(n):
                end = time.perf_counter() + 0.005
                while time.perf_counter() < end:
                    pass
                await asyncio.sleep(0)
            state["busy"] = False

        async def main():
            # The rising check looks back one reading only (settle_window 10 ms): the trigger
            # fires on the first tick after the spike, while the loop is busy, on any machine.
            policy = memreclaim.PacingPolicy(slack="64 MiB", min_interval=0.02,
                                             settle_window=0.01)
            async with Watchdog(interval=0.02, policy=policy,
                                idle_deadline=60.0, on_trim=on_trim) as wd:
                await asyncio.sleep(0.05)
                kept = spike()
                busy = asyncio.create_task(busy_for(60))   # ~0.3 s of busy loop
                await busy
                skipped = wd.counters.skipped_busy
                trims_while_busy = wd.counters.trims
                for _ in range(2000):       # bounded: ~20 s on a starved machine, usually 0.1 s
                    if wd.counters.trims:
                        break
                    await asyncio.sleep(0.01)
                out(trims_while_busy=trims_while_busy, skipped=skipped, trims=wd.counters.trims,
                    gate=state.get("gate"), busy_at_trim=state["busy_at_trim"])
        asyncio.run(main())
        """
    )
    assert result["skipped"] > 0
    assert result["trims_while_busy"] == 0
    assert result["trims"] == 1
    assert result["gate"] == "idle"
    assert result["busy_at_trim"] is False


@glibc_only
@pytest.mark.timeout(120)
def test_watchdog_cancellation_is_clean() -> None:
    result, stderr = run_script(
        """
        import gc
        def trim_threads():
            return [t.name for t in threading.enumerate() if t is not threading.main_thread()]

        async def stop_mid_trim():
            wd = Watchdog(interval=0.01, slack="64 MiB", min_interval=0.01, idle_gating=False)
            wd.start()
            await asyncio.sleep(0.03)
            kept = spike()
            seen = False
            for _ in range(2000):
                if trim_threads():
                    seen = True
                    break
                await asyncio.sleep(0.0005)
            await wd.stop()                  # cancels while the trim runs in its thread
            return seen, trim_threads(), wd.task is None, wd.running

        async def left_running():
            wd = Watchdog(interval=0.01)
            wd.start()                       # never stopped: asyncio.run cancels it
            await asyncio.sleep(0.03)

        seen, threads_after, cleared, running = asyncio.run(stop_mid_trim())
        asyncio.run(left_running())
        gc.collect()
        out(seen=seen, threads_after=threads_after, cleared=cleared, running=running,
            threads_at_end=trim_threads())
        """
    )
    assert result["seen"], "the trim thread was never observed; the test did not test cancel"
    assert result["threads_after"] == []
    assert result["cleared"] and not result["running"]
    assert result["threads_at_end"] == []
    assert "Task was destroyed but it is pending" not in stderr
    assert "Traceback" not in stderr, stderr


# ---- BackgroundTrimmer -----------------------------------------------------------------------


def test_trimmer_start_stop_twice_and_context_manager() -> None:
    trimmer = BackgroundTrimmer(interval=0.005)
    assert trimmer.stop() is True  # never started: fine
    trimmer.start()
    with pytest.raises(RuntimeError, match="already running"):
        trimmer.start()
    assert trimmer.running and trimmer.thread is not None
    assert trimmer.thread.daemon
    assert trimmer.stop() is True
    assert trimmer.stop() is True
    assert not trimmer.running and trimmer.thread is None
    with trimmer:
        assert trimmer.running
    assert not trimmer.running
    names = [thread.name for thread in threading.enumerate()]
    assert "memreclaim-trimmer" not in names


def test_trimmer_callback_exception_is_logged_not_fatal(caplog: pytest.LogCaptureFixture) -> None:
    seen: list[TrimEvent] = []

    def bad_callback(event: TrimEvent) -> None:
        seen.append(event)
        raise ValueError("bad callback")

    done = threading.Event()
    with (
        caplog.at_level(logging.INFO, logger="memreclaim"),
        BackgroundTrimmer(
            interval=0.005, slack="8 MiB", min_interval=0.005, on_trim=bad_callback
        ) as trimmer,
    ):
        while trimmer.counters.ticks < 3:
            done.wait(0.005)
        blob = b"x" * (64 * MiB)
        while trimmer.counters.trims == 0:
            done.wait(0.005)
        ticks = trimmer.counters.ticks
        while trimmer.counters.ticks < ticks + 5:
            done.wait(0.005)
        assert trimmer.running
        del blob
    assert trimmer.counters.callback_errors >= 1
    assert seen and seen[0].gate == "thread" and not seen[0].productive
    assert "on_trim callback raised" in caplog.text
    assert "ValueError: bad callback" in caplog.text


def test_trimmer_stop_from_callback_does_not_deadlock() -> None:
    holder: list[BackgroundTrimmer] = []
    answers: list[bool] = []

    def stop_self(event: TrimEvent) -> None:
        answers.append(holder[0].stop())

    trimmer = BackgroundTrimmer(
        interval=0.005, slack="8 MiB", min_interval=0.005, on_trim=stop_self
    )
    holder.append(trimmer)
    trimmer.start()
    waiter = threading.Event()
    while trimmer.counters.ticks < 2:
        waiter.wait(0.005)
    blob = b"x" * (64 * MiB)
    thread = trimmer._thread
    assert thread is not None
    thread.join(10)
    assert not thread.is_alive()
    assert answers == [False]  # asked to stop, could not join itself
    assert trimmer.stop() is True
    del blob


def test_trimmer_tick_from_a_hook() -> None:
    trimmer = BackgroundTrimmer(slack="8 MiB", min_interval=0.001)
    assert trimmer.tick() is None  # first call sets the floor
    trimmer.request_started()
    blob = b"x" * (64 * MiB)
    assert trimmer.in_flight == 1
    trimmer.request_finished()
    event = trimmer.tick()  # no request in flight: the burst is over, trim now
    assert event is not None and event.gate == "hook" and event.growth > 8 * MiB
    assert trimmer.counters.trims == 1
    del blob


@glibc_only
def test_a_trim_tells_the_policy_the_in_use_bytes_it_started_with() -> None:
    """Frees by other threads while a trim runs (a Dask worker dropping its results) are told
    from the in-use bytes at its start: read before the trim when the deciding tick had none
    (the first trim of a burst: level and floor alike, no figures asked)."""
    trimmer = BackgroundTrimmer(slack="8 MiB", min_interval=0.001, limit=None)
    outcomes: list[TrimOutcome] = []
    record = trimmer.policy.record_trim

    def spy(outcome: TrimOutcome) -> bool:
        outcomes.append(outcome)
        return record(outcome)

    trimmer.policy.record_trim = spy  # type: ignore[method-assign]
    assert trimmer.tick() is None  # sets the floor
    blob = [bytes(1000) for _ in range(40_000)]  # ~40 MiB in use when the trim starts
    assert trimmer.tick(settled=True) is not None
    assert len(outcomes) == 1 and outcomes[0].in_use is not None
    before = outcomes[0].in_use_before
    assert before is not None and before >= 30 * MiB, outcomes
    del blob


@glibc_only
@pytest.mark.timeout(120)
def test_trimmer_returns_a_spike_and_stays_quiet_otherwise() -> None:
    result, _ = run_script(
        """
        base = rss()
        wait = threading.Event()
        with BackgroundTrimmer(interval=0.02, slack="64 MiB", min_interval=0.02) as t:
            while t.counters.ticks < 100:               # no spike: many ticks, no trim
                churn = [bytes(2000) for _ in range(5000)]
                del churn
                wait.wait(0.002)
            quiet_ticks, quiet_trims = t.counters.ticks, t.counters.trims
            start = t.counters.ticks
            kept, retained = spike_holding_the_gil()
            ticks_during_spike = t.counters.ticks - start
            while t.counters.trims == 0 and t.counters.ticks < start + 50:
                wait.wait(0.005)
            ticks_to_trim = t.counters.ticks - start
            after = rss()
        out(base=base, retained=retained, after=after, quiet_ticks=quiet_ticks,
            quiet_trims=quiet_trims, ticks_to_trim=ticks_to_trim, trims=t.counters.trims,
            ticks_during_spike=ticks_during_spike,
            alive=[x.name for x in threading.enumerate() if x.name == "memreclaim-trimmer"])
        """
    )
    spike_size = result["retained"] - result["base"]
    assert result["quiet_ticks"] >= 100 and result["quiet_trims"] == 0
    assert spike_size > 300 * MiB
    assert result["ticks_during_spike"] == 0
    assert result["trims"] == 1
    assert result["ticks_to_trim"] < 50, result  # within the bounded window (ticks, not time)
    assert result["after"] - result["base"] < 0.25 * spike_size, result
    assert result["alive"] == []


@glibc_only
@pytest.mark.timeout(120)
def test_trimmer_backs_off_when_memory_is_live() -> None:
    result, _ = run_script(
        """
        wait = threading.Event()
        base = rss()
        # min_interval of 25 ticks: unproductive trims at most at ticks 0, 50, 150...
        policy = memreclaim.PacingPolicy(slack="64 MiB", min_interval=0.25, backoff_max=10.0)
        with BackgroundTrimmer(interval=0.01, policy=policy) as t:
            while t.counters.ticks < 3:
                wait.wait(0.005)
            held = live()           # the trimmer ticks meanwhile: growth-phase trims happen
            grown = rss() - base
            start, trims_in_growth = t.counters.ticks, t.counters.trims
            while t.counters.ticks < start + 50:
                held.append("y" * 3000)
                wait.wait(0.005)
            c = t.counters
        out(grown=grown, trims=c.trims - trims_in_growth, trims_in_growth=trims_in_growth,
            unproductive=c.unproductive_trims, all_trims=c.trims, ticks=c.ticks - start)
        """
    )
    assert result["grown"] > 300 * MiB
    assert result["ticks"] >= 50
    # once the memory is in place (live), at most 2 trims over 50 ticks
    assert result["trims"] <= 2, result
    # every trim, during the growth or after, returned too little and extended the back-off
    assert result["unproductive"] == result["all_trims"]


@glibc_only
@pytest.mark.timeout(120)
@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_trimmer_after_fork() -> None:
    result, stderr = run_script(
        """
        wait = threading.Event()
        t = BackgroundTrimmer(interval=0.02, slack="64 MiB", min_interval=0.02)
        t.start()
        while t.counters.ticks < 3:
            wait.wait(0.005)
        read_fd, write_fd = os.pipe()
        # Fork while the trimmer's locks are held, as when its thread is mid-tick: without the
        # at-fork handler the child would inherit held locks and hang in counters/tick/start.
        t._lock.acquire()
        t._tick_lock.acquire()
        pid = os.fork()
        if pid == 0:
            import signal
            signal.alarm(20)                        # a hang becomes a failure, not a timeout
            report = {"running_in_child": t.running, "thread_in_child": t.thread is not None}
            try:
                report["child_ticks"] = t.counters.ticks
                t.tick()
                base = rss()
                t.start()                           # one per worker: start it again here
                report["restarted"] = t.running
                kept, retained = spike_holding_the_gil()
                start = t.counters.ticks
                while t.counters.trims == 0 and t.counters.ticks < start + 50:
                    wait.wait(0.005)
                report.update(base=base, retained=retained, after=rss(),
                              child_trims=t.counters.trims)
                report["stopped"] = t.stop()
            finally:
                os.write(write_fd, json.dumps(report).encode())
                os._exit(0)
        t._tick_lock.release()
        t._lock.release()
        os.close(write_fd)
        _, status = os.waitpid(pid, 0)
        child = json.loads(os.read(read_fd, 65536).decode())
        out(child=child, status=status, parent_running=t.running, parent_stopped=t.stop())
        """
    )
    child = result["child"]
    assert result["status"] == 0
    assert child["running_in_child"] is False and child["thread_in_child"] is False
    assert child["restarted"] is True
    assert child["child_trims"] >= 1
    spike_size = child["retained"] - child["base"]
    assert spike_size > 300 * MiB
    assert child["after"] - child["base"] < 0.25 * spike_size
    assert child["stopped"] is True
    assert result["parent_running"] is True and result["parent_stopped"] is True
    assert "Traceback" not in stderr, stderr


@pytest.mark.timeout(60)
def test_interpreter_exit_with_a_running_trimmer_is_clean() -> None:
    result, stderr = run_script(
        """
        import memreclaim.watchdog as wd
        wait = threading.Event()
        t = BackgroundTrimmer(interval=0.001, slack="1 MiB", min_interval=0.001)
        t.start()
        blob = b"x" * (64 * MiB)               # keeps it trimming (unproductive, backing off)
        while t.counters.ticks < 5:
            wait.wait(0.005)
        thread = t.thread
        wd._at_exit()                           # what atexit runs
        stopped = {"running": t.running, "alive": thread.is_alive()}
        t.start()                               # and now exit without stopping it at all
        while t.counters.ticks < 10:
            wait.wait(0.001)
        out(**stopped)
        """
    )
    assert result == {"running": False, "alive": False}
    assert "Traceback" not in stderr and "Fatal" not in stderr, stderr


# ---- lifecycle misuse: ends cleanly, never hangs ---------------------------------------------


def test_trimmer_rejects_an_interval_its_thread_could_not_wait() -> None:
    with pytest.raises(ValueError, match="interval must be at most"):
        BackgroundTrimmer(interval=1e10)


def test_trimmer_whose_thread_cannot_start_stops_cleanly(monkeypatch: pytest.MonkeyPatch) -> None:
    import memreclaim.watchdog as wd

    def refuse(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    trimmer = BackgroundTrimmer(interval=0.01)
    monkeypatch.setattr(threading.Thread, "start", refuse)
    with pytest.raises(RuntimeError, match="can't start new thread"):
        trimmer.start()
    monkeypatch.undo()
    assert not trimmer.running
    assert trimmer.stop(timeout=1.0) is True  # no "cannot join thread before it is started"
    wd._at_exit()  # what atexit runs: clean too
    trimmer.start()  # and it can start once threads can
    assert trimmer.running
    assert trimmer.stop(timeout=5.0) is True


def test_watchdog_whose_loop_closed_without_stop_restarts_on_a_new_loop() -> None:
    watchdog = Watchdog(interval=0.01)
    first = asyncio.new_event_loop()
    try:

        async def start_only() -> None:
            watchdog.start()
            await asyncio.sleep(0.03)

        first.run_until_complete(start_only())
    finally:
        first.close()  # closed with the watchdog's task still pending, never stopped
    assert not watchdog.running

    async def again() -> int:
        await watchdog.stop()  # nothing left to wait for: returns at once
        async with watchdog:
            while watchdog.counters.ticks < 3:
                await asyncio.sleep(0.01)
        return watchdog.counters.ticks

    assert asyncio.run(asyncio.wait_for(again(), timeout=60)) >= 3
    assert not watchdog.running


def test_two_runners_share_one_trim_lock_and_count_each_trim_once() -> None:
    import memreclaim.runners._base as wd
    from memreclaim import _accounting

    trimmer_a = BackgroundTrimmer(slack="1 MiB", min_interval=0.001)
    trimmer_b = BackgroundTrimmer(slack="1 MiB", min_interval=0.001)
    trimmer_a.tick()
    trimmer_b.tick()
    before = _accounting.totals().trims
    blob = b"x" * (16 * MiB)
    with wd._TRIM_LOCK:  # another runner is trimming: this one skips, it does not wait
        assert trimmer_a.tick(settled=True) is None
    assert trimmer_a.counters.skipped_concurrent == 1
    assert _accounting.totals().trims == before
    assert trimmer_b.tick(settled=True) is not None
    assert _accounting.totals().trims == before + 1
    assert trimmer_a.counters.trims == 0 and trimmer_b.counters.trims == 1
    del blob


@glibc_only
@pytest.mark.timeout(120)
def test_pinned_survivors_cost_few_trims_and_a_later_free_goes_back(
    run_python: Any,
) -> None:
    """Survivors pin more than slack: <= 5 unproductive trims in 200 ticks (0.02 s apart, with
    min_interval=0.02 and backoff_max=0.2: 20 times the cap); then the cache is freed and given
    back."""
    result = run_python(
        """
        import threading
        from memreclaim import BackgroundTrimmer, PacingPolicy, workloads
        policy = PacingPolicy(slack="16 MiB", min_interval=0.02, backoff_max=0.2)
        wait = threading.Event()
        with BackgroundTrimmer(interval=0.02, policy=policy) as t:
            base = memreclaim.rss()
            cache = workloads.strings(100_000)           # ~230 MiB, all live
            pinned = memreclaim.rss()
            start = t.counters.ticks
            for _ in range(3000):                        # deadline: 30 s (200 ticks: 4 s)
                if t.counters.ticks >= start + 200:
                    break
                wait.wait(0.01)
            ticks = t.counters.ticks - start
            unproductive = t.counters.unproductive_trims
            del cache                                     # now freed: RSS alone would not say
            gc.collect()
            freed_at = t.counters.ticks
            for _ in range(6000):                         # deadline: 60 s
                if memreclaim.rss() - base < 0.25 * (pinned - base):
                    break
                wait.wait(0.01)
            emit(base=base, pinned=pinned, after=memreclaim.rss(), ticks=ticks,
                 unproductive=unproductive, ticks_to_give_back=t.counters.ticks - freed_at)
        """
    )
    assert result["pinned"] - result["base"] > 150 * MiB, result
    assert result["ticks"] >= 200, result
    assert result["unproductive"] <= 5, result
    assert result["after"] - result["base"] < 0.25 * (result["pinned"] - result["base"]), result


FREED_LATER = """
import asyncio, threading
from memreclaim import BackgroundTrimmer, Watchdog

events = []
state = {"trims": 0, "since": 0}

def learnt(counters):
    # the spike trimmed, then 20 ticks without another trim: the pinned level is learnt
    if counters.trims == 0:
        return False
    if counters.trims != state["trims"]:
        state["trims"], state["since"] = counters.trims, counters.ticks
    return counters.ticks - state["since"] >= 20

def report(runner, pinned, trims_before, back_ticks):
    reason = events[-1].reason if len(events) > trims_before else None
    return dict(pinned=pinned, back=memreclaim.rss(), trims_before=trims_before,
                ticks_to_trim=back_ticks, reason=reason)
"""

FREED_LATER_THREAD = """
with BackgroundTrimmer(interval=0.1, slack="16 MiB", on_trim=events.append) as t:
    wait = threading.Event()
    survivors = workloads.spike(130_000, every=20)
    for _ in range(6000):                          # deadline: 60 s
        if learnt(t.counters):
            break
        wait.wait(0.01)
    pinned, trims_before = memreclaim.rss(), t.counters.trims
    del survivors
    gc.collect()
    freed_at, back_ticks = t.counters.ticks, None
    for _ in range(6000):                          # deadline: 60 s
        if t.counters.trims > trims_before:
            back_ticks = t.counters.ticks - freed_at
            break
        wait.wait(0.01)
    found = report(t, pinned, trims_before, back_ticks)
memreclaim.trim()
emit(reference=memreclaim.rss(), **found)
"""

FREED_LATER_LOOP = """
async def main():
    async with Watchdog(interval=0.1, slack="16 MiB", on_trim=events.append) as w:
        survivors = workloads.spike(130_000, every=20)
        for _ in range(6000):                      # deadline: 60 s
            if learnt(w.counters):
                break
            await asyncio.sleep(0.01)
        pinned, trims_before = memreclaim.rss(), w.counters.trims
        del survivors
        gc.collect()
        freed_at, back_ticks = w.counters.ticks, None
        for _ in range(6000):                      # deadline: 60 s
            if w.counters.trims > trims_before:
                back_ticks = w.counters.ticks - freed_at
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0)                     # on_trim runs on the loop: let it
        return report(w, pinned, trims_before, back_ticks)
found = asyncio.run(main())
memreclaim.trim()
emit(reference=memreclaim.rss(), **found)
"""


@glibc_only
@pytest.mark.timeout(180)
@pytest.mark.parametrize("runner", ["BackgroundTrimmer", "Watchdog"])
def test_freed_survivors_go_back_though_the_free_bytes_rise_under_slack(
    runner: str, run_python: Any
) -> None:
    """Issue 22: 1 in 20 survivors of a ~300 MiB spike (~15 MiB) pin ~44 MiB; once the runner
    learnt that level, they are freed: the free bytes rise less than the 16 MiB slack, but the
    in-use drop, sized with the pinned excess, makes the runner trim within a bounded number
    of ticks, down to near what a direct trim reaches."""
    body = FREED_LATER_THREAD if runner == "BackgroundTrimmer" else FREED_LATER_LOOP
    result = run_python(FREED_LATER + body)
    excess = result["pinned"] - result["reference"]
    assert excess > 30 * MiB, f"the survivors did not pin the expected pages: {result}"
    assert result["ticks_to_trim"] is not None, f"the freed survivors were never trimmed: {result}"
    # A tick count, not a time: the heap's figures are read once per second (10 ticks).
    assert result["ticks_to_trim"] < 40, result
    assert result["back"] - result["reference"] < 0.25 * excess, result
    assert "in use fell" in result["reason"], result


def test_a_trim_that_could_not_act_on_a_part_leaves_a_provisional_level(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The runner glue: a TrimResult with a part it could not measure (None) and a level over
    the floor by more than slack makes the level provisional, logs when it is re-tested, and
    the re-test is counted once it happens."""
    from memreclaim._core import TrimResult

    calls: list[int] = []

    def fake_trim(*, pools: bool = False) -> TrimResult:
        calls.append(1)
        now = memreclaim.rss()
        fields = (0, now, now, None, None, 0.001, "glibc", "malloc_trim(0)", 0, 0, None, None)
        return TrimResult((*fields, {"glibc": 0, "pyarrow": None}, "madvise", 0, None))

    monkeypatch.setattr(memreclaim, "trim", fake_trim)
    policy = PacingPolicy(slack="4 MiB", min_interval=0.001, retest=0.05, retest_max=0.05)
    trimmer = BackgroundTrimmer(policy=policy)
    trimmer.tick()  # takes the floor
    blob = bytearray(32 * MiB)  # touched: resident, over the floor by more than slack
    with caplog.at_level(logging.INFO, logger="memreclaim"):
        event = trimmer.tick(settled=True)
    assert event is not None and not event.productive
    assert policy.provisional == "incomplete", (policy.unexplained, policy.level, policy.floor)
    assert "level provisional, re-test in" in caplog.text
    assert policy.retest_due is not None
    for _ in range(1000):  # deadline: 10 s; the re-test is due 0.05 s after the trim
        if trimmer.counters.retest_trims:
            break
        trimmer.tick(settled=True)
        threading.Event().wait(0.01)
    assert trimmer.counters.retest_trims >= 1 and len(calls) >= 2, trimmer.counters
    del blob


PYARROW_IN_A_THREAD = """
import asyncio
import pyarrow as pa
from memreclaim import PacingPolicy, Watchdog

def work():
    arrays = [pa.array([("k%d" % (i % 1000)) * 20 for i in range(200_000)]) for _ in range(12)]
    table = pa.table({"a": pa.chunked_array(arrays)})
    counts = table.group_by("a").aggregate([("a", "count")])
    del table, arrays
    return counts

async def main():
    policy = PacingPolicy(retest=0.2, retest_max=0.5)
    async with Watchdog(interval=0.05, policy=policy) as w:
        base = memreclaim.rss()
        counts = await asyncio.to_thread(work)
        spiked = memreclaim.rss()
        for _ in range(3000):                              # deadline: 30 s
            if memreclaim.rss() - base < 0.25 * (spiked - base) or w.counters.retest_trims >= 3:
                break
            await asyncio.sleep(0.01)
        return dict(base=base, spiked=spiked, after=memreclaim.rss(), trims=w.counters.trims,
                    retests=w.counters.retest_trims, provisional=w.policy.provisional)

emit(**asyncio.run(main()))
"""


@pytest.mark.timeout(180)
def test_a_pool_the_trims_miss_is_retested_not_learnt(run_python: Any) -> None:
    """Issue 22: a pyarrow spike made in a worker thread; the Watchdog trims in a thread of its
    own. Either its trims give the pool back, or (they miss it, as trim() from a thread that
    never allocated through pyarrow did at 8f18132) the level is provisional and re-tested:
    never learnt as a floor."""
    pytest.importorskip("pyarrow")
    result = run_python(PYARROW_IN_A_THREAD)
    spike = result["spiked"] - result["base"]
    assert spike > 100 * MiB, result
    assert result["trims"] >= 1, result
    if result["after"] - result["base"] >= 0.25 * spike:
        assert result["provisional"] == "incomplete" and result["retests"] >= 3, result


REGROWTH = """
import mmap, threading, time
import memreclaim.runners._base as wd
from memreclaim import BackgroundTrimmer, PacingPolicy
from memreclaim._core import TrimResult

wd._thp_always = True  # as under transparent_hugepage/enabled=always
SIZE = 160 * 2**20
region = mmap.mmap(-1, SIZE)  # mapped once: touching it grows RSS, not the address space
real_trim = memreclaim.trim

def touch():
    for offset in range(0, SIZE, mmap.PAGESIZE):
        region[offset] = 1

def trim_that_khugepaged_undoes(*, pools=False):
    # a trim that gives the region back (as malloc_trim gives free heap pages back) ...
    before = memreclaim.rss()
    result = real_trim(pools=pools)
    region.madvise(mmap.MADV_DONTNEED)
    after = memreclaim.rss()
    fields = (before - after, before, after, None, None, result.seconds, result.allocator,
              result.method, 0, 0, None, None, {"glibc": before - after}, "always", 0, None)
    return TrimResult(fields)

memreclaim.trim = trim_that_khugepaged_undoes
events, stamps = [], []

def on_trim(event):
    events.append(event.reason)
    stamps.append(time.monotonic())
    touch()  # ... and that comes straight back with no allocation (khugepaged re-collapsing)

policy = PacingPolicy(slack="16 MiB", min_interval=0.05, retest=0.4, retest_max=100.0,
                      settle_window=0.05)
with BackgroundTrimmer(interval=0.05, policy=policy, on_trim=on_trim) as t:
    touch()
    wait = threading.Event()
    for _ in range(3000):                                  # deadline: 30 s
        if len(stamps) >= 4:
            break
        wait.wait(0.01)
    emit(reasons=events, gaps=[b - a for a, b in zip(stamps, stamps[1:])],
         ticks=t.counters.ticks, retests=t.counters.retest_trims)
"""


@glibc_only
@pytest.mark.timeout(120)
def test_memory_that_comes_back_by_itself_is_retested_at_growing_spacing(run_python: Any) -> None:
    """THP=always, simulated: every trim gives a region back and it is faulted back in at once
    with no allocation. The runner does not trim it again at every min_interval (0.05 s): it
    re-tests the regrown level after `retest` (0.4 s), then twice as long each time. The gaps
    are lower bounds set by the policy: a loaded machine only lengthens them."""
    result = run_python(REGROWTH)
    assert len(result["gaps"]) >= 3, result
    assert all(
        reason.startswith("re-test of the regrowth level") for reason in result["reasons"][1:]
    )
    for k, gap in enumerate(result["gaps"]):  # 0.4, 0.8, 1.6 s at least
        assert gap >= 0.4 * 2**k * 0.95, result
    assert result["retests"] == len(result["gaps"]), result
