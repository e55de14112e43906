"""Unit tests of the two offline limits that need no engine: what capacity and engine args each gets
(`bench.harness.fleet`), how the runner admits traces and sends their steps (`bench.harness.offline_limit`, on an
engine double), pronk's ratios to each, the defect a limit exceeded is, and the goal rows that name what they are
measured against."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest

from bench.harness.figures import (
    BASELINE,
    BATCH,
    COMPUTE_LIMIT,
    FULL,
    HARNESS,
    LIMIT,
    LIMITS,
    UNTIERED,
    AgentRun,
    CheckedRound,
    CheckedRun,
    checked_table,
    limit_defects,
    rounds_table,
)
from bench.harness.fleet import (
    BUDGET_SHARE,
    COMPUTE_LIMIT_KV_BYTES,
    CPU_BLOCK_SIZE,
    admitted_footprint,
    capacity_limit,
    compute_limit,
    held_tokens,
    kv_footprint,
    kv_tokens_per_worker,
)
from bench.harness.goals import BEST_PEER, ENGINE_CORES, GOALS, IDEAL, checked_goals, goals
from bench.harness.offline_limit import TraceQueue, final_context, run_rolling
from bench.harness.report import defect_lines, goals_table, setups_table, write_json
from bench.harness.workload import generate
from pronk.agents.replay import filler_tokens, system_tokens
from pronk.agents.step_records import ToolCallCounts
from pronk.batches.schemas import CheckCounts
from pronk.jobs.catalog import resolve_job
from pronk.protocol.shapes import ShapeStep, TraceShape
from pronk.settings import get_settings

TINY_BYTES_PER_TOKEN = 2 * 4 * 2 * 64 * 4  # pronk's tiny model: 4 layers, 2 KV heads of 64, float32


def _model(tmp_path: Path, layers: int = 4) -> Path:
    """A model folder with just the config.json the KV sizing reads."""
    config = {"hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": layers}
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


class _Engine:
    """vLLM's `LLMEngine` as the runner drives it: each `step` ends the request with the fewest tokens to generate
    (the earliest sent among equals), and notes which root traces had a request in the engine."""

    def __init__(self) -> None:
        self.waiting: dict[str, tuple[list[int], int]] = {}
        self.sent: list[tuple[str, list[int]]] = []
        self.roots_in_engine: list[set[str]] = []

    def add_request(self, request_id, prompt, params) -> None:
        self.waiting[request_id] = (prompt["prompt_token_ids"], params.max_tokens)
        self.sent.append((request_id, prompt["prompt_token_ids"]))

    def step(self) -> list:
        self.roots_in_engine.append({rid.split("/")[0].split(".")[0] for rid in self.waiting})
        rid = min(self.waiting, key=lambda r: self.waiting[r][1])
        prompt, max_tokens = self.waiting.pop(rid)
        completion = SimpleNamespace(token_ids=[7] * max_tokens)
        return [
            SimpleNamespace(
                request_id=rid, finished=True, outputs=[completion], prompt_token_ids=prompt, num_cached_tokens=0
            )
        ]


def _trace(trace_id: str, output_tokens: int, steps: int = 2, fan_out: list[TraceShape] | None = None) -> TraceShape:
    first = ShapeStep(new_prompt_tokens=20, output_tokens=output_tokens, fan_out=fan_out or [])
    rest = [ShapeStep(new_prompt_tokens=10, output_tokens=output_tokens) for _ in range(steps - 1)]
    return TraceShape(trace_id=trace_id, system_prompt_tokens=100, steps=[first, *rest])


def test_the_runner_admits_a_trace_the_moment_room_frees_and_sends_each_step_when_the_last_ends():
    child = TraceShape(trace_id="x", system_prompt_tokens=5, steps=[ShapeStep(new_prompt_tokens=3, output_tokens=9)])
    shapes = [_trace("a", 2), _trace("b", 50, fan_out=[child]), _trace("c", 3), _trace("d", 4)]
    capacity = final_context(shapes[1]) + final_context(shapes[3])  # b and any one other
    engine = _Engine()
    out = run_rolling(engine, TraceQueue(shapes), capacity)
    assert out["traces"] == 4 and len(out["finished_s"]) == 4
    assert out["steps"] == sum(len(s.steps) for s in shapes) + 1  # b's child too
    assert out["output_tokens"] == sum(st.output_tokens for s in shapes for st in s.steps) + 9
    for roots in engine.roots_in_engine:  # never more than the capacity holds, never a trace waiting on a wave
        assert len(roots) <= 2
        assert len(roots) == 1 or sum(final_context(s) for s in shapes if s.trace_id in roots) <= capacity
    order = [rid for rid, _ in engine.sent]
    # a's short steps end first: c takes its room while b's long first step still runs, then d takes c's
    assert order.index("c/0") < order.index("b/1") and order.index("d/0") < order.index("b/1")
    prompts = dict(engine.sent)
    b_after_step_0 = prompts["b/0"] + [7] * 50
    assert prompts["b.0.0/0"][: len(b_after_step_0)] == b_after_step_0  # the child starts on its parent's tokens
    assert prompts["b/1"] == b_after_step_0 + filler_tokens("b/1", 10)
    assert len(prompts["a/0"]) == 100 + 20


def test_the_runner_holds_at_most_max_traces_and_admits_a_trace_too_big_alone():
    shapes = [_trace(f"t{i}", 2 + i) for i in range(5)]
    engine = _Engine()
    run_rolling(engine, TraceQueue(shapes), 10**9, max_traces=2)
    assert max(len(roots) for roots in engine.roots_in_engine) == 2
    engine = _Engine()
    out = run_rolling(engine, TraceQueue(shapes[:3]), 1)  # each trace alone exceeds the capacity: one at a time
    assert out["traces"] == 3 and max(len(roots) for roots in engine.roots_in_engine) == 1


def test_processes_sharing_a_queue_take_each_trace_once_in_order_where_it_fits_the_most_room(tmp_path):
    shapes = [_trace(f"t{i}", 2) for i in range(5)]
    TraceQueue.share(tmp_path / "claims", 2)
    first, second = (TraceQueue(shapes, tmp_path / "claims", index) for index in (0, 1))

    def take(queue: TraceQueue, room: float) -> str | None:
        shape = queue.take(room)
        return shape.trace_id if shape else None

    assert final_context(shapes[0]) == 134
    assert take(first, math.inf) == "t0"  # both hold nothing yet
    assert take(first, 200) is None  # the second, holding nothing, has more room
    assert take(second, math.inf) == "t1"
    assert take(second, 50) is None  # the first has more room
    assert take(first, 100) is None  # the most room, but the next does not fit it: it stays in the queue
    assert take(first, 200) == "t2"
    assert take(first, -1) is None  # the first may hold no more
    assert [take(second, 150), take(second, 140), take(second, 10)] == ["t3", "t4", None]  # none left


def test_a_shared_system_prompt_is_the_same_tokens_in_every_trace_and_the_runner_sends_it():
    shapes = [
        TraceShape(
            trace_id=t,
            system_prompt_tokens=300,
            shared_prefix_tokens=256,
            steps=[ShapeStep(new_prompt_tokens=4, output_tokens=2)],
        )
        for t in ("a", "b")
    ]
    engine = _Engine()
    run_rolling(engine, TraceQueue(shapes), 10**9)
    prompts = dict(engine.sent)
    assert prompts["a/0"][:256] == prompts["b/0"][:256] and prompts["a/0"][256:300] != prompts["b/0"][256:300]
    assert prompts["a/0"][:300] == system_tokens("a", shapes[0])
    with pytest.raises(ValueError, match="shared_prefix_tokens"):
        TraceShape(trace_id="c", system_prompt_tokens=10, shared_prefix_tokens=11, steps=shapes[0].steps)


def test_admitted_footprint_bounds_whatever_the_runner_admits_at_once():
    shapes = generate("agent-long", 0, traces=40).shapes
    sizes = sorted((kv_footprint(s, CPU_BLOCK_SIZE) for s in shapes), reverse=True)
    assert admitted_footprint(shapes, 10**9, 4, CPU_BLOCK_SIZE) == sum(sizes[:4])  # the four largest
    assert admitted_footprint(shapes, 1, 4, CPU_BLOCK_SIZE) == sizes[0]  # one alone: the largest
    capacity = 3 * max(final_context(s) for s in shapes)
    bound = admitted_footprint(shapes, capacity, None, CPU_BLOCK_SIZE)
    overheads = sorted((kv_footprint(s, CPU_BLOCK_SIZE) - final_context(s) for s in shapes), reverse=True)
    assert bound == min(sum(sizes), capacity + sum(overheads)) < sum(sizes)


def test_the_capacity_matched_limit_of_a_job_without_a_tier_is_the_device_limit(tmp_path):
    job = resolve_job("agent-long", get_settings())
    plan = capacity_limit(job, _model(tmp_path), generate("agent-long", 0).shapes)
    device = job.engine.kv_cache_memory_bytes // TINY_BYTES_PER_TOKEN
    assert plan.name == LIMIT and plan.max_traces is None and plan.engine_args == job.engine.as_vllm_kwargs()
    assert kv_tokens_per_worker(job, tmp_path) == device and plan.capacity_tokens == int(device * BUDGET_SHARE)


def test_the_capacity_matched_limit_gets_the_host_tier_as_stock_vllm_does(tmp_path):
    job = resolve_job("agent-long-tiered", get_settings())
    plan = capacity_limit(job, _model(tmp_path), [])
    tier = plan.engine_args["kv_transfer_config"]
    extra = tier["kv_connector_extra_config"]  # stock vLLM's LRU, not pronk's trace-aware eviction
    assert tier["kv_connector"] == "OffloadingConnector" and extra["cpu_bytes_to_use"] == 512 << 20
    assert "eviction_policy" not in extra
    assert plan.engine_args["kv_cache_memory_bytes"] == job.engine.kv_cache_memory_bytes  # the same device cache
    device, tiered = job.engine.kv_cache_memory_bytes // TINY_BYTES_PER_TOKEN, (512 << 20) // TINY_BYTES_PER_TOKEN
    assert plan.capacity_tokens == int(held_tokens(device, tiered) * BUDGET_SHARE) > 6 * int(device * BUDGET_SHARE)
    # the tier mirrors the device's blocks: together they hold the larger, not the sum
    assert held_tokens(18_432, 131_072) == 131_072 and held_tokens(18_432, 0) == 18_432


def test_kv_footprint_counts_whole_blocks_and_each_childs_own_tokens():
    child = TraceShape(trace_id="c", system_prompt_tokens=10, steps=[ShapeStep(new_prompt_tokens=5, output_tokens=5)])
    root = TraceShape(
        trace_id="r",
        system_prompt_tokens=200,
        steps=[
            ShapeStep(new_prompt_tokens=50, output_tokens=6, fan_out=[child]),
            ShapeStep(new_prompt_tokens=1, output_tokens=1),
        ],
    )
    assert final_context(root) == 258 and kv_footprint(root, 128) == 3 * 128 + (128 + 128)
    assert kv_footprint(child, 16) == 32


@pytest.mark.parametrize("job_id", ["agent-long", "agent-long-tiered"])
def test_the_compute_only_limit_holds_max_num_seqs_traces_at_once_whole(tmp_path, job_id):
    job = resolve_job(job_id, get_settings())
    shapes = generate("agent-long", 0, traces=100).shapes
    plan = compute_limit(job, _model(tmp_path), shapes)
    assert plan.name == COMPUTE_LIMIT and plan.max_traces == job.engine.max_num_seqs == 32
    assert "kv_transfer_config" not in plan.engine_args  # no tier: the device cache holds everything
    held = plan.engine_args["kv_cache_memory_bytes"] // TINY_BYTES_PER_TOKEN
    largest = sorted((kv_footprint(s, CPU_BLOCK_SIZE) for s in shapes), reverse=True)[:32]  # any 32 at once
    assert sum(largest) == admitted_footprint(shapes, plan.capacity_tokens, 32, CPU_BLOCK_SIZE) < held
    assert plan.engine_args["kv_cache_memory_bytes"] <= COMPUTE_LIMIT_KV_BYTES
    assert {k: v for k, v in plan.engine_args.items() if k != "kv_cache_memory_bytes"} == {
        k: v for k, v in job.engine.as_vllm_kwargs().items() if k != "kv_cache_memory_bytes"
    }


def test_the_compute_only_limit_admits_fewer_within_its_kv_bound_and_keeps_the_jobs_cache_at_least(tmp_path):
    job = resolve_job("agent-long", get_settings())
    shapes = generate("agent-long", 0, traces=100).shapes
    big = compute_limit(job, _model(tmp_path, layers=40), shapes)  # 10x the bytes a token: 32 traces no longer fit
    assert sum(sorted((final_context(s) for s in shapes), reverse=True)[:32]) > big.capacity_tokens
    assert big.engine_args["kv_cache_memory_bytes"] <= COMPUTE_LIMIT_KV_BYTES
    few = compute_limit(job, _model(tmp_path), shapes[:1])
    assert few.engine_args["kv_cache_memory_bytes"] == job.engine.kv_cache_memory_bytes  # max_model_len must fit


def _run(name: str, rate: float, busy: float | None = None) -> AgentRun:
    """A run of 10 traces, one every 1/rate s: `rate` traces a second, steady and over its whole wall time."""
    run = AgentRun(name, 10 / rate, 2, 10, 40, 1000, 800, 100, [1.0], finished_s=[t / rate for t in range(1, 11)])
    run.busy_share = busy
    return run


def _limit(name: str, rate: float) -> AgentRun:
    return AgentRun(name, 10 / rate, 2, 10, 40, 1000, 800, 100, [])  # `rate` traces per wall second


def test_ratios_to_both_limits_and_a_limit_exceeded_in_every_round_is_a_defect():
    rounds = [
        {
            BASELINE: _run(BASELINE, 1.0),
            UNTIERED: _run(UNTIERED, 0.5),
            BATCH: _run(BATCH, batch, busy=0.95),
            FULL: _run(FULL, full, busy=0.8),
            LIMIT: _limit(LIMIT, 2.0),
            COMPUTE_LIMIT: _limit(COMPUTE_LIMIT, 4.0),
        }
        for batch, full in ((2.2, 1.8), (2.4, 2.2), (2.6, 1.6))
    ]
    table = rounds_table(rounds, [0.9] * 3)
    batch, full = table[BATCH], table[FULL]
    assert [round(v, 6) for v in batch["over_limit"]["rounds"]] == [1.1, 1.2, 1.3] and batch["over_limit"]["defect"]
    assert [round(v, 6) for v in full["over_limit"]["rounds"]] == [0.9, 1.1, 0.8] and not full["over_limit"]["defect"]
    assert batch["over_compute_limit"]["median"] == 0.6 and not batch["over_compute_limit"]["defect"]
    assert not any(key in table[name] for name in LIMITS for key in (*LIMITS.values(), "recomputed_over_limit"))
    assert [(d["setup"], d["limit"]) for d in limit_defects(table)] == [(BATCH, LIMIT)]

    rows = {(g["figure"], g["setup"]): g for g in goals(rounds, [0.9] * 3, "agent-long-tiered")}
    to_limit = rows[("traces/s, pronk / capacity-matched limit", BATCH)]
    assert to_limit["defect"] and not to_limit["met"] and to_limit["against"] == LIMIT  # never a goal met
    assert "**defect**" in goals_table([to_limit]) and "**defect**" in setups_table(table)
    compute = rows[("traces/s, pronk / compute-only limit", BATCH)]
    assert compute["goal"] == 0.9 and compute["met"] is False and not compute["defect"]  # 0.6 of it
    assert "| ≥ 0.9 |" in goals_table([compute]) and compute["against"] == COMPUTE_LIMIT
    assert rows[("engine busy share", BATCH)]["met"] and not rows[("engine busy share", FULL)]["met"]
    no_tier = rows[("traces/s, pronk with the tier / stock round-robin, no tier", BATCH)]
    assert no_tier["median"] == 4.8 and no_tier["goal"] is None and no_tier["met"] is None  # issue 41's, retired
    assert "| reported |" in goals_table([no_tier])
    lines = defect_lines(table)
    assert lines.count("**Defect**") == 1 and BATCH in lines and LIMIT in lines


def test_a_run_is_set_against_a_limit_over_its_whole_wall_time_not_its_steady_window():
    bunched = AgentRun(BATCH, 20.0, 2, 10, 40, 1000, 800, 100, [1.0], finished_s=[15 + t / 4 for t in range(1, 11)])
    assert bunched.steady_traces_per_s == 4.0 and bunched.traces_per_s == 0.5
    rounds = [{BASELINE: _run(BASELINE, 1.0), BATCH: bunched, LIMIT: _limit(LIMIT, 1.0)}]
    assert rounds_table(rounds, [0.9])[BATCH]["over_limit"]["rounds"] == [0.5]


def test_a_compute_only_limit_exceeded_is_a_defect_even_with_no_goal():
    rounds = [
        {
            BASELINE: _run(BASELINE, 1.0),
            BATCH: _run(BATCH, 3.0),
            FULL: _run(FULL, 3.0),
            COMPUTE_LIMIT: _limit(COMPUTE_LIMIT, 2.0),
        }
    ]
    rows = [g for g in goals(rounds, [0.9], "cpu") if g["against"] == COMPUTE_LIMIT]
    assert len(rows) == 2 and all(g["defect"] and g["met"] is False for g in rows)


def test_a_goal_against_stock_shows_the_most_the_compute_only_limit_allows():
    rounds = [
        {
            BASELINE: _run(BASELINE, 1.0),
            UNTIERED: _run(UNTIERED, 0.5),
            BATCH: _run(BATCH, 1.2),
            FULL: _run(FULL, 1.2),
            COMPUTE_LIMIT: _limit(COMPUTE_LIMIT, compute),
        }
        for compute in (1.4, 1.5, 1.6)
    ]
    rows = {(g["figure"], g["setup"]): g for g in goals(rounds, [0.9] * 3, "agent-long-tiered")}
    same_tier = rows[("traces/s, pronk with the tier / stock round-robin, same tier", BATCH)]
    no_tier = rows[("traces/s, pronk with the tier / stock round-robin, no tier", BATCH)]
    assert same_tier["reachable"]["median"] == 1.5 and same_tier["goal"] is None  # 41's 2.0x lay above it
    assert no_tier["reachable"]["median"] == 3.0 and no_tier["reachable"]["rounds"] == [2.8, 3.0, 3.2]
    assert rows[("traces/s, pronk / compute-only limit", BATCH)]["reachable"] is None  # not against a stock setup
    assert "most reachable" in goals_table([same_tier]) and "| 1.500 (1.400–1.600) |" in goals_table([same_tier])
    without = [{name: run for name, run in r.items() if name != COMPUTE_LIMIT} for r in rounds]
    assert all(g["reachable"] is None for g in goals(without, [0.9] * 3, "agent-long-tiered"))


def _checked(name: str, wall_s: float, passed: int, finished: list[float]) -> CheckedRun:
    run = AgentRun(name, wall_s, 2, 10, 40, 10_000, 6_000, 300, [1.0], finished_s=finished)
    return CheckedRun(run, CheckCounts(passed=passed, failed=10 - passed), ToolCallCounts(10, 9, 8), 0.05)


def test_agent_real_rounds_carry_both_limits_and_their_defects(tmp_path):
    steady = [float(t) for t in range(1, 11)]  # 1 trace a second, steady and over its 10 s of wall time
    limits = {LIMIT: _limit(LIMIT, 0.9), COMPUTE_LIMIT: _limit(COMPUTE_LIMIT, 2.0)}
    rounds = [CheckedRound(_checked(BASELINE, 300.0, 6, []), _checked(HARNESS, 10.0, 6, steady), limits)] * 2
    table = checked_table(rounds)
    assert set(table) == {BASELINE, HARNESS, LIMIT, COMPUTE_LIMIT}
    assert table[HARNESS]["over_compute_limit"]["median"] == 0.5 and table[HARNESS]["over_limit"]["defect"]
    rows = checked_goals(rounds)
    assert [(g["goal"], g["against"]) for g in rows] == [  # no peer ran: no goal over one
        (None, BASELINE),
        (0.9, LIMIT),
        (None, COMPUTE_LIMIT),
        ("not lower beyond noise", BASELINE),
    ]
    per_dollar, to_limit, *_ = rows
    assert per_dollar["median"] == 30.0 and to_limit["defect"] and not to_limit["met"]
    assert per_dollar["reachable"]["median"] == 60.0  # the compute-only limit's 2 traces/s over stock's 10 in 300 s
    assert to_limit["reachable"] is None  # a limit's own row has no ceiling above it
    path = write_json(tmp_path / "results.json", [], {"profile": "agent-real"}, table, rows)
    entry = json.loads(path.read_text())["profiles"]["agent-real"]
    assert [(d["setup"], d["limit"]) for d in entry["defects"]] == [(HARNESS, LIMIT)]
    assert all("against" in g for g in entry["goals"])


def test_every_goal_row_names_what_it_is_measured_against():
    known = {BASELINE, UNTIERED, IDEAL, ENGINE_CORES, BEST_PEER, *LIMITS}
    assert all(goal.against in known for goal in GOALS)
    for goal in GOALS:  # a ratio to a limit names that limit, and a figure named after a limit is measured on it
        assert (goal.key in LIMITS.values() or goal.key == "recomputed_over_limit") == (goal.against in LIMITS)
        assert (goal.key == "over_best_peer") == (goal.against == BEST_PEER) == ("best vllm-router" in goal.figure)
        if goal.against == LIMIT:
            assert "capacity-matched limit" in goal.figure
        if goal.against == COMPUTE_LIMIT:
            assert "compute-only limit" in goal.figure
    tiered = {(g.key, g.goal) for g in GOALS if "agent-long-tiered" in g.records}
    assert tiered == {
        ("over_best_peer", 1.5),
        ("over_untiered", None),
        ("over_baseline", None),
        ("over_limit", 0.90),
        ("recomputed_over_limit", 1.10),
        ("busy_share", 0.90),
        ("over_compute_limit", 0.90),
    }
    real = {(g.key, g.goal) for g in GOALS if "agent-real" in g.records}
    assert real == {
        ("over_best_peer", 1.3),
        ("over_baseline", None),
        ("over_limit", 0.90),
        ("over_compute_limit", None),
    }
    long = {(g.key, g.goal) for g in GOALS if "agent-long" in g.records}
    assert long == {
        ("over_best_peer", 1.5),
        ("over_baseline", 3.0),
        ("over_limit", 0.80),
        ("cached_ratio_of_ideal", 0.90),
        ("over_compute_limit", None),
    }
    cpu = {(g.key, g.goal) for g in GOALS if "cpu" in g.records}
    assert cpu == {
        ("over_best_peer", 1.2),
        ("over_limit", 0.80),
        ("cached_ratio_of_ideal", 0.90),
        ("over_baseline", 1.4),
        ("over_compute_limit", None),
    }


def test_an_experiments_own_entries_have_no_limit_defects():
    assert limit_defects({"seeds": [{"seed": 0}], BATCH: {"over_limit": {"defect": True, "median": 1.2}}}) == [
        {"setup": BATCH, "limit": LIMIT, "key": "over_limit", "defect": True, "median": 1.2}
    ]
