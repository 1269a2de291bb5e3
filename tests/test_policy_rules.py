"""Each rule of memreclaim.policy on its own, driven by synthetic series (no clock, no I/O),
and the composition's one-release shim for the old call forms of decide/record_trim."""

from __future__ import annotations

import ast
import logging
from dataclasses import replace
from pathlib import Path

import pytest

import memreclaim.policy
from memreclaim.policy import PacingPolicy, Reading, TrimOutcome
from memreclaim.policy._backoff import Backoff, Retest
from memreclaim.policy._budget import CpuBudget
from memreclaim.policy._growth import GrowthTrigger, LearntLevel
from memreclaim.policy._limit import NEAR_LIMIT_HOLD, LimitStage
from memreclaim.policy._settle import Settle

MiB = 1 << 20
RULES = ("_limit", "_growth", "_backoff", "_budget", "_settle", "_reading")
# The installed package's sources (the tree's src/, or a wheel's site-packages in the matrix).
POLICY = Path(memreclaim.policy.__file__).resolve().parent


def test_settle_waits_for_a_flat_window() -> None:
    settle = Settle(window=1.0)
    settle.start(0.0, 100 * MiB)
    series = [(0.25 * i, (100 + 10 * i) * MiB) for i in range(1, 5)]  # a burst, 10 MiB a tick
    busy = [settle.busy(r, settle.observe(r), 5 * MiB) for r in (Reading(t, v) for t, v in series)]
    assert busy == [True] * 4
    flat = [Reading(1.0 + 0.25 * i, 140 * MiB) for i in range(1, 6)]
    busy = [settle.busy(r, settle.observe(r), 5 * MiB) for r in flat]
    assert busy == [True, True, True, False, False]  # the window holds a rise for 1 s
    rising = Reading(3.0, 200 * MiB, in_flight=0)
    assert not settle.busy(rising, settle.observe(rising), 5 * MiB)  # no request in flight
    rising = Reading(3.1, 260 * MiB, settled=True)
    assert not settle.busy(rising, settle.observe(rising), 5 * MiB)  # the work is over


def test_budget_pays_back_at_its_fraction() -> None:
    budget = CpuBudget(fraction=0.01, window=300.0)
    budget.start(0.0)
    assert budget.credit(0.0) == pytest.approx(3.0)
    budget.charge(0.0, 5.0)  # an expensive trim: 2 s in debt
    assert budget.credit(100.0) == pytest.approx(-1.0)
    assert budget.credit(200.0) == pytest.approx(0.0)
    assert budget.credit(10_000.0) == pytest.approx(3.0)  # the credit is capped


def test_backoff_starts_at_the_second_unproductive_trim() -> None:
    backoff = Backoff(min_interval=1.0, backoff_max=5.0)
    waits = []
    for n in range(6):
        backoff.record(float(n), productive=False)
        waits.append(backoff.wait)
    assert waits == [1.0, 2.0, 4.0, 5.0, 5.0, 5.0]
    assert not backoff.waited(5.0 + 4.9, backoff.wait) and backoff.waited(10.0, backoff.wait)
    backoff.record(11.0, productive=True)
    assert backoff.wait == 1.0
    with pytest.raises(ValueError, match="backoff_max"):
        Backoff(min_interval=2.0, backoff_max=1.0)


def test_retest_spacing_doubles_and_starts_over() -> None:
    retest = Retest(retest=8.0, retest_max=40.0, min_interval=1.0, cpu_budget=0.01)
    dues = []
    now = 0.0
    for _ in range(5):  # re-tests that find the level again
        retest.trimmed(0.01, after_a_trim=True)
        retest.judge(now, incomplete=True, productive=False)
        assert retest.state.provisional == "incomplete"
        dues.append(retest.state.due - now)  # type: ignore[operator]
        now = retest.state.due  # type: ignore[assignment]
        assert retest.is_due(now) and not retest.is_due(now - 0.1)
        retest.state.retesting = True
    assert dues == [8.0, 16.0, 32.0, 40.0, 40.0]
    retest.judge(now, incomplete=True, productive=True)  # a re-test that gave memory back
    assert retest.state.due == now + 8.0
    retest.trimmed(2.0, after_a_trim=True)  # a trim of 2 s: 200 s at a 1 % budget
    assert retest.spacing(1) == 40.0  # capped by retest_max
    retest.judge(now, incomplete=False, productive=True)
    assert retest.state.provisional is None and retest.state.due is None
    with pytest.raises(ValueError, match="run"):
        retest.spacing(0)


def test_retest_counts_a_trim_undone_by_regrowth_once() -> None:
    retest = Retest(retest=1.0, retest_max=100.0, min_interval=0.5, cpu_budget=1.0)
    retest.undone(10.0)
    retest.undone(10.0)  # the same trim, seen again: not counted twice
    assert retest.state.undone_run == 1 and retest.state.due == 11.0
    retest.trimmed(0.0, after_a_trim=True)
    retest.undone(20.0)  # the next trim undone too: the spacing doubles
    assert retest.state.undone_run == 2 and retest.state.due == 22.0
    retest.trimmed(0.0, after_a_trim=True)
    retest.trimmed(0.0, after_a_trim=True)  # a trim whose release held: the run starts over
    assert retest.state.undone_run == 0


