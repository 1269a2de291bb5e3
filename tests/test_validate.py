"""The shared argument checks (memreclaim._validate) and the workload builders' failure modes."""

from __future__ import annotations

import math

import pytest

from memreclaim import _validate, workloads
from memreclaim.units import parse_bytes


@pytest.mark.parametrize(
    ("value", "kwargs", "error"),
    [
        (True, {}, TypeError),
        ("1", {}, TypeError),
        (math.inf, {}, ValueError),
        (math.nan, {}, ValueError),
        (-1, {}, ValueError),
        (0, {}, ValueError),
        (11, {"maximum": 10}, ValueError),
    ],
)
def test_seconds_rejects(value: object, kwargs: dict[str, float], error: type[Exception]) -> None:
    with pytest.raises(error, match="interval"):
        _validate.seconds("interval", value, **kwargs)  # type: ignore[arg-type]


def test_seconds_accepts() -> None:
    assert _validate.seconds("t", 0, allow_zero=True) == 0.0
    assert _validate.seconds("t", 2) == 2.0
    assert isinstance(_validate.seconds("t", 2), float)


def test_size() -> None:
    assert _validate.size("slack", "2 MiB") == 2 * 2**20
    assert _validate.size("slack", 0, allow_zero=True) == 0
    with pytest.raises(ValueError, match="slack must be > 0"):
        _validate.size("slack", 0)
    with pytest.raises(TypeError, match="slack"):
        _validate.size("slack", 1.5)
    with pytest.raises(ValueError, match="slack"):
        _validate.size("slack", "3 parsecs")


def test_integer() -> None:
    assert _validate.integer("n", 3.0) == 3
    assert _validate.integer("n", 5, minimum=5, maximum=5) == 5
    with pytest.raises(ValueError, match="whole number"):
        _validate.integer("n", 2.5)
    with pytest.raises(TypeError, match="n must be an int"):
        _validate.integer("n", False)
    with pytest.raises(ValueError, match=">= 1"):
        _validate.integer("n", 0, minimum=1)
    with pytest.raises(ValueError, match="<= 4"):
        _validate.integer("n", 5, maximum=4)


def test_fraction_flag_callback_instance() -> None:
    assert _validate.fraction("f", 1) == 1.0
    with pytest.raises(ValueError, match="between"):
        _validate.fraction("f", 1.5)
    with pytest.raises(ValueError, match="exclusive"):
        _validate.fraction("f", 0, allow_zero=False)
    with pytest.raises(TypeError):
        _validate.fraction("f", None)
    assert _validate.flag("b", True) is True
    with pytest.raises(TypeError, match="b must be a bool"):
        _validate.flag("b", 1)
    assert _validate.callback("cb", None) is None
    assert _validate.callback("cb", print) is print
    with pytest.raises(TypeError, match="cb must be a callable"):
        _validate.callback("cb", 3)
    assert _validate.instance("x", 3, int) == 3
    with pytest.raises(TypeError, match="x must be a str or bytes, not int"):
        _validate.instance("x", 3, (str, bytes))


def test_workloads_shapes_and_errors() -> None:
    data = workloads.strings(100, seed=1)
    assert len(data) == 100
    assert all(600 <= len(text) <= 4000 for text, _ in data)
    assert data == workloads.strings(100, seed=1)  # deterministic
    assert len(workloads.keep_every(data, 50)) == 2
    assert workloads.keep_every(data, 0) == []
    assert workloads.spike(100, every=50) == workloads.keep_every(workloads.strings(100), 50)
    assert workloads.spike(100, every=0) == []
    assert len(workloads.dicts(10)) == 10
    rounds: list[int] = []
    survivors = workloads.buffers(2, per_round=1, after_round=rounds.append)
    assert rounds == [0, 1]
    assert len(survivors) == 2
    with pytest.raises(ValueError):
        workloads.strings(-1)
    with pytest.raises(ValueError):
        workloads.strings(1, smallest=10, largest=5)
    with pytest.raises(TypeError):
        workloads.buffers(1, after_round=3)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        workloads.keep_every(data, "2")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        workloads.spike(10, every=-1)


def test_integer_default_minimum_is_zero() -> None:
    assert _validate.integer("n", 0) == 0
    with pytest.raises(ValueError, match=">= 0, got -1"):
        _validate.integer("n", -1)


@pytest.mark.parametrize(
    ("text", "nbytes"),
    [
        ("1 KiB", 1024),
        ("1kb", 1000),
        ("1 MB", 1_000_000),
        ("1 MiB", 1 << 20),
        ("1.5 MiB", 3 << 19),
        ("2g", 2_000_000_000),
        (" 7 ", 7),
        (0, 0),
    ],
)
def test_parse_bytes_units(text: str | int, nbytes: int) -> None:
    assert parse_bytes(text) == nbytes


@pytest.mark.parametrize(
    ("value", "error"),
    [
        (-1, ValueError),
        ("-1", ValueError),
        ("1 XB", ValueError),
        (True, TypeError),
        (1.0, TypeError),
    ],
)
def test_parse_bytes_rejects(value: object, error: type[Exception]) -> None:
    with pytest.raises(error):
        parse_bytes(value)  # type: ignore[arg-type]
