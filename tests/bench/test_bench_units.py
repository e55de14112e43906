"""Unit tests of the benchmark's pieces that need no server: workload, figures, report files, log parsing."""

from __future__ import annotations

import asyncio
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from bench.experiments.probe import Load, load_figures
from bench.harness.agent_loop import OpenAIServers, replay
from bench.harness.baseline import engine_flags, processing_seconds, untiered
from bench.harness.figures import (
    BASELINE,
    BATCH,
    FULL,
    LIMIT,
    UNTIERED,
    AgentRun,
    Comparison,
    EngineLoad,
    percentile,
    record_key,
    rounds_table,
    run_figures,
    steady_rate,
    steady_window,
    worker_moves,
)
from bench.harness.goals import goals
from bench.harness.pronk_runs import (
    EngineCounters,
    OneOrder,
    counters_in_metrics,
    engine_core_seconds,
    running_in_metrics,
    sampling,
)
from bench.harness.report import goals_table, markdown_table, setups_table, write_json
from bench.harness.results_md import write_results_md
from bench.harness.suite import relabel
from bench.harness.workload import PROFILES, cache_bounds, generate
from pronk.engine.worker import COMPACT_JSON_OUTPUTS
from pronk.engine.worker_protocol import ChatMessage, SamplingSpec, StepRequest
from pronk.jobs.catalog import resolve_job
from pronk.settings import get_settings
from tests.pronk.agents.test_replay import EchoRouter


def _contexts(shape, start=0):
    context = start + shape.system_prompt_tokens
    for step in shape.steps:
        context += step.new_prompt_tokens + step.output_tokens
        for child in step.fan_out:
            yield from _contexts(child, context)
    yield context


def test_workload_is_seeded_capped_and_fans_out():
    one, again, other = generate("cpu", 3), generate("cpu", 3), generate("cpu", 4)
    assert one.shapes == again.shapes and one.shapes != other.shapes
    cap = PROFILES["cpu"].max_context_tokens
    assert all(c <= cap for shape in one.shapes for c in _contexts(shape))
    assert all(shape.steps[-1].tool_gap_s == 0 for shape in one.shapes)
    assert any(step.fan_out for shape in one.shapes for step in shape.steps)
    low, high = PROFILES["cpu"].output_tokens
    assert all(low <= step.output_tokens <= high for shape in one.shapes for step in shape.steps)
    mean_context, ideal = cache_bounds(one, 128)
    assert 0 < ideal < 1 and mean_context < cap


def test_relabel_gives_each_setup_its_own_trace_ids():
    shapes = generate("smoke", 0).shapes
    relabelled = relabel(shapes, "base")
    assert [s.trace_id for s in relabelled] == [f"base-{s.trace_id}" for s in shapes]
    assert [s.total_output_tokens() for s in relabelled] == [s.total_output_tokens() for s in shapes]


def test_figures_and_ratios():
    run = AgentRun(
        "x",
        wall_s=10.0,
        workers=2,
        traces=5,
        steps=20,
        prompt_tokens=1000,
        cached_tokens=600,
        output_tokens=400,
        trace_seconds=[1, 2, 3, 4],
    )
    assert run.traces_per_s == 0.5 and run.tasks_per_worker_hour == 900.0 and run.tasks_per_dollar(0.05) == 18000.0
    assert run.cached_ratio == 0.6 and percentile([1, 2, 3, 4], 50) == 2.5
    faster = Comparison("t", "s", pronk=2.0, baseline=4.0, higher_is_better=False)
    assert faster.ratio == 0.5 and not faster.pronk_loses
    assert Comparison("r", "1/s", pronk=1.0, baseline=2.0).pronk_loses
    assert Comparison("lag", "s", pronk=1.0, baseline=None).ratio is None
    table = markdown_table([faster, Comparison("r", "1/s", 1.0, 2.0)])
    verdicts = [row.split("|")[-2].strip() for row in table.splitlines()]
    assert verdicts[2:] == ["pronk wins", "pronk loses"]
    assert markdown_table([Comparison("rate", "passed/checked", 0.5, 0.5)]).endswith("| even |")


