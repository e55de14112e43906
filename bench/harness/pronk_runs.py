"""pronk's side of the benchmark: a bare asyncio loop over its workers, its batch flow, and Prefect's lag.

The bare loop runs the same replay loop as the baseline, through `pronk.engine.router.Router` with the
job's routing policy, so setups differ only in the mechanism switched on (`ABLATIONS`: pins, admission,
priority), and the difference between the full one and the batch flow on the same shapes is what the
orchestration (Prefect flow and task runs, batch records, step records, result files) costs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar
from uuid import UUID

import httpx
import psutil

from bench.harness.agent_loop import ReplayResult, replay
from bench.harness.figures import FULL, AgentRun, EngineLoad, worker_moves
from pronk.agents.tool_gaps import ToolGaps
from pronk.engine.registry import WorkerEntry
from pronk.engine.worker_protocol import StepRequest, StepResult, WorkerStats
from pronk.jobs.schema import JobConfig
from pronk.protocol.bodies import REPLAY_URL
from pronk.protocol.shapes import TraceShape
from pronk.settings import Settings
from pronk.worker_registry import worker_registry


@dataclass(frozen=True, slots=True)
class Ablation:
    """Which of the Herd's mechanisms a bare-loop setup switches on (routing is always the job's)."""

    name: str
    pins: bool
    admission: str
    priority: bool


ABLATIONS = (
    Ablation("pronk: affinity only", pins=False, admission="none", priority=False),
    Ablation("pronk: + pins", pins=True, admission="none", priority=False),
    Ablation("pronk: + admission", pins=True, admission="kv_budget", priority=False),
    Ablation(FULL, pins=True, admission="kv_budget", priority=True),
)


class OneOrder:
    """The router with every step stamped with one trace start time, so the engine's priority is off even on
    workers that run vLLM's priority queue: equal priorities run in arrival order (fcfs). Admission still orders
    its queue by each family's own start (the router sends it apart, in the admission hints), so `+ admission`
    measures admission alone."""

    def __init__(self, router):
        self.router = router

    async def generate(self, request: StepRequest) -> StepResult:
        return await self.router.generate(request.model_copy(update={"trace_started_at": 1.0}))

    async def finish(self, trace_id: str) -> None:
        await self.router.finish(trace_id)

    async def aclose(self) -> None:
        await self.router.aclose()


def pronk_router(job: JobConfig, settings: Settings, admission: str | None = None):
    from pronk.engine.router import Router
    from pronk.worker_token import worker_client

    return Router(
        job.job_id,
        worker_registry(settings),
        client=worker_client(settings),
        policy=job.scheduling.routing,
        admission=admission or job.scheduling.admission,
        admission_timeout_s=job.harness.step_timeout_s,
    )


async def bare_loop(
    shapes: list[TraceShape],
    job: JobConfig,
    settings: Settings,
    concurrency: int,
    ablation: Ablation,
    gap_scale: float = 1.0,
) -> ReplayResult:
    """The shapes through pronk's router and workers, driven by the plain agent loop, with `ablation`'s mechanisms.

    Priority needs workers running `scheduling.priority: true`; on fcfs workers it changes nothing.
    `gap_scale` multiplies every tool gap (0: none, to see what the serving path costs against the offline limit).
    """
    router = pronk_router(job, settings, ablation.admission)
    ttl = job.scheduling.kv_pin_ttl_s if ablation.pins else 0.0
    gaps = ToolGaps(ttl) if ablation.pins and job.scheduling.kv_pin_ttl == "auto" else None
    backend = router if ablation.priority else OneOrder(router)
    return await replay(shapes, backend, concurrency, ttl, gaps, gap_scale)


_PREEMPTIONS = re.compile(r"^vllm:num_preemptions(?:_total)?(?:\{[^}]*\})?\s+([0-9.eE+]+)\s*$", re.MULTILINE)
_TIER_LOADED = re.compile(
    r'^vllm:prompt_tokens_by_source(?:_total)?\{[^}]*source="external_kv_transfer"[^}]*\}\s+([0-9.eE+]+)\s*$',
    re.MULTILINE,
)
_TIER_COPY_S = re.compile(
    r"^vllm:kv_offload_(?:load|store)_time(?:_total)?(?:\{[^}]*\})?\s+([0-9.eE+]+)\s*$", re.MULTILINE
)


@dataclass(frozen=True, slots=True)
class EngineCounters:
    """Cumulative counts of a setup's engines, read before and after a run: the run's are the difference. The tier's
    are None where the engines have no KV host tier."""

    preemptions: int
    tier_loaded_tokens: int | None = None
    tier_copy_s: float | None = None

    def note_run(self, run: AgentRun, before: EngineCounters) -> None:
        """Put on `run` what the engines counted since `before`."""
        run.preemptions = self.preemptions - before.preemptions
        if self.tier_loaded_tokens is not None and before.tier_loaded_tokens is not None:
            run.tier_loaded_tokens = self.tier_loaded_tokens - before.tier_loaded_tokens
        if self.tier_copy_s is not None and before.tier_copy_s is not None:
            run.tier_copy_s = round(self.tier_copy_s - before.tier_copy_s, 3)


def counters_in_metrics(text: str, tiered: bool) -> EngineCounters:
    """vLLM's cumulative counters from a Prometheus /metrics page (summed over engines): preemptions and, with a
    host tier, prompt tokens loaded from it and the seconds its loads and stores took."""
    preemptions = round(sum(float(v) for v in _PREEMPTIONS.findall(text)))
    if not tiered:
        return EngineCounters(preemptions)
    return EngineCounters(
        preemptions,
        round(sum(float(v) for v in _TIER_LOADED.findall(text))),
        sum(float(v) for v in _TIER_COPY_S.findall(text)),
    )


async def metrics_pages(urls: list[str]) -> list[str]:
    """Each stock vLLM server's Prometheus /metrics page."""
    async with httpx.AsyncClient(timeout=10.0) as http:
        return [(await http.get(f"{url}/metrics")).text for url in urls]


