"""One Herd trial: a candidate configuration's temporary workers, a replay sample measured on them and, for the
guard's quality check, the job's labelled set run on them through the harness.

Trials never touch the job's own workers: each fleet is a job of its own (the candidate configuration under a
fresh `job-…` id, its file in a folder of its own that only its workers read through `PRONK_JOBS_DIR`), so it
registers under that id and no batch of the job is ever routed to it. Trials that differ only in settings the
router and harness read per run (routing, pins, admission, concurrency) reuse one fleet; a change of engine
settings, workers, the priority queue, the admission budget or the KV host tier starts a new one (`restart_key`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import shutil
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import yaml

from pronk.agents.harness import Harness, job_router
from pronk.agents.replay import TraceRecord, run_shape
from pronk.agents.step_records import StepRecorder
from pronk.agents.tool_gaps import ToolGaps
from pronk.batches.in_flight import InFlight
from pronk.batches.labelled import run_labelled
from pronk.batches.schemas import CheckCounts
from pronk.engine.router import Router
from pronk.jobs.schema import JobConfig
from pronk.protocol.lines import ValidRequest
from pronk.protocol.shapes import TraceShape
from pronk.settings import Settings
from pronk.stack.fleet import wait_for_workers
from pronk.stack.processes import spawn, stop
from pronk.stack.state import worker_name
from pronk.worker_registry import worker_registry

logger = logging.getLogger(__name__)

RESTART_SCHEDULING_KEYS = (
    "priority",
    "kv_budget_headroom",
    "kv_budget_growth_steps",
    "kv_pin_max_fraction",
    "kv_host_tier_bytes",
)
"""Scheduling settings a worker reads when it starts: changing them needs new workers, like engine settings."""


def restart_key(job: JobConfig) -> str:
    """What a job's workers are started with: trials (and applied versions) that differ here need new workers."""
    scheduling = job.scheduling.model_dump()
    return json.dumps(
        {
            "engine": job.engine.model_dump(),
            "workers": job.workers,
            "cpu_cores_per_worker": job.cpu_cores_per_worker,
            **{key: scheduling[key] for key in RESTART_SCHEDULING_KEYS},
        },
        sort_keys=True,
    )


@dataclass(slots=True)
class Measurement:
    """What replaying a sample on a configuration gave: tasks per dollar, trace times, cache use."""

    traces: int
    completed: int
    failed: int
    wall_s: float
    worker_seconds: float
    cost_usd: float
    tasks_per_dollar: float
    p50_s: float
    p90_s: float
    cached_ratio: float
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    errors: list[str] = field(default_factory=list)
    in_flight: list[int] = field(default_factory=list)
    """The traces in flight the replay chose, in order: one value when fixed, every change when adaptive."""

    def metrics(self) -> dict[str, float]:
        figures = {k: float(v) for k, v in asdict(self).items() if isinstance(v, (int, float))}
        if self.in_flight:
            figures["in_flight_last"] = float(self.in_flight[-1])
        return figures


def measure(
    records: list[TraceRecord | BaseException], wall_s: float, workers: int, price_per_worker_hour: float
) -> Measurement:
    """The figures of one replay: cost is the fleet's worker-seconds for the wall time, as a batch is charged."""
    done = [r for r in records if isinstance(r, TraceRecord)]
    errors = [f"{type(r).__name__}: {r}"[:300] for r in records if isinstance(r, BaseException)]
    summaries = [r.summary() for r in done]
    prompt = sum(s.prompt_tokens for s in summaries)
    cached = sum(s.cached_tokens for s in summaries)
    durations = sorted(r.duration_s for r in done)
    worker_seconds = wall_s * workers
    cost = worker_seconds / 3600.0 * price_per_worker_hour
    return Measurement(
        traces=len(records),
        completed=len(done),
        failed=len(errors),
        wall_s=round(wall_s, 3),
        worker_seconds=round(worker_seconds, 3),
        cost_usd=cost,
        tasks_per_dollar=round(len(done) / cost, 3) if cost > 0 else 0.0,
        p50_s=round(_quantile(durations, 0.5), 3),
        p90_s=round(_quantile(durations, 0.9), 3),
        cached_ratio=round(cached / prompt, 4) if prompt else 0.0,
        prompt_tokens=prompt,
        cached_tokens=cached,
        output_tokens=sum(s.output_tokens for s in summaries),
        errors=errors[:5],
    )


def _quantile(ordered: list[float], q: float) -> float:
    if not ordered:
        return 0.0
    return (
        statistics.quantiles(ordered, n=100, method="inclusive")[round(q * 100) - 1] if len(ordered) > 1 else ordered[0]
    )


def trial_router(job: JobConfig, settings: Settings) -> Router:
    """A router to the live workers of `job` (a trial fleet's id) with its scheduling settings; a step waits for
    admission at most the harness's step timeout."""
    return job_router(job, settings, admission_timeout_s=job.harness.step_timeout_s)