def test_vllm_flags_and_progress_parsing():
    flags = engine_flags(resolve_job("job-c0ffee01", get_settings()))
    assert "--enable-prefix-caching" in flags and flags[flags.index("--kv-cache-memory-bytes") + 1] == "67108864"
    assert json.loads(flags[flags.index("--structured-outputs-config") + 1]) == COMPACT_JSON_OUTPUTS  # as the workers
    assert processing_seconds("x\nRunning batch: 100% Completed | 64/64 [00:12<00:00,  5.00req/s]\n") == 12.8
    assert processing_seconds("Running batch: 100% Completed | 10/10 [01:10<00:00,  2.00s/req]") == 20.0
    assert processing_seconds("no bar") is None
    assert "--kv-transfer-config" not in flags
    tiered = json.loads(
        (f := engine_flags(resolve_job("agent-long-tiered", get_settings())))[f.index("--kv-transfer-config") + 1]
    )
    extra = tiered["kv_connector_extra_config"]  # pronk's copy spec on CPU, vLLM's LRU: no trace-aware policy
    assert tiered["kv_connector"] == "OffloadingConnector" and extra["cpu_bytes_to_use"] == 512 << 20
    assert extra["spec_module_path"] == "pronk.engine.kv_tier" and "eviction_policy" not in extra


def test_worker_moves_counts_steps_that_left_their_trace_worker():
    steps = [("a", 0, "w0", 90), ("a", 1, "w0", 5), ("a", 2, "w1", 700), ("b", 0, "w1", 80), ("b", 1, "w0", 300)]
    assert worker_moves(steps) == (2 / 3, 1000)  # moved: a's step 2 and b's step 1, of 3 with a previous step


def test_agent_long_profile_is_prefill_dominated_and_fits_16k():
    from bench.harness.workload import PROFILES as profiles

    profile = profiles["agent-long"]
    workload = generate("agent-long", 0)
    assert len(workload.shapes) == profile.traces and workload.steps_cut_by_cap == 0
    for shape in workload.shapes:
        assert 2000 <= shape.system_prompt_tokens <= 4000 and 6 <= len(shape.steps) <= 12
        assert all(8 <= s.output_tokens <= 32 and 300 <= s.new_prompt_tokens <= 1500 for s in shape.steps)
        assert not any(s.fan_out for s in shape.steps)
        assert max(_contexts(shape)) <= profile.max_context_tokens
    mean_context, ideal = cache_bounds(workload, 128)
    assert 6000 < mean_context < 14000 and 0.7 < ideal < 0.95


def test_agent_long_job_runs_16k_positions_and_oversubscribes_its_cache():
    job = resolve_job("agent-long", get_settings())
    assert job.engine.hf_overrides == {"max_position_embeddings": 16384} and job.engine.max_model_len == 16384
    flags = engine_flags(job)
    assert json.loads(flags[flags.index("--hf-overrides") + 1]) == {"max_position_embeddings": 16384}
    assert "--scheduling-policy" not in flags  # the stock baseline keeps vLLM's default order (fcfs)
    assert job.scheduling.priority and job.scheduling.admission == "kv_budget"
    tokens = job.engine.kv_cache_memory_bytes // (2 * 4 * 2 * 64 * 4)  # tiny model: 4 layers, 2 KV heads of 64, fp32
    mean_context, _ = cache_bounds(generate("agent-long", 0), 128)
    working_set = job.scheduling.max_concurrency / job.workers * mean_context
    assert tokens >= job.engine.max_model_len and 2.0 <= working_set / tokens <= 3.0
    assert PROFILES["agent-long"].traces >= 3 * job.scheduling.max_concurrency


def test_steady_rate_leaves_out_start_and_tail():
    assert math.isnan(steady_rate([1.0, 2.0, 3.0]))
    # 10 completions one second apart, then a long tail: the middle 80% (2nd to 9th) span 7 s for 7 traces
    assert steady_rate([float(t) for t in range(1, 10)] + [100.0]) == 1.0


