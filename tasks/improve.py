"""Prefect tasks of an improve round: roll the training set out on the job's workers, fine-tune on the passes,
register the result as the next model version. None is retried: a round that fails ends, and the next run of the
flow starts a new round from the version the fleet serves. The rollouts and the training report their progress to
the live round record they are handed (hence no cache)."""

from __future__ import annotations

import asyncio

from prefect import task
from prefect.cache_policies import NO_CACHE

from pronk.batches.schemas import LinesChecked
from pronk.improve import rounds
from pronk.improve.rounds import ImproveRound
from pronk.improve.selection import SelectionReport
from pronk.improve.training_examples import TrainingExample
from pronk.jobs.schema import ImproveConfig, JobConfig
from pronk.models.training import StepDone, TrainingResult
from pronk.settings import Settings


@task(cache_policy=NO_CACHE, task_run_name="rollouts-{round_id}")
async def roll_out(
    round_id: str, job: JobConfig, config: ImproveConfig, settings: Settings, seed: int, progress: LinesChecked
) -> tuple[list[TrainingExample], SelectionReport]:
    """Run the training set k times on the job's live workers, check every sample, keep the passed transcripts."""
    return await rounds.roll_out(round_id, job, config, settings, seed, progress)


@task(cache_policy=NO_CACHE, task_run_name="train-{round_id}")
async def fine_tune(
    round_id: str,
    parent_version: str,
    examples: list[TrainingExample],
    config: ImproveConfig,
    settings: Settings,
    on_step: StepDone,
) -> TrainingResult:
    """Fine-tune the parent version on the kept transcripts in a niced child process, within the job's budget."""
    return await asyncio.to_thread(rounds.fine_tune, round_id, parent_version, examples, config, settings, on_step)


@task(cache_policy=NO_CACHE, task_run_name="register-{record.id}")
async def register_version(
    record: ImproveRound, selection: SelectionReport, training: TrainingResult, job: JobConfig, settings: Settings
) -> tuple[str, str]:
    """Register the checkpoint as the model's next version, with its lineage as an MLflow run."""
    return await asyncio.to_thread(rounds.register, record, selection, training, job, settings)
