"""One round of the improve loop: roll the training set out on the job's live workers, keep the passes, fine-tune the
version the fleet serves on them, register the result with its lineage, and hand it to Leap's canary.

The round's record (`ImproveRound`, kept under the store as `improve/<id>.json`) is what the flow's artifacts,
`pronk improve` and the MLflow run show: the parent version, the rollouts' counts, the training's figures, the new
version, the Leap that judged it, and the held-out success rate before and after (the canary's two tallies on the
job's `quality.labelled_set`, which the rollouts never use). The rollouts themselves (every sample's check verdict,
step records and transcript) are kept beside it as `improve/<id>/rollouts.jsonl`: the training data's provenance.
"""

from __future__ import annotations

import json
import random
import shutil
import time
from dataclasses import asdict
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from pronk import storage
from pronk.agents.harness import Harness, job_router
from pronk.agents.step_records import StepRecorder
from pronk.agents.tools.scratch import scratch_dir
from pronk.agents.transcripts import TranscriptRecorder
from pronk.batches.labelled import labelled_requests, read_labelled_set
from pronk.batches.schemas import CheckCounts, LinesChecked
from pronk.improve.branches import branch
from pronk.improve.hints import hinted_request, reference_hints
from pronk.improve.rollouts import Sample, rollout
from pronk.improve.selection import SelectionReport, select
from pronk.improve.training_examples import TrainingExample, encode_examples
from pronk.jobs.schema import ImproveConfig, JobConfig
from pronk.models.registry import models_uri, resolve_model, tag_version
from pronk.models.training import StepDone, TrainingResult, train
from pronk.models.versions import NotLeapable, leap_model, upload_checkpoint
from pronk.pronk_error import PronkError
from pronk.protocol.ids import new_id
from pronk.protocol.lines import ValidRequest
from pronk.settings import Settings
from pronk.tracking import job_experiment
from pronk.worker_registry import worker_registry

RoundStatus = Literal["rolling_out", "training", "leaping", "leapt", "refused", "nothing_to_learn", "failed"]


class NotImprovable(PronkError, ValueError):
    """The job cannot be improved now: no live worker, workers on several versions, or no MLflow model to version."""


class RoundProgress(BaseModel):
    """How far the round's phase has got, saved about once a second while it runs, for `pronk improve` to show."""

    rollouts: LinesChecked = Field(default_factory=LinesChecked, description="Samples asked so far, and checked.")
    step: int = Field(default=0, description="Training steps done.")
    steps: int = Field(default=0, description="Steps the budget allows (`max_seconds` may end training sooner).")
    loss: float | None = Field(default=None, description="The last training step's loss.")

    def trained(self, step: int, loss: float) -> None:
        """A training step ended (`pronk.models.training.StepDone`)."""
        self.step, self.loss = step, loss


class ImproveRound(BaseModel):
    """One round of the improve loop of a job."""

    id: str = Field(default_factory=lambda: new_id("improve"))
    job_id: str
    round: int = Field(ge=1, description="1 for the loop's first round.")
    model: str = Field(description="Registered model name.")
    parent_version: str = Field(description="The version the fleet served when the round began, e.g. `NAME/3`.")
    status: RoundStatus = "rolling_out"
    message: str = ""
    selection: SelectionReport | None = None
    training: TrainingResult | None = None
    version: str | None = Field(default=None, description="The version the round registered, e.g. `NAME/4`.")
    leap_id: str | None = None
    held_out_before: CheckCounts | None = Field(default=None, description="The parent on the held-out set.")
    held_out_after: CheckCounts | None = Field(default=None, description="The new version on the held-out set.")
    mlflow_run_id: str | None = Field(default=None, description="The MLflow run holding the round's lineage.")
    seconds: dict[str, float] = Field(default_factory=dict, description="Wall-clock seconds of each phase.")
    progress: RoundProgress = Field(default_factory=RoundProgress)
    started_at: float = Field(default_factory=time.time)
    finished_at: float | None = None

    def finish(self, status: RoundStatus, message: str) -> None:
        self.status, self.message, self.finished_at = status, message, time.time()

    def shown(self, canary: LinesChecked | None = None) -> tuple[str, int, int | None]:
        """What a terminal shows of the round while it runs: its phase, and how far that has got of how much (None:
        not known); `canary`: the lines its Leap's canary has checked, once the round leaps."""
        progress, where = self.progress, f"round {self.round}"
        if self.status == "rolling_out":
            return f"{where}: rollouts checked", progress.rollouts.done, progress.rollouts.total or None
        if self.status == "training":
            loss = "" if progress.loss is None else f", loss {progress.loss:.3f}"
            return f"{where}: training steps{loss}", progress.step, progress.steps or None
        if self.status == "leaping" and canary is not None:
            return f"{where}: canary lines checked", canary.done, canary.total or None
        return f"{where}: {self.status.replace('_', ' ')}", 0, None

    def row(self) -> dict[str, object]:
        """The round's row of the flow's table artifact."""

        def rate(counts: CheckCounts | None) -> float | None:
            return None if counts is None or counts.success_rate is None else round(counts.success_rate, 3)

        selection, training = self.selection, self.training
        return {
            "round": self.round,
            "from": self.parent_version,
            "to": self.version or "",
            "status": self.status,
            "samples": selection.samples if selection else None,
            "passed": selection.passed if selection else None,
            "kept": selection.kept if selection else None,
            "steps": training.steps if training else None,
            "loss first → last": f"{training.losses[0]:.3f} → {training.losses[-1]:.3f}"
            if training and training.losses
            else "",
            "held-out before": rate(self.held_out_before),
            "held-out after": rate(self.held_out_after),
            "minutes": None if self.finished_at is None else round((self.finished_at - self.started_at) / 60, 1),
        }


