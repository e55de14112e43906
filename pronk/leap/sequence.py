"""Leap's sequence: swap a job's running fleet to an MLflow model version in place, in seconds, with no redeploy.

Every worker first stages the new weights (downloads and validates them while still serving the old
ones); then all of them swap at a step boundary (drain in-flight generations, reload in place, reset
the prefix cache, resume). A worker that fails is retried by the caller's step; if the fleet cannot all
switch, the workers that did switch go back, and the job's alias moves only when the whole fleet serves
the new version. A job with a labelled set first switches one worker alone, its canary (`pronk.leap.canary`),
and the rest follow only if the canary's success rate holds.

Each step updates the Leap's record (`pronk.leap.records`) as it goes. The Leap flow is the recipe over `begin`,
`switch`, `roll_back` and `conclude`, with the worker calls (`LeapRun.stage`, `LeapRun.reload`, made through the
engine's `WorkerClient`) wrapped as retried Prefect tasks.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from pronk.engine.client import WorkerClient
from pronk.jobs.schema import JobConfig
from pronk.leap.records import LeapRecord, LeapStore, WorkerLeap, WorkerLeapState
from pronk.models.checkpoints import CheckpointMismatch
from pronk.models.registry import is_models_uri, models_uri, parse_models_uri, set_alias
from pronk.models.versions import check_version_fits, resolve_version
from pronk.pronk_error import PronkError
from pronk.settings import Settings
from pronk.worker_registry import worker_registry

WORKER_TIMEOUT_S = 300.0
"""How long one stage or reload call to a worker may take (a download of the weights, or a drain and a reload)."""

Answer = TypeVar("Answer")


class LeapRefused(PronkError, ValueError):
    """The Leap was refused: no such version, no live worker, a checkpoint that does not fit, an unreadable labelled
    set, or a canary whose success rate fell (it went back). Nothing changed.

    `record` is the saved `refused` record when the refusal came after the fleet was read, else None.
    """

    def __init__(self, message: str, record: LeapRecord | None = None):
        super().__init__(message)
        self.record = record


class LeapFailed(PronkError, RuntimeError):
    """The fleet could not all switch; the record says which workers went back."""


def target_version(name: str, version: int | None, alias: str | None, settings: Settings) -> int:
    """The version number a Leap goes to: `version`, or the one `alias` names (exactly one of them)."""
    if version is not None and alias is None:
        return version
    if version is not None or alias is None:
        raise LeapRefused("give exactly one of version or alias")
    try:
        return resolve_version(name, models_uri(f"{name}@{alias}"), settings)
    except Exception as exc:
        raise LeapRefused(f"model {name} has no alias {alias!r}: {exc}") from exc


def check_fits(target_uri: str, current_version: str, settings: Settings) -> None:
    """Refuse a target that does not fit the weights the fleet serves (each worker checks again when staging)."""
    try:
        check_version_fits(target_uri, current_version, settings)
    except CheckpointMismatch as exc:
        raise LeapRefused(str(exc)) from exc
    except Exception as exc:
        raise LeapRefused(f"cannot resolve {target_uri}: {exc}") from exc


class LeapRun:
    """Live state of one Leap: its record, the version each worker served before, and the calls to the workers.

    A plain class, so Prefect passes it through its tasks untouched. Each call updates its worker's entry
    and saves the record before and after, so the record shows `uploading`, `reloading`, attempts and
    errors as they happen. The caller owns `workers` (`pronk.worker_token.worker_client`, with `WORKER_TIMEOUT_S`)
    and closes it.
    """

    def __init__(self, record: LeapRecord, store: LeapStore, workers: WorkerClient):
        self.record = record
        self.store = store
        self.workers = workers
        self.original = {w.worker_id: w.version for w in record.workers.values()}
        self._saving = asyncio.Lock()

    async def save(self) -> None:
        async with self._saving:
            await asyncio.to_thread(self.store.save, self.record)

    async def stage(self, worker_id: str, model_uri: str) -> None:
        """Download and validate `model_uri` on one worker while it keeps serving; a worker that refuses the
        checkpoint raises `pronk.engine.client.WeightsRefused`."""
        worker = self.record.workers[worker_id]
        staged = await self._attempt(worker, "uploading", lambda: self.workers.stage_weights(worker.url, model_uri))
        worker.state, worker.stage_seconds = "ready", staged.seconds
        await self.save()

    async def reload(self, worker_id: str, version: str) -> None:
        """Swap one worker to a staged version at a step boundary (drain, reload, reset prefix cache, resume)."""
        worker = self.record.workers[worker_id]
        swapped = await self._attempt(worker, "reloading", lambda: self.workers.reload_weights(worker.url, version))
        worker.state, worker.version = "ready", swapped.to_version
        worker.paused_at, worker.resumed_at = swapped.paused_at, swapped.resumed_at
        await self.save()

    async def _attempt(
        self, worker: WorkerLeap, state: WorkerLeapState, call: Callable[[], Awaitable[Answer]]
    ) -> Answer:
        worker.state, worker.attempts, worker.error = state, worker.attempts + 1, None
        await self.save()
        try:
            return await call()
        except Exception as exc:
            worker.state, worker.error = "failed", str(exc)
            await self.save()
            raise


StageStep = Callable[[LeapRun, str, str], Awaitable[None]]
"""Stage a model URI on one worker (`LeapRun.stage`, or the flow's retried task around it)."""
ReloadStep = Callable[[LeapRun, str, str], Awaitable[None]]
"""Swap one worker to a version (`LeapRun.reload`, or the flow's retried task around it)."""


def begin(
    job: JobConfig,
    version: int | None,
    alias: str | None,
    settings: Settings,
    leap_id: str | None = None,
    flow_run_id: str | None = None,
) -> LeapRecord:
    """The record of a Leap about to start, or `LeapRefused` (saved, as `refused`, when it got far enough).

    Refused before any worker is touched: a job that serves no MLflow model, no such version, no live
    worker, or a target that does not fit what a worker serves.
    """
    if not is_models_uri(job.model):
        raise LeapRefused(f"job {job.job_id} serves {job.model!r}; Leap needs an MLflow model (models:/NAME@ALIAS)")
    name, job_alias, _ = parse_models_uri(job.model)
    target = target_version(name, version, alias, settings)
    workers = worker_registry(settings).live(job.job_id)
    record = LeapRecord(
        job_id=job.job_id,
        model=name,
        to_version=f"{name}/{target}",
        alias=job_alias,
        from_version=", ".join(sorted({w.stats.model_version for w in workers})) or None,
        flow_run_id=flow_run_id,
        workers={
            w.worker_id: WorkerLeap(worker_id=w.worker_id, url=w.url, version=w.stats.model_version) for w in workers
        },
    )
    if leap_id:
        record.id = leap_id
    try:
        if not workers:
            raise LeapRefused(f"no live workers for {job.job_id}")
        for current in sorted({w.stats.model_version for w in workers}):
            check_fits(models_uri(record.to_version), current, settings)
    except LeapRefused as exc:
        record.finish("refused", str(exc))
        LeapStore(settings).save(record)
        raise LeapRefused(str(exc), record) from exc
    return record


async def switch(run: LeapRun, stage: StageStep, reload: ReloadStep) -> list[str]:
    """Stage on every worker not yet on the target (the canary is), then swap them; return those that could not switch.

    None switched when staging failed somewhere (the record stays `staging`).
    """
    record = run.record
    workers = [w for w in run.original if record.workers[w].version != record.to_version]
    record.status = "staging"
    await run.save()
    uri = models_uri(record.to_version)
    staged = await asyncio.gather(*(stage(run, w, uri) for w in workers), return_exceptions=True)
    not_staged = [w for w, result in zip(workers, staged) if isinstance(result, BaseException)]
    if not_staged:
        return not_staged
    record.status = "reloading"
    await run.save()
    swapped = await asyncio.gather(*(reload(run, w, record.to_version) for w in workers), return_exceptions=True)
    return [w for w, result in zip(workers, swapped) if isinstance(result, BaseException)]


async def roll_back(run: LeapRun, reload: ReloadStep) -> list[str]:
    """Swap the workers that reached the new version back to what each served; return those that could not."""
    switched = [w for w, entry in run.record.workers.items() if entry.version != run.original[w]]
    back = await asyncio.gather(*(reload(run, w, run.original[w]) for w in switched), return_exceptions=True)
    stuck = []
    for worker_id, result in zip(switched, back):
        if isinstance(result, BaseException):
            stuck.append(worker_id)
        else:
            run.record.workers[worker_id].state = "rolled_back"
    await run.save()
    return stuck


async def conclude(run: LeapRun, failed: list[str], reload: ReloadStep, settings: Settings) -> None:
    """End the Leap: on failure roll back what switched and raise `LeapFailed`; else move the job's alias."""
    record = run.record
    if failed:
        errors = "; ".join(f"{w}: {record.workers[w].error}" for w in failed)
        message = f"{len(failed)} of {len(run.original)} workers could not switch to {record.to_version} ({errors}); "
        if all(entry.version == run.original[w] for w, entry in record.workers.items()):
            message += f"no worker switched, the fleet still serves {record.from_version}"
            record.finish("failed", message)
        else:
            stuck = await roll_back(run, reload)
            message += (
                f"the others went back to {record.from_version}" if not stuck else f"{stuck} could not go back either"
            )
            record.finish("rolled_back" if not stuck else "failed", message)
        raise LeapFailed(message)
    target = record.to_version.rsplit("/", 1)[1]
    already = all(version == record.to_version for version in run.original.values())
    if record.alias:
        await asyncio.to_thread(set_alias, record.model, record.alias, int(target), settings)
        record.alias_moved = True
    served = (
        f"the fleet already served {record.to_version}: nothing switched"
        if already
        else f"{len(run.original)} workers serve {record.to_version}"
    )
    record.finish("completed", served + (f"; {record.model}@{record.alias} → {target}" if record.alias else ""))
