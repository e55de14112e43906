"""`python -m bench`: run the baseline and pronk side by side on one workload, then print and record the table.

One round draws a workload (seed + round) and replays it on every setup, in an order rotated by one
each round: N stock vLLM servers behind round-robin (the baseline); the same servers behind vllm-router, once with
each of its policies (the peers, `bench.harness.peer`); pronk's workers through the same bare
asyncio loop over pronk's router with the Herd's mechanisms switched on one by one (`ABLATIONS`:
affinity only, + pins, + admission, + priority), so those setups differ only in the mechanism; pronk's
batch flow with the job as configured (the product, orchestration included); and the two offline limits
(`bench.harness.fleet.LIMITS`: the same KV capacity as pronk, and compute only). Each setup gets the same
shapes under its own trace ids, so no setup reads KV another left in a cache. Every round's value is kept
(`rounds_table`, `goals`); then the single-step file runs through pronk's batch flow and through vLLM's
`run_batch`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from bench.harness import agent_real, pronk_runs, report
from bench.harness.agent_loop import OpenAIServers, replay
from bench.harness.baseline import VllmServers, run_vllm_batch, untiered
from bench.harness.config import BenchConfig
from bench.harness.figures import (
    BASELINE,
    BATCH,
    FULL,
    PEERS,
    UNTIERED,
    AgentRun,
    EngineLoad,
    SingleStepRun,
    agent_comparisons,
    median_run,
    record_key,
    rounds_best_peer,
    rounds_table,
    single_step_comparisons,
)
from bench.harness.fleet import (
    CPU_BLOCK_SIZE,
    LIMITS,
    LimitPlan,
    job_model_dir,
    kv_tokens_per_worker,
    limit_run,
    pronk_fleet,
)
from bench.harness.goals import goals
from bench.harness.peer import VllmRouter
from bench.harness.pronk_runs import ABLATIONS
from bench.harness.report import record, run_meta
from bench.harness.workload import LABELLED_PROFILES, Workload, cache_bounds, generate, write_single_step_file
from pronk.jobs.catalog import resolve_job
from pronk.jobs.schema import JobConfig
from pronk.protocol.shapes import TraceShape
from pronk.settings import Settings

log = logging.getLogger(__name__)


def relabel(shapes: list[TraceShape], label: str) -> list[TraceShape]:
    """The same shapes under trace ids of their own, so their token content (and KV) is the setup's own."""

    def one(shape: TraceShape) -> TraceShape:
        steps = [s.model_copy(update={"fan_out": [one(c) for c in s.fan_out]}) for s in shape.steps]
        return shape.model_copy(update={"trace_id": f"{label}-{shape.trace_id}", "steps": steps})

    return [one(shape) for shape in shapes]