class RoundStore:
    """`improve/<id>.json` per round, `improve/latest-<job>.json` the newest round of each job, and
    `improve/<id>/rollouts.jsonl` with every sample of a round's rollouts."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.root = storage.join(settings.store_uri, "improve")

    def save(self, record: ImproveRound) -> None:
        data = record.model_dump_json().encode()
        storage.write_bytes(storage.join(self.root, f"{record.id}.json"), data, self.settings)
        storage.write_bytes(storage.join(self.root, f"latest-{record.job_id}.json"), data, self.settings)

    def latest(self, job_id: str) -> ImproveRound | None:
        try:
            return ImproveRound.model_validate_json(
                storage.read_bytes(storage.join(self.root, f"latest-{job_id}.json"), self.settings)
            )
        except FileNotFoundError:
            return None

    def rollouts_uri(self, round_id: str) -> str:
        return storage.join(self.root, round_id, "rollouts.jsonl")

    def save_rollouts(self, round_id: str, samples: list[Sample]) -> None:
        """Write every sample: its check, step records and transcripts."""
        rows = [
            json.dumps(
                {
                    "task_id": s.task_id,
                    "sample": s.index,
                    "hinted": s.hinted,
                    "branch_of": s.branch_of,
                    "custom_id": s.run.request.custom_id,
                    "check": s.run.check.model_dump(mode="json"),
                    "steps": [asdict(r) for r in s.run.records],
                    "transcripts": [asdict(t) for t in s.run.transcripts],
                },
                default=str,
            )
            for s in samples
        ]
        storage.write_bytes(self.rollouts_uri(round_id), "\n".join(rows).encode(), self.settings)


def served_version(job: JobConfig, settings: Settings) -> tuple[str, str]:
    """(registered model name, the one version label every live worker of the job serves), or `NotImprovable`."""
    try:
        name = leap_model(job)
    except NotLeapable as exc:
        raise NotImprovable(f"{exc} Improving registers new versions of an MLflow model.") from exc
    versions = {w.stats.model_version for w in worker_registry(settings).live(job.job_id)}
    if not versions:
        raise NotImprovable(f"no live workers for {job.job_id}: `pronk stack up` starts them")
    if len(versions) > 1:
        raise NotImprovable(f"the workers of {job.job_id} serve {sorted(versions)}: a Leap is under way")
    return name, versions.pop()


def round_tasks(
    job: JobConfig, config: ImproveConfig, settings: Settings, seed: int
) -> tuple[list[ValidRequest], dict[str, str]]:
    """The round's lines of the job's training set (`tasks_per_round` of them, drawn by `seed`), validated for the
    job, and the hints of the set's lines that carry a reference (`pronk.improve.hints`; none without
    `hinted_samples`): the file is read once a round. Never the job's held-out `quality.labelled_set`."""
    if config.training_set == job.quality.labelled_set:
        raise NotImprovable(f"job {job.job_id}: improve.training_set is the held-out quality.labelled_set")
    data = read_labelled_set(config.training_set, settings)
    lines = labelled_requests(data, job, config.training_set)
    if config.tasks_per_round is not None and config.tasks_per_round < len(lines):
        lines = random.Random(seed).sample(lines, config.tasks_per_round)
    return lines, reference_hints(data) if config.hinted_samples else {}


