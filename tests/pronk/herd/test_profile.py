"""The traffic profile from hand-written step records: every figure checked against what the records say."""

from __future__ import annotations

from pathlib import Path

import pytest

from pronk.agents.step_records import StepRecord, steps_ndjson
from pronk.herd.profile import NoStepRecords, profile_steps, scan_steps
from pronk.settings import get_settings

SERVED = {"worker_id": "w0", "model_version": "m/1", "engine_time_s": 0.1, "custom_id": "x"}


def records() -> list[StepRecord]:
    """Root trace `a` (3 steps, a failed attempt, one child), its child `a.1.0` (2 steps) and root `b` (1 step)."""
    return [
        StepRecord("a", 0, "a", prompt_tokens=100, output_tokens=10, tool_name="sql", tool_time_s=0.5,
                   tool_ok=True, started_at=0.0, **SERVED),
        StepRecord("a", 1, "a", prompt_tokens=130, cached_tokens=96, output_tokens=20, tool_name="spawn_subagents",
                   tool_time_s=1.0, tool_ok=True, started_at=1.0, **SERVED),
        StepRecord("a", 2, "a", attempt=0, error="unparsable step output", prompt_tokens=200, started_at=2.9),
        StepRecord("a", 2, "a", attempt=1, prompt_tokens=200, cached_tokens=128, host_tier_tokens=128,
                   output_tokens=5, started_at=3.0, **SERVED),
        StepRecord("a.1.0", 0, "a", parent_trace_id="a", prompt_tokens=150, output_tokens=8, started_at=2.0, **SERVED),
        StepRecord("a.1.0", 1, "a", parent_trace_id="a", prompt_tokens=170, output_tokens=4, started_at=2.5,
                   **SERVED),
        StepRecord("b", 0, "b", prompt_tokens=120, output_tokens=6, started_at=0.5, **SERVED),
    ]  # fmt: skip


def write(path: Path, rows: list[StepRecord]) -> str:
    path.write_bytes(steps_ndjson(rows))
    return str(path)


def test_profile_of_known_step_records(tmp_path):
    profile = profile_steps(scan_steps([write(tmp_path / "one_steps.jsonl", records())], get_settings()))

    assert (profile.runs, profile.traces, profile.root_traces) == (1, 3, 2)
    assert (profile.steps, profile.failed_attempts) == (6, 1)
    assert profile.system_prompt_tokens.values == [100.0, 120.0]
    assert profile.system_prompt_tokens.mean == 110.0
    # a: 130-100-10 = 20, 200-130-20 = 50; the child: 170-150-8 = 12
    assert profile.new_prompt_tokens.values == [12.0, 20.0, 50.0]
    assert (profile.new_prompt_tokens.p50, profile.new_prompt_tokens.mean) == (20.0, 27.333333)
    assert profile.output_tokens.values == [4.0, 5.0, 6.0, 8.0, 10.0, 20.0]
    assert (profile.output_tokens.p50, profile.output_tokens.p10, profile.output_tokens.p90) == (7.0, 4.5, 15.0)
    assert profile.steps_per_trace.values == [1.0, 2.0, 3.0]
    assert profile.fan_out.values == [1.0]
    assert profile.fan_out_share == 0.5
    assert {tool: d.values for tool, d in profile.tool_gap_s.items()} == {"spawn_subagents": [1.0], "sql": [0.5]}
    assert profile.cached_ratio == round(224 / 870, 6)
    assert profile.host_tier_ratio == round(128 / 870, 6)  # step 2's prefix came back from the host tier
    # a runs 0 → 3.1, b 0.5 → 0.6: in flight 1, 2, 1, 0
    assert profile.concurrency.values == [0.0, 1.0, 1.0, 2.0]
    assert profile.concurrency.max == 2.0
    assert profile.arrival_rate_per_s == 2.0  # two roots 0.5 s apart
    assert "new_prompt_tokens" in profile.text()
    # what a family keeps at the engines and in KV while in flight: a spans 3.1 s, b 0.1 s; six served steps of
    # 0.1 s; each step's context held through its step and its tool call
    load = profile.line_load
    assert (load.lines, load.span_s, load.busy_s) == (2, pytest.approx(3.2), pytest.approx(0.6))
    held = 110 * 0.6 + 150 * 1.1 + 205 * 0.1 + 158 * 0.1 + 174 * 0.1 + 126 * 0.1
    assert load.token_s == pytest.approx(held)
    assert profile.summary()["running_per_line"] == round(0.6 / 3.2, 6)


