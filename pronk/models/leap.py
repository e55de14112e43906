"""Leap: swap a job's running fleet to an MLflow model version in place, in seconds, with no redeploy.

Every worker first stages the new weights (downloads and validates them while still serving the old
ones); then all of them swap at a step boundary (drain in-flight generations, reload in place, reset
the prefix cache, resume). A worker that fails is retried by the caller's step; if the fleet cannot all
switch, the workers that did switch go back, and the job's alias moves only when the whole fleet serves
the new version. A job with a labelled set first switches one worker alone, its canary (`pronk.models.canary`),
and the rest follow only if the canary's success rate holds.

The record (`LeapRecord`, kept under the store like batch records) is what `pronk leap status`,
`GET /v1/weights/status` and the flow's artifacts show: the target version, each worker's state
(`ready → uploading → reloading → ready`, or `failed`), its attempts and pause/resume times, the
canary's tallies, and how the Leap ended. The Leap flow is the recipe over `begin`, `switch`, `roll_back`
and `conclude`, with the worker calls (`LeapRun.stage`, `LeapRun.reload`) wrapped as retried Prefect tasks.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Literal

import httpx
from pydantic import BaseModel, Field

from engine.auth import auth_headers
from engine.tls import verify_context
from pronk import storage
from pronk.batches.schemas import CheckCounts
from pronk.errors import PronkError
from pronk.jobs import get_job
from pronk.models.checkpoints import CheckpointMismatch
from pronk.models.registry import is_models_uri, models_uri, parse_models_uri, set_alias
from pronk.models.versions import check_version_fits, resolve_version
from pronk.protocol.ids import new_id
from pronk.settings import Settings, get_settings
from pronk.worker_registry import worker_registry

LeapStatus = Literal["queued", "canary", "staging", "reloading", "completed", "rolled_back", "failed", "refused"]
WorkerLeapState = Literal["ready", "uploading", "reloading", "failed", "rolled_back"]


class WorkerLeap(BaseModel):
    """One worker's part in a Leap."""

    worker_id: str
    url: str
    state: WorkerLeapState = "ready"
    version: str = Field(description="The version this worker serves now.")
    attempts: int = Field(default=0, description="Stage and reload attempts made.")
    stage_seconds: float | None = None
    paused_at: float | None = Field(default=None, description="Unix time its in-flight generations had drained.")
    resumed_at: float | None = Field(default=None, description="Unix time it served the new weights.")
    error: str | None = None


class CanaryRecord(BaseModel):
    """The labelled set's tallies on the canary (the target version) and on the baseline (the version served)."""

    worker_id: str = Field(description="The worker switched first and measured on the target version.")
    labelled_set: str
    lines: int
    baseline_workers: list[str] = Field(
        description="Workers measured on the version served: the others, or the canary itself before it switched."
    )
    baseline: CheckCounts | None = None
    candidate: CheckCounts | None = None
    worse: bool | None = Field(default=None, description="Whether the canary passed fewer checks beyond noise.")
    reason: str = ""


class LeapRecord(BaseModel):
    """One Leap of a job's fleet to a model version."""

    id: str = Field(default_factory=lambda: new_id("leap"))
    job_id: str
    model: str = Field(description="Registered model name.")
    from_version: str | None = Field(
        default=None, description="Version label the fleet served before, e.g. `pronk-tiny/1`."
    )
    to_version: str = Field(description="Target version label, e.g. `pronk-tiny/2`.")
    status: LeapStatus = "queued"
    message: str = ""
    alias: str | None = Field(
        default=None, description="The job's alias, moved to the target when the whole fleet switched."
    )
    alias_moved: bool = False
    workers: dict[str, WorkerLeap] = Field(default_factory=dict)
    canary: CanaryRecord | None = Field(default=None, description="None: the Leap switched the fleet at once.")
    created_at: float = Field(default_factory=time.time)
    finished_at: float | None = None
    switch_seconds: float | None = Field(
        default=None, description="First worker paused → last worker serving the new version."
    )
    flow_run_id: str | None = None

    def finish(self, status: LeapStatus, message: str) -> None:
        self.status, self.message, self.finished_at = status, message, time.time()
        # The canary switched before its labelled run: the fleet's switch is timed on the workers that followed.
        fleet = [w for w in self.workers.values() if not self.canary or w.worker_id != self.canary.worker_id]
        paused = [w.paused_at for w in fleet or self.workers.values() if w.paused_at]
        resumed = [w.resumed_at for w in fleet or self.workers.values() if w.resumed_at]
        if status == "completed" and paused and resumed:
            self.switch_seconds = max(resumed) - min(paused)

    def canary_summary(self) -> str:
        """The canary's tallies in one line, for the CLI and the artifact ("" when the Leap ran no canary)."""
        canary = self.canary
        if canary is None:
            return ""
        if canary.baseline is None or canary.candidate is None:
            return f"canary {canary.worker_id}: the {canary.lines} lines of {canary.labelled_set} did not finish"
        return (
            f"canary {canary.worker_id} on {self.to_version}: {canary.candidate.describe()}; "
            f"{self.from_version} on {', '.join(canary.baseline_workers)}: {canary.baseline.describe()}; "
            f"{'refused' if canary.worse else 'held'}"
        )

    def table(self) -> list[dict[str, object]]:
        """Rows for a Prefect table artifact and the CLI."""
        return [
            {
                "worker": w.worker_id,
                "state": w.state,
                "version": w.version,
                "attempts": w.attempts,
                "stage s": None if w.stage_seconds is None else round(w.stage_seconds, 3),
                "paused → resumed s": None
                if not (w.paused_at and w.resumed_at)
                else round(w.resumed_at - w.paused_at, 3),
                "error": w.error or "",
            }
            for w in self.workers.values()
        ]


