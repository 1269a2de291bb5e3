"""The Watchdog's idle check reads no private state of the event loop (asyncio's ``loop._ready``
before): a sample is busy when its wake-up was late or one yield to the loop took long."""

from __future__ import annotations

import asyncio
import time

from memreclaim import Watchdog


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_short_chunks_between_yields_are_busy_and_a_quiet_loop_is_not() -> None:
    """Chunks of 2 ms (under busy_lag, 5 ms: lateness alone may miss them) fill the pass that the
    sampler's yield waits for (>= 2 ms > busy_lag / 5); a loop with nothing queued is idle on at
    least one of many samples (load only makes samples busier, so the quiet one is asked for once
    among 200)."""

    async def main() -> tuple[list[bool], list[bool]]:
        watchdog = Watchdog(interval=1.0, limit=None)
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()

        async def chunks() -> None:
            while not stop.is_set():
                _spin(0.002)
                await asyncio.sleep(0)

        busy_task = asyncio.create_task(chunks())
        await asyncio.sleep(0)
        busy = [await watchdog._sample_is_busy(loop) for _ in range(5)]
        stop.set()
        await busy_task
        quiet = [await watchdog._sample_is_busy(loop) for _ in range(200)]
        return busy, quiet

    busy, quiet = asyncio.run(asyncio.wait_for(main(), timeout=60))
    assert all(busy), busy
    assert not all(quiet), "a loop with nothing queued never sampled idle"