def test_runs_stay_apart(tmp_path):
    """The same trace ids in two runs are two traces each; arrivals are counted within each run."""
    uris = [write(tmp_path / f"{i}_steps.jsonl", records()) for i in range(2)]
    profile = profile_steps(scan_steps(uris, get_settings()))
    assert (profile.runs, profile.traces, profile.root_traces, profile.steps) == (2, 6, 4, 12)
    assert profile.steps_per_trace.values == [1.0, 1.0, 2.0, 2.0, 3.0, 3.0]
    assert profile.arrival_rate_per_s == 2.0
    assert profile.cached_ratio == round(224 / 870, 6)
    assert profile.host_tier_ratio == round(128 / 870, 6)  # step 2's prefix came back from the host tier


def test_no_records():
    with pytest.raises(NoStepRecords):
        scan_steps([], get_settings())


def test_profile_as_mlflow_run_with_histograms(tmp_path):
    import mlflow

    from pronk.herd.tracking import log_profile
    from pronk.settings import Settings

    settings = Settings(data_dir=tmp_path)
    profile = profile_steps(scan_steps([write(tmp_path / "one_steps.jsonl", records())], get_settings()))
    run_id = log_profile(profile, "job-c0ffee01", settings)
    client = mlflow.MlflowClient(settings.tracking_uri)
    run = client.get_run(run_id)
    assert run.data.metrics["output_tokens.p50"] == 7.0 and run.data.metrics["cached_ratio"] == round(224 / 870, 6)
    assert run.data.tags["pronk.herd"] == "profile"
    pngs = {a.path for a in client.list_artifacts(run_id, "histograms")}
    assert {"histograms/output_tokens.png", "histograms/tool_gap_s_sql.png"} <= pngs


def test_shapes_rebuild_the_traces(tmp_path):
    from pronk.herd.shapes import relabel, shapes_from_steps

    shapes = shapes_from_steps(scan_steps([write(tmp_path / "one_steps.jsonl", records())], get_settings()))
    assert [s.trace_id for s in shapes] == ["0-a", "0-b"]
    a, b = shapes
    assert a.system_prompt_tokens == 99 and [s.new_prompt_tokens for s in a.steps] == [1, 20, 50]
    assert [s.output_tokens for s in a.steps] == [10, 20, 5]
    assert [s.tool_gap_s for s in a.steps] == [0.5, 0.0, 0.0]  # the spawning step's gap is its children's run
    (child,) = a.steps[1].fan_out  # spawned after step 1 (started 1.0 ≤ 2.0 < 3.0), from its 130 + 20 tokens
    assert child.system_prompt_tokens == 1  # its first prompt (150) is all parent prefix: one token of its own
    assert [s.new_prompt_tokens for s in child.steps] == [1, 12] and [s.output_tokens for s in child.steps] == [8, 4]
    assert (b.system_prompt_tokens, b.total_steps()) == (119, 1)
    assert a.total_steps() == 5 and a.total_output_tokens() == 47
    assert (a.shared_prefix_tokens, b.shared_prefix_tokens, child.shared_prefix_tokens) == (0, 0, 0)
    shared = records()
    shared[-1].cached_tokens = 64  # b's first step found 64 tokens cached: other traces' (a common prompt)
    shared[4].cached_tokens = 128  # the child's first found its parent's prefix: nothing shared with others
    a, b = shapes_from_steps(scan_steps([write(tmp_path / "shared_steps.jsonl", shared)], get_settings()))
    assert (a.shared_prefix_tokens, a.steps[1].fan_out[0].shared_prefix_tokens, b.shared_prefix_tokens) == (0, 0, 64)
    retried = [*shared[:-1], StepRecord("b", 0, "b", attempt=0, error="unparsable step output", prompt_tokens=120,
                                        cached_tokens=64, output_tokens=6, started_at=0.5, **SERVED),
               StepRecord("b", 0, "b", attempt=1, prompt_tokens=120, cached_tokens=112, output_tokens=6,
                          started_at=0.7, **SERVED)]  # fmt: skip
    _, b = shapes_from_steps(scan_steps([write(tmp_path / "retried_steps.jsonl", retried)], get_settings()))
    assert b.shared_prefix_tokens == 64  # the retry found its own first attempt's prefix: only the first counts
    again = relabel(shapes, "t1")
    assert [s.trace_id for s in again] == ["t1-0000", "t1-0001"] and again[0].steps[1].fan_out[
        0
    ].trace_id == "t1-0000.1.0"
