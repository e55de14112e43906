"""The benchmark kept alive: a small run on the real stack and real stock vLLM servers produces every figure.

It asserts that each setup ran and each figure exists, never a speed.
"""

from __future__ import annotations

import json
import math

import pytest

from bench.figures import Comparison
from bench.suite import BenchConfig, record, run_bench

pytestmark = pytest.mark.e2e


def test_smoke_bench_runs_every_setup_and_reports_every_figure(stack, tmp_path):
    config = BenchConfig(
        profile="smoke", traces=4, single_step_requests=6, work_dir=tmp_path / "work", command="pytest smoke"
    )
    outcome = run_bench(config, stack, echo=lambda _line: None)

    pronk, bare, baseline = outcome["runs"]
    for run in (pronk, bare, baseline):
        assert run.traces == 4 and not run.errors, (run.name, run.errors)
        assert run.output_tokens == outcome["workloads"][0].total_output_tokens()
        assert len(run.trace_seconds) == 4 and run.wall_s > 0
    assert pronk.prefect_lag_s is not None and pronk.orchestration_overhead is not None
    single_pronk, single_vllm = outcome["single"]
    assert single_pronk.completed == single_vllm.completed == 6

    comparisons: list[Comparison] = outcome["comparisons"]
    names = {c.name for c in comparisons}
    for figure in (
        "traces per second",
        "tasks per worker-hour",
        "tasks per dollar",
        "output tokens per second",
        "cached-token ratio",
        "p50 trace completion time",
        "p90 trace completion time",
        "orchestration overhead",
        "Prefect server lag",
    ):
        assert any(figure in name for name in names), figure
    assert any(name.startswith("single-step") for name in names)
    for c in comparisons:
        assert c.pronk is not None and not math.isnan(c.pronk), c.name
        if c.baseline is not None:
            assert c.ratio is not None and c.ratio >= 0, c.name

    md, data, plot = record(config, outcome, outcome["meta"], tmp_path)
    assert "pronk / baseline" in md.read_text() and plot.stat().st_size > 0
    rows = json.loads(data.read_text())["comparisons"]
    assert len(rows) == len(comparisons) and all(
        {"name", "pronk", "baseline", "ratio", "unit"} <= row.keys() for row in rows
    )
