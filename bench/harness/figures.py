"""The benchmark's figures: per-run measurements, the setup tables made of them over rounds, and the pronk / baseline
comparisons; the goals set on them are `bench.harness.goals`."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from bench.harness.agent_loop import ReplayResult
from pronk.agents.outcomes import Completion, LineFailure
from pronk.agents.step_records import StepRecord, ToolCallCounts
from pronk.batches.labelled import CheckedLine, tally
from pronk.batches.schemas import CheckCounts

BASELINE = "stock vLLM: round-robin"
UNTIERED = "stock vLLM: round-robin, no host tier"
"""A job with a KV host tier runs every setup with it, and this one more: stock vLLM without a tier (issue 27)."""
BATCH = "pronk batch flow (Prefect, full)"
HARNESS = "pronk: harness over the job's router"  # the agent-real profile's pronk setup
LIMIT = "offline limit, same KV capacity (vLLM offline, no gaps)"
"""The capacity-matched limit: vLLM's offline engine on the same work with pronk's KV capacity, device and host
tier (`bench.harness.fleet.capacity_limit`)."""
COMPUTE_LIMIT = "compute-only limit (vLLM offline, every prefix cached, full batches)"
"""The limit nothing can beat: every step's prefix cached, batches as full as `max_num_seqs` allows, no gaps
(`bench.harness.fleet.compute_limit`)."""
LIMITS = {LIMIT: "over_limit", COMPUTE_LIMIT: "over_compute_limit"}
"""Each limit, and the key of a setup's ratio to it in the records."""
FULL = "pronk: + priority"  # the bare loop with every mechanism on (bench.harness.pronk_runs.ABLATIONS)
CACHE_AWARE = "vllm-router: cache_aware"
STICKY = "vllm-router: sticky_least_loaded, X-Session-ID"
PEERS = (CACHE_AWARE, STICKY)
"""The peers: the vLLM project's router in front of the same stock servers, with each of two policies
(`bench.harness.peer`); the goals over a peer are set against the better of them (`best_peer`)."""


def worker_moves(steps: list[tuple[str, int, str, int]]) -> tuple[float, int]:
    """(the share of steps with a previous step that ran on a different worker than it, NaN when none had one;
    the prompt tokens those moved steps recomputed).

    `steps` are (trace id, step index, worker id, recomputed prompt tokens); a move means the prefix was recomputed
    elsewhere, unless that worker still had it.
    """
    moves = transitions = recomputed = 0
    last: dict[str, str] = {}
    for trace_id, _, worker, step_recomputed in sorted(steps):
        if trace_id in last:
            transitions += 1
            if worker != last[trace_id]:
                moves += 1
                recomputed += step_recomputed
        last[trace_id] = worker
    return (moves / transitions if transitions else math.nan), recomputed


def step_moves(records: list[StepRecord]) -> list[tuple[str, int, str, int]]:
    """What `worker_moves` reads of step records a worker served."""
    return [(r.trace_id, r.step, r.worker_id or "", r.prompt_tokens - r.cached_tokens) for r in records]


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0–100), linear between closest ranks; NaN when empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def _steady_ranks(completions: int, trim: float) -> tuple[int, int]:
    """The ranks of the first and the last completion of the middle (1 - 2 x trim) of `completions`."""
    return math.floor(completions * trim), math.ceil(completions * (1 - trim)) - 1


def steady_window(finished_s: list[float], trim: float = 0.1) -> tuple[float, float] | None:
    """A run's steady state: from the first to the last completion of the middle 80%, on the clock of `finished_s`
    (s from the run's start); None with fewer than 5 completions.

    With at least 3x as many traces as are in flight, this leaves out the start (all slots filling at
    once) and the tail (the last traces finishing alone).
    """
    ordered = sorted(finished_s)
    if len(ordered) < 5:
        return None
    first, last = _steady_ranks(len(ordered), trim)
    return ordered[first], ordered[last]


def steady_rate(finished_s: list[float], trim: float = 0.1) -> float:
    """Traces per second in steady state (`steady_window`): the completions after its first over its span; NaN with
    fewer than 5 completions."""
    window = steady_window(finished_s, trim)
    if window is None:
        return math.nan
    first, last = _steady_ranks(len(finished_s), trim)
    span = window[1] - window[0]
    return (last - first) / span if span > 0 else math.nan


