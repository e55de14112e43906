"""Unit tests of the agent-real profile's pieces that need no server: the traces' documents, the checked figures (per
second, per dollar, the goals), the shapes of pronk's records and the recorded section."""

from __future__ import annotations

import json
import math

import pytest

from bench.harness.agent_real import shapes_of, trace_contexts
from bench.harness.figures import (
    BASELINE,
    HARNESS,
    LIMIT,
    AgentRun,
    CheckedRound,
    CheckedRun,
    checked_table,
)
from bench.harness.goals import checked_goals
from bench.harness.report import checked_section, write_json
from bench.harness.results_md import write_results_md
from bench.harness.workload import CHARS_PER_TOKEN, LABELLED_PROFILES, labelled_traces, relabelled
from pronk.agents.outcomes import Completion, LineFailure, RequestOutcome, Usage
from pronk.agents.step_records import StepRecord, ToolCallCounts
from pronk.batches.labelled import CheckedLine, labelled_lines
from pronk.batches.schemas import CheckCounts
from pronk.jobs.catalog import resolve_job
from pronk.protocol.checks import CheckResult
from pronk.settings import get_settings


def test_each_trace_reads_a_document_of_its_own_before_its_unchanged_task():
    lines = labelled_lines(resolve_job("agent-real", get_settings()), get_settings())
    by_id = {line.custom_id: line for line in lines}
    profile = LABELLED_PROFILES["agent-real"]
    traces = labelled_traces(lines, profile, seed=1)
    assert traces == labelled_traces(lines, profile, seed=1) and traces != labelled_traces(lines, profile, seed=2)
    assert len(traces) == profile.traces and len({t.custom_id for t in traces}) == profile.traces
    documents = set()
    for trace in traces:
        original = by_id[trace.custom_id.split("-", 2)[2]]
        assert trace.custom_id.startswith("r1-t") and trace.check == original.check
        assert trace.body.model_dump(exclude={"messages"}) == original.body.model_dump(exclude={"messages"})
        first, *rest = trace.body.messages
        assert rest == original.body.messages[1:] and first.role == original.body.messages[0].role
        task = original.body.messages[0].text()
        assert first.text().startswith("Background reading:") and first.text().endswith(task)
        document = first.text()[: -len(task)]
        low, high = profile.document_tokens
        assert low * CHARS_PER_TOKEN <= len(document) <= high * CHARS_PER_TOKEN + 40
        documents.add(document)
    assert len(documents) == len(traces)
    assert len({t.custom_id.split("-", 2)[2] for t in traces}) == len(traces)  # one pass draws no line twice
    many = labelled_traces(lines, profile, seed=1, traces=2 * len(lines))
    assert {t.custom_id.split("-", 2)[2] for t in many} == set(by_id)
    assert [t.custom_id for t in relabelled(traces[:2], "base")] == [f"base-{t.custom_id}" for t in traces[:2]]


def _run(name: str, wall_s: float, passed: int, failed: int, finished: list[float] | None = None) -> CheckedRun:
    run = AgentRun(name, wall_s, 2, passed + failed, 40, 10_000, 6_000, 300, [1.0, 2.0], finished_s=finished or [])
    return CheckedRun(run, CheckCounts(passed=passed, failed=failed, unchecked=0), ToolCallCounts(10, 9, 8), 0.05)


def test_checked_successes_per_second_and_per_dollar():
    run = _run("x", 1800.0, passed=6, failed=3)
    assert run.cost_usd == pytest.approx(0.05)  # $0.05 a worker-hour x 2 workers x half an hour
    assert run.successes_per_dollar == pytest.approx(120.0) and run.successes_per_s == pytest.approx(6 / 1800)
    figures = run.figures()
    assert figures["success_rate"] == pytest.approx(2 / 3) and figures["tool_call_validity"] == 0.8
    assert figures["cached_ratio"] == 0.6 and math.isnan(figures["traces_per_s_steady"])


def test_rounds_goals_and_the_success_rate_judgement():
    steady = [float(t) for t in range(1, 11)]  # 1 trace a second in steady state
    limit = AgentRun(LIMIT, 5.0, 2, 10, 40, 10_000, 8_000, 300, [])  # 2 traces per wall second
    rounds = [
        CheckedRound(_run(BASELINE, 300.0, 6, 4), _run(HARNESS, 100.0, 6, 4, steady), {LIMIT: limit}),
        CheckedRound(_run(BASELINE, 200.0, 5, 5), _run(HARNESS, 100.0, 5, 5, steady), {LIMIT: limit}),
        CheckedRound(_run(BASELINE, 300.0, 6, 4), _run(HARNESS, 200.0, 6, 4, steady), {LIMIT: limit}),
    ]
    table = checked_table(rounds)
    assert set(table) == {BASELINE, HARNESS, LIMIT} and table[LIMIT]["traces_per_s_wall"]["median"] == 2.0
    assert (
        table[HARNESS]["over_baseline"]["rounds"] == [3.0, 2.0, 1.5] and table[HARNESS]["over_limit"]["median"] == 0.05
    )
    assert table[BASELINE]["successes_per_dollar"]["rounds"][0] == pytest.approx(6 / (0.05 * 2 * 300 / 3600), rel=1e-5)
    per_dollar, to_limit, quality = checked_goals(rounds)
    assert per_dollar["goal"] is None and per_dollar["median"] == 2.0  # issue 41's 2.5x over stock, retired
    assert not to_limit["met"]  # 0.05 of the limit
    assert quality["met"] and "holds" in quality["reason"] and quality["rounds"] == [1.0, 1.0, 1.0]

    worse = [CheckedRound(_run(BASELINE, 300.0, 30, 2), _run(HARNESS, 10.0, 10, 22, steady))]
    (per_dollar, quality) = checked_goals(worse)  # no limit: no limit goal
    assert per_dollar["median"] == 10.0 and not quality["met"] and "fell beyond noise" in quality["reason"]