def test_rounds_keep_every_value_and_goals_use_the_same_round():
    def run(name, rate, cached):
        return AgentRun(
            name,
            wall_s=10 / rate,
            workers=2,
            traces=10,
            steps=40,
            prompt_tokens=1000,
            cached_tokens=cached,
            output_tokens=100,
            trace_seconds=[1.0],
            finished_s=[t / rate for t in range(1, 11)],
            preemptions=3,
        )

    limit = AgentRun(LIMIT, 2.5, 2, 10, 40, 1000, 900, 100, [])  # 4 traces per wall second
    rounds = [
        {BASELINE: run(BASELINE, 1.0, 200), BATCH: run(BATCH, 2.0, 800), FULL: run(FULL, 2.0, 800), LIMIT: limit},
        {BASELINE: run(BASELINE, 2.0, 200), BATCH: run(BATCH, 3.0, 800), FULL: run(FULL, 3.0, 800), LIMIT: limit},
        {BASELINE: run(BASELINE, 1.0, 200), BATCH: run(BATCH, 4.0, 900), FULL: run(FULL, 4.0, 900), LIMIT: limit},
    ]
    table = rounds_table(rounds, [0.9, 0.9, 0.9])
    assert [round(v, 6) for v in table[FULL]["over_limit"]["rounds"]] == [0.5, 0.75, 1.0]
    assert "over_limit" not in table[LIMIT]
    rates = table[BATCH]["over_baseline"]
    assert [round(v, 6) for v in rates["rounds"]] == [2.0, 1.5, 4.0] and rates["median"] == 2.0
    assert rates["min"] == 1.5 and rates["max"] == 4.0 and "over_baseline" not in table[BASELINE]
    assert table[BATCH]["cached_ratio_of_ideal"]["rounds"][2] == 1.0 and table[FULL]["preemptions"]["median"] == 3
    rows = goals(rounds, [0.9, 0.9, 0.9], "agent-long")
    speed = next(g for g in rows if g["setup"] == BATCH and g["figure"].startswith("agent-long"))
    assert speed["goal"] == 3.0 and not speed["met"] and speed["rounds"] == rates["rounds"]
    assert not any(g["figure"].startswith("today's") for g in rows)


def test_replay_gap_scale_multiplies_every_tool_gap(monkeypatch):
    slept = []
    real_sleep = asyncio.sleep

    async def sleep(seconds):
        slept.append(seconds)
        await real_sleep(0)

    def tool_gaps(shape):
        for step in shape.steps:
            yield from [step.tool_gap_s] if step.tool_gap_s else []
            for child in step.fan_out:
                yield from tool_gaps(child)

    shapes = generate("smoke", 3).shapes
    gaps = sorted(g for shape in shapes for g in tool_gaps(shape))
    monkeypatch.setattr(asyncio, "sleep", sleep)
    for scale in (0.0, 0.5):
        slept.clear()
        result = asyncio.run(replay(shapes, EchoRouter(), 2, gap_scale=scale))
        assert len(result.traces) == len(shapes) and not result.errors
        assert sorted(slept) == [g * scale for g in gaps]


def test_a_replays_load_samples_and_completions_count_from_one_start():
    async def read() -> list[int]:
        await asyncio.sleep(0)
        return [1]

    before = time.monotonic()
    replayed = replay(generate("smoke", 3).shapes, EchoRouter(), 2, gap_scale=0.0)
    result, samples = asyncio.run(sampling(replayed, read, interval_s=0.001))
    run = AgentRun.from_replay("x", result, 1)
    run.note_load([(at, [EngineLoad(n) for n in counts]) for at, counts in samples], 1)
    assert before <= result.started == run.started and run.finished_s and run.load_samples
    assert all(0.0 <= at <= run.wall_s + 0.1 for at, _ in run.load_samples)  # inside the run, on its clock
    assert all(0.0 < end <= run.wall_s for end in run.finished_s)


def test_preemptions_and_host_tier_counts_from_vllm_metrics():
    page = (
        "# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.\n"
        'vllm:num_preemptions_total{engine="0",model_name="m"} 7.0\n'
        'vllm:num_preemptions_total{engine="1",model_name="m"} 2.0\n'
        "vllm:num_requests_running 1.0\n"
        'vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="local_compute"} 900.0\n'
        'vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="external_kv_transfer"} 512.0\n'
        'vllm:kv_offload_load_time_total{engine="0",model_name="m"} 0.25\n'
        'vllm:kv_offload_store_time_total{engine="0",model_name="m"} 0.5\n'
        'vllm:kv_offload_load_bytes_total{engine="0",model_name="m"} 2097152.0\n'
    )
    assert counters_in_metrics(page, tiered=False) == EngineCounters(9)
    assert counters_in_metrics(page, tiered=True) == EngineCounters(9, 512, 0.75)
    assert counters_in_metrics("", tiered=True) == EngineCounters(0, 0, 0.0)
    run = AgentRun("x", 1.0, 2, 1, 1, 1, 0, 1, [])
    EngineCounters(9, 512, 0.75).note_run(run, EngineCounters(4, 500, 0.5))
    assert (run.preemptions, run.tier_loaded_tokens, run.tier_copy_s) == (5, 12, 0.25)
    EngineCounters(9).note_run(run := AgentRun("y", 1.0, 2, 1, 1, 1, 0, 1, []), EngineCounters(9))
    assert (run.preemptions, run.tier_loaded_tokens, run.tier_copy_s) == (0, None, None)


