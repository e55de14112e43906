"""The guard refuses a winner that does not beat the current configuration by more than the measured noise."""

from __future__ import annotations

import pytest

from pronk.batches.schemas import CheckCounts
from pronk.herd.guard import judge, relative_spread


def test_relative_spread():
    assert relative_spread([100.0]) == 0.0
    assert relative_spread([90.0, 110.0]) == pytest.approx(0.2)


def test_a_clear_winner_is_accepted():
    verdict = judge([100.0, 104.0], [150.0, 146.0])
    assert verdict.accept and verdict.gain == pytest.approx(148 / 102)
    assert verdict.noise == pytest.approx(0.05)  # spreads of 3.9% and 2.7% are below the floor


def test_a_winner_inside_the_noise_is_refused():
    verdict = judge([100.0, 120.0], [125.0, 125.0])  # 18% noise from the repeats; 1.136x does not beat it
    assert not verdict.accept and verdict.noise == pytest.approx(20 / 110)
    assert "within the measured noise" in verdict.reason
    assert judge([100.0, 120.0], [135.0, 135.0]).accept  # 1.227x does


def test_the_winner_own_spread_counts():
    assert not judge([100.0, 101.0], [160.0, 90.0]).accept  # mean 125, but its own repeats spread 56%


def test_equal_or_worse_is_refused_and_failures_refuse():
    assert not judge([100.0, 100.0], [100.0, 100.0]).accept
    assert not judge([100.0, 100.0], [80.0, 80.0]).accept
    refused = judge([100.0, 100.0], [300.0, 300.0], winner_failed=1)
    assert not refused.accept and "failed 1 trace" in refused.reason


def test_one_measurement_of_either_is_not_enough():
    verdict = judge([100.0], [300.0, 300.0])
    assert not verdict.accept and "current configuration was measured once" in verdict.reason
    verdict = judge([100.0, 100.0], [300.0])
    assert not verdict.accept and "winner was measured once" in verdict.reason
    with pytest.raises(ValueError):
        judge([], [1.0])


def test_a_winner_cheaper_per_task_but_worse_on_the_labelled_set_is_refused_naming_both_rates():
    verdict = judge(
        [100.0, 100.0], [200.0, 200.0], success=(CheckCounts(passed=16, failed=4), CheckCounts(passed=4, failed=16))
    )
    assert not verdict.accept and verdict.gain == pytest.approx(2.0)
    assert verdict.quality is not None and verdict.quality.worse
    assert "answers worse" in verdict.reason
    assert "4/20 passed (20%)" in verdict.reason and "16/20 passed (80%)" in verdict.reason


def test_a_winner_within_noise_on_the_labelled_set_is_accepted():
    verdict = judge([100.0, 100.0], [200.0, 200.0], success=(CheckCounts(passed=20), CheckCounts(passed=18, failed=2)))
    assert verdict.accept and verdict.quality is not None and not verdict.quality.worse
    assert "holds within noise: 18/20 passed (90%) against 20/20 passed (100%)" in verdict.reason


def test_a_success_rate_not_measured_refuses_the_winner():
    verdict = judge([100.0, 100.0], [200.0, 200.0], success=(CheckCounts(passed=20), None))
    assert not verdict.accept and "winner's success rate on the labelled set was not measured" in verdict.reason
    verdict = judge([100.0, 100.0], [200.0, 200.0], success=(None, CheckCounts(passed=20)))
    assert not verdict.accept and "current configuration's success rate" in verdict.reason
    assert judge([100.0, 100.0], [200.0, 200.0]).quality is None  # no labelled set: tasks per dollar alone
