"""Prefect tasks of a Leap: stage new weights on one worker, swap one worker to a staged version.

Each task updates its worker's entry in the shared `LeapRun` (so the record and the artifacts show
`uploading`, `reloading`, attempts and errors as they happen) and is retried up to 3 attempts in
all, except when the worker refused the checkpoint itself: another attempt cannot make it fit.
"""

from __future__ import annotations

import asyncio

import httpx
from prefect import task
from prefect.cache_policies import NO_CACHE

from engine.auth import auth_headers
from pronk.errors import PronkError
from pronk.models.leap_records import LeapRecord, LeapStore, WorkerLeapState

ATTEMPTS = 3


class WeightsRefused(PronkError, RuntimeError):
    """A worker refused the checkpoint (it does not fit the served model): never retried."""


class LeapRun:
    """Live state of one Leap shared by its tasks (a plain class, so Prefect passes it through untouched)."""

    def __init__(self, record: LeapRecord, store: LeapStore, token: str, timeout_s: float = 300.0):
        self.record = record
        self.store = store
        self.http = httpx.AsyncClient(timeout=httpx.Timeout(timeout_s, connect=5.0), headers=auth_headers(token))
        self._saving = asyncio.Lock()

    async def save(self) -> None:
        async with self._saving:
            await asyncio.to_thread(self.store.save, self.record)

    async def post(self, worker_id: str, path: str, body: dict) -> dict:
        url = self.record.workers[worker_id].url
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


async def _attempt(run: LeapRun, worker_id: str, state: WorkerLeapState, path: str, payload: dict) -> dict:
    """One attempt of a worker call, with the worker's state and attempt count saved before and after."""
    worker = run.record.workers[worker_id]
    worker.state, worker.attempts, worker.error = state, worker.attempts + 1, None
    await run.save()
    try:
        return await run.post(worker_id, path, payload)
    except Exception as exc:
        worker.state, worker.error = "failed", str(exc)
        await run.save()
        raise


def _retriable(task, task_run, state) -> bool:
    return not isinstance(state.data, WeightsRefused)


@task(
    cache_policy=NO_CACHE,
    retries=ATTEMPTS - 1,
    retry_delay_seconds=1,
    retry_condition_fn=_retriable,
    task_run_name="stage-{worker_id}",
)
async def stage_weights(run: LeapRun, worker_id: str, model_uri: str) -> None:
    """Download and validate `model_uri` on one worker while it keeps serving."""
    staged = await _attempt(run, worker_id, "uploading", "/weights/stage", {"model_uri": model_uri})
    worker = run.record.workers[worker_id]
    worker.state, worker.stage_seconds = "ready", staged["seconds"]
    await run.save()


@task(cache_policy=NO_CACHE, retries=ATTEMPTS - 1, retry_delay_seconds=1, task_run_name="reload-{worker_id}-{version}")
async def reload_weights(run: LeapRun, worker_id: str, version: str) -> None:
    """Swap one worker to a staged version at a step boundary (drain, reload, reset prefix cache, resume)."""
    swapped = await _attempt(run, worker_id, "reloading", "/weights/reload", {"version": version})
    worker = run.record.workers[worker_id]
    worker.state, worker.version = "ready", swapped["to_version"]
    worker.paused_at, worker.resumed_at = swapped["paused_at"], swapped["resumed_at"]
    await run.save()