def test_engine_load_is_sampled_through_a_run_and_a_missed_sample_never_fails_it():
    page = 'vllm:num_requests_running{engine="0",model_name="m"} 3.0\nvllm:num_requests_waiting{engine="0"} 7.0\n'
    assert running_in_metrics(page) == 3 and running_in_metrics("") == 0
    answers = iter([[1, 0], httpx.ConnectError("down"), [2, 1]])

    async def read() -> list[int]:
        answer = next(answers, [0, 0])
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def work() -> str:
        await asyncio.sleep(0.2)
        return "done"

    before = time.monotonic()
    result, samples = asyncio.run(sampling(work(), read, interval_s=0.01))
    running = [value for _, value in samples]
    assert result == "done" and running[:2] == [[1, 0], [2, 1]] and [1, 0] not in running[2:]
    times = [at for at, _ in samples]
    assert before <= times[0] and times == sorted(times) and times[-1] <= time.monotonic()  # on time.monotonic()
    run = AgentRun("x", 1.0, 2, 1, 1, 1, 0, 1, [], started=10.0)
    loads = [  # each engine's running requests, and its core process's CPU seconds so far
        [EngineLoad(1, 0.0), EngineLoad(0, 5.0)],
        [EngineLoad(2, 0.5), EngineLoad(1, 5.0)],
        [EngineLoad(0, 1.5), EngineLoad(0, 5.5)],
        [EngineLoad(3, 1.5), EngineLoad(0, 5.75)],
    ]
    run.note_load([(10.5, loads[0]), (11.0, loads[1]), (11.5, loads[2]), (12.0, loads[3])], 1)
    assert run.busy_share == (1.5 / 1.5 + 0.75 / 1.5) / 2 and run.running_per_worker == 7 / 8
    assert run.load_samples[0] == (0.5, loads[0]) and run.load_samples[-1][0] == 2.0  # s from the run's start
    assert run.busy_share_steady is None  # one completion: no steady window
    assert run.runnable_share is None  # no wait readings
    run.note_load([(10.5, loads[0]), (12.0, loads[3])], 2)  # two cores an engine: the same CPU time, half as busy
    assert run.busy_share == (1.5 / 1.5 + 0.75 / 1.5) / 4
    waited = [[EngineLoad(1, 0.0, 1.0), EngineLoad(0, 5.0, 2.0)], [EngineLoad(0, 1.0, 1.25), EngineLoad(0, 5.5, 2.5)]]
    run.note_load([(10.0, waited[0]), (12.0, waited[1])], 1)  # ready to run but off its core: had work, not busy
    assert run.busy_share == (1.0 / 2 + 0.5 / 2) / 2 and run.runnable_share == (1.25 / 2 + 1.0 / 2) / 2
    assert run_figures(run, 0.9)["runnable_share"] == run.runnable_share
    unread = AgentRun("x", 1.0, 2, 1, 1, 1, 0, 1, [], started=10.0)
    unread.note_load([(10.5, [EngineLoad(1), EngineLoad(0)]), (11.0, [EngineLoad(2), EngineLoad(1)])], 1)
    assert unread.busy_share is None and unread.running_per_worker == 1.0  # no CPU readings: the gauge alone
    unsampled = AgentRun("y", 1.0, 2, 1, 1, 1, 0, 1, [], started=0.0)
    unsampled.note_load([], 1)  # no sample answered: the figures stay unknown
    assert unsampled.busy_share is None and unsampled.running_per_worker is None
    assert math.isnan(run_figures(unsampled, 0.9)["busy_share_steady"])