def _record(trace_id: str, step: int, prompt: int, output: int, worker: str | None = "w0", **more) -> StepRecord:
    return StepRecord(trace_id, step, trace_id, custom_id=trace_id, worker_id=worker, prompt_tokens=prompt,
                      output_tokens=output, started_at=100.0 + step, **more)  # fmt: skip


def test_a_run_of_checked_lines_counts_served_attempts_and_failed_lines():
    records = [
        _record(
            "a",
            0,
            2000,
            30,
            cached_tokens=0,
            tool_name="python",
            tool_time_s=0.2,
            tool_call_parsed=True,
            tool_call_valid=True,
        ),
        _record("a", 1, 2100, 10, cached_tokens=1920),
        _record("b", 0, 1500, 0, worker=None, error="TimeoutError"),
    ]
    done = Completion("agent", "c", "smol", "v1", "w0", Usage(4100, 1920, 40), text="42", duration_s=3.0)
    a, b = relabelled(labelled_lines(resolve_job("agent-real", get_settings()), get_settings())[:2], "pronk")
    lines = [
        CheckedLine(a, RequestOutcome(1, a.custom_id, done), CheckResult(status="passed"), records[:2], 13.0),
        CheckedLine(
            b,
            RequestOutcome(2, b.custom_id, LineFailure("step_failed", "no")),
            CheckResult(status="failed"),
            records[2:],
            15.0,
        ),
    ]
    run = CheckedRun.of(HARNESS, lines, started=10.0, wall_s=5.0, workers=2, price=0.05)
    assert run.run.steps == 2 and run.run.prompt_tokens == 4100 and run.run.cached_tokens == 1920
    assert run.run.finished_s == [3.0, 5.0] and run.run.trace_seconds == [3.0]
    assert run.run.errors == [f"{b.custom_id}: step_failed: no"] and run.checks == CheckCounts(passed=1, failed=1)
    assert run.tool_calls == ToolCallCounts(1, 1, 1) and run.records == records
    assert trace_contexts(records) == [2110]


def test_the_limit_replays_the_shapes_of_pronks_records(tmp_path):
    records = [
        _record("a", 0, 2000, 30, tool_name="python", tool_time_s=0.25),
        _record("a", 1, 2100, 10),
        _record("b", 0, 1500, 20),
    ]
    shapes = shapes_of(records, tmp_path / "steps.jsonl")
    by_len = sorted(shapes, key=lambda s: len(s.steps))
    assert [len(s.steps) for s in by_len] == [1, 2]
    two = by_len[1]
    assert two.system_prompt_tokens == 1999 and [s.new_prompt_tokens for s in two.steps] == [1, 70]
    assert [s.output_tokens for s in two.steps] == [30, 10] and two.steps[0].tool_gap_s == 0.25


def test_the_checked_section_keeps_other_profiles(tmp_path):
    rounds = [CheckedRound(_run(BASELINE, 300.0, 6, 4), _run(HARNESS, 100.0, 6, 4))]
    meta = {
        "profile": "agent-real",
        "date": "d",
        "machine": "m",
        "command": "c",
        "job": "job-10d91d95",
        "model": "models:/smol@live",
        "workers": 2,
        "price_per_worker_hour": 0.05,
        "kv_cache_memory_bytes": 188743680,
        "max_model_len": 4096,
        "concurrency": 8,
        "rounds": 1,
        "seed": 0,
        "traces_per_round": 10,
        "labelled_set": "data/labelled/agent.jsonl",
        "document_tokens": [800, 2200],
        "vllm_server_startup_s": 40.0,
        "kv": {
            "tokens_per_worker": 4096,
            "mean_trace_context": 2300,
            "longest_trace_context": 3500,
            "working_set_tokens_per_worker": 9200,
            "cache_share_of_working_set": 0.45,
        },
    }
    text = checked_section(meta, [], "plot.png", checked_table(rounds), checked_goals(rounds))
    assert "checked successes/$" in text and "not lower beyond noise" in text and "holds 45% of it" in text
    md, results = tmp_path / "RESULTS.md", tmp_path / "results.json"
    write_results_md(md, "## agent-long section", "agent-long")
    write_json(results, [], {"profile": "agent-long"})
    write_results_md(md, text, "agent-real")
    write_json(results, [], meta, checked_table(rounds), checked_goals(rounds))
    assert "## agent-long section" in md.read_text() and "profile `agent-real`" in md.read_text()
    profiles = json.loads(results.read_text())["profiles"]
    assert set(profiles) == {"agent-long", "agent-real"}
    assert profiles["agent-real"]["setups"][HARNESS]["over_baseline"]["rounds"] == [3.0]
