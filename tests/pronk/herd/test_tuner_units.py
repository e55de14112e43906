"""Tuner pieces that need no workers: knob values as job changes, what needs new workers, a trial's figures."""

from __future__ import annotations

import pytest

from pronk.agents.replay import TraceRecord
from pronk.agents.step_records import StepRecord
from pronk.herd.trial import measure, restart_key
from pronk.herd.tuner import KNOBS, LIVE_KNOBS, TuneConfig, Tuner, changes_of, chosen_knobs, fit_to_cores
from pronk.jobs.catalog import resolve_job
from pronk.jobs.sections import merge_sections
from pronk.jobs.versions import with_changes
from pronk.settings import get_settings


def test_knobs_become_job_changes():
    changes = changes_of({"max_num_seqs": 16, "routing": "least_loaded", "max_concurrency": 8, "workers": 1})
    assert changes == {
        "engine": {"max_num_seqs": 16},
        "scheduling": {"routing": "least_loaded", "max_concurrency": 8},
        "workers": 1,
    }
    job = with_changes(resolve_job("job-c0ffee01", get_settings(), versions=False), changes)
    assert (job.engine.max_num_seqs, job.engine.max_model_len, job.scheduling.routing) == (16, 4096, "least_loaded")


def test_live_knobs_need_no_new_workers():
    job = resolve_job("job-c0ffee01", get_settings(), versions=False)
    every_live = {"admission": "kv_budget", "kv_pin_ttl_s": 5.0, "kv_pin_ttl": "auto", "routing": "least_loaded",
                  "concurrency": "adaptive", "max_concurrency": 4}  # fmt: skip
    assert set(every_live) == set(LIVE_KNOBS)
    assert restart_key(with_changes(job, changes_of(every_live))) == restart_key(job)
    for knob in (
        "max_num_seqs",
        "max_num_batched_tokens",
        "priority",
        "kv_budget_headroom",
        "kv_budget_growth_steps",
        "kv_host_tier_bytes",
    ):
        changed = with_changes(job, changes_of({knob: KNOBS[knob][1][-1]}))
        assert restart_key(changed) != restart_key(job), knob
    assert restart_key(with_changes(job, {"workers": 1})) != restart_key(job)


def test_versions_merge_section_by_section():
    merged = merge_sections({"engine": {"max_num_seqs": 16}, "workers": 2}, {"engine": {"seed": 1}, "workers": 1})
    assert merged == {"engine": {"max_num_seqs": 16, "seed": 1}, "workers": 1}


def test_a_trial_is_charged_its_fleet_for_its_wall_time():
    def trace(trace_id: str, duration: float, prompt: int, cached: int) -> TraceRecord:
        row = StepRecord(trace_id, 0, trace_id, worker_id="w", prompt_tokens=prompt, cached_tokens=cached,
                         output_tokens=10)  # fmt: skip
        return TraceRecord(trace_id, [row], duration)

    m = measure([trace("a", 2.0, 100, 50), trace("b", 4.0, 300, 50), RuntimeError("boom")], 36.0, 2, 0.05)
    assert (m.traces, m.completed, m.failed, m.worker_seconds) == (3, 2, 1, 72.0)
    assert m.cost_usd == pytest.approx(72 / 3600 * 0.05)
    assert m.tasks_per_dollar == pytest.approx(2 / m.cost_usd, rel=1e-6)
    assert (m.p50_s, m.cached_ratio, m.output_tokens) == (3.0, 0.25, 20)
    assert m.errors == ["RuntimeError: boom"]


def test_unknown_knobs_are_refused(tmp_path):
    from pronk.settings import Settings

    with pytest.raises(ValueError, match="unknown knobs"):
        Tuner(
            resolve_job("job-c0ffee01", get_settings()), Settings(data_dir=tmp_path), TuneConfig(1.0, knobs=("speed",))
        )
    capped = Tuner(
        resolve_job("job-c0ffee01", get_settings()), Settings(data_dir=tmp_path), TuneConfig(1.0, max_workers=1)
    )
    assert capped.job.workers == 1


def test_chosen_knobs_all_live_or_named():
    assert chosen_knobs(None) == chosen_knobs([]) == tuple(KNOBS)
    assert chosen_knobs(["live"]) == LIVE_KNOBS
    assert chosen_knobs(["concurrency"]) == ("concurrency", "max_concurrency", "kv_host_tier_bytes")
    assert chosen_knobs(["routing", "max_num_seqs"]) == ("routing", "max_num_seqs")


def test_ngram_speculation_becomes_vllms_speculative_config():
    job = with_changes(
        resolve_job("job-c0ffee01", get_settings(), versions=False), changes_of({"speculative_ngram_tokens": 4})
    )
    kwargs = job.engine.as_vllm_kwargs()
    assert kwargs["speculative_config"]["method"] == "ngram"
    assert kwargs["speculative_config"]["num_speculative_tokens"] == 4
    assert "speculative_ngram_tokens" not in kwargs
    assert (
        "speculative_config" not in resolve_job("job-c0ffee01", get_settings(), versions=False).engine.as_vllm_kwargs()
    )


def test_a_worker_with_more_cores_costs_more_and_never_shares_them():
    job = resolve_job("job-c0ffee01", get_settings(), versions=False)  # 2 workers of 1 core
    wider = with_changes(job, changes_of({"cpu_cores_per_worker": 2, "workers": 1}))
    assert wider.price_per_worker_hour == pytest.approx(2 * job.price_per_worker_hour)
    assert fit_to_cores({"cpu_cores_per_worker": 2}, job, cores=2) == {"cpu_cores_per_worker": 2, "workers": 1}
    assert fit_to_cores({"cpu_cores_per_worker": 1}, job, cores=2) == {"cpu_cores_per_worker": 1}
    assert fit_to_cores({"workers": 4, "cpu_cores_per_worker": 2}, job, cores=4)["workers"] == 2