ENGINE_CORE_CHILD = """
import ctypes, sys, time
ctypes.CDLL(None).prctl(15, b"EngineCore", 0, 0, 0)  # PR_SET_NAME, as vLLM titles its engine core process
end = time.process_time() + 0.3
while time.process_time() < end:
    pass
print("computed", flush=True)
sys.stdin.read()
"""


def test_an_engines_busy_time_is_its_engine_core_process_cpu_time_and_its_wait_its_main_threads():
    child = subprocess.Popen(
        [sys.executable, "-c", ENGINE_CORE_CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == "computed\n"
        cpu, wait = engine_core_seconds(os.getpid())  # read while the child lives: it is this process's child
        assert cpu is not None and cpu >= 0.3
        schedstat = Path(f"/proc/{child.pid}/schedstat").read_text().split()
        assert wait is not None and 0.0 <= wait <= int(schedstat[1]) / 1e9  # its main thread's run-queue wait so far
        assert engine_core_seconds(child.pid) == (None, None)  # no engine core under the child itself
    finally:
        child.communicate("")
    assert engine_core_seconds(child.pid) == (None, None)  # an ended process


def test_steady_window_is_the_window_of_the_steady_rate():
    assert steady_window([1.0, 2.0, 3.0, 4.0]) is None and math.isnan(steady_rate([1.0, 2.0, 3.0, 4.0]))
    finished = [0.5, 3.0, 9.0, 1.0, 2.0, 4.0, 5.0, 6.0, 7.0, 30.0]
    for trim, window in ((0.1, (1.0, 9.0)), (0.2, (2.0, 7.0))):  # the 2nd and 9th, the 3rd and 8th of 10
        first, last = steady_window(finished, trim) or (math.nan, math.nan)
        inside = sum(first <= t <= last for t in finished)  # the rate counts the completions after the window's first
        assert (first, last) == window and steady_rate(finished, trim) == (inside - 1) / (last - first)


def test_engines_idle_only_at_the_start_and_the_tail_are_busy_all_through_the_steady_window():
    finished = [float(t) for t in range(10, 20)]  # window: 11 s to 18 s from the start
    run = AgentRun("x", 25.0, 2, 10, 40, 1000, 800, 100, [1.0], finished_s=finished, started=100.0)

    def cpu_at(t: int) -> float:  # each engine computes from 10 s to 20 s, and only then
        return float(min(max(t - 10, 0), 10))

    def at(t: int, running: list[int]) -> tuple[float, list[EngineLoad]]:
        return 100.0 + t, [EngineLoad(n, cpu_at(t)) for n in running]

    idle = [at(t, [0, 0]) for t in range(0, 10)] + [at(t, [0, 0]) for t in range(20, 25)]
    busy = [at(t, [2, 1]) for t in range(10, 20)]
    run.note_load(sorted(idle + busy), 1)
    assert run.busy_share == 10 / 24 and run.busy_share_steady == 1.0  # samples from 0 s to 24 s
    assert run.running_per_worker == 30 / 50 and run.running_per_worker_steady == 1.5
    figures = run_figures(run, 0.9)
    assert figures["busy_share"] == 10 / 24 and figures["busy_share_steady"] == 1.0
    table = rounds_table([{BATCH: run}], [0.9])
    assert table[BATCH]["busy_share_steady"]["median"] == 1.0 and "busy share, steady window" in setups_table(table)
    between = AgentRun("y", 25.0, 2, 10, 40, 1000, 800, 100, [1.0], finished_s=finished, started=100.0)
    between.note_load(idle, 1)  # samples only outside the window: nothing to say of it
    assert between.busy_share == 10 / 24 and between.busy_share_steady is None
    with pytest.raises(ValueError, match="no start"):  # samples of a run with no known start cannot be placed
        AgentRun("z", 1.0, 2, 1, 1, 1, 0, 1, []).note_load(busy, 1)


def test_a_tiered_record_has_its_own_key_the_untiered_baseline_and_the_tier_goals():
    def run(name: str, rate: float, recomputed: int, loaded: int | None) -> AgentRun:
        return AgentRun(
            name,
            10.0,
            2,
            10,
            40,
            1000,
            1000 - recomputed,
            100,
            [1.0],
            finished_s=[t / rate for t in range(1, 11)],
            tier_loaded_tokens=loaded,
            tier_copy_s=None if loaded is None else 0.1,
        )

    one = {
        BASELINE: run(BASELINE, 2.0, 300, 50),
        UNTIERED: run(UNTIERED, 1.0, 500, None),
        BATCH: run(BATCH, 3.0, 220, 80),
        FULL: run(FULL, 3.0, 220, 80),
        LIMIT: AgentRun(LIMIT, 2.5, 2, 10, 40, 1000, 800, 100, []),
    }
    table = rounds_table([one], [0.9])
    assert table[BATCH]["over_untiered"]["median"] == 3.0 and table[BATCH]["over_baseline"]["median"] == 1.5
    assert table[BATCH]["recomputed_over_limit"]["median"] == 1.1 and "over_untiered" not in table[UNTIERED]
    assert record_key("agent-long", tiered=True) == "agent-long-tiered" and record_key("cpu", tiered=False) == "cpu"
    rows = {(g["figure"], g["setup"]): g for g in goals([one], [0.9], "agent-long-tiered")}
    assert len(rows) == 10 and not any(g["figure"].startswith("agent-long traces/s") for g in rows.values())
    recomputed = rows[("recomputed prompt tokens, pronk / the capacity-matched limit's", BATCH)]
    assert recomputed["ceiling"] and recomputed["met"] and "≤ 1.1" in goals_table([recomputed])
    assert recomputed["against"] == LIMIT
    same_tier = rows[("traces/s, pronk with the tier / stock round-robin, same tier", BATCH)]
    assert same_tier["goal"] is None and same_tier["median"] == 1.5  # issue 41's 2.0x, retired: reported
    assert "tokens loaded from the tier" in setups_table(table)
    assert "tier" not in setups_table({BASELINE: table[UNTIERED]})


def test_probe_load_figures_per_worker():
    # two workers, four samples: w0 runs a step in 3, w1 in 1; steps wait for room in samples 2 and 3
    samples = [
        [Load(1, 0, 2, 5), Load(0, 0, 1, 0)],
        [Load(1, 1, 2, 5), Load(0, 0, 1, 0)],
        [Load(0, 0, 3, 6), Load(0, 2, 2, 1)],
        [Load(2, 0, 3, 7), Load(1, 0, 2, 1)],
    ]
    assert load_figures(samples) == {
        "busy": [0.75, 0.25],
        "idle_with_waiters": [0.25, 0.5],
        "resident": [2.5, 1.5],
        "paused": [2, 1],
    }
    assert load_figures([])["busy"] == []


def test_one_order_stamps_every_step_with_one_start_time():
    seen = []

    class Router:
        async def generate(self, request):
            seen.append(request.trace_started_at)

        async def finish(self, trace_id):
            seen.append(trace_id)

        async def aclose(self):
            pass

    from pronk.engine.worker_protocol import SamplingSpec, StepRequest

    wrapped = OneOrder(Router())
    request = StepRequest(
        request_id="r", prompt_token_ids=[1, 2], sampling=SamplingSpec(max_tokens=1), trace_id="t", trace_started_at=5.0
    )
    asyncio.run(wrapped.generate(request))
    asyncio.run(wrapped.finish("t"))
    assert seen == [1.0, "t"]


def test_results_json_and_md_keep_each_profile(tmp_path):
    path = tmp_path / "results.json"
    write_json(path, [], {"profile": "cpu"})
    write_json(path, [], {"profile": "agent-long"}, {"s": {}}, [{"figure": "x"}])
    data = json.loads(path.read_text())["profiles"]
    assert set(data) == {"cpu", "agent-long"} and data["agent-long"]["goals"] == [{"figure": "x"}]
    md = tmp_path / "RESULTS.md"
    write_results_md(md, "## cpu section", "cpu")
    write_results_md(md, "## long section", "agent-long")
    write_results_md(md, "## long again", "agent-long")
    text = md.read_text()
    assert "## cpu section" in text and "## long again" in text and "## long section" not in text


def test_gpu_check_job_is_a_valid_dummy_weight_cuda_job(tmp_path):
    from bench.experiments.gpu_check import KV_BYTES_PER_TOKEN, MAX_MODEL_LEN, write_job

    job = write_job(tmp_path / "jobs", tmp_path / "model", 16, MAX_MODEL_LEN + 256, host_tier_bytes=2**33)
    assert job.device == "cuda" and job.engine.load_format == "dummy" and job.scheduling.admission == "kv_budget"
    assert job.engine.kv_cache_memory_bytes == (MAX_MODEL_LEN + 256) * KV_BYTES_PER_TOKEN
    flags = engine_flags(job)
    assert "--load-format" in flags
    # on CUDA the stock servers' tier is vLLM's own CPU offloading, not pronk's copy spec
    tier = json.loads(flags[flags.index("--kv-transfer-config") + 1])
    assert tier["kv_connector"] == "OffloadingConnector" and "spec_module_path" not in tier["kv_connector_extra_config"]
    assert tier["kv_connector_extra_config"]["cpu_bytes_to_use"] == 2**33
    assert "--kv-transfer-config" not in engine_flags(untiered(job))


def test_results_json_keeps_the_first_bench_one_profile_file(tmp_path):
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"meta": {"profile": "cpu"}, "comparisons": [{"name": "old"}]}))
    write_json(path, [], {"profile": "agent-long"})
    profiles = json.loads(path.read_text())["profiles"]
    assert profiles["cpu"]["comparisons"] == [{"name": "old"}] and "agent-long" in profiles


