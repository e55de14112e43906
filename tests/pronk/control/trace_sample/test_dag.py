"""Sampled trace DAGs without a server: which traces are drawn, and the nodes and edges of one trace family."""

from __future__ import annotations

import itertools

from pronk.agents.step_records import StepRecord
from pronk.control.trace_sample.choice import SampleCandidate, choose_sample
from pronk.control.trace_sample.dag import readable, trace_dag


def candidates(
    n: int, failed: frozenset[int] | set[int] = frozenset(), no_steps: frozenset[int] | set[int] = frozenset()
):
    return [SampleCandidate(i, f"t-{i}", i in failed, 0 if i in no_steps else 3) for i in range(1, n + 1)]


def test_sample_takes_failed_traces_first_then_spreads_evenly():
    chosen = choose_sample(candidates(100, failed={7, 93}), 10)
    lines = [c.line for c in chosen]
    assert {7, 93} <= set(lines) and len(lines) == 10 and lines == sorted(lines)
    rest = [line for line in lines if line not in {7, 93}]
    gaps = [b - a for a, b in itertools.pairwise(rest)]
    assert rest[0] <= 13 and rest[-1] >= 88 and max(gaps) - min(gaps) <= 2


def test_sample_is_all_failed_when_they_fill_it_and_skips_lines_without_steps():
    assert [c.line for c in choose_sample(candidates(50, failed=set(range(1, 50, 2))), 5)] == [1, 3, 5, 7, 9]
    assert [c.line for c in choose_sample(candidates(4, no_steps={2}), 10)] == [1, 3, 4]
    assert choose_sample(candidates(4), 0) == [] and choose_sample([], 10) == []


def record(trace_id: str, step: int, tool: str | None = None, parent: str | None = None, **kw) -> StepRecord:
    return StepRecord(
        trace_id=trace_id,
        step=step,
        root_trace_id="t-42",
        parent_trace_id=parent,
        custom_id="t-42",
        worker_id="w-0",
        model_version="pronk-tiny/1",
        prompt_tokens=100,
        cached_tokens=64,
        output_tokens=8,
        tool_name=tool,
        tool_ok=True if tool else None,
        **kw,
    )


def fan_out_family() -> list[StepRecord]:
    """t-42: step 0 sql, step 1 (retried once) spawns two children, step 2 answers; child 1 calls python first."""
    return [
        record("t-42", 0, "sql", tool_time_s=0.25),
        record("t-42", 1, None, attempt=0, error="unparsable step output"),
        record("t-42", 1, "spawn_subagents", attempt=1),
        record("t-42.1.0", 0, None, parent="t-42", finish_reason="stop"),
        record("t-42.1.1", 0, "python", parent="t-42"),
        record("t-42.1.1", 1, None, parent="t-42", finish_reason="stop"),
        record("t-42", 2, None, finish_reason="stop"),
    ]


def test_dag_links_step_tool_step_and_fans_children_out_and_back_in():
    nodes = trace_dag(fan_out_family())
    by_name = {n.name: n for n in nodes}
    key = {n.name: n.key for n in nodes}
    assert list(by_name) == [n.name for n in nodes] and len(nodes) == 9
    assert by_name["t-42 step 0: sql"].upstream == []
    assert by_name["t-42 step 0 tool: sql"].upstream == [key["t-42 step 0: sql"]]
    assert by_name["t-42 step 1: spawn_subagents"].upstream == [key["t-42 step 0 tool: sql"]]
    spawn = key["t-42 step 1 tool: spawn_subagents"]
    assert by_name["t-42.1.0 step 0: stop"].upstream == [spawn]
    assert by_name["t-42.1.1 step 0: python"].upstream == [spawn]
    assert by_name["t-42.1.1 step 1: stop"].upstream == [key["t-42.1.1 step 0 tool: python"]]
    assert sorted(by_name["t-42 step 2: stop"].upstream) == sorted(
        [spawn, key["t-42.1.0 step 0: stop"], key["t-42.1.1 step 1: stop"]]
    )
    order = [n.key for n in nodes]
    assert all(order.index(up) < order.index(n.key) for n in nodes for up in n.upstream)


