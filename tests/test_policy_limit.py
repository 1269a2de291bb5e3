"""limit=None means no limit everywhere; "auto" (the default of the runners and of PacingPolicy)
is resolved by memlimits.auto_limit, once, outside the policy's rules; one unproductive floor."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from memreclaim import BackgroundTrimmer, PacingPolicy, Watchdog, memlimits
from memreclaim._accounting import UNPRODUCTIVE_BELOW

MiB = 1 << 20


def _fake(**fields: object) -> Callable[..., memlimits.Limits]:
    return lambda refresh=False: memlimits.Limits(**fields)  # type: ignore[arg-type]


@pytest.fixture
def cgroup_limited(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memlimits, "limits", _fake(source="cgroup2", limit=512 * MiB, high=None))


def test_runners_default_to_auto_and_none_is_no_limit(cgroup_limited: None) -> None:
    for runner in (Watchdog, BackgroundTrimmer):
        assert runner().policy.limit == 512 * MiB, runner
        assert runner(limit="auto").policy.limit == 512 * MiB, runner
        assert runner(limit=None).policy.limit is None, runner  # was "auto" for the runners
        assert runner(limit="100 MiB").policy.limit == 100 * MiB, runner
    assert PacingPolicy().limit == 512 * MiB
    assert PacingPolicy(limit=None).limit is None


def test_a_limit_with_a_policy_is_ambiguous(cgroup_limited: None) -> None:
    policy = PacingPolicy(limit=None)
    assert Watchdog(policy=policy).policy is policy  # limit left at "auto": the policy's own
    for limit in (None, "64 MiB"):
        with pytest.raises(TypeError, match="pass either policy= or limit="):
            BackgroundTrimmer(policy=policy, limit=limit)


def test_auto_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    cases = [
        (dict(source="cgroup1", limit=512 * MiB, high=384 * MiB), 384 * MiB),
        (dict(source="cgroup2", limit=None, high=300 * MiB), 300 * MiB),
        (dict(source="rlimit_as", limit=1 << 40, high=None), None),  # address space: not RSS
        (dict(source="rlimit_data", limit=1 << 40, high=200 * MiB), 200 * MiB),
        (dict(source="none", limit=None, high=None), None),
    ]
    for fields, expected in cases:
        monkeypatch.setattr(memlimits, "limits", _fake(**fields))
        assert memlimits.auto_limit() == expected, fields
    monkeypatch.undo()
    with pytest.raises(TypeError, match="refresh"):
        memlimits.auto_limit(refresh="yes")  # type: ignore[arg-type]


def test_bad_limits_are_refused_by_name() -> None:
    for bad, error in (("lots", ValueError), (-1, ValueError), (object(), TypeError)):
        with pytest.raises(error, match="limit"):
            Watchdog(limit=bad)  # type: ignore[arg-type]
        with pytest.raises(error, match="limit"):
            PacingPolicy(limit=bad)  # type: ignore[arg-type]


def test_one_unproductive_floor() -> None:
    policy = PacingPolicy(limit=None)
    assert policy.min_release == UNPRODUCTIVE_BELOW
    assert not policy.productive(UNPRODUCTIVE_BELOW - 1, growth=0)
    assert policy.productive(UNPRODUCTIVE_BELOW, growth=0)
