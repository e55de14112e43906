"""The router: sends each step to a live worker of its job, and re-sends it if that worker dies.

A step in flight on a worker that drops out of the registry (its heartbeat stopped) or stops answering a
health probe (its host's link went down) is abandoned and re-sent, not left waiting on a dead connection.

With an admission strategy (`pronk.engine.admission`), it also asks the worker to admit each step by its KV
budget, places new traces by room and keeps started ones on the worker that holds their prefix. Callers
tell it when a trace ends (`finish`), so the worker drops the trace's pin and admission at once.

A router given `only` sends steps to those workers of the job alone: Leap's canary measures one version's
workers beside another's this way while the job's other routers keep serving from all of them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import Collection

from pronk.engine.admission import KvBudgetAdmission, NoAdmission, make_admission
from pronk.engine.client import NotAdmitted, WorkerClient, WorkerUnavailable
from pronk.engine.engine_error import EngineError
from pronk.engine.registry import Registry, RegistryUnavailable, WorkerEntry
from pronk.engine.routing import RoutingPolicy, make_policy
from pronk.engine.worker_protocol import AdmissionHints, StepRequest, StepResult

log = logging.getLogger(__name__)


class NoWorkerAvailable(EngineError):
    """No live worker of the job could take the step."""


class Router:
    def __init__(
        self,
        job_id: str,
        registry: Registry,
        policy: RoutingPolicy | str = "least_loaded",
        client: WorkerClient | None = None,
        token: str | None = None,
        max_attempts: int = 3,
        refresh_interval_s: float = 0.5,
        wait_for_worker_s: float = 30.0,
        admission: NoAdmission | KvBudgetAdmission | str = "none",
        admission_wait_s: float = 5.0,
        admission_timeout_s: float = 3600.0,
        max_families: int = 100_000,
        liveness_interval_s: float = 3.0,
        probe_timeout_s: float = 10.0,
        only: Collection[str] | None = None,
    ):
        self.job_id = job_id
        self.registry = registry
        self.only = None if only is None else frozenset(only)
        self.policy = make_policy(policy) if isinstance(policy, str) else policy
        if client is None and token is None:
            raise ValueError("a Router needs the workers' token (or a client that carries it)")
        self.client = client or WorkerClient(token or "")
        self.max_attempts = max_attempts
        self.refresh_interval_s = refresh_interval_s
        self.wait_for_worker_s = wait_for_worker_s
        self.in_flight: dict[str, int] = defaultdict(int)
        self.failed: dict[str, float] = {}
        self.admission = make_admission(admission) if isinstance(admission, str) else admission
        self.admission_wait_s = admission_wait_s
        self.admission_timeout_s = admission_timeout_s
        self.max_families = max_families
        self.liveness_interval_s = liveness_interval_s
        self.probe_timeout_s = probe_timeout_s  # generous: a busy worker's event loop may answer late, not never
        self._probes: dict[str, tuple[float, asyncio.Future[bool]]] = {}
        self._workers: list[WorkerEntry] = []
        self._read_at = 0.0
        self._since: dict[str, float] = {}
        self._homes: dict[str, str] = {}
        self._served: dict[str, str] = {}
        self._pending: dict[str, int] = defaultdict(int)

    def workers(self) -> list[WorkerEntry]:
        """Live workers (of `only`, when given), re-read from the registry at most every `refresh_interval_s`.

        A worker that failed a step is skipped until it announces itself again after the failure.
        """
        now = time.time()
        if now - self._read_at >= self.refresh_interval_s:
            try:
                self._workers = [
                    w for w in self.registry.live(self.job_id, now) if self.only is None or w.worker_id in self.only
                ]
            except RegistryUnavailable as exc:
                # The last read stands until its heartbeats are too old: a registry briefly out of reach
                # stops no step, one gone for longer leaves no worker (and steps fail as engine_unavailable).
                log.warning("worker registry unavailable, keeping the last read: %s", exc)
                timeout_s = self.registry.heartbeat_timeout_s
                self._workers = [w for w in self._workers if now - w.heartbeat_at <= timeout_s]
            self._read_at = now
            self._pending.clear()
        return [w for w in self._workers if w.heartbeat_at > self.failed.get(w.worker_id, 0.0)]

    async def _live(self, excluded: set[str]) -> list[WorkerEntry]:
        """Live workers not in `excluded` (or, when every live one is, those: a worker that failed a step is live
        again only with a heartbeat newer than its failure), waiting up to `wait_for_worker_s` for one to appear.

        A machine overloaded for a few seconds can make every worker miss a step at once; a step then waits for one
        to come back rather than failing its line while the fleet is still there."""
        deadline = time.monotonic() + self.wait_for_worker_s
        while True:
            live = self.workers()
            candidates = [w for w in live if w.worker_id not in excluded] or live
            if candidates:
                return candidates
            if time.monotonic() >= deadline:
                raise NoWorkerAvailable(f"no live worker for job {self.job_id} (tried {sorted(excluded) or 'none'})")
            await asyncio.sleep(self.refresh_interval_s)
            self._read_at = 0.0

    async def _call(self, worker: WorkerEntry, request: StepRequest) -> StepResult:
        """The step on `worker`, checking every `liveness_interval_s` that the worker is still there."""
        call = asyncio.ensure_future(self.client.generate(worker.url, request))
        try:
            while True:
                done, _ = await asyncio.wait({call}, timeout=self.liveness_interval_s)
                if done:
                    return call.result()
                if not await self._reachable(worker):
                    raise WorkerUnavailable(
                        f"{worker.url}: lost (no heartbeat or no answer) while step {request.request_id} was on it"
                    )
        finally:
            call.cancel()

    async def _reachable(self, worker: WorkerEntry) -> bool:
        """Whether a worker holding a step is still live in the registry and answers a health probe (one probe per
        worker per interval, shared by all its steps)."""
        self.workers()
        if not any(w.worker_id == worker.worker_id for w in self._workers):
            return False
        started, probe = self._probes.get(worker.worker_id, (0.0, None))
        if probe is None or time.monotonic() - started >= self.liveness_interval_s:
            probe = asyncio.ensure_future(self.client.healthy(worker.url, self.probe_timeout_s))
            self._probes[worker.worker_id] = (time.monotonic(), probe)
        return await asyncio.shield(probe)

    async def _pick(self, excluded: set[str], request: StepRequest) -> WorkerEntry:
        return self.policy.choose(await self._live(excluded), self.in_flight, request)

    def _remember(self, table: dict, key: str, value) -> None:
        if key not in table and len(table) >= self.max_families:
            table.pop(next(iter(table)))
        table[key] = value

    async def generate(self, request: StepRequest) -> StepResult:
        """Run one step on a worker of the job; the request is stamped with its family's start time."""
        family = request.affinity_key or request.trace_id
        if family is not None and family not in self._since:
            self._remember(self._since, family, time.time())
        if family is not None and request.trace_started_at is None:
            request = request.model_copy(update={"trace_started_at": self._since[family]})
        if self.admission.enabled and request.trace_id is not None:
            result = await self._generate_admitted(request, request.trace_id, family or request.trace_id)
        else:
            result = await self._generate_routed(request)
        if request.trace_id is not None:
            self._remember(self._served, request.trace_id, result.worker_id)
        return result

    async def _generate_admitted(self, request: StepRequest, trace: str, family: str) -> StepResult:
        """Ask workers to admit the step until one does: a started trace waits at the worker holding its prefix,
        a new one at its family's home, else at the worker with the most room for it, then the next."""
        started = trace in self._served
        # The admission queue's order is the family's own start, even where a caller set the engine's priority.
        hints = AdmissionHints(started=started, wait_s=self.admission_wait_s, since=self._since.get(family))
        deadline = time.monotonic() + self.admission_timeout_s
        busy: set[str] = set()
        errors: list[str] = []
        sent = request.model_copy(update={"admission": hints})
        while True:
            candidates = await self._live(set())
            home = self._served.get(trace) or self._homes.get(family)
            at_home = next((w for w in candidates if w.worker_id == home), None)
            if started and at_home is not None:
                worker = at_home
            else:
                pool = [w for w in candidates if w.worker_id not in busy]
                if not pool:
                    busy.clear()
                    pool = candidates
                placed = self.admission.place(pool, home if home not in busy else None, self._pending)
                worker = placed if placed is not None else pool[0]
                self._pending[worker.worker_id] += _token_estimate(request)
            self.in_flight[worker.worker_id] += 1
            try:
                result = await self._call(worker, sent)
            except NotAdmitted:
                busy.add(worker.worker_id)
                if time.monotonic() >= deadline:
                    raise NoWorkerAvailable(
                        f"step {request.request_id} of trace {trace} not admitted within {self.admission_timeout_s}s"
                    ) from None
                continue
            except WorkerUnavailable as exc:
                self.failed[worker.worker_id] = time.time()
                errors.append(str(exc))
                if len(errors) >= self.max_attempts:
                    raise NoWorkerAvailable(
                        f"step {request.request_id} failed on {len(errors)} workers: {'; '.join(errors)}"
                    ) from None
                sent = sent.model_copy(update={"request_id": f"{request.request_id}-r{len(errors)}"})
                continue
            finally:
                self.in_flight[worker.worker_id] -= 1
            if not started:
                self._remember(self._homes, family, result.worker_id)
            return result.model_copy(update={"request_id": request.request_id})

    async def _generate_routed(self, request: StepRequest) -> StepResult:
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
                result = await self._call(worker, sent)
                return result.model_copy(update={"request_id": request.request_id})
            except WorkerUnavailable as exc:
                self.failed[worker.worker_id] = time.time()
                errors.append(str(exc))
            finally:
                self.in_flight[worker.worker_id] -= 1
        raise NoWorkerAvailable(f"step {request.request_id} failed on {self.max_attempts} workers: {'; '.join(errors)}")

    async def finish(self, trace_id: str) -> None:
        """The trace ended: its worker drops its KV pin and its admission now, not at the TTL or idle expiry, and a
        KV host tier there evicts its blocks first. Told whatever the mechanisms: one small call per trace."""
        worker_id = self._served.pop(trace_id, None)
        self._since.pop(trace_id, None)
        self._homes.pop(trace_id, None)
        if worker_id is not None:
            await self.release(worker_id, [trace_id])

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


def _token_estimate(request: StepRequest) -> int:
    """Tokens a step will hold: exact for token ids, about four characters a token for messages."""
    if request.prompt_token_ids is not None:
        prompt = len(request.prompt_token_ids)
    else:
        prompt = sum(len(m.text()) for m in request.messages or []) // 4
    return prompt + request.sampling.max_tokens
