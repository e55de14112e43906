"""The router: sends each step to a live worker of its job, and re-sends it if that worker dies."""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict

from engine.client import WorkerClient, WorkerUnavailable
from engine.errors import EngineError
from engine.protocol import StepRequest, StepResult
from engine.registry import Registry, WorkerEntry
from engine.routing import RoutingPolicy, make_policy


class NoWorkerAvailable(EngineError):
    """No live worker of the job could take the step."""


class Router:
    def __init__(
        self,
        job_id: str,
        registry: Registry,
        policy: RoutingPolicy | str = "least_loaded",
        client: WorkerClient | None = None,
        max_attempts: int = 3,
        refresh_interval_s: float = 0.5,
        wait_for_worker_s: float = 30.0,
    ):
        self.job_id = job_id
        self.registry = registry
        self.policy = make_policy(policy) if isinstance(policy, str) else policy
        self.client = client or WorkerClient()
        self.max_attempts = max_attempts
        self.refresh_interval_s = refresh_interval_s
        self.wait_for_worker_s = wait_for_worker_s
        self.in_flight: dict[str, int] = defaultdict(int)
        self.failed: dict[str, float] = {}
        self._workers: list[WorkerEntry] = []
        self._read_at = 0.0

    def workers(self) -> list[WorkerEntry]:
        """Live workers, re-read from the registry at most every `refresh_interval_s`.

        A worker that failed a step is skipped until it announces itself again after the failure.
        """
        now = time.time()
        if now - self._read_at >= self.refresh_interval_s:
            self._workers = self.registry.live(self.job_id, now)
            self._read_at = now
        return [w for w in self._workers if w.heartbeat_at > self.failed.get(w.worker_id, 0.0)]

    async def _pick(self, excluded: set[str], request: StepRequest) -> WorkerEntry:
        deadline = time.monotonic() + self.wait_for_worker_s
        while True:
            candidates = [w for w in self.workers() if w.worker_id not in excluded]
            if candidates:
                return self.policy.choose(candidates, self.in_flight, request)
            if time.monotonic() >= deadline:
                raise NoWorkerAvailable(f"no live worker for job {self.job_id} (tried {sorted(excluded) or 'none'})")
            await asyncio.sleep(self.refresh_interval_s)
            self._read_at = 0.0

    async def generate(self, request: StepRequest) -> StepResult:
        tried: set[str] = set()
        errors: list[str] = []
        for attempt in range(self.max_attempts):
            worker = await self._pick(tried, request)
            tried.add(worker.worker_id)
            sent = (
                request
                if attempt == 0
                else request.model_copy(update={"request_id": f"{request.request_id}-r{attempt}"})
            )
            self.in_flight[worker.worker_id] += 1
            try:
                result = await self.client.generate(worker.url, sent)
                return result.model_copy(update={"request_id": request.request_id})
            except WorkerUnavailable as exc:
                self.failed[worker.worker_id] = time.time()
                errors.append(str(exc))
            finally:
                self.in_flight[worker.worker_id] -= 1
        raise NoWorkerAvailable(f"step {request.request_id} failed on {self.max_attempts} workers: {'; '.join(errors)}")

    async def release(self, worker_id: str, trace_ids: list[str]) -> bool:
        """Tell the worker these traces ended so it drops their KV pins; best effort (the TTL is the fallback)."""
        worker = next((w for w in self.workers() if w.worker_id == worker_id), None)
        if worker is None:
            return False
        try:
            await self.client.release(worker.url, trace_ids)
        except WorkerUnavailable:
            return False
        return True

    async def aclose(self) -> None:
        await self.client.aclose()
