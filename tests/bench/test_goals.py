"""Unit tests of the goals over the peers: which peer is the best, pronk's ratio to it round by round, the rows that
name it, and a goal cut to what the compute-only limit allows over it, with the record saying so."""

from __future__ import annotations

import math

import pytest

from bench.harness.figures import (
    BASELINE,
    BATCH,
    CACHE_AWARE,
    COMPUTE_LIMIT,
    FULL,
    HARNESS,
    STICKY,
    AgentRun,
    CheckedRound,
    CheckedRun,
    best_peer,
    checked_table,
    rounds_table,
)
from bench.harness.goals import BEST_PEER, PEER_CAP_SHARE, checked_goals, goals, peer_goal
from bench.harness.report import goals_table, setups_table
from pronk.agents.step_records import ToolCallCounts
from pronk.batches.schemas import CheckCounts


def _run(name: str, rate: float) -> AgentRun:
    """10 traces, one every 1/rate s: `rate` traces a second, steady and over its whole wall time."""
    return AgentRun(name, 10 / rate, 2, 10, 40, 1000, 800, 100, [1.0], finished_s=[t / rate for t in range(1, 11)])


def _round(pronk: float, cache_aware: float, sticky: float, compute: float | None = None) -> dict[str, AgentRun]:
    runs = {
        BASELINE: _run(BASELINE, 1.0),
        CACHE_AWARE: _run(CACHE_AWARE, cache_aware),
        STICKY: _run(STICKY, sticky),
        BATCH: _run(BATCH, pronk),
        FULL: _run(FULL, pronk),
    }
    if compute is not None:
        runs[COMPUTE_LIMIT] = AgentRun(COMPUTE_LIMIT, 10 / compute, 2, 10, 40, 1000, 1000, 100, [])
    return runs


def test_the_best_peer_is_the_one_with_the_highest_median():
    assert best_peer({CACHE_AWARE: [1.0, 3.0, 1.1], STICKY: [1.5, 1.4, 1.6], BATCH: [9.0] * 3}) == STICKY
    assert best_peer({CACHE_AWARE: [math.nan, 2.0], STICKY: [1.0, 1.0]}) == CACHE_AWARE  # a NaN round left out
    assert best_peer({BASELINE: [1.0], BATCH: [2.0]}) is None  # no peer ran


def test_pronk_is_set_against_the_best_peer_round_by_round():
    rounds = [_round(2.0, 1.0, 1.6), _round(3.0, 1.2, 1.5), _round(2.4, 2.0, 1.2)]  # sticky's median is higher
    table = rounds_table(rounds, [0.9] * 3)
    assert [round(v, 6) for v in table[BATCH]["over_best_peer"]["rounds"]] == [1.25, 2.0, 2.0]
    assert "over_best_peer" not in table[STICKY] and "over_best_peer" not in table[CACHE_AWARE]
    assert table[STICKY]["over_baseline"]["median"] == 1.5  # a peer's own gain over round-robin
    assert "| / best peer |" in setups_table(table)
    rows = [g for g in goals(rounds, [0.9] * 3, "agent-long") if g["figure"].startswith("traces/s, pronk / best")]
    assert [(g["setup"], g["against"], g["goal"], g["median"], g["met"]) for g in rows] == [
        (BATCH, STICKY, 1.5, 2.0, True),
        (FULL, STICKY, 1.5, 2.0, True),
    ]
    assert all(g["reachable"] is None and g["capped"] is None for g in rows)  # no compute-only limit in the record


def test_a_goal_over_the_peer_never_asks_more_than_the_compute_only_limit_makes_over_it():
    assert peer_goal(1.5, {"median": 2.0}) == (1.5, None)
    assert peer_goal(1.5, None) == (1.5, None)
    goal, why = peer_goal(1.5, {"median": 1.3})
    assert goal == pytest.approx(PEER_CAP_SHARE * 1.3) and "1.30x" in why and "capped from 1.5" in why

    rounds = [_round(1.0, 1.0, 0.9, compute=c) for c in (1.0, 1.1, 1.2)]  # the limit makes 1.0-1.2x the best peer
    (row,) = [g for g in goals(rounds, [0.9] * 3, "cpu") if g["setup"] == BATCH and g["against"] == CACHE_AWARE]
    assert row["reachable"]["median"] == 1.1 and row["goal"] == pytest.approx(1.045) and row["capped"]
    assert row["median"] == 1.0 and row["met"] is False  # 1.0x < 0.95 x 1.1x, not the 1.2x the issue asks
    assert "≥ 1.045 (capped from 1.2: the compute-only limit makes only 1.10x" in goals_table([row])


def test_a_goal_within_the_limit_stays_as_the_issue_asks():
    rounds = [_round(3.0, 1.0, 1.0, compute=4.0)]
    (row, _) = [g for g in goals(rounds, [0.9], "agent-long-tiered") if g["against"] in (CACHE_AWARE, STICKY)]
    assert row["figure"] == "traces/s, pronk with the tier / best vllm-router setup, same tier"
    assert row["goal"] == 1.5 and row["capped"] is None and row["met"] and row["reachable"]["median"] == 4.0


def _checked(name: str, wall_s: float, passed: int) -> CheckedRun:
    run = AgentRun(name, wall_s, 2, 10, 40, 10_000, 6_000, 300, [1.0], finished_s=[float(t) for t in range(1, 11)])
    return CheckedRun(run, CheckCounts(passed=passed, failed=10 - passed), ToolCallCounts(10, 9, 8), 0.05)


def test_agent_real_is_set_against_the_peer_with_the_most_checked_successes_per_dollar():
    peers = {CACHE_AWARE: _checked(CACHE_AWARE, 100.0, 6), STICKY: _checked(STICKY, 50.0, 6)}  # sticky: 2x per $
    rounds = [CheckedRound(_checked(BASELINE, 200.0, 6), _checked(HARNESS, 25.0, 6), {}, peers)] * 2
    table = checked_table(rounds)
    assert list(table) == [BASELINE, CACHE_AWARE, STICKY, HARNESS]
    assert table[HARNESS]["over_best_peer"]["median"] == 2.0 and table[STICKY]["over_baseline"]["median"] == 4.0
    assert table[HARNESS]["busy_share"]["median"] is None  # not sampled in this double
    rows = checked_goals(rounds)
    per_peer = rows[0]
    assert per_peer["figure"] == "checked successes per dollar, pronk / best vllm-router setup"
    assert (per_peer["against"], per_peer["goal"], per_peer["met"]) == (STICKY, 1.3, True)
    successes = [g for g in rows if g["goal"] == "not lower beyond noise"]
    assert [g["against"] for g in successes] == [BASELINE, STICKY] and all(g["met"] for g in successes)
    assert BEST_PEER in successes[1]["figure"]