async def server_counters(urls: list[str], tiered: bool = False) -> EngineCounters:
    """The counters so far of stock vLLM servers, from their /metrics."""
    pages = [counters_in_metrics(page, tiered) for page in await metrics_pages(urls)]
    preemptions = sum(c.preemptions for c in pages)
    if not tiered:
        return EngineCounters(preemptions)
    return EngineCounters(
        preemptions, sum(c.tier_loaded_tokens or 0 for c in pages), sum(c.tier_copy_s or 0.0 for c in pages)
    )


async def live_workers(job: JobConfig, settings: Settings) -> list[tuple[WorkerEntry, WorkerStats]]:
    """Every live pronk worker of the job, by worker id, with its /stats."""
    from pronk.worker_token import worker_client

    client = worker_client(settings)
    try:
        workers = sorted(worker_registry(settings).live(job.job_id), key=lambda w: w.worker_id)
        return [(w, await client.stats(w.url)) for w in workers]
    finally:
        await client.aclose()


async def live_worker_stats(job: JobConfig, settings: Settings) -> list[WorkerStats]:
    """The /stats of every live pronk worker of the job."""
    return [stats for _, stats in await live_workers(job, settings)]


T = TypeVar("T")
S = TypeVar("S")
_RUNNING = re.compile(r"^vllm:num_requests_running(?:\{[^}]*\})?\s+([0-9.eE+]+)\s*$", re.MULTILINE)
LOAD_SAMPLE_S = 1.0
"""How often a setup's engines are asked what they run: often enough for a busy share over a ~100 s round, rarely
enough that rendering stock vLLM's /metrics costs its server well under 1% of a core."""


ENGINE_CORE = "EngineCore"
"""What vLLM names its engine core process (`VLLM::EngineCore`). A CPU engine runs its model there too: pronk's
workers and the stock servers alike (`bench.harness.baseline.pinned`)."""


def engine_core_seconds(pid: int) -> tuple[float | None, float | None]:
    """(CPU seconds, seconds waiting for a core) so far of the vLLM engine core under `pid` (a stock server or a
    pronk worker); (None, None) where it has none on this machine. The wait is its main thread's, the one that runs
    the model: the time it was ready to run while another process or thread held its core (Linux's per-task
    schedstat); None where the kernel does not keep it."""
    try:
        cores = [p for p in psutil.Process(pid).children(recursive=True) if ENGINE_CORE in p.name()]
        if not cores:
            return None, None
        cpu = sum(times.user + times.system for times in (p.cpu_times() for p in cores))
    except psutil.Error:
        return None, None
    try:
        wait = sum(int(Path(f"/proc/{p.pid}/schedstat").read_text().split()[1]) for p in cores) / 1e9
    except (OSError, IndexError, ValueError):
        return cpu, None
    return cpu, wait


