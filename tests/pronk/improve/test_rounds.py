"""An improve round's lines, its row and its progress: the training set drawn per round, never the held-out set."""

from __future__ import annotations

import pytest

from pronk.batches.schemas import LinesChecked
from pronk.improve.rounds import ImproveRound, NotImprovable, RoundStore, round_tasks
from pronk.jobs.catalog import resolve_job
from pronk.settings import Settings, get_settings


def test_a_round_draws_its_tasks_by_seed_from_the_training_set():
    settings = get_settings()
    job = resolve_job("smollm2-cpu", settings)
    config = job.improve.model_copy(update={"tasks_per_round": 10})
    first = [line.custom_id for line in round_tasks(job, config, settings, seed=0)[0]]
    assert len(first) == len(set(first)) == 10
    assert first == [line.custom_id for line in round_tasks(job, config, settings, seed=0)[0]]
    assert first != [line.custom_id for line in round_tasks(job, config, settings, seed=1000)[0]]
    every, hints = round_tasks(job, config.model_copy(update={"tasks_per_round": None}), settings, seed=0)
    assert len(every) > 10 and set(first) <= {line.custom_id for line in every}
    assert set(hints) == {line.custom_id for line in every}  # from the same read of the file
    assert round_tasks(job, config.model_copy(update={"hinted_samples": 0}), settings, seed=0)[1] == {}


def test_the_held_out_set_is_never_a_training_set():
    settings = get_settings()
    job = resolve_job("smollm2-cpu", settings)
    config = job.improve.model_copy(update={"training_set": job.quality.labelled_set})
    with pytest.raises(NotImprovable, match="held-out"):
        round_tasks(job, config, settings, seed=0)


def test_a_rounds_row_shows_its_rates_and_loss():
    record = ImproveRound(job_id="job-5a011201", round=1, model="m", parent_version="m/1", version="m/2")
    assert record.row()["held-out before"] is None and record.row()["loss first → last"] == ""


def test_a_running_round_shows_its_rollouts_then_its_training_steps_and_loss_then_its_canary():
    record = ImproveRound(job_id="job-5a011201", round=2, model="m", parent_version="m/1")
    assert record.shown() == ("round 2: rollouts checked", 0, None)
    record.progress.rollouts = LinesChecked(total=96, done=40)
    assert record.shown() == ("round 2: rollouts checked", 40, 96)
    record.status, record.progress.steps = "training", 40
    assert record.shown() == ("round 2: training steps", 0, 40)
    record.progress.trained(3, 0.5349)
    assert record.shown() == ("round 2: training steps, loss 0.535", 3, 40)
    record.status = "leaping"
    assert record.shown() == ("round 2: leaping", 0, None)  # before its canary has begun
    assert record.shown(LinesChecked(total=64, done=12)) == ("round 2: canary lines checked", 12, 64)
    record.finish("nothing_to_learn", "no rollout passed")
    assert record.shown() == ("round 2: nothing to learn", 0, None)


def test_the_store_keeps_each_jobs_latest_round(tmp_path):
    store = RoundStore(Settings(data_dir=tmp_path, storage_uri=str(tmp_path / "store")))
    assert store.latest("job-5a011201") is None
    first = ImproveRound(job_id="job-5a011201", round=1, model="m", parent_version="m/1")
    second = ImproveRound(job_id="job-5a011201", round=2, model="m", parent_version="m/2")
    other = ImproveRound(job_id="job-c0ffee01", round=1, model="t", parent_version="t/1")
    for record in (first, second, other):
        store.save(record)
    second.progress.rollouts.done = 5
    store.save(second)
    assert store.latest("job-5a011201") == second and store.latest("job-c0ffee01") == other