def test_nodes_carry_the_steps_figures():
    by_name = {n.name: n for n in trace_dag(fan_out_family())}
    step = by_name["t-42 step 1: spawn_subagents"]
    assert step.figures["attempts"] == 2 and step.figures["cached_tokens"] == 64 and "error" not in step.figures
    assert not step.failed
    assert step.summary.startswith(
        "prompt 100 tokens (64 cached), 8 out; worker w-0, model pronk-tiny/1; queue 0.000 s"
    )
    tool = by_name["t-42 step 0 tool: sql"]
    assert tool.kind == "tool" and tool.figures["tool_time_s"] == 0.25 and tool.figures["ok"] is True
    assert tool.summary == "sql ok in 0.250 s"
    assert by_name["t-42 step 1 tool: spawn_subagents"].figures["children"] == 2


def test_nodes_run_when_their_steps_and_tool_calls_ran():
    rows = [
        record("t-42", 0, "sql", started_at=100.0, engine_time_s=2.0, tool_time_s=0.25),
        record("t-42", 1, None, attempt=0, error="unparsable step output", started_at=103.0, engine_time_s=1.0),
        record("t-42", 1, "python", attempt=1, started_at=104.5, engine_time_s=1.5, tool_time_s=3.0),
        record("t-42", 2, None, finish_reason="stop", started_at=109.0, engine_time_s=0.5),
    ]
    times = {n.name: (n.started_at, n.ended_at) for n in trace_dag(rows)}
    assert times == {
        "t-42 step 0: sql": (100.0, 102.0),
        "t-42 step 0 tool: sql": (102.0, 102.25),
        "t-42 step 1: python": (103.0, 106.0),  # from its first attempt's start to its last one's end
        "t-42 step 1 tool: python": (106.0, 109.0),
        "t-42 step 2: stop": (109.0, 109.5),
    }


def test_a_failed_step_and_a_failed_tool_are_marked():
    rows = [record("t-42", 0, "python"), record("t-42", 1, None, error="TimeoutError: step took too long")]
    rows[0].tool_ok = False
    nodes = {n.name: n for n in trace_dag(rows)}
    assert (
        nodes["t-42 step 0 tool: python"].failed
        and nodes["t-42 step 0 tool: python"].summary == "python failed in 0.000 s"
    )
    assert nodes["t-42 step 1: error"].failed and str(nodes["t-42 step 1: error"].figures["error"]).startswith(
        "Timeout"
    )


def test_hostile_ids_are_bounded_and_orphans_are_drawn_as_roots():
    assert readable("a\nb\x00" + "x" * 100) == "a?b?" + "x" * 43 + "…"
    orphan = record("t-42.9.0", 0, None, parent="t-42")  # its parent's spawning step left no record
    nodes = trace_dag([record("t-42", 0, None, finish_reason="stop"), orphan])
    assert [(n.name, n.upstream) for n in nodes] == [("t-42 step 0: stop", []), ("t-42.9.0 step 0: final", [])]


def test_a_long_trace_with_nested_fan_outs_is_drawn_upstream_first():
    rows = [record("t-42", s, "spawn_subagents" if s == 0 else "sql") for s in range(256)]
    rows += [
        record(f"t-42.0.{i}", s, "spawn_subagents" if s == 0 else None, parent="t-42")
        for i in range(4)
        for s in range(2)
    ]
    rows += [record("t-42.0.3.0.0", s, None, parent="t-42.0.3") for s in range(256)]
    nodes = trace_dag(rows)
    assert len(nodes) == 2 * 256 + 4 * 3 + 256
    seen: set[str] = set()
    for node in nodes:
        assert set(node.upstream) <= seen, node.name
        seen.add(node.key)
    assert [n.upstream for n in nodes if n.name == "t-42.0.3.0.0 step 0: final"] == [["t-42.0.3/0/tool"]]