def test_learnt_level_follows_rss_down_and_learns_after_a_trim() -> None:
    level = LearntLevel(slack=None, use_traced=True)
    with pytest.raises(RuntimeError, match="reset"):
        level.require()
    level.start(60 * MiB, traced=10 * MiB)
    assert level.slack == 8 * MiB  # max(8 MiB, level / 8)
    assert level.observe(Reading(1.0, 110 * MiB, traced=30 * MiB)) == 60 * MiB
    assert level.growth(110 * MiB, 30 * MiB) == 30 * MiB  # 20 MiB of it traced: live
    assert level.observe(Reading(2.0, 50 * MiB, traced=5 * MiB)) == 50 * MiB
    assert level.state.floor == 50 * MiB and level.traced_fall(1 * MiB) == 4 * MiB
    level.learn(TrimOutcome(3.0, growth=0, released=0, rss_after=1024 * MiB))
    assert level.slack == 128 * MiB and level.state.floor == 50 * MiB


def test_growth_trigger_sees_frees_that_rss_cannot_show() -> None:
    level = LearntLevel(slack=10 * MiB, use_traced=True)
    level.start(100 * MiB, traced=None)
    trigger = GrowthTrigger(release_fraction=0.25)
    trigger.start(100 * MiB, in_use=60 * MiB)  # baseline 40 MiB
    assert trigger.reason(Reading(1.0, 105 * MiB), level, 10 * MiB) is None
    assert "growth" in str(trigger.reason(Reading(1.0, 115 * MiB), level, 10 * MiB))
    after = TrimOutcome(
        2.0, growth=0, released=0, rss_after=100 * MiB, free=5 * MiB, in_use=40 * MiB
    )
    level.learn(after)
    trigger.learn(after)
    assert trigger.state.excess == 20 * MiB  # 100 - 40 in use - 40 baseline
    freed = Reading(3.0, 100 * MiB, free=16 * MiB)
    trigger.observe(freed)
    assert trigger.freed(freed) == 11 * MiB
    assert "freed" in str(trigger.reason(freed, level, 10 * MiB))
    # 8 MiB of in-use bytes gone: with the pinned excess pro rata, 12 MiB returnable
    assert trigger.unpinned(32 * MiB) == 12 * MiB
    assert "in use fell" in str(
        trigger.reason(Reading(4.0, 100 * MiB, in_use=32 * MiB), level, 10 * MiB)
    )


def test_frees_while_a_trim_runs_still_trigger_the_next() -> None:
    """A Dask worker's trace (issue 31's flake): the results were dropped (in use 39 -> 14 MiB)
    while the trim ran; its figures after already counted them free, so neither the free
    bytes nor the in-use bytes rose or fell after it, and 41 MiB the trim had passed stayed
    resident for good. The drop counts from the in-use bytes when the trim started."""
    policy = PacingPolicy(slack="16 MiB", limit=None)
    policy.reset(0.0, 66 * MiB, in_use=13 * MiB)  # baseline 53 MiB
    decided = Reading(8.6, 210 * MiB, free=565 * MiB, in_use=39 * MiB, mapped=605 * MiB)
    policy.decide(decided)
    after = TrimOutcome(
        8.7,
        growth=0,
        released=74 * MiB,
        rss_after=136 * MiB,
        free=590 * MiB,
        in_use=14 * MiB,
        mapped=605 * MiB,
    )
    policy.record_trim(replace(after, in_use_before=39 * MiB))
    assert policy.excess == 69 * MiB  # 136 - 14 in use - 53 baseline
    later = Reading(9.7, 136 * MiB, free=590 * MiB, in_use=14 * MiB, mapped=605 * MiB)
    assert policy.wants_free(9.7, later.rss)
    assert policy.decide(later) == "trim"
    assert "in use fell 25.0 MiB" in policy.reason
    # a trim whose in-use bytes did not fall while it ran leaves no such drop
    policy.record_trim(replace(after, now=9.8, released=41 * MiB, rss_after=95 * MiB))
    steady = Reading(11.0, 95 * MiB, free=590 * MiB, in_use=14 * MiB, mapped=605 * MiB)
    assert policy.decide(steady) == "below-slack"