class Bench:
    def __init__(self, config: BenchConfig, settings: Settings):
        self.config = config
        self.settings = settings
        self.job: JobConfig = resolve_job(config.job, settings)
        self.concurrency = (
            self.job.scheduling.max_concurrency
        )  # what pronk's batch keeps in flight; every setup gets the same
        self.work = config.work_dir
        self.work.mkdir(parents=True, exist_ok=True)
        self.peer_commands: dict[str, str] = {}
        """Each peer's vllm-router command line, by setup name, for the record."""

    @functools.cached_property
    def model_dir(self) -> Path:
        return job_model_dir(self.job, self.settings)

    def agent_round(
        self,
        workload: Workload,
        servers: VllmServers,
        turn: int,
        untiered: VllmServers | None = None,
        routers: dict[str, VllmRouter] | None = None,
    ) -> dict[str, AgentRun]:
        """Every setup on one workload, in an order rotated by `turn` so no setup always goes first; `untiered` are
        stock servers of a tiered job without its tier, one more baseline; `routers`, the peers: vllm-routers in
        front of `servers`, by setup name."""
        job, n, settings = self.job, self.job.workers, self.settings
        tiered = bool(job.scheduling.kv_host_tier_bytes)

        def stock(
            name: str,
            stock_servers: VllmServers,
            label: str,
            with_tier: bool,
            client: Callable[[], OpenAIServers] | None = None,
        ) -> Callable[[], AgentRun]:
            """A setup of stock servers: behind round-robin, or behind what `client` makes (a vllm-router)."""

            def one() -> AgentRun:
                before = asyncio.run(pronk_runs.server_counters(stock_servers.urls, with_tier))
                backend = client() if client else OpenAIServers(stock_servers.urls, job.served_model_name)
                result, samples = asyncio.run(
                    pronk_runs.sampling(
                        replay(relabel(workload.shapes, label), backend, self.concurrency),
                        lambda: pronk_runs.server_loads(stock_servers.urls, stock_servers.pids),
                    )
                )
                run = AgentRun.from_replay(name, result, n)
                run.note_load(samples, job.cpu_cores_per_worker)
                asyncio.run(pronk_runs.server_counters(stock_servers.urls, with_tier)).note_run(run, before)
                return run

            return one

        def load_on_workers() -> Awaitable[list[EngineLoad]]:
            return pronk_runs.worker_loads(job, settings)

        def ablation(setup: pronk_runs.Ablation, label: str) -> Callable[[], AgentRun]:
            def one() -> AgentRun:
                before = asyncio.run(pronk_runs.worker_counters(job, settings))
                result, samples = asyncio.run(
                    pronk_runs.sampling(
                        pronk_runs.bare_loop(relabel(workload.shapes, label), job, settings, self.concurrency, setup),
                        load_on_workers,
                    )
                )
                run = AgentRun.from_replay(setup.name, result, n)
                run.note_load(samples, job.cpu_cores_per_worker)
                asyncio.run(pronk_runs.worker_counters(job, settings)).note_run(run, before)
                return run

            return one

        def batch() -> AgentRun:
            before = asyncio.run(pronk_runs.worker_counters(job, settings))
            run, samples = asyncio.run(
                pronk_runs.sampling(
                    pronk_runs.trace_batch(
                        relabel(workload.shapes, "batch"), job, self.work / f"agent-{workload.seed}"
                    ),
                    load_on_workers,
                )
            )
            run.name = BATCH
            run.note_load(samples, job.cpu_cores_per_worker)
            asyncio.run(pronk_runs.worker_counters(job, settings)).note_run(run, before)
            log.info(
                "the trace-sample drawer ended %.1f s after the batch flow", pronk_runs.wait_for_trace_drawer(settings)
            )
            return run

        def limit(plan_of: Callable[..., LimitPlan], label: str) -> Callable[[], AgentRun]:
            def one() -> AgentRun:
                shapes = relabel(workload.shapes, label)
                plan = plan_of(job, self.model_dir, shapes)
                return limit_run(plan, job, self.model_dir, shapes, self.work / f"limits-{workload.seed}")

            return one

        setups: list[tuple[str, Callable[[], AgentRun]]] = [(BASELINE, stock(BASELINE, servers, "base", tiered))]
        if untiered is not None:
            setups.append((UNTIERED, stock(UNTIERED, untiered, "untiered", False)))
        for i, (name, router) in enumerate((routers or {}).items()):
            client = functools.partial(router.client, job.served_model_name)
            setups.append((name, stock(name, servers, f"peer{i}", tiered, client)))
        setups += [(a.name, ablation(a, f"abl{i}")) for i, a in enumerate(ABLATIONS)]
        setups += [(BATCH, batch)]
        if self.config.limit:
            setups += [(name, limit(plan_of, f"lim{i}")) for i, (name, plan_of) in enumerate(LIMITS.items())]
        turn %= len(setups)
        runs = {}
        for name, run in setups[turn:] + setups[:turn]:
            log.info("round %d: %s", workload.seed - self.config.seed, name)
            runs[name] = run()
        runs[BATCH].orchestration_overhead = (runs[BATCH].wall_s - runs[FULL].wall_s) / runs[BATCH].wall_s
        return {name: runs[name] for name, _ in setups}

    def single_step(self, model_dir: Path) -> tuple[SingleStepRun, SingleStepRun]:
        path = write_single_step_file(
            self.work / "single_step.jsonl",
            self.config.single_step_requests,
            self.job.served_model_name,
            self.config.seed,
        )
        batch, wall, _ = asyncio.run(pronk_runs.run_batch_file(path, self.job, self.work / "single-pronk"))
        pronk = SingleStepRun(
            "pronk run_batch",
            wall,
            batch["request_counts"]["total"],
            batch["request_counts"]["completed"],
            batch["usage"]["output_tokens"],
        )
        out = self.work / "single-vllm" / "output.jsonl"
        out.parent.mkdir(parents=True, exist_ok=True)
        wall, processing = run_vllm_batch(self.job, model_dir, path, out, self.work / "logs" / "vllm-run-batch.log")
        lines = [json.loads(line) for line in out.read_text().splitlines()]
        ok = [
            line for line in lines if not line.get("error") and (line.get("response") or {}).get("status_code") == 200
        ]
        tokens = sum(line["response"]["body"]["usage"]["completion_tokens"] for line in ok)
        return pronk, SingleStepRun("vLLM run_batch", wall, len(lines), len(ok), tokens, processing_s=processing)

    def run(self, on_round: Callable[[dict], object] | None = None) -> dict:
        """Every round, then the single-step comparison; `on_round` gets the outcome so far after each round."""
        cfg, settings = self.config, self.settings
        model_dir = self.model_dir
        workloads = [generate(cfg.profile, cfg.seed + r, cfg.traces) for r in range(cfg.rounds)]
        rounds: list[dict[str, AgentRun]] = []
        with contextlib.ExitStack() as stack:
            logs = self.work / "logs"
            servers = stack.enter_context(VllmServers(self.job, model_dir, logs, self.job.workers, behind_router=True))
            routers = {
                name: stack.enter_context(VllmRouter(name, servers.urls, self.concurrency, logs)) for name in PEERS
            }
            self.peer_commands = {name: router.command_line for name, router in routers.items()}
            without_tier = None
            if self.job.scheduling.kv_host_tier_bytes:  # stock vLLM without the tier too, in the same rounds
                without_tier = stack.enter_context(
                    VllmServers(untiered(self.job), model_dir, self.work / "logs-untiered", self.job.workers)
                )
            pronk_runs.warm_batch_flow(
                relabel(generate(cfg.profile, cfg.seed - 1, 2).shapes, "warm"), self.job, settings, self.work / "warm"
            )
            for turn, workload in enumerate(workloads):
                rounds.append(self.agent_round(workload, servers, turn, without_tier, routers))
                if on_round is not None and len(rounds) < len(workloads):
                    on_round(self.outcome(rounds, workloads[: len(rounds)], servers.startup_s))
            startup_s = servers.startup_s
        outcome = self.outcome(rounds, workloads, startup_s)
        if cfg.single_step_requests:
            single_pronk, single_vllm = self.single_step(model_dir)
            outcome["comparisons"] += single_step_comparisons(single_pronk, single_vllm)
            outcome["single"] = [single_pronk, single_vllm]
        return outcome

    def outcome(self, rounds: list[dict[str, AgentRun]], workloads: list[Workload], startup_s: float) -> dict:
        """The figures of the rounds run so far."""
        ideals = [cache_bounds(w, self.job.engine.block_size or CPU_BLOCK_SIZE)[1] for w in workloads]
        pronk, bare, baseline = (median_run([r[name] for r in rounds]) for name in (BATCH, FULL, BASELINE))
        peer = rounds_best_peer(rounds)
        return {
            "comparisons": agent_comparisons(pronk, bare, baseline, self.job.price_per_worker_hour),
            "runs": [pronk, bare, baseline, *([median_run([r[peer] for r in rounds])] if peer else [])],
            "rounds": rounds,
            "setups": rounds_table(rounds, ideals),
            "goals": goals(
                rounds, ideals, record_key(self.config.profile, bool(self.job.scheduling.kv_host_tier_bytes))
            ),
            "single": [],
            "workloads": workloads,
            "startup_s": startup_s,
            "peer_commands": self.peer_commands,
        }


