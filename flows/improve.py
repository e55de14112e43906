"""The improve flow: weights that get better from the job's own checked traces, pushed to the running fleet.

A recipe over `pronk.improve`, one round after another, each from the version the fleet serves: roll the job's
training set out on its live workers (k samples a task, every sample checked), keep the passed transcripts
(rejection sampling), fine-tune on them within the job's step, time and core budget, register the result as the
model's next version with its lineage, and Leap to it through the canary, which measures both versions on the
job's held-out set and refuses a worse one, so a bad round never reaches the fleet. The loop stops at the first
round that does not leap. A table artifact shows every round's success rates.
"""

from __future__ import annotations

import asyncio
import time

from prefect import flow, get_run_logger
from prefect.artifacts import acreate_table_artifact

from pronk.batches.progress import saved_every
from pronk.control.dead_runs import record_process
from pronk.flows.leap import leap
from pronk.improve.rounds import ImproveRound, RoundStore, log_held_out, served_version
from pronk.jobs.catalog import resolve_job
from pronk.jobs.schema import ImproveConfig, JobConfig
from pronk.leap.records import LeapRecord, LeapStore
from pronk.leap.sequence import LeapFailed, LeapRefused
from pronk.settings import Settings, get_settings
from pronk.stack.prefect_env import show_pronk_logs
from pronk.tasks.improve import fine_tune, register_version, roll_out

ROUND_SEED_STRIDE = 1000
"""Round n samples with seeds from `improve.seed + (n - 1) * ROUND_SEED_STRIDE`: no two rounds repeat a sample."""


def _held_out(record: ImproveRound, leap_record: LeapRecord | None) -> None:
    canary = leap_record.canary if leap_record else None
    if canary is not None:
        record.held_out_before, record.held_out_after = canary.baseline, canary.candidate


async def _leap(record: ImproveRound, job: JobConfig, version: str, canary: bool, settings: Settings) -> None:
    """Leap the fleet to `version` through the canary on the job's held-out set; the round ends `leapt`, `refused`
    or `failed`."""
    try:
        number = int(version.rsplit("/", 1)[1])
        leapt = LeapRecord.model_validate(
            await leap(job_id=job.job_id, version=number, canary=canary, labelled_set=job.quality.labelled_set)
        )
    except (LeapRefused, LeapFailed) as exc:
        failed = exc.record if isinstance(exc, LeapRefused) else None
        failed = failed or await asyncio.to_thread(LeapStore(settings).latest, job.job_id)
        record.leap_id = failed.id if failed else None
        _held_out(record, failed)
        record.finish("refused" if isinstance(exc, LeapRefused) else "failed", f"{version} did not leap: {exc}")
        return
    record.leap_id = leapt.id
    _held_out(record, leapt)
    record.finish("leapt", f"the fleet serves {version}: {leapt.canary_summary() or leapt.message}")


async def improve_round(
    job: JobConfig, config: ImproveConfig, settings: Settings, number: int, canary: bool
) -> ImproveRound:
    """One round: rollouts, selection, training, registration and a Leap through the canary. Its record is saved
    about once a second meanwhile, with how far the rollouts and the training have got (`pronk improve` shows it);
    each phase is logged as it ends."""
    logger = get_run_logger()
    store = RoundStore(settings)
    model, parent = await asyncio.to_thread(served_version, job, settings)
    record = ImproveRound(job_id=job.job_id, round=number, model=model, parent_version=parent)
    await asyncio.to_thread(store.save, record)
    try:
        async with saved_every(lambda: asyncio.to_thread(store.save, record)):
            seed = config.seed + (number - 1) * ROUND_SEED_STRIDE
            started = time.monotonic()
            examples, selection = await roll_out(record.id, job, config, settings, seed, record.progress.rollouts)
            record.selection, record.seconds["rollouts"] = selection, round(time.monotonic() - started, 3)
            logger.info(
                "improve %s round %d: %d samples checked, %d passed, %d kept to train on",
                job.job_id,
                number,
                selection.samples,
                selection.passed,
                selection.kept,
            )
            if not examples:
                record.finish("nothing_to_learn", f"no rollout passed its check ({selection.samples} samples)")
                return record
            record.status, record.progress.steps = "training", config.max_steps
            started = time.monotonic()
            training = await fine_tune(record.id, parent, examples, config, settings, record.progress.trained)
            record.training, record.seconds["training"] = training, round(time.monotonic() - started, 3)
            logger.info(
                "improve %s round %d: %d training steps (stopped by %s), loss %s",
                job.job_id,
                number,
                training.steps,
                training.stopped_by,
                record.row()["loss first → last"] or "none",
            )
            if not training.steps:
                record.finish("failed", f"the training budget ({config.max_seconds}s) ended before its first step")
                return record
            record.version, record.mlflow_run_id = await register_version(record, selection, training, job, settings)
            record.status = "leaping"
            started = time.monotonic()
            await _leap(record, job, record.version, canary, settings)
            record.seconds["leap"] = round(time.monotonic() - started, 3)
        await asyncio.to_thread(log_held_out, record, settings)
        return record
    except Exception as exc:
        record.finish("failed", f"{type(exc).__name__}: {exc}")
        raise
    finally:
        await asyncio.to_thread(store.save, record)


@flow(name="improve", log_prints=False, on_running=[record_process])
async def improve(
    job_id: str,
    rounds: int | None = None,
    canary: bool = True,
    seed: int | None = None,
    training_set: str | None = None,
    held_out: str | None = None,
) -> list[dict]:
    """Improve a job's weights from its own checked traces for `rounds` rounds (default: the job's
    `improve.rounds`), each leaping to its new version through the canary; stops at the first that does not leap.
    `seed` replaces the job's `improve.seed` (which training lines a round draws, and its samples' seeds);
    `training_set` and `held_out` replace its `improve.training_set` and `quality.labelled_set` (an enrichment's
    sets, made by `pronk improve enrichment-sets`)."""
    show_pronk_logs()
    logger = get_run_logger()
    settings = get_settings()
    job = (await asyncio.to_thread(resolve_job, job_id, settings)).with_labelled_set(held_out)
    overrides = {"seed": seed, "training_set": training_set}
    config = job.improve.model_copy(update={k: v for k, v in overrides.items() if v is not None})
    done: list[ImproveRound] = []
    try:
        for number in range(1, (rounds or config.rounds) + 1):
            record = await improve_round(job, config, settings, number, canary)
            done.append(record)
            logger.info(
                "improve %s round %d (%s): %s: %s", job.job_id, number, record.id, record.status, record.message
            )
            if record.status != "leapt":
                break
    finally:
        if done:
            await acreate_table_artifact(
                table=[r.row() for r in done],
                key=f"improve-{job.job_id}",
                description=f"Improve rounds of {job.job_id}: held-out success before and after each "
                f"({job.quality.labelled_set or 'no held-out set'}); training set {config.training_set}, "
                f"seed {config.seed}.",
            )
    return [r.model_dump(mode="json") for r in done]