@dataclass(frozen=True, slots=True)
class EngineLoad:
    """One engine at one sample: the requests vLLM's running gauge reports, the CPU seconds its engine core process
    has used so far, and the seconds that process's main thread has waited so far for a core while ready to run
    (None where that process cannot be read here: an engine on another host)."""

    running: int
    cpu_s: float | None = None
    wait_s: float | None = None


class EngineShares(NamedTuple):
    """What timed samples of each engine's load say (`_engine_load`)."""

    busy: float | None
    runnable: float | None
    running: float | None


def _engine_load(samples: list[tuple[float, list[EngineLoad]]], cores: int) -> EngineShares:
    """Busy share, runnable share and running requests per engine of timed samples of each engine's load; all None
    without one.

    Busy share is the engine core process's CPU time over the wall time between the first and the last sample, per
    core it is pinned to, mean over the engines (None below two samples or without CPU readings). A CPU engine's core
    process runs only while it has work (it blocks on its input queue when idle), so this is the share of the time
    the engine computed. vLLM's running gauge cannot say that: it is reported after each engine iteration, so a long
    prefill that starts on an idle engine reads as idle until it ends (on the agent-long profile the gauge read
    0.53-0.83 while the engines used 0.89-0.91 of their cores). The gauge still gives the requests an engine runs,
    mean over the samples and engines. Runnable share adds the time the engine core's main thread waited for its
    core while ready to run (another process or thread held it): the share of the time the engine had work, so
    runnable less busy is what the processes sharing the engines' cores took from them (None without wait
    readings)."""
    if not samples:
        return EngineShares(None, None, None)
    running = statistics.mean(engine.running for _, row in samples for engine in row)
    (first_at, first), (last_at, last) = samples[0], samples[-1]
    if last_at <= first_at:
        return EngineShares(None, None, running)

    def share(seconds: Callable[[EngineLoad], float | None]) -> float | None:
        spent = []
        for before, after in zip(first, last, strict=True):
            start, end = seconds(before), seconds(after)
            if start is None or end is None:
                return None
            spent.append(end - start)
        return statistics.mean(s / (last_at - first_at) / cores for s in spent)

    def cpu_and_wait(engine: EngineLoad) -> float | None:
        return None if engine.cpu_s is None or engine.wait_s is None else engine.cpu_s + engine.wait_s

    return EngineShares(share(lambda engine: engine.cpu_s), share(cpu_and_wait), running)