def engine_load(running: int, pid: int) -> EngineLoad:
    """An engine's load now: `running` requests (its gauge), and its engine core's times under `pid`."""
    return EngineLoad(running, *engine_core_seconds(pid))


async def server_loads(urls: list[str], pids: list[int]) -> list[EngineLoad]:
    """Each stock vLLM server's load now: its /metrics running gauge, its engine core's times."""
    pages = await metrics_pages(urls)
    return [engine_load(running_in_metrics(page), pid) for page, pid in zip(pages, pids, strict=True)]


def running_in_metrics(text: str) -> int:
    """The requests running now, from a Prometheus /metrics page (summed over engines)."""
    return round(sum(float(v) for v in _RUNNING.findall(text)))


async def worker_loads(job: JobConfig, settings: Settings) -> list[EngineLoad]:
    """Each live pronk worker's load now: its /stats running count (the same vLLM gauge), its engine core's times."""
    return [engine_load(stats.running, w.pid) for w, stats in await live_workers(job, settings)]


async def sampling(
    work: Awaitable[T], read: Callable[[], Awaitable[S]], interval_s: float = LOAD_SAMPLE_S
) -> tuple[T, list[tuple[float, S]]]:
    """Await `work` while calling `read` every `interval_s` and once more when it ends, so a run shorter than the
    interval still spans two samples: its result, and each sample as (its `time.monotonic()`, what `read` returned),
    timed halfway through the read, so a run that knows its start on that clock can place its samples
    (`AgentRun.note_load`). A sample the engines do not answer is skipped; it never fails the run."""
    samples: list[tuple[float, S]] = []
    done = asyncio.Event()

    async def sample() -> None:
        while True:
            with contextlib.suppress(httpx.HTTPError):
                asked = time.monotonic()
                value = await read()
                samples.append(((asked + time.monotonic()) / 2, value))
            if done.is_set():
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), interval_s)

    sampler = asyncio.create_task(sample())
    try:
        return await work, samples
    finally:
        done.set()
        await sampler


async def worker_counters(job: JobConfig, settings: Settings) -> EngineCounters:
    """The counters so far of the job's live pronk workers, from their /stats."""
    stats = await live_worker_stats(job, settings)
    tiers = [s.host_tier for s in stats if s.host_tier is not None]
    return EngineCounters(
        sum(s.preemptions for s in stats),
        sum(t.loaded_tokens for t in tiers) if tiers else None,
        sum(t.load_seconds + t.store_seconds for t in tiers) if tiers else None,
    )


async def prefect_lag_s(flow_run_id: str, timeout_s: float = 120.0) -> float:
    """Seconds after the flow returned until the server shows the flow run and all its task runs final."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    started = time.monotonic()
    async with get_client() as client:
        while time.monotonic() - started < timeout_s:
            flow_run = await client.read_flow_run(UUID(flow_run_id))
            tasks = await client.read_task_runs(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[UUID(flow_run_id)]))
            )
            states = [flow_run.state] + [t.state for t in tasks]
            if all(s is not None and s.is_final() for s in states):
                return time.monotonic() - started
            await asyncio.sleep(0.1)
    return timeout_s


DRAWER_WAIT_S = 300.0
"""The longest a setup waits for the batch flow's trace-sample drawer to end (it draws ~20 s here)."""


def wait_for_trace_drawer(settings: Settings, timeout_s: float = DRAWER_WAIT_S) -> float:
    """Wait until no trace-sample drawer runs; the seconds waited. The batch flow leaves its trace sample to a process
    of its own (`pronk.control.trace_sample.drawer`) that imports Prefect and MLflow and draws task runs once the flow
    run has ended: off the flow's path by design, but on the cores the next setup's engines would use, so the setup
    after the batch flow starts only once it is done."""
    from pronk.control.trace_sample.lock import running_drawer

    started = time.monotonic()
    while running_drawer(settings) is not None and time.monotonic() - started < timeout_s:
        time.sleep(0.5)
    return time.monotonic() - started