def test_growth_trigger_tells_regrowth_from_allocation() -> None:
    trigger = GrowthTrigger(release_fraction=0.25)
    trigger.start(200 * MiB, in_use=100 * MiB)
    trigger.learn(
        TrimOutcome(
            1.0,
            growth=0,
            released=50 * MiB,
            rss_after=150 * MiB,
            in_use=100 * MiB,
            vsize=1000 * MiB,
        )
    )
    assert trigger.may_have_regrown(40 * MiB, 8 * MiB)
    assert not trigger.may_have_regrown(70 * MiB, 8 * MiB)  # more than the trim released
    back = Reading(2.0, 190 * MiB, in_use=101 * MiB, vsize=1000 * MiB)
    assert trigger.allocation_explains(back, 40 * MiB) is False  # came back by itself
    grown = Reading(2.0, 190 * MiB, in_use=130 * MiB, vsize=1000 * MiB)
    assert trigger.allocation_explains(grown, 40 * MiB) is True
    assert trigger.allocation_explains(Reading(2.0, 190 * MiB), 40 * MiB) is None


def test_limit_stage_far_near_urgent(caplog: pytest.LogCaptureFixture) -> None:
    stage = LimitStage(limit=1000 * MiB, fraction=0.9, min_release=1 * MiB, min_interval=1.0)
    assert stage.mark == 900 * MiB
    assert not stage.approaching(400 * MiB, 300 * MiB)  # far
    assert stage.approaching(700 * MiB, 300 * MiB)  # nearer the mark than the level
    assert stage.decide(Reading(1.0, 700 * MiB), 300 * MiB, 0, False, True) is None
    at = Reading(2.0, 950 * MiB)
    stage.observe(at, 300 * MiB)
    assert stage.state.urgent
    assert stage.decide(at, 300 * MiB, 0, True, True) == ("rising", "")
    assert stage.decide(at, 300 * MiB, 0, False, False) == ("min-interval", "")
    assert stage.decide(at, 300 * MiB, 0, False, True)[0] == "trim"  # type: ignore[index]
    freed = stage.decide(at, 300 * MiB, 2 * MiB, True, False)  # freed: at once, busy or not
    assert freed is not None and freed[0] == "trim" and "freed" in freed[1]
    stage.record(TrimOutcome(3.0, growth=0, released=0, rss_after=400 * MiB))
    assert not stage.state.urgent and stage.held(3.0 + NEAR_LIMIT_HOLD - 0.01)
    assert not stage.held(3.0 + NEAR_LIMIT_HOLD) and not stage.held(None)
    with caplog.at_level(logging.WARNING, logger="memreclaim"):
        for _ in range(3):
            assert stage.decide(Reading(4.0, 950 * MiB), 920 * MiB, 0, False, True) is None
    assert len([r for r in caplog.records if "live memory" in r.getMessage()]) == 1
    assert LimitStage(None, 0.9, 0, 1.0).decide(at, 0, 10 * MiB, False, True) is None


def test_readings_and_outcomes_are_checked_when_made() -> None:
    for bad, error in ((dict(in_flight="many"), TypeError), (dict(mapped=-1), ValueError)):
        with pytest.raises(error):
            Reading(1.0, 100, **bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="settled"):
        Reading(1.0, 100, settled=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="seconds"):
        TrimOutcome(1.0, growth=0, released=0, rss_after=0, seconds=-1.0)
    with pytest.raises(ValueError, match="in_use_before"):
        TrimOutcome(1.0, growth=0, released=0, rss_after=0, in_use_before=-1)
    with pytest.raises(TypeError, match="unreached"):
        TrimOutcome(1.0, growth=0, released=0, rss_after=0, unreached=1)  # type: ignore[arg-type]


def test_the_old_call_forms_warn_for_one_release_and_decide_the_same() -> None:
    new, old = PacingPolicy(slack="10 MiB", limit=None), PacingPolicy(slack="10 MiB", limit=None)
    for policy in (new, old):
        policy.reset(0.0, 100 * MiB)
    assert new.decide(Reading(2.0, 130 * MiB, settled=True)) == "trim"
    with pytest.warns(DeprecationWarning, match=r"decide\(now, \.\.\.\).*Reading"):
        assert old.decide(2.0, 130 * MiB, settled=True) == "trim"
    outcome = dict(growth=30 * MiB, released=30 * MiB, rss_after=100 * MiB)
    assert new.record_trim(TrimOutcome(2.5, **outcome))  # type: ignore[arg-type]
    with pytest.warns(DeprecationWarning, match="record_trim.*TrimOutcome"):
        assert old.record_trim(2.5, **outcome)
    assert (new.level, new.last_trim, new.wait) == (old.level, old.last_trim, old.wait)
    with pytest.raises(TypeError, match="alone"):
        new.decide(Reading(3.0, 100 * MiB), 5)


def test_no_rule_reads_a_file_or_the_clock() -> None:
    """The rules import nothing that reads the world: no os, time, io, memlimits, no open()."""
    forbidden = {"os", "io", "time", "pathlib", "threading", "memlimits", "_core"}
    for rule in RULES:
        tree = ast.parse((POLICY / f"{rule}.py").read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                names = {(node.module or "").split(".")[-1], *(a.name for a in node.names)}
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                names = {node.func.id} & {"open"}
                assert not names, f"policy/{rule}.py calls open()"
                continue
            else:
                continue
            assert not names & forbidden, f"policy/{rule}.py imports {names & forbidden}"
