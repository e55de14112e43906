"""`python -m bench --profile agent-real`: the job's labelled agent tasks as long-context traces on a real model,
checked, pronk against stock vLLM round-robin and against vllm-router, beside the offline limits.

Each round draws its traces from the job's labelled set (`workload.labelled_traces`, seed + round: every trace a
document of its own in front of its task) and runs them on every serving setup, in an order rotated each round. All
run the very same loop: pronk's agent `Harness` over the lines (real python, sql and search tools), the job's
`max_concurrency` lines at a time, every answer checked by `run_check` (`pronk.batches.labelled.check_lines`). Only
what answers a step differs: pronk's workers through `job_router`, or N stock vLLM OpenAI servers behind round-robin
(`OpenAIServers`, sent chat completions with each step's JSON schema as `response_format`), or the same servers
behind vllm-router with each of its policies (the peers, `bench.harness.peer`). Then the two offline limits
(`bench.harness.fleet.LIMITS`: the same KV capacity as pronk, and compute only) replay the shapes pronk's own step
records give (`pronk.herd.shapes.shapes_from_steps`) with no tool gaps. Every round is kept; the goals are those of
issues 26 and 63 (`goals.checked_goals`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import cast

from bench.harness import pronk_runs
from bench.harness.agent_loop import OpenAIServers
from bench.harness.baseline import VllmServers
from bench.harness.config import BenchConfig
from bench.harness.figures import (
    BASELINE,
    HARNESS,
    PEERS,
    CheckedRound,
    CheckedRun,
    Comparison,
    EngineLoad,
    checked_best_peer,
    checked_table,
    median_run,
)
from bench.harness.fleet import LIMITS, job_model_dir, kv_tokens_per_worker, limit_run, pronk_fleet
from bench.harness.goals import checked_goals
from bench.harness.peer import VllmRouter
from bench.harness.report import (
    CHECKED_COLUMNS,
    checked_section,
    defect_lines,
    goals_table,
    record,
    run_meta,
    setups_table,
    text_table,
)
from bench.harness.workload import LABELLED_PROFILES, LabelledProfile, labelled_traces, relabelled
from pronk.agents.harness import Harness, job_router
from pronk.agents.step_records import StepRecord, StepRecorder, record_order, steps_ndjson
from pronk.batches.labelled import check_lines, labelled_lines
from pronk.engine.router import Router
from pronk.herd.profile import scan_steps
from pronk.herd.shapes import shapes_from_steps
from pronk.jobs.catalog import resolve_job
from pronk.jobs.schema import JobConfig
from pronk.protocol.lines import ValidRequest
from pronk.protocol.shapes import TraceShape
from pronk.settings import Settings, get_settings

log = logging.getLogger(__name__)


def trace_contexts(records: list[StepRecord]) -> list[int]:
    """Each root trace's final context (its longest step's prompt plus output) from its step records."""
    final: dict[str, int] = {}
    for r in records:
        if r.worker_id is not None and r.parent_trace_id is None:
            final[r.trace_id] = max(final.get(r.trace_id, 0), r.prompt_tokens + r.output_tokens)
    return list(final.values())


def shapes_of(records: list[StepRecord], path: Path) -> list[TraceShape]:
    """The trace shapes `records` give (each step's exact prompt and output lengths, its tool gap), by way of a steps
    file at `path` read as the Herd reads a job's records."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(steps_ndjson(sorted(records, key=record_order)))
    return shapes_from_steps(scan_steps([str(path)], get_settings()))


class RealBench:
    """The rounds of one `agent-real` run, on a running pronk fleet and N stock vLLM servers."""

    def __init__(self, config: BenchConfig, settings: Settings):
        self.config = config
        self.settings = settings
        self.job: JobConfig = resolve_job(config.job, get_settings())
        self.profile: LabelledProfile = LABELLED_PROFILES[config.profile]
        self.lines = labelled_lines(self.job, settings)
        self.work = config.work_dir
        self.work.mkdir(parents=True, exist_ok=True)
        self.records: list[StepRecord] = []
        """pronk's step records of every round so far (the traces' contexts for the KV figures)."""

    @functools.cached_property
    def model_dir(self) -> Path:
        return job_model_dir(self.job, self.settings)

    async def checked(
        self,
        name: str,
        lines: list[ValidRequest],
        router: Router,
        scratch: Path,
        loads: Callable[[], Awaitable[list[EngineLoad]]],
    ) -> CheckedRun:
        """`lines` through pronk's harness over `router`, every answer checked, the engines' load sampled through it
        (`loads`); the router is closed after."""
        harness = Harness(router, self.job, StepRecorder(), scratch, sandbox_bwrap=self.settings.sandbox_bwrap)
        started = time.monotonic()
        try:
            checked, samples = await pronk_runs.sampling(check_lines(lines, harness), loads)
        finally:
            await router.aclose()
        job = self.job
        run = CheckedRun.of(name, checked, started, time.monotonic() - started, job.workers, job.price_per_worker_hour)
        run.run.note_load(samples, job.cpu_cores_per_worker)
        return run

    def round(
        self, seed: int, servers: VllmServers, turn: int, routers: dict[str, VllmRouter] | None = None
    ) -> CheckedRound:
        """Every serving setup on one round's traces, in an order rotated by `turn`, then the limits on pronk's
        shapes; `routers` are the peers: vllm-routers in front of `servers`, by setup name."""
        traces = labelled_traces(self.lines, self.profile, seed, self.config.traces)
        job, settings, scratch = self.job, self.settings, self.work / f"scratch-{seed}"

        def on_servers(name: str, label: str, client: Callable[[], OpenAIServers]) -> Callable[[], CheckedRun]:
            def one() -> CheckedRun:
                before = asyncio.run(pronk_runs.server_counters(servers.urls))
                # the harness only calls generate and finish, which the stock servers speak like a router
                backend = cast(Router, client())
                loads = functools.partial(pronk_runs.server_loads, servers.urls, servers.pids)
                run = asyncio.run(self.checked(name, relabelled(traces, label), backend, scratch, loads))
                asyncio.run(pronk_runs.server_counters(servers.urls)).note_run(run.run, before)
                return run

            return one

        def pronk() -> CheckedRun:
            before = asyncio.run(pronk_runs.worker_counters(job, settings))
            router = job_router(job, settings)  # as the batch flow builds it
            loads = functools.partial(pronk_runs.worker_loads, job, settings)
            run = asyncio.run(self.checked(HARNESS, relabelled(traces, "pronk"), router, scratch, loads))
            asyncio.run(pronk_runs.worker_counters(job, settings)).note_run(run.run, before)
            return run

        round_robin = functools.partial(OpenAIServers, servers.urls, job.served_model_name)
        setups = [(BASELINE, on_servers(BASELINE, "base", round_robin))]
        for i, (name, router) in enumerate((routers or {}).items()):
            setups.append((name, on_servers(name, f"peer{i}", functools.partial(router.client, job.served_model_name))))
        setups.append((HARNESS, pronk))
        turn %= len(setups)
        runs: dict[str, CheckedRun] = {}
        for name, run in setups[turn:] + setups[:turn]:
            log.info("round %d: %s", seed - self.config.seed, name)
            runs[name] = run()
        self.records += runs[HARNESS].records
        limits = {}
        if self.config.limit:
            shapes = shapes_of(runs[HARNESS].records, self.work / f"agent-real-{seed}" / "pronk_steps.jsonl")
            for name, plan_of in LIMITS.items():
                log.info("round %d: %s", seed - self.config.seed, name)
                plan = plan_of(job, self.model_dir, shapes)
                limits[name] = limit_run(plan, job, self.model_dir, shapes, self.work / f"limits-{seed}")
        peers = {name: runs[name] for name in routers or {}}
        return CheckedRound(runs[BASELINE], runs[HARNESS], limits, peers)

    def run(self, on_round=None) -> dict:
        """Every round; `on_round` gets the outcome so far after each round but the last."""
        cfg = self.config
        rounds: list[CheckedRound] = []
        with contextlib.ExitStack() as stack:
            logs = self.work / "logs"
            servers = stack.enter_context(
                VllmServers(self.job, self.model_dir, logs, self.job.workers, behind_router=True)
            )
            concurrency = self.job.scheduling.max_concurrency
            routers = {name: stack.enter_context(VllmRouter(name, servers.urls, concurrency, logs)) for name in PEERS}
            commands = {name: router.command_line for name, router in routers.items()}
            for turn in range(cfg.rounds):
                rounds.append(self.round(cfg.seed + turn, servers, turn, routers))
                if on_round is not None and len(rounds) < cfg.rounds:
                    on_round(outcome(rounds, servers.startup_s, commands))
            startup_s = servers.startup_s
        return outcome(rounds, startup_s, commands)

    def kv(self) -> dict:
        """KV capacity per process against the working set the traces really made (pronk's records)."""
        contexts = trace_contexts(self.records) or [0]
        mean = sum(contexts) / len(contexts)
        in_flight = min(self.job.scheduling.max_concurrency, self.config.traces or self.profile.traces)
        working = in_flight / self.job.workers * mean
        tokens = kv_tokens_per_worker(self.job, self.model_dir)
        return {
            "tokens_per_worker": tokens,
            "mean_trace_context": round(mean),
            "longest_trace_context": max(contexts),
            "working_set_tokens_per_worker": round(working),
            "cache_share_of_working_set": round(tokens / working, 3) if working else None,
        }


COMPARED = (
    # (figure, unit, key in checked_table, higher is better)
    ("checked successes per dollar", "passed/USD", "successes_per_dollar", True),
    ("checked successes per second", "passed/s", "successes_per_s", True),
    ("success rate", "passed/checked", "success_rate", True),
    ("tool-call validity", "valid/calls", "tool_call_validity", True),
    ("traces per second (steady state)", "traces/s", "traces_per_s_steady", True),
    ("traces per second (all traces / wall time)", "traces/s", "traces_per_s_wall", True),
    ("cached-token ratio", "cached/prompt", "cached_ratio", True),
    ("p90 trace completion time", "s", "p90_trace_s", False),
)


def outcome(rounds: list[CheckedRound], startup_s: float, peer_commands: dict[str, str]) -> dict:
    """The figures of the rounds run so far; `peer_commands`, how each peer's vllm-router was started."""
    setups = checked_table(rounds)
    comparisons = [
        Comparison(f"agent-real: {name}", unit, setups[HARNESS][key]["median"], setups[BASELINE][key]["median"], better)
        for name, unit, key, better in COMPARED
    ]
    plotted = [HARNESS, BASELINE, *filter(None, [checked_best_peer(rounds)])]
    return {
        "comparisons": comparisons,
        "runs": [median_run([r.served()[name].run for r in rounds]) for name in plotted],
        "rounds": rounds,
        "setups": setups,
        "goals": checked_goals(rounds),
        "startup_s": startup_s,
        "peer_commands": peer_commands,
    }


def run_real_bench(config: BenchConfig, settings: Settings, echo=print) -> dict:
    """Run every round, print the tables, and (with `record`) write the profile's results, after every round too."""
    bench = RealBench(config, settings)
    started = time.monotonic()

    def summary(done: dict, final: bool) -> dict:
        rounds: list[CheckedRound] = done["rounds"]
        info = {
            **run_meta(config, bench.job, len(rounds)),
            "model": bench.job.model,
            "labelled_set": bench.job.quality.labelled_set,
            "traces_per_round": rounds[0].pronk.run.traces,
            "document_tokens": list(bench.profile.document_tokens),
            "vllm_server_startup_s": round(done["startup_s"], 1),
            "peer_commands": done["peer_commands"],
            "kv": bench.kv(),
            "bench_wall_s": round(time.monotonic() - started, 1),
            "rounds_completed": len(rounds),
            "errors": {name: run.errors[:5] for r in rounds for name, run in r.trace_runs().items() if run.errors},
        }
        if config.record:
            for path in record(config, done, info, section=checked_section):
                echo(f"wrote {path}" + ("" if final else f" (after round {len(rounds)})"))
        return info

    with pronk_fleet(settings, bench.job):
        started = time.monotonic()
        done = bench.run(on_round=lambda partial: summary(partial, final=False))
    echo(text_table(done["comparisons"]))
    echo(setups_table(done["setups"], CHECKED_COLUMNS))
    if defects := defect_lines(done["setups"]):
        echo(defects)
    echo(goals_table(done["goals"]))
    info = summary(done, final=True)
    kv = info["kv"]
    echo(
        f"KV per process {kv['tokens_per_worker']:,} tokens, working set ~{kv['working_set_tokens_per_worker']:,} "
        f"(mean final context {kv['mean_trace_context']:,}, longest {kv['longest_trace_context']:,}): the cache holds "
        f"{kv['cache_share_of_working_set']:.0%} of it; bench took {info['bench_wall_s']} s"
    )
    if info["errors"]:
        echo(f"errors: {info['errors']}")
    done["meta"] = info
    return done