def warm_batch_flow(shapes: list[TraceShape], job: JobConfig, settings: Settings, work_dir: Path) -> None:
    """Run `shapes` (a couple) through the batch flow, and wait for its trace drawer, before anything is measured.
    A process's first batch imports Prefect's flow engine, MLflow and matplotlib and makes the job's MLflow
    experiment (~4 s of CPU here, on the cores the engines use): a cost a long-running pronk pays once, which the
    first measured batch would otherwise carry alone."""
    asyncio.run(trace_batch(shapes, job, work_dir))
    wait_for_trace_drawer(settings)


async def run_batch_file(input_path: Path, job: JobConfig, out_dir: Path) -> tuple[dict, float, float]:
    """pronk's batch flow on a file, in this process like `pronk batch run`: (batch, wall s, Prefect lag s)."""
    from pronk.flows.batch import run_batch

    started = time.monotonic()
    batch = await run_batch(input_uri=str(input_path.resolve()), job_id=job.job_id, output_dir=str(out_dir.resolve()))
    wall = time.monotonic() - started
    lag = await prefect_lag_s(batch["flow_run_id"]) if batch.get("flow_run_id") else float("nan")
    return batch, wall, lag


def replay_lines(shapes: list[TraceShape], model: str) -> list[dict]:
    """One replay line per root shape; its custom_id is the trace id."""
    return [
        {
            "custom_id": s.trace_id,
            "method": "POST",
            "url": REPLAY_URL,
            "body": {"model": model, "shape": s.model_dump()},
        }
        for s in shapes
    ]


def _read_jsonl(uri: str | None) -> list[dict]:
    path = Path(uri) if uri else None
    return (
        [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path and path.exists() else []
    )


async def trace_batch(shapes: list[TraceShape], job: JobConfig, work_dir: Path) -> AgentRun:
    """The shapes as a pronk batch (replay lines) through the batch flow; figures from its output lines.

    A trace's end is its last step's start (a step record's wall-clock `started_at`) plus its engine time, so
    `finished_s` counts from `started_at`, the wall clock just before the flow is started. The run's `started` is
    `time.monotonic()` at that same instant: the two clocks agree up to any adjustment of the wall clock during the
    run (NTP slews it by at most 0.5 ms a second), as close as records stamped with the wall clock allow.
    """
    work_dir.mkdir(parents=True, exist_ok=True)
    path = work_dir / "replay_batch.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in replay_lines(shapes, job.served_model_name)))
    started, started_at = time.monotonic(), time.time()
    batch, wall, lag = await run_batch_file(path, job, work_dir / "out")
    traces = [line["response"]["body"]["pronk"]["trace"] for line in _read_jsonl(batch["output_uri"])]
    steps = _read_jsonl(batch["output_uri"].removesuffix("_output.jsonl") + "_steps.jsonl")
    ends: dict[str, float] = defaultdict(float)
    for r in steps:
        root = r.get("root_trace_id") or r["trace_id"]
        ends[root] = max(ends[root], r["started_at"] + (r.get("engine_time_s") or 0.0) - started_at)
    moved, moved_recomputed = worker_moves(
        [
            (r["trace_id"], r["step"], r["worker_id"], r["prompt_tokens"] - r["cached_tokens"])
            for r in steps
            if r.get("worker_id")
        ]
    )
    errors = [
        f"{line['custom_id']}: {line['error']['code']}: {line['error']['message']}"[:300]
        for line in _read_jsonl(batch["error_uri"])
    ]
    return AgentRun(
        name="pronk batch (Prefect)",
        wall_s=wall,
        workers=job.workers,
        traces=len(traces),
        steps=sum(t["steps"] for t in traces),
        prompt_tokens=sum(t["prompt_tokens"] for t in traces),
        cached_tokens=sum(t["cached_tokens"] for t in traces),
        output_tokens=sum(t["output_tokens"] for t in traces),
        trace_seconds=[t["duration_s"] for t in traces],
        moved_steps=moved,
        moved_recomputed_tokens=moved_recomputed,
        errors=errors,
        prefect_lag_s=lag,
        finished_s=sorted(ends.values()),
        started=started,
    )
