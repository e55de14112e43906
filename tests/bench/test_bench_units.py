"""Unit tests of the benchmark's pieces that need no server: workload, figures, report files, log parsing."""

from __future__ import annotations

from bench.baseline import engine_flags, processing_seconds
from bench.figures import AgentRun, Comparison, percentile, worker_moves
from bench.report import END, START, write_results_md
from bench.suite import relabel
from bench.workload import PROFILES, cache_bounds, generate
from pronk.jobs import get_job


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


def test_results_md_keeps_other_sections(tmp_path):
    path = tmp_path / "RESULTS.md"
    path.write_text("# Benchmark results\n\n## Gap KV\n\nkept\n")
    write_results_md(path, "## main\n\nfirst")
    write_results_md(path, "## main\n\nsecond")
    text = path.read_text()
    assert text.index(START) < text.index("## Gap KV") and "second" in text and "first" not in text
    assert text.count(START) == 1 and text.count(END) == 1 and "kept" in text


def test_vllm_flags_and_progress_parsing():
    flags = engine_flags(get_job("job-c0ffee01"))
    assert "--enable-prefix-caching" in flags and flags[flags.index("--kv-cache-memory-bytes") + 1] == "67108864"
    assert processing_seconds("x\nRunning batch: 100% Completed | 64/64 [00:12<00:00,  5.00req/s]\n") == 12.8
    assert processing_seconds("Running batch: 100% Completed | 10/10 [01:10<00:00,  2.00s/req]") == 20.0
    assert processing_seconds("no bar") is None


def test_worker_moves_counts_steps_that_left_their_trace_worker():
    steps = [("a", 0, "w0"), ("a", 1, "w0"), ("a", 2, "w1"), ("b", 0, "w1"), ("b", 1, "w0")]
    assert worker_moves(steps) == (2, 3)
