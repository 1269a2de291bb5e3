"""The process totals are counted by the C core's trim itself (issue 23): a `_core.trim` call made
outside the public wrapper is counted too, a forked child starts from zero (also while another
thread is counting), and bad input to the counting entry point changes nothing."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest

import memreclaim
from memreclaim import _accounting, _core

MiB = 1 << 20


def test_totals_is_a_struct_sequence_with_the_accounting_fields() -> None:
    totals = memreclaim.totals()
    assert isinstance(totals, _core.TrimTotals)
    assert "TrimTotals" not in memreclaim.__all__  # the type of totals(), not a top-level name
    assert _core.TrimTotals.n_fields == 5  # type: ignore[attr-defined]
    assert isinstance(totals.trims, int) and isinstance(totals.unproductive, int)
    assert isinstance(totals.released_bytes, int) and isinstance(totals.seconds, float)
    assert len(totals.seconds_buckets) == len(_core.SECONDS_BUCKETS) + 1
    assert sum(totals.seconds_buckets) == totals.trims
    assert totals.unproductive <= totals.trims
    # One definition: the shim's constants are the C core's.
    assert _accounting.SECONDS_BUCKETS is _core.SECONDS_BUCKETS
    assert _accounting.UNPRODUCTIVE_BELOW == _core.UNPRODUCTIVE_BELOW == MiB
    assert list(_core.SECONDS_BUCKETS) == sorted(_core.SECONDS_BUCKETS)
    with pytest.raises(TypeError):
        memreclaim.totals(1)  # type: ignore[call-arg]


def test_a_direct_core_trim_is_counted_once(run_python: Callable[..., dict[str, Any]]) -> None:
    # In a fresh interpreter: no runner of another test trims in between.
    out = run_python(
        """
        from memreclaim import _accounting, _core
        t0 = memreclaim.totals()
        direct = _core.trim()                      # not through memreclaim.trim()
        t1 = memreclaim.totals()
        public = memreclaim.trim()
        t2 = memreclaim.totals()
        shim = _accounting.totals()
        def delta(a, b):
            return [b.trims - a.trims, b.unproductive - a.unproductive,
                    b.released_bytes - a.released_bytes, b.seconds - a.seconds,
                    [y - x for x, y in zip(a.seconds_buckets, b.seconds_buckets)]]
        emit(direct=delta(t0, t1), public=delta(t1, t2),
             released=[direct.released, public.released], seconds=[direct.seconds, public.seconds],
             shim=[shim.trims, shim.released_bytes, list(shim.seconds_buckets)],
             now=[t2.trims, t2.released_bytes, list(t2.seconds_buckets)])
        """
    )
    for key, index in (("direct", 0), ("public", 1)):
        trims, unproductive, released, seconds, buckets = out[key]
        result_released = out["released"][index]
        assert trims == 1, out
        assert unproductive == int(result_released is None or result_released < MiB), out
        assert released == (result_released or 0), out
        assert seconds == pytest.approx(out["seconds"][index]), out
        assert sum(buckets) == 1 and min(buckets) == 0, out
        slot = next(
            (i for i, b in enumerate(_core.SECONDS_BUCKETS) if out["seconds"][index] <= b),
            len(_core.SECONDS_BUCKETS),
        )
        assert buckets[slot] == 1, out
    assert out["shim"] == out["now"], out  # the shim reads the same account


def test_a_forked_child_starts_from_zero_while_another_thread_counts(
    run_python: Callable[..., dict[str, Any]],
) -> None:
    """The totals' lock is taken around fork: a child forked while another thread is counting
    neither hangs on it nor inherits its parent's trims."""
    out = run_python(
        """
        import threading, time
        from memreclaim import _core
        memreclaim.trim()
        stop = threading.Event()
        def count():
            while not stop.is_set():
                _core._record_trim(0, 0.0)
        worker = threading.Thread(target=count)
        worker.start()
        children, hung, bad = 0, 0, 0
        deadline = time.monotonic() + 60
        for _ in range(30):
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:
                first = _core.totals().trims
                _core._record_trim(5 << 20, 0.002)
                t = _core.totals()
                os.write(w, json.dumps([first, t.trims, t.unproductive, t.released_bytes]).encode())
                os._exit(0)
            os.close(w)
            child_deadline = min(deadline, time.monotonic() + 20)
            while os.waitpid(pid, os.WNOHANG) == (0, 0):
                if time.monotonic() > child_deadline:
                    os.kill(pid, 9)
                    os.waitpid(pid, 0)
                    hung += 1
                    break
                time.sleep(0.01)
            else:
                got = os.read(r, 200)
                children += 1
                if not got or json.loads(got) != [0, 1, 0, 5 << 20]:
                    bad += 1
            os.close(r)
        stop.set()
        worker.join(timeout=30)
        emit(children=children, hung=hung, bad=bad, parent=memreclaim.totals().trims)
        """,
        timeout=300,
    )
    assert out["hung"] == 0 and out["bad"] == 0, out
    assert out["children"] == 30, out
    assert out["parent"] >= 2, out  # the parent's own account went on


