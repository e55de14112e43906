"""The benchmark kept alive: a small run on the real stack and real stock vLLM servers produces every figure.

It asserts that each setup ran and each figure exists, never a speed. A `bench_smoke` test: `make bench-smoke`
runs it, and `make bench` runs it first; `make test` leaves it out (it guards the benchmark, not pronk).
"""

from __future__ import annotations

import json
import math

import pytest

from bench.harness.config import BenchConfig
from bench.harness.figures import (
    BASELINE,
    BATCH,
    COMPUTE_LIMIT,
    FULL,
    HARNESS,
    LIMIT,
    LIMITS,
    PEERS,
    UNTIERED,
    Comparison,
)
from bench.harness.pronk_runs import ABLATIONS
from bench.harness.report import CHECKED_COLUMNS, checked_section, record
from bench.harness.suite import run_bench

pytestmark = [pytest.mark.e2e, pytest.mark.bench_smoke]


def one_round(stack, tmp_path, **fields) -> tuple[BenchConfig, dict]:
    """One round of `python -m bench` with `fields`, on the test stack; its config and outcome."""
    config = BenchConfig(rounds=1, work_dir=tmp_path / "work", command="pytest smoke", **fields)
    return config, run_bench(config, stack, echo=lambda _line: None)


def test_smoke_bench_runs_every_setup_and_reports_every_figure(stack, tmp_path):
    config, outcome = one_round(stack, tmp_path, profile="smoke", traces=6, single_step_requests=6)

    (runs,) = outcome["rounds"]
    assert list(runs) == [BASELINE, *PEERS, *(a.name for a in ABLATIONS), BATCH, LIMIT, COMPUTE_LIMIT]
    for name in PEERS:  # every step's server is known behind the router, from its responses
        assert not math.isnan(runs[name].moved_steps) and runs[name].busy_share is not None, name
    assert set(outcome["meta"]["peer_commands"]) == set(PEERS)
    assert all("vllm-router" in command for command in outcome["meta"]["peer_commands"].values())
    for run in runs.values():
        assert run.traces == 6 and not run.errors, (run.name, run.errors)
        assert run.output_tokens == outcome["workloads"][0].total_output_tokens(), run.name
        assert len(run.finished_s) == 6 and run.wall_s > 0, run.name
        # a limit's traces end in a few waves, so its steady window can be empty on so small a workload
        assert not math.isnan(run.steady_traces_per_s) or run.name in LIMITS, run.name
        assert run.preemptions is not None or run.name in LIMITS
    assert runs[LIMIT].cached_tokens > 0 and runs[COMPUTE_LIMIT].cached_tokens > 0
    pronk = outcome["runs"][0]
    assert pronk.prefect_lag_s is not None and pronk.orchestration_overhead is not None
    single_pronk, single_vllm = outcome["single"]
    assert single_pronk.completed == single_vllm.completed == 6

    setups = outcome["setups"]
    assert set(setups) == set(runs) and {"over_limit", "over_compute_limit"} <= setups[BATCH].keys()
    assert all(len(figures["traces_per_s_steady"]["rounds"]) == 1 for figures in setups.values())
    assert setups[FULL]["over_baseline"]["median"] > 0 and setups[BASELINE]["preemptions"]["median"] is not None
    assert setups[BATCH]["over_best_peer"]["median"] > 0 and "over_best_peer" not in setups[PEERS[0]]
    goal_rows = {(g["figure"], g["setup"]) for g in outcome["goals"]}
    assert ("cached-token ratio / ideal", BATCH) in goal_rows or not outcome["goals"]

    comparisons: list[Comparison] = outcome["comparisons"]
    names = {c.name for c in comparisons}
    for figure in (
        "traces per second (steady state)",
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
    text = md.read_text()
    assert "pronk / baseline" in text and BATCH in text and plot.stat().st_size > 0
    entry = json.loads(data.read_text())["profiles"]["smoke"]
    assert len(entry["comparisons"]) == len(comparisons) and set(entry["setups"]) == set(runs)
    assert all({"name", "pronk", "baseline", "ratio", "unit"} <= row.keys() for row in entry["comparisons"])


def test_agent_real_smoke_runs_both_setups_and_the_limit_and_reports_every_figure(stack, tmp_path):
    """`--profile agent-real` on SmolLM2, tiny: 4 traces with short documents, one round. How many answers pass is the
    model's business; that each is checked, and each figure is there, is the bench's."""
    config, outcome = one_round(stack, tmp_path, job="agent-real", profile="agent-real-smoke", traces=4)

    (checked,) = outcome["rounds"]
    assert set(checked.peers) == set(PEERS)
    for run in (checked.baseline, *checked.peers.values(), checked.pronk):
        assert run.run.traces == 4 and run.checks.checked + run.checks.unchecked == 4, run.run.name
        assert len(run.run.finished_s) == 4 and run.run.wall_s > 0 and run.run.prompt_tokens > 0, run.run.name
        assert run.tool_calls.total > 0 and run.run.preemptions is not None, run.run.name
        assert not math.isnan(run.successes_per_dollar) and run.cost_usd > 0, run.run.name
        assert run.run.busy_share is not None, run.run.name
    assert set(checked.limits) == set(LIMITS)
    assert all(limit.traces == 4 and limit.cached_tokens > 0 for limit in checked.limits.values())

    setups = outcome["setups"]
    assert set(setups) == {BASELINE, *PEERS, HARNESS, LIMIT, COMPUTE_LIMIT}
    for _, key in CHECKED_COLUMNS:
        assert key in setups[HARNESS], key
        assert key in setups[BASELINE] or key.startswith("over_"), key
    assert setups[HARNESS]["over_baseline"]["median"] is not None
    assert setups[HARNESS]["over_best_peer"]["median"] is not None
    peer = outcome["goals"][0]["against"]
    assert peer in PEERS and [g["against"] for g in outcome["goals"]] == [
        peer,
        BASELINE,
        LIMIT,
        COMPUTE_LIMIT,
        BASELINE,
        peer,
    ]
    assert outcome["meta"]["kv"]["cache_share_of_working_set"] > 0
    assert {c.name for c in outcome["comparisons"]} >= {
        "agent-real: checked successes per dollar",
        "agent-real: checked successes per second",
        "agent-real: success rate",
        "agent-real: tool-call validity",
    }

    md, data, plot = record(config, outcome, outcome["meta"], tmp_path, section=checked_section)
    assert "profile `agent-real-smoke`" in md.read_text() and plot.stat().st_size > 0
    entry = json.loads(data.read_text())["profiles"]["agent-real-smoke"]
    assert set(entry["setups"]) == set(setups) and len(entry["goals"]) == 6


def test_a_tiered_job_runs_stock_with_and_without_its_tier_and_counts_the_tier(stack, tmp_path):
    config, outcome = one_round(
        stack, tmp_path, job="agent-long-tiered", profile="smoke", traces=4, single_step_requests=0
    )

    (runs,) = outcome["rounds"]
    assert list(runs) == [BASELINE, UNTIERED, *PEERS, *(a.name for a in ABLATIONS), BATCH, LIMIT, COMPUTE_LIMIT]
    assert all(run.traces == 4 and not run.errors for run in runs.values()), {n: r.errors for n, r in runs.items()}
    assert runs[UNTIERED].tier_loaded_tokens is None and runs[UNTIERED].tier_copy_s is None
    for name in (BASELINE, *PEERS, FULL, BATCH):  # whether anything was evicted and loaded back is the workload's doing
        assert runs[name].tier_loaded_tokens is not None and runs[name].tier_copy_s is not None, name
    assert "over_untiered" in outcome["setups"][BATCH] and "recomputed_over_limit" in outcome["setups"][BATCH]
    for name, run in runs.items():  # every serving setup's engines were sampled through its run
        sampled = (run.busy_share, run.runnable_share, run.running_per_worker, run.moved_recomputed_tokens)
        assert (name in LIMITS) == (None in sampled), (name, sampled)

    md, data, _plot = record(config, outcome, outcome["meta"], tmp_path)
    assert "<!-- bench:smoke-tiered:start -->" in md.read_text() and "KV host tier" in md.read_text()
    assert set(json.loads(data.read_text())["profiles"]) == {"smoke-tiered"}