async def run_labelled_set(job: JobConfig, lines: list[ValidRequest], settings: Settings) -> CheckCounts:
    """The job's labelled set run through the harness on the live workers of `job` (a trial fleet's id), with
    `job`'s harness, scheduling and default settings: the checked success rate of that configuration. Its tools
    write under a scratch folder removed after."""
    router = trial_router(job, settings)
    scratch = settings.data_dir / "herd" / "scratch" / job.job_id
    try:
        return await run_labelled(
            lines, Harness(router, job, StepRecorder(), scratch, sandbox_bwrap=settings.sandbox_bwrap)
        )
    finally:
        await router.aclose()
        shutil.rmtree(scratch, ignore_errors=True)


async def replay_sample(
    job: JobConfig, shapes: list[TraceShape], settings: Settings, time_scale: float, timeout_s: float
) -> Measurement:
    """Replay `shapes` on the live workers of `job` with its scheduling settings, within its traces in flight
    (`max_concurrency`, or the adaptive target: `pronk.batches.in_flight`). Traces still running at `timeout_s`
    count as failed."""
    scheduling = job.scheduling
    router = trial_router(job, settings)
    gaps = ToolGaps(scheduling.kv_pin_ttl_s) if scheduling.kv_pin_ttl == "auto" else None
    in_flight = InFlight(job)

    async def one(shape: TraceShape) -> TraceRecord | BaseException:
        async with in_flight.slots:
            try:
                record = await run_shape(
                    router, shape, kv_pin_ttl_s=scheduling.kv_pin_ttl_s, time_scale=time_scale, gaps=gaps
                )
            except Exception as exc:  # noqa: BLE001 - one failed trace is a figure of the trial, not its end
                return exc
            in_flight.observe(record.records, router.workers)
            return record

    in_flight.retarget(router.workers)
    tasks = [asyncio.create_task(one(shape)) for shape in shapes]
    started = time.monotonic()
    try:
        await asyncio.wait(tasks, timeout=timeout_s)
    finally:
        for task in tasks:
            task.cancel()
        await router.aclose()
    wall = time.monotonic() - started
    records: list[TraceRecord | BaseException] = [
        t.result() if t.done() and not t.cancelled() else TimeoutError(f"not finished within {timeout_s:.0f}s")
        for t in tasks
    ]
    measurement = measure(records, wall, job.workers, job.worker_hour_price)
    measurement.in_flight = [p.target for p in in_flight.points]
    return measurement


class TrialFleet:
    """Temporary engine workers for trials, started for one configuration at a time and always stopped after."""

    def __init__(self, settings: Settings, start_timeout_s: float = 300.0):
        self.settings = settings
        self.start_timeout_s = start_timeout_s
        self.job: JobConfig | None = None
        self.key: str | None = None
        self.pids: dict[str, int] = {}
        self.starts: list[float] = []
        """Seconds each fleet took to start serving."""

    def serve(self, candidate: JobConfig) -> JobConfig:
        """Workers for `candidate` (the running ones when their start-up settings match); returns the trial job
        whose id the trial's router addresses (the candidate's settings, the fleet's id)."""
        key = restart_key(candidate)
        if self.job is None or key != self.key:
            self.stop()
            self._start(candidate)
            self.key = key
        assert self.job is not None
        return candidate.model_copy(update={"job_id": self.job.job_id, "name": self.job.name})

    def _start(self, candidate: JobConfig) -> None:
        suffix = secrets.token_hex(4)
        job = candidate.model_copy(update={"job_id": f"job-{suffix}", "name": f"herd-trial-{suffix}"})
        folder = self.settings.data_dir / "herd" / "trial_jobs" / job.job_id
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{job.name}.yaml").write_text(yaml.safe_dump(job.model_dump(mode="json", exclude_none=True)))
        self.job = job
        started = time.monotonic()
        env = {"PRONK_DATA_DIR": str(self.settings.data_dir), "PRONK_JOBS_DIR": str(folder)}
        for index in range(job.workers):
            name = worker_name(job.job_id, index)
            argv = [sys.executable, "-m", "pronk.stack.worker", "--job", job.job_id, "--index", str(index)]
            self.pids[name] = spawn(argv, self.settings.logs_dir / f"{name}.log", env=env)
        logger.info("trial fleet %s: starting %d worker(s)", job.job_id, job.workers)
        wait_for_workers(job, self.settings, self.pids, self.start_timeout_s)
        self.starts.append(time.monotonic() - started)
        logger.info("trial fleet %s serving after %.1f s", job.job_id, self.starts[-1])

    def stop(self) -> None:
        """Stop the running fleet's workers (their whole process groups) and drop its job folder."""
        for name, pid in self.pids.items():
            if not stop(pid):
                logger.error("trial worker %s (process group %d) outlived SIGKILL", name, pid)
        if self.job is not None:
            registry = worker_registry(self.settings)
            for name in self.pids:
                registry.withdraw(self.job.job_id, name)
            shutil.rmtree(self.settings.data_dir / "herd" / "trial_jobs" / self.job.job_id, ignore_errors=True)
        self.pids, self.job, self.key = {}, None, None

    def __enter__(self) -> TrialFleet:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()