async def roll_out(
    round_id: str,
    job: JobConfig,
    config: ImproveConfig,
    settings: Settings,
    seed: int,
    progress: LinesChecked | None = None,
) -> tuple[list[TrainingExample], SelectionReport]:
    """Run the training set `samples_per_task` times on the job's live workers, branch the answers of the failed
    samples (`pronk.improve.branches`), then run `hinted_samples` times with a hint each line none of whose samples
    passed (`pronk.improve.hints`); keep every sample with the round, and select the passed transcripts. `progress`
    counts the samples asked and checked."""
    lines, hints = round_tasks(job, config, settings, seed)
    router = job_router(job, settings)
    harness = Harness(
        router,
        job,
        StepRecorder(),
        scratch_dir(settings, round_id),
        TranscriptRecorder(),
        sandbox_bwrap=settings.sandbox_bwrap,
    )
    try:
        samples = await rollout(lines, harness, config.samples_per_task, config.temperature, seed, progress=progress)
        if config.answer_branches:
            samples += await branch(
                samples,
                harness,
                config.answer_branches,
                config.cap_per_task,
                config.temperature,
                seed,
                first_index=config.samples_per_task,
                progress=progress,
            )
        solved = {s.task_id for s in samples if s.passed}
        unsolved = [line for line in lines if line.custom_id not in solved and line.custom_id in hints]
        if unsolved:
            hinted = [hinted_request(line, hints[line.custom_id]) for line in unsolved]
            samples += await rollout(
                hinted,
                harness,
                config.hinted_samples,
                config.temperature,
                seed,
                first_index=config.samples_per_task * (1 + config.answer_branches),
                hinted=True,
                progress=progress,
            )
    finally:
        await router.aclose()
    RoundStore(settings).save_rollouts(round_id, samples)
    return select(samples, config.cap_per_task)


def checkpoint_dir(round_id: str, settings: Settings) -> Path:
    """Where a round writes its checkpoint before registering it."""
    return settings.data_dir / "improve" / round_id / "checkpoint"


def fine_tune(
    round_id: str,
    parent_version: str,
    examples: list[TrainingExample],
    config: ImproveConfig,
    settings: Settings,
    on_step: StepDone | None = None,
) -> TrainingResult:
    """Fine-tune the parent version (`NAME/N`, its checkpoint on local disk) on the kept transcripts, in a niced child
    process within `config`'s budget; the checkpoint goes to the round's `checkpoint_dir`."""
    base = resolve_model(models_uri(parent_version), settings).path
    return train(base, encode_examples(base, examples), checkpoint_dir(round_id, settings), config, on_step)


def register(
    record: ImproveRound, selection: SelectionReport, training: TrainingResult, job: JobConfig, settings: Settings
) -> tuple[str, str]:
    """Register the round's checkpoint as the model's next version (checked against the parent) and log its lineage
    as an MLflow run of the job's experiment: parent, rollouts, sample counts, training figures, the loss curve.
    Returns the new version's label (`NAME/N`) and the run's id."""
    import mlflow

    try:
        uploaded = upload_checkpoint(
            training.checkpoint_dir, record.model, settings, job_model=job.model, source_tag=f"improve:{record.id}"
        )
    finally:
        shutil.rmtree(training.checkpoint_dir, ignore_errors=True)  # MLflow keeps the registered copy
    version = f"{record.model}/{uploaded.version}"
    job_experiment(job.job_id, settings)
    with mlflow.start_run(run_name=f"improve-{record.id}") as run:
        mlflow.set_tags({"pronk.kind": "improve", "pronk.round": record.id, "pronk.version": version})
        mlflow.log_params(
            {
                "parent_version": record.parent_version,
                "version": version,
                "round": record.round,
                "rollouts": RoundStore(settings).rollouts_uri(record.id),
                "tasks": selection.tasks,
                "samples": selection.samples,
                "passed": selection.passed,
                "kept": selection.kept,
                "hinted_samples": selection.hinted.samples,
                "hinted_kept": selection.hinted.kept,
                "branch_samples": selection.branches.samples,
                "branch_kept": selection.branches.kept,
                "steps": training.steps,
                "stopped_by": training.stopped_by,
                "threads": training.threads,
                "nice": training.nice,
            }
        )
        for step, loss in enumerate(training.losses):
            mlflow.log_metric("train_loss", loss, step=step)
        mlflow.log_metrics(
            {
                "train_seconds": training.seconds,
                "trained_tokens": training.trained_tokens,
                "rollout_pass_rate": selection.passed / selection.samples if selection.samples else 0.0,
            }
        )
    tag_version(record.model, uploaded.version, "pronk.improve_run", run.info.run_id, settings)
    return version, run.info.run_id


def log_held_out(record: ImproveRound, settings: Settings) -> None:
    """The held-out success rates before and after, as metrics of the round's run (MLflow charts them by version)."""
    from mlflow import MlflowClient

    if record.mlflow_run_id is None:
        return
    client = MlflowClient(tracking_uri=settings.tracking_uri)
    for key, counts in (("held_out_before", record.held_out_before), ("held_out_after", record.held_out_after)):
        if counts is not None and counts.success_rate is not None:
            client.log_metric(record.mlflow_run_id, key, counts.success_rate, step=record.round)
