"""Prefect tasks of an improve round: roll the training set out on the job's workers, fine-tune on the passes,
register the result as the next model version. None is retried: a round that fails ends, and the next run of the
flow starts a new round from the version the fleet serves. The rollouts and the training report their progress to
the live round record they are handed (hence no cache)."""

from __future__ import annotations

import asyncio

from prefect import task
from prefect.cache_policies import NO_CACHE

from pronk.batches.schemas import LinesChecked
from pronk.jobs.schema import ImproveConfig, JobConfig
from pronk.learn import rounds
from pronk.learn.rounds import ImproveRound
from pronk.learn.selection import SelectionReport
from pronk.learn.training import StepDone, TrainingBudget, TrainingExample, TrainingResult, train
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
    base = await asyncio.to_thread(rounds.base_model_dir, parent_version, settings)
    out = rounds.checkpoint_dir(round_id, settings)
    return await asyncio.to_thread(train, base, examples, out, TrainingBudget.of(config), on_step)


@task(cache_policy=NO_CACHE, task_run_name="register-{record.id}")
async def register_version(
    record: ImproveRound, selection: SelectionReport, training: TrainingResult, job: JobConfig, settings: Settings
) -> tuple[str, str]:
    """Register the checkpoint as the model's next version, with its lineage as an MLflow run."""
    return await asyncio.to_thread(rounds.register, record, selection, training, job, settings)