BAD_RECORDS = [
    (("1", 0.0), TypeError, "released must be an int"),
    ((True, 0.0), TypeError, "released must be an int"),
    ((1.5, 0.0), TypeError, "released must be an int"),
    ((-1, 0.0), ValueError, "released must be between 0"),
    ((2**70, 0.0), OverflowError, "released must be between 0"),
    ((0, "0.1"), TypeError, "seconds must be a float"),
    ((0, None), TypeError, "seconds must be a float"),
    ((0, False), TypeError, "seconds must be a float"),
    ((0, -0.5), ValueError, "not negative"),
    ((0, math.nan), ValueError, "finite"),
    ((0, math.inf), ValueError, "finite"),
    ((0,), TypeError, "takes 2 arguments"),
    ((0, 0.0, 0), TypeError, "takes 2 arguments"),
]


@pytest.mark.parametrize(("args", "error", "match"), BAD_RECORDS)
def test_record_trim_failure_modes(
    args: tuple[Any, ...], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        _core._record_trim(*args)
    if len(args) == 2:
        with pytest.raises(error, match=match):
            _accounting.record(*args)


def test_a_refused_record_changes_nothing(run_python: Callable[..., dict[str, Any]]) -> None:
    out = run_python(
        """
        import math
        from memreclaim import _core
        bad = [("1", 0.0), (True, 0.0), (1.5, 0.0), (-1, 0.0), (2**70, 0.0), (0, "0.1"),
               (0, None), (0, -0.5), (0, math.nan), (0, math.inf), (0,), (0, 0.0, 0)]
        before = _core.totals()
        refused = 0
        for args in bad:
            try:
                _core._record_trim(*args)
            except (TypeError, ValueError, OverflowError):
                refused += 1
        emit(refused=refused, same=_core.totals() == before, trims=before.trims)
        """
    )
    assert out == {"refused": 12, "same": True, "trims": 0}, out


def test_record_counts_unknown_and_small_releases_as_unproductive(
    run_python: Callable[..., dict[str, Any]],
) -> None:
    out = run_python(
        """
        from memreclaim import _core
        t0 = _core.totals()
        _core._record_trim(None, 0.0)
        _core._record_trim((1 << 20) - 1, 2.5)     # last bound, inclusive
        _core._record_trim(1 << 20, 2.6)            # productive, overflow bucket
        _core._record_trim(7, 1)                    # an int number of seconds is a number
        t1 = _core.totals()
        emit(d=[t1.trims - t0.trims, t1.unproductive - t0.unproductive,
                t1.released_bytes - t0.released_bytes, t1.seconds - t0.seconds,
                [b - a for a, b in zip(t0.seconds_buckets, t1.seconds_buckets)]])
        """
    )
    trims, unproductive, released, seconds, buckets = out["d"]
    assert (trims, unproductive, released) == (4, 3, (1 << 20) - 1 + (1 << 20) + 7), out
    assert seconds == pytest.approx(6.1), out
    assert buckets[0] == 1 and buckets[-2] == 1 and buckets[-1] == 1, out
    assert buckets[_core.SECONDS_BUCKETS.index(1.0)] == 1, out
