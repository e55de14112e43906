"""Step records: NDJSON that polars reads, per-trace summaries, MLflow traces with agent, LLM and tool spans."""

from __future__ import annotations

import polars as pl

from pronk.agents.step_records import (
    StepRecord,
    ToolCallCounts,
    log_mlflow_traces,
    record_order,
    steps_ndjson,
    summarise,
)


def records() -> list[StepRecord]:
    common = {"root_trace_id": "t", "custom_id": "t", "worker_id": "w0", "model_version": "m/1", "started_at": 1000.0}
    return [
        StepRecord(
            trace_id="t",
            step=0,
            prompt_tokens=300,
            cached_tokens=0,
            output_tokens=20,
            engine_time_s=0.2,
            tool_name="sql",
            tool_ok=True,
            tool_time_s=0.1,
            **common,
        ),
        StepRecord(
            trace_id="t",
            step=1,
            attempt=0,
            error="unparsable step output",
            prompt_tokens=340,
            cached_tokens=256,
            output_tokens=30,
            **common,
        ),
        StepRecord(
            trace_id="t",
            step=1,
            attempt=1,
            prompt_tokens=340,
            cached_tokens=256,
            output_tokens=12,
            tool_name="spawn_subagents",
            tool_ok=True,
            **common,
        ),
        StepRecord(
            trace_id="t.1.0",
            step=0,
            parent_trace_id="t",
            prompt_tokens=380,
            cached_tokens=256,
            output_tokens=9,
            tool_name="python",
            tool_ok=False,
            **common,
        ),
    ]


def test_ndjson_reads_into_polars_with_every_field(tmp_path):
    (tmp_path / "b_steps.jsonl").write_bytes(steps_ndjson(sorted(records(), key=record_order)))
    frame = pl.read_ndjson(tmp_path / "b_steps.jsonl")
    assert frame.height == 4 and frame["trace_id"].to_list() == ["t", "t", "t", "t.1.0"]
    assert frame.filter(pl.col("error").is_not_null())["attempt"].to_list() == [0]


def test_summary_counts_steps_attempts_tools_and_cache():
    summary = summarise(records())
    assert summary.steps == 3 and summary.failed_attempts == 1 and summary.traces == 2
    assert summary.tool_calls == {"sql": 1, "spawn_subagents": 1, "python": 1} and summary.tool_errors == 1
    assert summary.prompt_tokens == 1360 and summary.cached_tokens == 768
    assert summary.cached_ratio == round(768 / 1360, 4) and summary.workers == ["w0"]


def test_the_summary_counts_tool_calls_by_validity_every_attempt_included():
    rows = records()
    for row, (parsed, valid) in zip(rows, [(True, True), (False, False), (True, True), (True, False)], strict=True):
        row.tool_call_parsed, row.tool_call_valid = parsed, valid
    rows.append(StepRecord(trace_id="t", step=2, root_trace_id="t", finish_reason="stop"))  # the final answer
    counts = summarise(rows).tool_call_counts
    assert counts == ToolCallCounts(total=4, parsed=3, valid=2) and counts.validity == 0.5
    assert summarise(rows).as_dict()["tool_call_counts"] == {"total": 4, "parsed": 3, "valid": 2}
    assert summarise([]).tool_call_counts.validity is None
    counts.add(ToolCallCounts(total=1, parsed=1, valid=1))
    assert (counts.total, counts.parsed, counts.valid) == (5, 4, 3)


def test_traces_land_in_mlflow_with_agent_llm_and_tool_spans(tmp_path):
    import mlflow

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    experiment_id, logged = log_mlflow_traces(
        records(), uri, "pronk-test", tmp_path / "artifacts", {"pronk.batch": "b"}
    )
    experiment = mlflow.get_experiment_by_name("pronk-test")
    assert list(logged) == ["t"] and experiment is not None and experiment_id == experiment.experiment_id
    mlflow.set_tracking_uri(uri)
    (trace,) = mlflow.search_traces(locations=[experiment_id], return_type="list")
    assert trace.info.trace_id == logged["t"]
    kinds = sorted(span.span_type for span in trace.data.spans)
    assert kinds.count("AGENT") == 1 and kinds.count("LLM") == 4 and kinds.count("TOOL") == 3
