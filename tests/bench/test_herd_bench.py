"""`bench/experiments/herd.py`: the side-by-side figures (unit) and its smoke mode on the real stack (e2e)."""

from __future__ import annotations

import pytest

from bench.experiments.herd import SMOKE, recorded, run_herd_bench, side_by_side
from pronk.herd.trial import Measurement


def measurement(tasks_per_dollar: float, failed: int = 0) -> Measurement:
    return Measurement(4, 4 - failed, failed, 10.0, 20.0, 0.001, tasks_per_dollar, 1.0, 2.0, 0.5, 100, 50, 10)


def test_side_by_side_ratios_and_goal():
    figures = side_by_side([measurement(100), measurement(200)], [measurement(160), measurement(300)])
    assert figures["ratios"] == [1.6, 1.5] and figures["median_ratio"] == 1.55
    assert figures["goal_met"] and figures["never_worse"]
    worse = side_by_side([measurement(100)], [measurement(90, failed=1)])
    assert not worse["goal_met"] and not worse["never_worse"] and worse["tuned_failed"] == 1


def test_recording_one_profile_and_job_keeps_the_others():
    old = {"runs": [{"profile": "cpu", "job": "tiny-cpu", "wall_s": 1}, {"profile": "a", "job": "a", "wall_s": 1}]}
    outcome = {"config": {"rounds": 3}, "wall_s": 2, "profiles": [{"profile": "a", "job": "a-untuned"}]}
    runs = recorded(recorded(old, outcome), outcome)["runs"]
    assert [(r["profile"], r["job"]) for r in runs] == [("cpu", "tiny-cpu"), ("a", "a"), ("a", "a-untuned")]
    assert runs[-1]["config"] == {"rounds": 3} and runs[-1]["wall_s"] == 2


def test_smoke_config_is_small():
    assert SMOKE.profiles == ["smoke"] and SMOKE.budget_minutes <= 2 and SMOKE.max_workers == 1


@pytest.mark.e2e
@pytest.mark.bench_smoke
def test_smoke_herd_bench_reports_both_configurations(stack):
    outcome = run_herd_bench(SMOKE, stack, echo=lambda _line: None)
    (profile,) = outcome["profiles"]
    assert len(profile["rounds"]["default"]) == len(profile["rounds"]["tuned"]) == 1
    assert profile["rounds"]["default"][0]["completed"] == 3 and profile["rounds"]["tuned"][0]["completed"] == 3
    assert len(profile["ratios"]) == 1 and profile["tuning"]["trials"] >= 2