SCHEMA = {"type": "object", "properties": {"final": {"type": "string"}}, "required": ["final"]}


def _step(**sampling) -> StepRequest:
    messages = [ChatMessage(role="system", content="s"), ChatMessage(role="tool", content="[python ok] 42")]
    return StepRequest(request_id="r", messages=messages, sampling=SamplingSpec(**sampling))


def test_a_chat_step_goes_to_stock_vllm_as_a_chat_completion_with_its_schema():
    servers = OpenAIServers(["http://a"], "smol")
    path, body = servers.request_body(_step(max_tokens=7, temperature=0.0, seed=3, stop=["\n"], json_schema=SCHEMA))
    assert path == "/v1/chat/completions"
    assert body == {
        "model": "smol",
        "messages": [{"role": "system", "content": "s"}, {"role": "tool", "content": "[python ok] 42"}],
        "max_completion_tokens": 7,
        "temperature": 0.0,
        "top_p": 1.0,
        "seed": 3,
        "stop": ["\n"],
        "ignore_eos": False,
        "return_token_ids": True,
        "response_format": {"type": "json_schema", "json_schema": {"name": "step", "schema": SCHEMA}},
    }
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    read = ChatCompletionRequest.model_validate(body)  # vLLM 0.32's server reads the schema as structured outputs
    assert read.extract_structured_outputs().json == SCHEMA
    sampling = read.to_sampling_params(7, {})
    assert (sampling.seed, sampling.stop, sampling.max_tokens, sampling.temperature) == (3, ["\n"], 7, 0.0)

    plain = servers.request_body(StepRequest(request_id="p", prompt_token_ids=[5, 6], sampling=SamplingSpec()))
    assert plain[0] == "/v1/completions" and plain[1]["prompt"] == [5, 6] and plain[1]["max_tokens"] == 256
    assert "seed" not in plain[1] and "stop" not in plain[1] and "response_format" not in plain[1]
    asyncio.run(servers.aclose())


def test_a_chat_completion_answer_becomes_a_step_result():
    sent = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append((request.url.path, json.loads(request.content)))
        return httpx.Response(
            200,
            json={
                "choices": [{"message": {"role": "assistant", "content": '{"final":"42"}'}, "token_ids": [1, 2, 3]}],
                "usage": {
                    "prompt_tokens": 900,
                    "completion_tokens": 3,
                    "prompt_tokens_details": {"cached_tokens": 768},
                },
            },
        )

    servers = OpenAIServers(["http://a", "http://b"], "smol")
    servers._http = httpx.AsyncClient(transport=httpx.MockTransport(answer))

    async def two():
        try:
            return [await servers.generate(_step(json_schema=SCHEMA)) for _ in range(2)]
        finally:
            await servers.aclose()

    first, second = asyncio.run(two())
    assert [path for path, _ in sent] == ["/v1/chat/completions"] * 2
    assert first.text == '{"final":"42"}' and first.token_ids == [1, 2, 3] and first.finish_reason == "stop"
    assert (first.prompt_tokens, first.cached_tokens, first.completion_tokens) == (900, 768, 3)
    assert (first.worker_id, second.worker_id) == ("vllm-server-0", "vllm-server-1")  # round-robin