@dataclass(slots=True)
class AgentRun:
    """One replay of the agent workload on one setup."""

    name: str
    wall_s: float
    workers: int
    traces: int
    steps: int
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    trace_seconds: list[float]
    moved_steps: float = math.nan
    errors: list[str] = field(default_factory=list)
    orchestration_overhead: float | None = None
    prefect_lag_s: float | None = None
    finished_s: list[float] = field(default_factory=list)
    preemptions: int | None = None
    tier_loaded_tokens: int | None = None
    """Prompt tokens the engines loaded from a KV host tier instead of recomputing; None without a tier."""
    tier_copy_s: float | None = None
    """Seconds the engines spent copying KV to and from the host tier."""
    moved_recomputed_tokens: int | None = None
    """Of the recomputed prompt tokens, those of steps that ran on another worker than their trace's previous step."""
    started: float | None = None
    """`time.monotonic()` at the instant `finished_s` counts from, where this process saw the run start (not the
    offline limits, run in processes of their own)."""
    load_samples: list[tuple[float, list[EngineLoad]]] = field(default_factory=list)
    """Each sample of the engines' load (`note_load`): its time in s from `started`, one `EngineLoad` per engine."""
    busy_share: float | None = None
    """The share of the run's time the engines computed: their core processes' CPU time per pinned core (mean over
    the workers; `_engine_load`)."""
    runnable_share: float | None = None
    """The share of the run's time the engines had work: computing, or ready to compute while another process held
    their core (`_engine_load`)."""
    running_per_worker: float | None = None
    """Requests an engine was running, mean over the samples and workers."""
    busy_share_steady: float | None = None
    """`busy_share` over the samples inside the steady window (`steady_window`) alone: what is left of the idle once
    the start and the tail are left out. None with fewer than 5 completions or two samples in the window."""
    running_per_worker_steady: float | None = None
    """`running_per_worker` over the samples inside the steady window alone."""

    @classmethod
    def from_replay(cls, name: str, result: ReplayResult, workers: int) -> AgentRun:
        steps = [r for trace in result.traces for r in trace.records if r.worker_id is not None]
        moved, moved_recomputed = worker_moves(step_moves(steps))
        return cls(
            name=name,
            wall_s=result.wall_s,
            workers=workers,
            traces=len(result.traces),
            steps=len(steps),
            prompt_tokens=sum(s.prompt_tokens for s in steps),
            cached_tokens=sum(s.cached_tokens for s in steps),
            output_tokens=sum(s.output_tokens for s in steps),
            trace_seconds=[t.duration_s for t in result.traces],
            moved_steps=moved,
            moved_recomputed_tokens=moved_recomputed,
            errors=list(result.errors),
            finished_s=list(result.finished_s),
            started=result.started,
        )

    def note_load(self, samples: list[tuple[float, list[EngineLoad]]], cores_per_engine: int) -> None:
        """Put on the run what samples of each engine's load say, over the whole run and over its steady window; each
        sample is (its `time.monotonic()`, one `EngineLoad` per engine), as `pronk_runs.sampling` takes them, and
        each engine is pinned to `cores_per_engine` cores. The run's `started` and `finished_s` must be known by
        then."""
        if self.started is None:
            raise ValueError(f"{self.name}: no start to place the load samples against")
        self.load_samples = [(at - self.started, loads) for at, loads in samples]
        self.busy_share, self.runnable_share, self.running_per_worker = _engine_load(
            self.load_samples, cores_per_engine
        )
        window = steady_window(self.finished_s)
        steady = [(at, loads) for at, loads in self.load_samples if window is not None and window[0] <= at <= window[1]]
        self.busy_share_steady, _, self.running_per_worker_steady = _engine_load(steady, cores_per_engine)

    @property
    def traces_per_s(self) -> float:
        """Finished traces over the whole wall time: start-up and tail included."""
        return self.traces / self.wall_s

    @property
    def steady_traces_per_s(self) -> float:
        return steady_rate(self.finished_s)

    @property
    def recomputed_prompt_tokens(self) -> int:
        return self.prompt_tokens - self.cached_tokens

    @property
    def tasks_per_worker_hour(self) -> float:
        return self.traces / (self.workers * self.wall_s / 3600.0)

    def tasks_per_dollar(self, price_per_worker_hour: float) -> float:
        return self.tasks_per_worker_hour / price_per_worker_hour if price_per_worker_hour else math.nan

    @property
    def output_tokens_per_s(self) -> float:
        return self.output_tokens / self.wall_s

    @property
    def cached_ratio(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else math.nan


@dataclass(slots=True)
class SingleStepRun:
    """One single-step batch file run to completion on one setup."""

    name: str
    wall_s: float
    requests: int
    completed: int
    output_tokens: int
    processing_s: float | None = None

    @property
    def requests_per_s(self) -> float:
        return self.completed / self.wall_s

    @property
    def output_tokens_per_s(self) -> float:
        return self.output_tokens / self.wall_s

    @property
    def requests_per_s_processing(self) -> float:
        """Requests per second on requests alone; a run with no start-up of its own counts its wall time."""
        return self.completed / (self.processing_s or self.wall_s)


@dataclass(slots=True)
class Comparison:
    """One row of the table and one object of results.json."""

    name: str
    unit: str
    pronk: float | None
    baseline: float | None
    higher_is_better: bool = True
    pronk_bare: float | None = None

    @property
    def ratio(self) -> float | None:
        if (
            self.pronk is None
            or self.baseline is None
            or not self.baseline
            or math.isnan(self.baseline)
            or math.isnan(self.pronk)
        ):
            return None
        return self.pronk / self.baseline

    @property
    def pronk_loses(self) -> bool:
        ratio = self.ratio
        return ratio is not None and (ratio < 1.0 if self.higher_is_better else ratio > 1.0)

    def as_json(self) -> dict:
        clean = lambda v: None if v is None or (isinstance(v, float) and math.isnan(v)) else round(v, 6)  # noqa: E731
        return {
            "name": self.name,
            "pronk": clean(self.pronk),
            "baseline": clean(self.baseline),
            "ratio": clean(self.ratio),
            "unit": self.unit,
            "pronk_bare_loop": clean(self.pronk_bare),
            "higher_is_better": self.higher_is_better,
        }


def median_run(runs: list[AgentRun]) -> AgentRun:
    """A run whose every figure is the median over rounds (completion times pooled for percentiles)."""
    if len(runs) == 1:
        return runs[0]
    by_rate = sorted(runs, key=lambda r: (math.isnan(r.steady_traces_per_s), r.steady_traces_per_s))
    med = lambda get: statistics.median(get(r) for r in runs)  # noqa: E731
    first = runs[0]
    total = lambda get: sum(get(r) for r in runs)  # noqa: E731
    scale = med(lambda r: r.wall_s) / max(total(lambda r: r.wall_s), 1e-9)
    overheads = [r.orchestration_overhead for r in runs if r.orchestration_overhead is not None]
    lags = [r.prefect_lag_s for r in runs if r.prefect_lag_s is not None]
    return AgentRun(
        name=first.name,
        wall_s=med(lambda r: r.wall_s),
        workers=first.workers,
        traces=round(med(lambda r: r.traces)),
        steps=round(med(lambda r: r.steps)),
        prompt_tokens=round(total(lambda r: r.prompt_tokens) * scale),
        cached_tokens=round(total(lambda r: r.cached_tokens) * scale),
        output_tokens=round(med(lambda r: r.output_tokens)),
        trace_seconds=[s for r in runs for s in r.trace_seconds],
        moved_steps=med(lambda r: r.moved_steps),
        errors=[e for r in runs for e in r.errors],
        orchestration_overhead=statistics.median(overheads) if overheads else None,
        prefect_lag_s=statistics.median(lags) if lags else None,
        finished_s=by_rate[(len(runs) - 1) // 2].finished_s,
        preemptions=round(med(lambda r: r.preemptions or 0)),
    )


def agent_comparisons(pronk: AgentRun, bare: AgentRun, baseline: AgentRun, price: float) -> list[Comparison]:
    rows = [
        ("traces per second (steady state)", "traces/s", lambda r: r.steady_traces_per_s, True),
        ("traces per second (all traces / wall time)", "traces/s", lambda r: r.traces_per_s, True),
        ("tasks per worker-hour", "traces/worker-h", lambda r: r.tasks_per_worker_hour, True),
        (f"tasks per dollar (at ${price}/worker-h)", "traces/USD", lambda r: r.tasks_per_dollar(price), True),
        ("output tokens per second", "tokens/s", lambda r: r.output_tokens_per_s, True),
        ("cached-token ratio", "cached/prompt", lambda r: r.cached_ratio, True),
        ("p50 trace completion time", "s", lambda r: percentile(r.trace_seconds, 50), False),
        ("p90 trace completion time", "s", lambda r: percentile(r.trace_seconds, 90), False),
        ("steps moved off their trace's previous worker", "share of steps", lambda r: r.moved_steps, False),
    ]
    out = [
        Comparison(f"agent: {name}", unit, get(pronk), get(baseline), better, get(bare))
        for name, unit, get, better in rows
    ]
    out.append(
        Comparison(
            "agent: orchestration overhead", "share of end-to-end", pronk.orchestration_overhead, None, False, 0.0
        )
    )
    out.append(Comparison("agent: Prefect server lag", "s", pronk.prefect_lag_s, None, False, None))
    return out


def single_step_comparisons(pronk: SingleStepRun, baseline: SingleStepRun) -> list[Comparison]:
    return [
        Comparison(
            "single-step: requests per second (end to end)", "requests/s", pronk.requests_per_s, baseline.requests_per_s
        ),
        Comparison(
            "single-step: output tokens per second", "tokens/s", pronk.output_tokens_per_s, baseline.output_tokens_per_s
        ),
        Comparison(
            "single-step: requests per second (vLLM without its start-up)",
            "requests/s",
            pronk.requests_per_s_processing,
            baseline.requests_per_s_processing,
        ),
        Comparison("single-step: wall time", "s", pronk.wall_s, baseline.wall_s, False),
    ]


def median_of(values: list[float]) -> float:
    return statistics.median(values) if values else math.nan


def spread(values: list[float]) -> dict:
    """Every round's value and their min/median/max (NaN rounds kept in `rounds`, left out of the summary)."""
    clean = [v for v in values if v is not None and not math.isnan(v)]
    rounded = [None if v is None or math.isnan(v) else round(v, 6) for v in values]
    if not clean:
        return {"rounds": rounded, "min": None, "median": None, "max": None}
    return {
        "rounds": rounded,
        "min": round(min(clean), 6),
        "median": round(statistics.median(clean), 6),
        "max": round(max(clean), 6),
    }


def run_figures(run: AgentRun, ideal_cached_ratio: float) -> dict[str, float]:
    """One setup's figures in one round."""
    return {
        "traces_per_s_steady": run.steady_traces_per_s,
        "traces_per_s_wall": run.traces_per_s,
        "cached_ratio": run.cached_ratio,
        "cached_ratio_of_ideal": run.cached_ratio / ideal_cached_ratio if ideal_cached_ratio else math.nan,
        "recomputed_prompt_tokens": float(run.recomputed_prompt_tokens),
        "preemptions": _or_nan(run.preemptions),
        "tier_loaded_tokens": _or_nan(run.tier_loaded_tokens),
        "tier_copy_s": _or_nan(run.tier_copy_s),
        "p50_trace_s": percentile(run.trace_seconds, 50),
        "p90_trace_s": percentile(run.trace_seconds, 90),
        "moved_steps": run.moved_steps,
        "moved_recomputed_tokens": _or_nan(run.moved_recomputed_tokens),
        "busy_share": _or_nan(run.busy_share),
        "runnable_share": _or_nan(run.runnable_share),
        "running_per_worker": _or_nan(run.running_per_worker),
        "busy_share_steady": _or_nan(run.busy_share_steady),
        "running_per_worker_steady": _or_nan(run.running_per_worker_steady),
        "traces": float(run.traces),
        "errors": float(len(run.errors)),
    }


def _or_nan(value: float | None) -> float:
    return math.nan if value is None else float(value)


def limit_spread(ratios: list[float]) -> dict:
    """The spread of a setup's ratio to a limit, flagged `defect` when it is above 1 beyond the rounds' spread (above
    1 in every round): a limit exceeded is a limit that does not bound, so its figures are wrong, never a goal met."""
    values = spread(ratios)
    return values | {"defect": values["min"] is not None and values["min"] > 1.0}


def limit_defects(setups: dict[str, dict[str, dict]]) -> list[dict]:
    """Every setup's ratio to a limit that `limit_spread` flagged: setup, limit, key and the ratio's spread. An entry
    that is not a setup's figures (an experiment's own list of seeds, say) has none."""
    return [
        {"setup": name, "limit": limit, "key": key, **figures[key]}
        for name, figures in setups.items()
        if isinstance(figures, dict)
        for limit, key in LIMITS.items()
        if (figures.get(key) or {}).get("defect")
    ]


def best_peer(values: dict[str, list[float]]) -> str | None:
    """Of `values` (each setup's figure, round by round), the peer setup whose median is highest; None where no peer
    ran. A goal over a peer is set against this one, its ratio taken round by round in the same record."""
    medians = {name: median_of([v for v in values[name] if not math.isnan(v)]) for name in PEERS if name in values}
    ranked = [name for name, median in medians.items() if not math.isnan(median)]
    return max(ranked, key=medians.__getitem__) if ranked else None


def rounds_best_peer(rounds: list[dict[str, AgentRun]]) -> str | None:
    """The best peer of replayed rounds: by steady traces/s, the figure the goals over it compare."""
    return best_peer({name: [r[name].steady_traces_per_s for r in rounds] for name in rounds[0]})


def rounds_table(rounds: list[dict[str, AgentRun]], ideals: list[float]) -> dict[str, dict[str, dict]]:
    """setup -> figure -> spread over rounds, plus each setup's steady traces/s over the baseline's and over the best
    peer's (`rounds_best_peer`) steady traces/s, and its traces per wall second over each limit's, in the same round.
    A limit starts every trace at once and runs them back to back with no gaps, so its whole wall time is work: its
    rate is traces / wall."""
    table: dict[str, dict[str, dict]] = {}
    peer = rounds_best_peer(rounds)
    for name in rounds[0]:
        per_round = [run_figures(r[name], ideal) for r, ideal in zip(rounds, ideals, strict=True)]
        table[name] = {key: spread([f[key] for f in per_round]) for key in per_round[0]}
        if BASELINE in rounds[0] and name != BASELINE:
            table[name]["over_baseline"] = spread(
                [ratio(r[name].steady_traces_per_s, r[BASELINE].steady_traces_per_s) for r in rounds]
            )
        if UNTIERED in rounds[0] and name != UNTIERED:
            table[name]["over_untiered"] = spread(
                [ratio(r[name].steady_traces_per_s, r[UNTIERED].steady_traces_per_s) for r in rounds]
            )
        if name in LIMITS:
            continue
        if peer is not None and name not in PEERS:
            table[name]["over_best_peer"] = spread(
                [ratio(r[name].steady_traces_per_s, r[peer].steady_traces_per_s) for r in rounds]
            )
        for limit, key in LIMITS.items():
            if limit in rounds[0]:
                table[name][key] = limit_spread([over_limit(r[name], r[limit]) for r in rounds])
        if LIMIT in rounds[0]:
            table[name]["recomputed_over_limit"] = spread(
                [ratio(r[name].recomputed_prompt_tokens, r[LIMIT].recomputed_prompt_tokens) for r in rounds]
            )
    return table


def ratio(a: float, b: float) -> float:
    """`a` over `b`; NaN where either is NaN or `b` is 0."""
    return a / b if b and not math.isnan(a) and not math.isnan(b) else math.nan


def over_limit(run: AgentRun, limit: AgentRun) -> float:
    """`run`'s traces per wall second over an offline limit's, on the same shapes. Whole wall on both sides: a
    steady rate against a whole-wall one favours a run whose traces finish in a bunch (docs/benchmarks.md)."""
    return ratio(run.traces_per_s, limit.traces_per_s)


def record_key(profile: str, tiered: bool) -> str:
    """The name a record goes by in RESULTS.md, results.json and GOALS: a job with a KV host tier keeps its own
    record beside the profile's."""
    return f"{profile}-tiered" if tiered else profile


@dataclass(slots=True)
class CheckedRun:
    """One setup's run of real agent traces (`bench.harness.agent_real`): the trace figures beside how many of the
    answers their checks passed. A task counts as done only when its check passed."""

    run: AgentRun
    checks: CheckCounts
    tool_calls: ToolCallCounts
    price_per_worker_hour: float
    records: list[StepRecord] = field(default_factory=list)
    """Every step attempt of the run (what the offline limit's shapes are made of)."""

    @classmethod
    def of(
        cls, name: str, lines: list[CheckedLine], started: float, wall_s: float, workers: int, price: float
    ) -> CheckedRun:
        """`lines` run from `started` (time.monotonic) for `wall_s`; every attempt a worker served counts its tokens."""
        records = [r for line in lines for r in line.records]
        served = [r for r in records if r.worker_id is not None]
        moved, moved_recomputed = worker_moves(step_moves([r for r in served if r.error is None]))
        completions = [line.outcome.result for line in lines if isinstance(line.outcome.result, Completion)]
        failures = [
            (line.request.custom_id, line.outcome.result)
            for line in lines
            if isinstance(line.outcome.result, LineFailure)
        ]
        run = AgentRun(
            name=name,
            wall_s=wall_s,
            workers=workers,
            traces=len(lines),
            steps=len(served),
            prompt_tokens=sum(r.prompt_tokens for r in served),
            cached_tokens=sum(r.cached_tokens for r in served),
            output_tokens=sum(r.output_tokens for r in served),
            trace_seconds=[c.duration_s for c in completions],
            moved_steps=moved,
            moved_recomputed_tokens=moved_recomputed,
            errors=[f"{custom_id}: {f.code}: {f.message}"[:300] for custom_id, f in failures],
            finished_s=sorted(line.finished_at - started for line in lines),
            started=started,
        )
        return cls(run, tally(lines), ToolCallCounts.of(records), price, records)

    @property
    def successes_per_s(self) -> float:
        """Checked successes (passed lines) over the run's wall time."""
        return self.checks.passed / self.run.wall_s

    @property
    def cost_usd(self) -> float:
        """The fleet's price for the run's wall time: price per worker-hour x workers x hours."""
        return self.price_per_worker_hour * self.run.workers * self.run.wall_s / 3600.0

    @property
    def successes_per_dollar(self) -> float:
        return self.checks.passed / self.cost_usd if self.cost_usd else math.nan

    def figures(self) -> dict[str, float]:
        """This run's figures in one round."""
        rate, validity = self.checks.success_rate, self.tool_calls.validity
        return {
            "wall_s": self.run.wall_s,
            "traces": float(self.run.traces),
            "passed": float(self.checks.passed),
            "failed": float(self.checks.failed),
            "unchecked": float(self.checks.unchecked),
            "success_rate": math.nan if rate is None else rate,
            "successes_per_s": self.successes_per_s,
            "successes_per_dollar": self.successes_per_dollar,
            "tool_call_validity": math.nan if validity is None else validity,
            "prompt_tokens": float(self.run.prompt_tokens),
            "cached_tokens": float(self.run.cached_tokens),
            "cached_ratio": self.run.cached_ratio,
            "recomputed_prompt_tokens": float(self.run.recomputed_prompt_tokens),
            "moved_steps": self.run.moved_steps,
            "busy_share": _or_nan(self.run.busy_share),
            "traces_per_s_steady": self.run.steady_traces_per_s,
            "traces_per_s_wall": self.run.traces_per_s,
            "preemptions": _or_nan(self.run.preemptions),
            "p90_trace_s": percentile(self.run.trace_seconds, 90),
            "errors": float(len(self.run.errors)),
        }


def limit_figures(limit: AgentRun) -> dict[str, float]:
    """An offline limit's figures in one round (its rate is traces over its wall time: it never idles)."""
    return {
        "wall_s": limit.wall_s,
        "traces": float(limit.traces),
        "traces_per_s_wall": limit.traces_per_s,
        "prompt_tokens": float(limit.prompt_tokens),
        "cached_tokens": float(limit.cached_tokens),
        "cached_ratio": limit.cached_ratio,
        "recomputed_prompt_tokens": float(limit.recomputed_prompt_tokens),
    }


@dataclass(slots=True)
class CheckedRound:
    """One agent-real round: the stock baseline, the peers (by name) and pronk on the same traces, and the offline
    limits on the shapes pronk's run produced, by name (none without `--limit`)."""

    baseline: CheckedRun
    pronk: CheckedRun
    limits: dict[str, AgentRun] = field(default_factory=dict)
    peers: dict[str, CheckedRun] = field(default_factory=dict)

    def served(self) -> dict[str, CheckedRun]:
        """The setups that served the traces, checked, by name."""
        return {BASELINE: self.baseline, **self.peers, HARNESS: self.pronk}

    def runs(self) -> dict[str, CheckedRun | AgentRun]:
        return {**self.served(), **self.limits}

    def trace_runs(self) -> dict[str, AgentRun]:
        """Every setup's trace figures, checks left out, by name."""
        return {name: run.run if isinstance(run, CheckedRun) else run for name, run in self.runs().items()}


def checked_best_peer(rounds: list[CheckedRound]) -> str | None:
    """The best peer of agent-real rounds: by checked successes per dollar, the figure the goal over it compares."""
    return best_peer({name: [r.peers[name].successes_per_dollar for r in rounds] for name in rounds[0].peers})


def checked_table(rounds: list[CheckedRound]) -> dict[str, dict[str, dict]]:
    """setup -> figure -> spread over rounds, with, in the same round, each serving setup's checked successes per
    dollar over the baseline's, pronk's over the best peer's (`checked_best_peer`), and pronk's traces per wall second
    over each limit's."""
    table: dict[str, dict[str, dict]] = {}
    for name in rounds[0].runs():
        runs = [r.runs()[name] for r in rounds]
        per_round = [run.figures() if isinstance(run, CheckedRun) else limit_figures(run) for run in runs]
        table[name] = {key: spread([f[key] for f in per_round]) for key in per_round[0]}
    for name in (*rounds[0].peers, HARNESS):
        table[name]["over_baseline"] = spread(
            [ratio(r.served()[name].successes_per_dollar, r.baseline.successes_per_dollar) for r in rounds]
        )
    if (peer := checked_best_peer(rounds)) is not None:
        table[HARNESS]["over_best_peer"] = spread(
            [ratio(r.pronk.successes_per_dollar, r.peers[peer].successes_per_dollar) for r in rounds]
        )
    for limit, key in LIMITS.items():
        if limit in rounds[0].limits:
            table[HARNESS][key] = limit_spread([over_limit(r.pronk.run, r.limits[limit]) for r in rounds])
    return table