def meta(config: BenchConfig, job: JobConfig, outcome: dict) -> dict:
    workload: Workload = outcome["workloads"][0]
    return {
        **run_meta(config, job, len(outcome["rounds"])),
        "traces_per_round": len(workload.shapes),
        "steps_per_round": workload.total_steps(),
        "steps_cut_by_context_cap": workload.steps_cut_by_cap,
        "single_step_requests": config.single_step_requests,
        "vllm_server_startup_s": round(outcome["startup_s"], 1),
        "peer_commands": outcome["peer_commands"],
        "errors": {name: run.errors[:5] for r in outcome["rounds"] for name, run in r.items() if run.errors},
    }


def kv_summary(job: JobConfig, model_dir: Path, workload: Workload, concurrency: int) -> dict:
    """KV capacity per process against the workload's working set, and the no-eviction cached ratio."""
    mean_context, ideal = cache_bounds(workload, job.engine.block_size or CPU_BLOCK_SIZE)
    return {
        "tokens_per_worker": kv_tokens_per_worker(job, model_dir),
        "mean_trace_context": round(mean_context),
        "working_set_tokens_per_worker": round(min(concurrency, len(workload.shapes)) / job.workers * mean_context),
        "ideal_cached_ratio": ideal,
    }


def run_bench(config: BenchConfig, settings: Settings, echo=print) -> dict:
    """Run everything, print the table, and (with `record`) write the results files, after every round too. A
    labelled profile (`agent-real`) runs real agent tasks instead (`bench.harness.agent_real`)."""
    if config.profile in LABELLED_PROFILES:
        return agent_real.run_real_bench(config, settings, echo)
    bench = Bench(config, settings)
    started = time.monotonic()

    def summary(outcome: dict, final: bool) -> dict:
        info = meta(config, bench.job, outcome)
        info["kv"] = kv_summary(bench.job, bench.model_dir, outcome["workloads"][0], bench.concurrency)
        info["bench_wall_s"] = round(time.monotonic() - started, 1)
        info["rounds_completed"] = len(outcome["rounds"])
        if config.record:
            for path in record(config, outcome, info):
                echo(f"wrote {path}" + ("" if final else f" (after round {len(outcome['rounds'])})"))
        return info

    with pronk_fleet(settings, bench.job):
        started = time.monotonic()
        outcome = bench.run(on_round=lambda partial: summary(partial, final=False))
    echo(report.text_table(outcome["comparisons"]))
    echo(report.setups_table(outcome["setups"]))
    if defects := report.defect_lines(outcome["setups"]):
        echo(defects)
    echo(report.goals_table(outcome["goals"]))
    info = summary(outcome, final=True)
    echo(
        f"KV per process {info['kv']['tokens_per_worker']:,} tokens, working set "
        f"~{info['kv']['working_set_tokens_per_worker']:,}; cached ratio with no eviction "
        f"{info['kv']['ideal_cached_ratio']:.3f}; bench took {info['bench_wall_s']} s"
    )
    if info["errors"]:
        echo(f"errors: {info['errors']}")
    outcome["meta"] = info
    return outcome
