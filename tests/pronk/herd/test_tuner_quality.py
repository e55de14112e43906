"""The tuner's quality guard, with stand-ins for the trial fleet, the replay and the labelled run: a whole tuning
(Optuna, MLflow on SQLite, the guard) without a worker. Every candidate is twice as cheap per task as the current
configuration; what the labelled set says decides.

Real workers answering worse under a configuration made so on purpose: `test_herd_e2e.py`'s labelled-set test.
"""

from __future__ import annotations

import json
from dataclasses import replace

import mlflow
import pytest

from pronk.batches.labelled import LabelledSetError
from pronk.batches.schemas import CheckCounts
from pronk.herd import tuner
from pronk.herd.trial import Measurement, restart_key
from pronk.jobs.catalog import resolve_job
from pronk.jobs.schema import JobConfig, QualityConfig
from pronk.jobs.versions import with_changes
from pronk.protocol.shapes import ShapeStep, TraceShape
from pronk.settings import Settings, get_settings
from tests.bench.test_herd_bench import measurement

CURRENT_CONCURRENCY = 32
"""tiny-cpu's `max_concurrency`: the stand-ins tell the current configuration by it."""


class StandInFleet:
    def __init__(self, settings: Settings):
        self.key: str | None = None
        self.starts: list[float] = []
        self.start_timeout_s = 0.0

    def serve(self, candidate: JobConfig) -> JobConfig:
        if restart_key(candidate) != self.key:
            self.key = restart_key(candidate)
            self.starts.append(0.0)
        return candidate.model_copy(update={"job_id": "job-7a1a1000"})

    def stop(self) -> None:
        self.key = None

    def __enter__(self) -> StandInFleet:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def is_current(job: JobConfig) -> bool:
    return job.scheduling.max_concurrency == CURRENT_CONCURRENCY


async def stand_in_replay(job, shapes, settings, time_scale, timeout_s) -> Measurement:
    return replace(measurement(100.0 if is_current(job) else 200.0), wall_s=0.2)


class CountedTuner(tuner.Tuner):
    """Time is counted in replays here: room for the current configuration's two and four candidates, then only
    for the winner's repeat (one 0.2 s replay, not two), whatever the machine's speed."""

    def remaining(self) -> float:
        return 60.0 if len(self.replay_seconds) < 2 + 4 else 0.3


@pytest.fixture(scope="module")
def settings(tmp_path_factory) -> Settings:
    return Settings(data_dir=tmp_path_factory.mktemp("herd-quality"))


def tune(monkeypatch, settings, tmp_path, candidate_tally: CheckCounts | None) -> tuple[tuner.TuneResult, list]:
    """One tuning of tiny-cpu's `max_concurrency`; with `candidate_tally`, the job has a labelled set on which the
    current configuration passes 20 of 20 lines and every candidate gives `candidate_tally`."""
    labelled_runs: list[JobConfig] = []

    async def stand_in_labelled(job, lines, settings) -> CheckCounts:
        labelled_runs.append(job)
        assert candidate_tally is not None
        return CheckCounts(passed=20) if is_current(job) else candidate_tally

    monkeypatch.setattr(tuner, "TrialFleet", StandInFleet)
    monkeypatch.setattr(tuner, "replay_sample", stand_in_replay)
    monkeypatch.setattr(tuner, "run_labelled_set", stand_in_labelled)
    job = resolve_job("tiny-cpu", get_settings(), versions=False)
    assert job.scheduling.max_concurrency == CURRENT_CONCURRENCY
    if candidate_tally is not None:
        line = {"method": "POST", "url": "/v1/chat/completions", "check": {"type": "regex", "pattern": ""},
                "body": {"model": "any", "messages": [{"role": "user", "content": "Say something."}]}}  # fmt: skip
        path = tmp_path / "labelled.jsonl"
        path.write_text("".join(json.dumps({**line, "custom_id": f"q{i}"}) + "\n" for i in range(2)))
        job = job.model_copy(update={"quality": QualityConfig(labelled_set=str(path))})
    # Optuna's sampler may propose the current value too: only `max_concurrency` other than 32 wins
    config = tuner.TuneConfig(budget_minutes=1.0, sample=1, knobs=("max_concurrency",), seed=1)
    shape = TraceShape(trace_id="t", system_prompt_tokens=10, steps=[ShapeStep(new_prompt_tokens=5, output_tokens=5)])
    result = CountedTuner(job, settings, config).tune(traffic=[shape])
    assert [t.label for t in result.trials][-1].endswith(" again")
    return result, labelled_runs


def test_a_winner_cheaper_per_task_but_worse_on_the_labelled_set_is_refused(monkeypatch, settings, tmp_path):
    result, labelled_runs = tune(monkeypatch, settings, tmp_path, CheckCounts(passed=4, failed=16))
    assert result.winner is not None and result.verdict is not None
    assert result.verdict.gain == pytest.approx(2.0) and not result.verdict.accept
    assert "answers worse" in result.verdict.reason
    assert "4/20 passed (20%) against 20/20 passed (100%)" in result.verdict.reason
    # the set ran twice: on the current configuration's first replay and on the winner's repeat, on their fleets
    assert [job.job_id for job in labelled_runs] == ["job-7a1a1000"] * 2
    assert [is_current(job) for job in labelled_runs] == [True, False]
    measured = {row["trial"]: row["labelled"] for row in result.summary()["table"] if row["labelled"]}
    assert measured == {
        "current #1": {"passed": 20, "failed": 0, "unchecked": 0, "success_rate": 1.0},
        f"{result.winner.label} again": {"passed": 4, "failed": 16, "unchecked": 0, "success_rate": 0.2},
    }
    assert "| labelled set |" in result.markdown() and "| 4/20 passed (20%) |" in result.markdown()
    run = mlflow.MlflowClient(settings.tracking_uri).get_run(result.mlflow_run_id)
    assert (run.data.metrics["current_success_rate"], run.data.metrics["winner_success_rate"]) == (1.0, 0.2)
    assert run.data.tags["pronk.herd.accept"] == "False"


