"""A quick look at one setup: one round per seed on the job's fleet, with each worker's load sampled.

`make bench` takes about an hour a profile; a probe takes two or three minutes a seed, so a scheduling change
can be tried before it is recorded. Each round runs one setup on a fresh workload: one of
`bench.harness.pronk_runs.ABLATIONS` (default: every mechanism on), or the batch flow (`--setup "pronk batch flow
(Prefect, full)"`: replay lines through the Prefect flow in this process, as `make bench` runs it, so a profiler on
this process sees the flow's own cost). It prints one JSON line with the bench's figures of one round
(`bench.harness.figures.run_figures`, as in `bench/results/results.json`; `first_errors` quotes up to three)
and, from every worker's `/stats` sampled every `--interval-s`:

- `busy`: per worker, the share of samples with a step in the engine (admitted, not waiting for room);
- `idle_with_waiters`: per worker, the share with no step in the engine while steps waited for room somewhere;
- `resident`: per worker, the mean number of admitted traces; `paused`: pauses admission made in the round;
- `cpu_s`: CPU seconds each kind of process on the machine used in the round (this process, which runs the loop or
  the flow; the engine cores; the workers' HTTP front ends; the Prefect server; the rest), so what competes with
  the engines for the cores shows;
- `host_tier`: with a KV host tier, what the round looked up, hit and loaded there, and its copies and their time.
- `drawer_s`: with the batch flow, how long its trace-sample drawer ran on after the flow returned (the next round
  starts once it has ended). Two unmeasured traces go through the flow first, as in `make bench`.

`--gap-scale` multiplies every tool gap (0: none). `--limit` also runs the capacity-matched offline limit
(`bench.harness.fleet.capacity_limit`) on the round's shapes (with the fleet idle) and adds `limit_traces_per_s` and
`over_limit`, as `make bench` computes them. A round with no gaps beside the limit shows what the serving path
costs; the same round with its gaps shows what they cost.

Knobs a worker reads at start (the job's `scheduling.kv_budget_headroom`, `scheduling.kv_budget_growth_steps`) are
tried with a job file that sets them (`base:` the job, and the one change). Probes on one machine must run one at a
time.

    python -m bench.experiments.probe --job agent-long --profile agent-long --traces 30 --seeds 1,2
        [--gap-scale 0] [--limit] [--out probes.jsonl]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from bench.harness import pronk_runs
from bench.harness.figures import BATCH, FULL, AgentRun, over_limit, run_figures
from bench.harness.fleet import CPU_BLOCK_SIZE, capacity_limit, limit_run, pronk_fleet
from bench.harness.suite import relabel
from bench.harness.workload import cache_bounds, generate
from pronk.engine.worker_protocol import WorkerStats
from pronk.jobs.catalog import resolve_job
from pronk.jobs.schema import JobConfig
from pronk.settings import Settings, get_settings
from pronk.stack.prefect_env import configure_prefect


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


async def worker_loads(job: JobConfig, settings: Settings) -> list[Load]:
    """Every live worker's load now."""
    return [Load.of(stats) for stats in await pronk_runs.live_worker_stats(job, settings)]


CPU_ROLES = (
    ("engine cores", lambda p: pronk_runs.ENGINE_CORE in p.name()),
    ("worker front ends", lambda p: "pronk.stack.worker" in " ".join(p.cmdline())),
    ("prefect server", lambda p: "prefect server" in " ".join(p.cmdline())),
)


def cpu_by_role() -> dict[str, float]:
    """CPU seconds so far of every process on the machine, summed by `CPU_ROLES` ("this process" and "other" for the
    rest); a process that ends between two readings drops out of the later one."""
    totals = dict.fromkeys(["this process", *(role for role, _ in CPU_ROLES), "other"], 0.0)
    me = os.getpid()
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            times = process.cpu_times()
            role = "this process" if process.pid == me else next((r for r, hit in CPU_ROLES if hit(process)), "other")
            totals[role] += times.user + times.system
    return totals


TIER_FIGURES = ("lookup_tokens", "hit_tokens", "loaded_tokens", "stores", "store_seconds", "loads", "load_seconds")
"""The KV host tier's counts a round reports (`pronk.engine.worker_protocol.HostTierStats`), summed over the workers."""


async def tier_totals(job: JobConfig, settings: Settings) -> dict[str, float] | None:
    """The job's live workers' KV host tier counts so far, summed; None where the job has no tier."""
    present = [s.host_tier for s in await pronk_runs.live_worker_stats(job, settings) if s.host_tier is not None]
    return {name: sum(getattr(tier, name) for tier in present) for name in TIER_FIGURES} if present else None


@dataclass(frozen=True, slots=True)
class Round:
    """What one probe round runs: `setup` on the workload of `seed`, its tool gaps times `gap_scale`, and with
    `limit` the offline limit on the same shapes."""

    profile: str
    traces: int
    seed: int
    setup: str = FULL
    gap_scale: float = 1.0
    limit: bool = False
    concurrency: int | None = None
    """Traces a bare loop keeps in flight; None: the job's `max_concurrency`."""


