"""An improve round's lines and its row: the training set drawn per round, never the held-out set."""

from __future__ import annotations

import pytest

from pronk.jobs.files import get_job
from pronk.learn.rounds import ImproveRound, NotImprovable, training_lines
from pronk.settings import get_settings


def test_a_round_draws_its_tasks_by_seed_from_the_training_set():
    settings = get_settings()
    job = get_job("smollm2-cpu", settings)
    config = job.improve.model_copy(update={"tasks_per_round": 10})
    first = [line.custom_id for line in training_lines(job, config, settings, seed=0)]
    assert len(first) == len(set(first)) == 10
    assert first == [line.custom_id for line in training_lines(job, config, settings, seed=0)]
    assert first != [line.custom_id for line in training_lines(job, config, settings, seed=1000)]
    every = training_lines(job, config.model_copy(update={"tasks_per_round": None}), settings, seed=0)
    assert len(every) > 10 and set(first) <= {line.custom_id for line in every}


def test_the_held_out_set_is_never_a_training_set():
    settings = get_settings()
    job = get_job("smollm2-cpu", settings)
    config = job.improve.model_copy(update={"training_set": job.quality.labelled_set})
    with pytest.raises(NotImprovable, match="held-out"):
        training_lines(job, config, settings, seed=0)


def test_a_rounds_row_shows_its_rates_and_loss():
    record = ImproveRound(job_id="job-5a011201", round=1, model="m", parent_version="m/1", version="m/2")
    assert record.row()["held-out before"] is None and record.row()["loss first → last"] == ""
