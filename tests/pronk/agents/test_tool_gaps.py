"""Pin TTLs from measured tool gaps (`kv_pin_ttl: auto`)."""

from __future__ import annotations

import pytest

from pronk.agents.tool_gaps import ToolGaps
from pronk.jobs.schema import SchedulingConfig


def test_default_until_measured_then_p90_with_margin_clamped():
    gaps = ToolGaps(default_s=30.0, min_samples=5, margin=1.25, floor_s=0.5, ceiling_s=60.0)
    for seconds in [1.0, 1.0, 1.0, 1.0]:
        gaps.observe("python", seconds)
    assert gaps.estimate("python") == 30.0
    for seconds in [1.0, 1.0, 1.0, 1.0, 1.0, 2.0]:
        gaps.observe("python", seconds)
    assert gaps.estimate("python") == pytest.approx(2.5)
    for _ in range(10):
        gaps.observe("search", 0.01)
        gaps.observe("sql", 500.0)
    assert gaps.estimate("search") == 0.5 and gaps.estimate("sql") == 60.0


def test_a_step_that_may_call_several_tools_gets_the_longest_ttl():
    gaps = ToolGaps(default_s=30.0, min_samples=1)
    gaps.observe("search", 0.8)
    gaps.observe("python", 4.0)
    assert gaps.ttl(["search", "python"]) == pytest.approx(5.0)
    assert gaps.ttl(["search", "never-seen"]) == 30.0
    assert gaps.ttl([]) == 30.0


def test_job_scheduling_switches():
    assert SchedulingConfig().kv_pin_ttl == "fixed" and SchedulingConfig().admission == "none"
    assert SchedulingConfig(kv_pin_ttl="auto", admission="kv_budget").admission == "kv_budget"
    with pytest.raises(ValueError):
        SchedulingConfig(admission="maybe")