def probe(job: JobConfig, settings: Settings, round_: Round, interval_s: float, work_dir: Path) -> dict:
    """One round; its figures as a JSON-ready dict."""
    workload = generate(round_.profile, round_.seed, round_.traces)
    label = f"probe{round_.seed}-{time.time():.0f}"
    shapes = relabel(workload.shapes, label)
    concurrency = round_.concurrency or job.scheduling.max_concurrency
    tier_before = asyncio.run(tier_totals(job, settings))
    cpu_before = cpu_by_role()
    if round_.setup == BATCH:
        if round_.gap_scale != 1.0 or round_.concurrency:
            raise ValueError("the batch flow runs the job as it is: --gap-scale and --concurrency are for bare loops")
        run, samples = asyncio.run(
            pronk_runs.sampling(
                pronk_runs.trace_batch(shapes, job, work_dir / label), lambda: worker_loads(job, settings), interval_s
            )
        )
    else:
        ablation = next(a for a in pronk_runs.ABLATIONS if a.name == round_.setup)
        loop = pronk_runs.bare_loop(shapes, job, settings, concurrency, ablation, round_.gap_scale)
        result, samples = asyncio.run(pronk_runs.sampling(loop, lambda: worker_loads(job, settings), interval_s))
        run = AgentRun.from_replay(round_.setup, result, job.workers)
    cpu_after = cpu_by_role()
    tier_after = asyncio.run(tier_totals(job, settings))
    drawer_s = pronk_runs.wait_for_trace_drawer(settings) if round_.setup == BATCH else None
    ideal = cache_bounds(workload, job.engine.block_size or CPU_BLOCK_SIZE)[1]
    figures = {name: round(value, 4) for name, value in run_figures(run, ideal).items()}
    if round_.limit:
        from pronk.models.registry import resolve_model

        model_dir = resolve_model(job.model, settings).path
        shapes = relabel(workload.shapes, f"{label}-limit")
        limit = limit_run(capacity_limit(job, model_dir, shapes), job, model_dir, shapes, work_dir / label)
        figures["limit_traces_per_s"] = round(limit.traces_per_s, 4)
        figures["over_limit"] = round(over_limit(run, limit), 4)
    return {
        "job": job.name,
        "profile": round_.profile,
        "seed": round_.seed,
        "setup": round_.setup,
        "gap_scale": round_.gap_scale,
        "concurrency": concurrency,
        "wall_s": round(run.wall_s, 1),
        **figures,
        **load_figures([loads for _, loads in samples]),
        "cpu_s": {role: round(cpu_after[role] - cpu_before[role], 1) for role in cpu_after},
        "host_tier": {k: round(tier_after[k] - tier_before[k], 3) for k in TIER_FIGURES}
        if tier_after and tier_before
        else None,
        "drawer_s": drawer_s,
        "first_errors": run.errors[:3],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--job", default="agent-long")
    parser.add_argument("--profile", default="agent-long")
    parser.add_argument("--traces", type=int, default=30, help="root traces a round")
    parser.add_argument("--seeds", default="1", help="comma-separated; one round each")
    parser.add_argument("--setup", default=FULL, choices=[a.name for a in pronk_runs.ABLATIONS] + [BATCH])
    parser.add_argument("--gap-scale", type=float, default=1.0, help="multiplies every tool gap (0: none)")
    parser.add_argument(
        "--concurrency",
        help="traces in flight, comma-separated: each on every seed, in an order rotated a seed (default: the job's)",
    )
    parser.add_argument("--limit", action="store_true", help="also run the offline limit on each round's shapes")
    parser.add_argument("--interval-s", type=float, default=0.1, help="how often each worker's /stats is read")
    parser.add_argument("--out", type=Path, help="also append each round's line to this JSONL file")
    args = parser.parse_args()

    settings = Settings()
    configure_prefect(settings)  # the batch flow reports to the stack's Prefect server, as in `make bench`
    job = resolve_job(args.job, get_settings())
    with pronk_fleet(settings, job):
        if args.setup == BATCH:  # as `make bench` does before its rounds
            warm = relabel(generate(args.profile, -1, 2).shapes, f"warm-{time.time():.0f}")
            pronk_runs.warm_batch_flow(warm, job, settings, settings.data_dir / "bench" / "probe" / "warm")
        concurrencies = [int(c) for c in args.concurrency.split(",")] if args.concurrency else [None]
        for turn, seed in enumerate(int(s) for s in args.seeds.split(",")):
            first = turn % len(concurrencies)
            for concurrency in concurrencies[first:] + concurrencies[:first]:
                round_ = Round(args.profile, args.traces, seed, args.setup, args.gap_scale, args.limit, concurrency)
                line = json.dumps(probe(job, settings, round_, args.interval_s, settings.data_dir / "bench" / "probe"))
                print(line, flush=True)
                if args.out:
                    with args.out.open("a") as out:
                        out.write(line + "\n")


if __name__ == "__main__":
    main()