def test_a_winner_within_noise_on_the_labelled_set_is_accepted(monkeypatch, settings, tmp_path):
    result, labelled_runs = tune(monkeypatch, settings, tmp_path, CheckCounts(passed=18, failed=2))
    assert result.verdict is not None and result.verdict.accept, result.verdict
    assert "18/20 passed (90%) against 20/20 passed (100%)" in result.verdict.reason
    assert len(labelled_runs) == 2


def test_a_job_without_a_labelled_set_is_judged_on_tasks_per_dollar_alone(monkeypatch, settings, tmp_path):
    result, labelled_runs = tune(monkeypatch, settings, tmp_path, None)
    assert result.verdict is not None and result.verdict.accept and result.verdict.quality is None
    assert labelled_runs == []
    assert all(row["labelled"] is None for row in result.summary()["table"])
    assert "labelled set" not in result.markdown()


def test_a_labelled_set_that_cannot_be_read_stops_the_tuning_before_any_trial(settings, tmp_path):
    job = resolve_job("tiny-cpu", get_settings(), versions=False)
    job = job.model_copy(update={"quality": QualityConfig(labelled_set=str(tmp_path / "missing.jsonl"))})
    with pytest.raises(LabelledSetError, match="cannot read the labelled set"):
        tuner.Tuner(job, settings, tuner.TuneConfig(budget_minutes=1.0)).tune(traffic=[])


def gain_of(job: JobConfig) -> float:
    """The stand-in's tasks per dollar: adaptive concurrency and a host tier each add half of the current's."""
    scheduling = job.scheduling
    return 100.0 * (1 + 0.5 * (scheduling.concurrency == "adaptive") + 0.5 * (scheduling.kv_host_tier_bytes > 0))


@pytest.mark.parametrize(("candidate_tally", "accept"), [(CheckCounts(passed=18, failed=2), True),
                                                         (CheckCounts(passed=4, failed=16), False)])  # fmt: skip
def test_the_concurrency_search_tries_lines_in_flight_and_the_host_tier_together_under_the_guard(
    monkeypatch, settings, tmp_path, candidate_tally, accept
):
    """`--knobs concurrency`: every candidate sets the lines in flight and the tier together, each tier size on a fleet
    of its own (a worker reads it when it starts), and the labelled set decides whether the winner stands."""
    fleets: list[int] = []
    replayed: list[JobConfig] = []

    class TierFleet(StandInFleet):
        def serve(self, candidate: JobConfig) -> JobConfig:
            if restart_key(candidate) != self.key:
                fleets.append(candidate.scheduling.kv_host_tier_bytes)
            return super().serve(candidate)

    async def stand_in_replay(job, shapes, settings, time_scale, timeout_s) -> Measurement:
        replayed.append(job)
        return replace(measurement(gain_of(job)), wall_s=0.2)

    async def stand_in_labelled(job, lines, settings) -> CheckCounts:
        return CheckCounts(passed=20) if gain_of(job) == 100.0 else candidate_tally

    monkeypatch.setattr(tuner, "TrialFleet", TierFleet)
    monkeypatch.setattr(tuner, "replay_sample", stand_in_replay)
    monkeypatch.setattr(tuner, "run_labelled_set", stand_in_labelled)
    job = resolve_job("tiny-cpu", get_settings(), versions=False)
    assert (job.scheduling.concurrency, job.scheduling.kv_host_tier_bytes) == ("fixed", 0)
    line = {"method": "POST", "url": "/v1/chat/completions", "check": {"type": "regex", "pattern": ""},
            "body": {"model": "any", "messages": [{"role": "user", "content": "Say something."}]}}  # fmt: skip
    path = tmp_path / "labelled.jsonl"
    path.write_text("".join(json.dumps({**line, "custom_id": f"q{i}"}) + "\n" for i in range(2)))
    job = job.model_copy(update={"quality": QualityConfig(labelled_set=str(path))})
    config = tuner.TuneConfig(budget_minutes=1.0, sample=1, knobs=tuner.chosen_knobs(["concurrency"]), seed=3)
    shape = TraceShape(trace_id="t", system_prompt_tokens=10, steps=[ShapeStep(new_prompt_tokens=5, output_tokens=5)])
    result = CountedTuner(job, settings, config).tune(traffic=[shape])

    candidates = [t for t in result.trials if t.params]
    assert candidates and all(set(t.params) == set(tuner.CONCURRENCY_KNOBS) for t in candidates)
    assert all(set(t.changes) == {"scheduling"} for t in candidates)
    tiers = [j.scheduling.kv_host_tier_bytes for j in replayed]
    assert fleets == [tier for i, tier in enumerate(tiers) if i == 0 or tier != tiers[i - 1]]
    assert result.winner is not None and result.verdict is not None
    assert gain_of(with_changes(job, result.winner.changes)) > 100.0
    assert result.verdict.accept is accept and result.verdict.quality is not None