class LeapStore:
    """`leaps/<id>.json` per Leap and `leaps/latest-<job>.json`, the newest Leap of each job."""

    def __init__(self, settings: Settings | None = None):
        self.settings = settings or get_settings()
        self.root = storage.join(self.settings.store_uri, "leaps")

    def save(self, record: LeapRecord) -> None:
        data = record.model_dump_json().encode()
        storage.write_bytes(storage.join(self.root, f"{record.id}.json"), data, self.settings)
        storage.write_bytes(storage.join(self.root, f"latest-{record.job_id}.json"), data, self.settings)

    def load(self, leap_id: str) -> LeapRecord:
        return LeapRecord.model_validate_json(
            storage.read_bytes(storage.join(self.root, f"{leap_id}.json"), self.settings)
        )

    def latest(self, job_id: str) -> LeapRecord | None:
        try:
            return LeapRecord.model_validate_json(
                storage.read_bytes(storage.join(self.root, f"latest-{job_id}.json"), self.settings)
            )
        except FileNotFoundError:
            return None


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


class WeightsRefused(PronkError, RuntimeError):
    """A worker refused the checkpoint (it does not fit the served model): another attempt cannot make it fit."""


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
    errors as they happen.
    """

    def __init__(
        self,
        record: LeapRecord,
        store: LeapStore,
        token: str,
        timeout_s: float = 300.0,
        ca_file: Path | None = None,
    ):
        """`token` and `ca_file` as every caller of the workers has them (`pronk.worker_token.worker_client`)."""
        self.record = record
        self.store = store
        self.original = {w.worker_id: w.version for w in record.workers.values()}
        self.http = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout_s, connect=5.0), headers=auth_headers(token), verify=verify_context(ca_file)
        )
        self._saving = asyncio.Lock()

    async def save(self) -> None:
        async with self._saving:
            await asyncio.to_thread(self.store.save, self.record)

    async def stage(self, worker_id: str, model_uri: str) -> None:
        """Download and validate `model_uri` on one worker while it keeps serving."""
        staged = await self._attempt(worker_id, "uploading", "/weights/stage", {"model_uri": model_uri})
        worker = self.record.workers[worker_id]
        worker.state, worker.stage_seconds = "ready", staged["seconds"]
        await self.save()

    async def reload(self, worker_id: str, version: str) -> None:
        """Swap one worker to a staged version at a step boundary (drain, reload, reset prefix cache, resume)."""
        swapped = await self._attempt(worker_id, "reloading", "/weights/reload", {"version": version})
        worker = self.record.workers[worker_id]
        worker.state, worker.version = "ready", swapped["to_version"]
        worker.paused_at, worker.resumed_at = swapped["paused_at"], swapped["resumed_at"]
        await self.save()

    async def _attempt(self, worker_id: str, state: WorkerLeapState, path: str, payload: dict) -> dict:
        worker = self.record.workers[worker_id]
        worker.state, worker.attempts, worker.error = state, worker.attempts + 1, None
        await self.save()
        try:
            return await self._post(worker.url, worker_id, path, payload)
        except Exception as exc:
            worker.state, worker.error = "failed", str(exc)
            await self.save()
            raise

    async def _post(self, url: str, worker_id: str, path: str, body: dict) -> dict:
        try:
            response = await self.http.post(f"{url}{path}", json=body)
        except httpx.TransportError as exc:
            raise RuntimeError(f"{worker_id}: {type(exc).__name__} on {path}: {exc}") from exc
        if response.status_code in (400, 409) and path == "/weights/stage":
            raise WeightsRefused(f"{worker_id}: {response.json().get('detail', response.text)}")
        if response.status_code >= 400:
            raise RuntimeError(f"{worker_id}: HTTP {response.status_code} on {path}: {response.text[:300]}")
        return response.json()

    async def aclose(self) -> None:
        await self.http.aclose()


StageStep = Callable[[LeapRun, str, str], Awaitable[None]]
"""Stage a model URI on one worker (`LeapRun.stage`, or the flow's retried task around it)."""
ReloadStep = Callable[[LeapRun, str, str], Awaitable[None]]
"""Swap one worker to a version (`LeapRun.reload`, or the flow's retried task around it)."""


def begin(
    job_id: str,
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
    job = get_job(job_id)
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
    if record.alias:
        await asyncio.to_thread(set_alias, record.model, record.alias, int(target), settings)
        record.alias_moved = True
    record.finish(
        "completed",
        f"{len(run.original)} workers serve {record.to_version}"
        + (f"; {record.model}@{record.alias} → {target}" if record.alias else ""),
    )
