"""A quick look at one bare-loop setup: one round per seed on the job's fleet, with each worker's load sampled.

`make bench` takes about an hour a profile; a probe takes two or three minutes a seed, so a scheduling change
can be tried before it is recorded. Each round runs one setup of `bench.pronk_runs.ABLATIONS` (default: every
mechanism on) on a fresh workload, and prints one JSON line with the bench's figures of one round
(`bench.figures.run_figures`, as in `bench/results.json`; `first_errors` quotes up to three) and, from every
worker's `/stats` sampled every `--interval-s`:

- `busy`: per worker, the share of samples with a step in the engine (admitted, not waiting for room);
- `idle_with_waiters`: per worker, the share with no step in the engine while steps waited for room somewhere;
- `resident`: per worker, the mean number of admitted traces; `paused`: pauses admission made in the round.

Knobs a worker reads at start (`PRONK_KV_BUDGET_HEADROOM`, `PRONK_KV_BUDGET_GROWTH_STEPS`) can be set in the
environment of a probe that starts its own fleet (no stack up). Probes on one machine must run one at a time.

    python -m bench.probe --job agent-long --profile agent-long --traces 30 --seeds 1,2 [--out probes.jsonl]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from bench import pronk_runs
from bench.figures import FULL, AgentRun, run_figures
from bench.suite import CPU_BLOCK_SIZE, pronk_fleet, relabel
from bench.workload import cache_bounds, generate
from engine.protocol import WorkerStats
from pronk.jobs import JobConfig, get_job
from pronk.settings import Settings


@dataclass(frozen=True, slots=True)
class Load:
    """One worker's load at one sample."""

    in_engine: int
    waiting_for_room: int
    resident: int
    paused_total: int

    @classmethod
    def of(cls, stats: WorkerStats) -> Load:
        return cls(
            stats.in_flight,
            stats.admission_waiting,
            stats.admission_resident,
            stats.admission_counts.get("paused", 0),
        )


def load_figures(samples: list[list[Load]]) -> dict[str, list[float] | list[int]]:
    """Per-worker busy share, idle-while-steps-wait share, mean resident traces and pauses over the samples."""
    if not samples:
        return {"busy": [], "idle_with_waiters": [], "resident": [], "paused": []}
    workers = range(len(samples[0]))

    def share(hit) -> list[float]:
        return [round(sum(1 for row in samples if hit(row, i)) / len(samples), 3) for i in workers]

    return {
        "busy": share(lambda row, i: row[i].in_engine > 0),
        "idle_with_waiters": share(lambda row, i: row[i].in_engine == 0 and sum(w.waiting_for_room for w in row) > 0),
        "resident": [round(statistics.mean(row[i].resident for row in samples), 2) for i in workers],
        "paused": [samples[-1][i].paused_total - samples[0][i].paused_total for i in workers],
    }


async def sampled(job: JobConfig, settings: Settings, round_, interval_s: float):
    """Await `round_` while sampling every live worker of the job; (its result, the samples)."""
    from engine.client import WorkerClient
    from engine.registry import Registry
    from pronk.worker_token import worker_token

    client = WorkerClient(worker_token(settings))
    workers = Registry.from_settings(settings).live(job.job_id)
    samples: list[list[Load]] = []
    done = asyncio.Event()

    async def sample() -> None:
        while not done.is_set():
            samples.append([Load.of(await client.stats(w.url)) for w in workers])
            await asyncio.sleep(interval_s)

    sampler = asyncio.create_task(sample())
    try:
        return await round_, samples
    finally:
        done.set()
        await sampler
        await client.aclose()


def probe(job: JobConfig, settings: Settings, profile: str, traces: int, seed: int, setup: str, interval_s: float):
    """One round of `setup` on the workload of `seed`; its figures as a JSON-ready dict."""
    workload = generate(profile, seed, traces)
    ablation = next(a for a in pronk_runs.ABLATIONS if a.name == setup)
    shapes = relabel(workload.shapes, f"probe{seed}-{time.time():.0f}")
    result, samples = asyncio.run(
        sampled(job, settings, pronk_runs.bare_loop(shapes, job, settings, job.max_concurrency, ablation), interval_s)
    )
    run = AgentRun.from_replay(setup, result, job.workers)
    ideal = cache_bounds(workload, job.engine.block_size or CPU_BLOCK_SIZE)[1]
    figures = {name: round(value, 4) for name, value in run_figures(run, ideal).items()}
    return {
        "job": job.name,
        "profile": profile,
        "seed": seed,
        "setup": setup,
        "wall_s": round(run.wall_s, 1),
        **figures,
        **load_figures(samples),
        "first_errors": run.errors[:3],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--job", default="agent-long")
    parser.add_argument("--profile", default="agent-long")
    parser.add_argument("--traces", type=int, default=30, help="root traces a round")
    parser.add_argument("--seeds", default="1", help="comma-separated; one round each")
    parser.add_argument("--setup", default=FULL, choices=[a.name for a in pronk_runs.ABLATIONS])
    parser.add_argument("--interval-s", type=float, default=0.1, help="how often each worker's /stats is read")
    parser.add_argument("--out", type=Path, help="also append each round's line to this JSONL file")
    args = parser.parse_args()

    settings = Settings()
    job = get_job(args.job)
    with pronk_fleet(settings, job):
        for seed in (int(s) for s in args.seeds.split(",")):
            line = json.dumps(probe(job, settings, args.profile, args.traces, seed, args.setup, args.interval_s))
            print(line, flush=True)
            if args.out:
                with args.out.open("a") as out:
                    out.write(line + "\n")


if __name__ == "__main__":
    main()
