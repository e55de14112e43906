"""A job's traffic profile: the distributions of its step records, read lazily with polars over many runs.

Every run of a batch writes `<batch id>_steps.jsonl` (`steps_uri` in the batch record), one row per step
attempt. The profile keeps each step's last good attempt (a worker served it, no error) and measures:
system-prompt tokens (a root trace's first prompt), new prompt tokens per later step (what the step added
to its prefix), output tokens, steps per trace, fan-out (children per spawning step), tool-call gaps per
tool, traces in flight and their arrival rate, the cached share of prompt tokens, and what a trace family keeps at
the engines and in their KV while in flight (`line_load`, where an adaptive run's lines in flight start from).
"""

from __future__ import annotations

import logging
import math
from dataclasses import asdict, dataclass, field
from typing import Any

import polars as pl

from pronk import storage
from pronk.agents.step_records import steps_frame
from pronk.batches.in_flight import LineLoad
from pronk.batches.store import BatchStore
from pronk.settings import Settings

logger = logging.getLogger(__name__)

STEP_SCHEMA: dict[str, Any] = {
    "trace_id": pl.String,
    "step": pl.Int64,
    "attempt": pl.Int64,
    "root_trace_id": pl.String,
    "parent_trace_id": pl.String,
    "custom_id": pl.String,
    "kind": pl.String,
    "worker_id": pl.String,
    "model_version": pl.String,
    "prompt_tokens": pl.Int64,
    "cached_tokens": pl.Int64,
    "host_tier_tokens": pl.Int64,
    "output_tokens": pl.Int64,
    "queue_time_s": pl.Float64,
    "engine_time_s": pl.Float64,
    "tool_name": pl.String,
    "tool_time_s": pl.Float64,
    "tool_ok": pl.Boolean,
    "error": pl.String,
    "finish_reason": pl.String,
    "started_at": pl.Float64,
}
"""The step-record columns (`pronk.agents.step_records.StepRecord`), fixed so files of any age read alike."""


class NoStepRecords(ValueError):
    """The job has no step records to profile yet."""


@dataclass(slots=True)
class Distribution:
    """Summary of one measured quantity, with the values themselves for histograms and replay shapes."""

    count: int
    mean: float
    p10: float
    p50: float
    p90: float
    max: float
    values: list[float] = field(default_factory=list, repr=False)

    @classmethod
    def of(cls, values: list[float]) -> Distribution:
        clean = sorted(float(v) for v in values if v is not None and math.isfinite(v))
        if not clean:
            return cls(0, 0.0, 0.0, 0.0, 0.0, 0.0, [])
        return cls(
            count=len(clean),
            mean=round(sum(clean) / len(clean), 6),
            p10=_quantile(clean, 0.1),
            p50=_quantile(clean, 0.5),
            p90=_quantile(clean, 0.9),
            max=clean[-1],
            values=clean,
        )

    def summary(self) -> dict[str, float]:
        return {k: v for k, v in asdict(self).items() if k != "values"}


def _quantile(ordered: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), on sorted values."""
    position = (len(ordered) - 1) * q
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return round(ordered[low] + (ordered[high] - ordered[low]) * (position - low), 6)


@dataclass(slots=True)
class TrafficProfile:
    """What a job's traffic looks like, from its step records."""

    runs: int
    traces: int
    root_traces: int
    steps: int
    failed_attempts: int
    system_prompt_tokens: Distribution
    new_prompt_tokens: Distribution
    output_tokens: Distribution
    steps_per_trace: Distribution
    fan_out: Distribution
    """Children per spawning step."""
    fan_out_share: float
    """Share of root traces with at least one child."""
    tool_gap_s: dict[str, Distribution]
    concurrency: Distribution
    """Root traces in flight, sampled at every trace start and end."""
    arrival_rate_per_s: float
    cached_ratio: float
    host_tier_ratio: float = 0.0
    """Share of prompt tokens loaded from the workers' KV host tier (part of `cached_ratio`)."""
    line_load: LineLoad = field(default_factory=LineLoad)
    """Root trace families' spans, engine seconds and KV token-seconds (`pronk.batches.in_flight`)."""

    def distributions(self) -> dict[str, Distribution]:
        named = {
            "system_prompt_tokens": self.system_prompt_tokens,
            "new_prompt_tokens": self.new_prompt_tokens,
            "output_tokens": self.output_tokens,
            "steps_per_trace": self.steps_per_trace,
            "fan_out": self.fan_out,
            "concurrency": self.concurrency,
        }
        return named | {f"tool_gap_s[{tool}]": d for tool, d in self.tool_gap_s.items()}

    def summary(self) -> dict[str, Any]:
        return {
            "runs": self.runs,
            "traces": self.traces,
            "root_traces": self.root_traces,
            "steps": self.steps,
            "failed_attempts": self.failed_attempts,
            "fan_out_share": self.fan_out_share,
            "arrival_rate_per_s": self.arrival_rate_per_s,
            "cached_ratio": self.cached_ratio,
            "host_tier_ratio": self.host_tier_ratio,
            "running_per_line": round(self.line_load.running, 6),
            "resident_tokens_per_line": round(self.line_load.resident_tokens, 3),
            **{name: d.summary() for name, d in self.distributions().items()},
        }

    def text(self) -> str:
        """The profile as a table a terminal shows."""
        head = (
            f"{self.runs} runs, {self.root_traces} root traces ({self.traces} with children), {self.steps} steps, "
            f"{self.failed_attempts} failed attempts; cached ratio {self.cached_ratio:.3f} (host tier "
            f"{self.host_tier_ratio:.3f}), fan-out share "
            f"{self.fan_out_share:.3f}, arrivals {self.arrival_rate_per_s:.3f}/s"
        )
        rows = [f"{'quantity':<28}{'count':>8}{'mean':>11}{'p10':>11}{'p50':>11}{'p90':>11}{'max':>11}"]
        for name, d in self.distributions().items():
            rows.append(
                f"{name:<28}{d.count:>8}{d.mean:>11.3f}{d.p10:>11.3f}{d.p50:>11.3f}{d.p90:>11.3f}{d.max:>11.3f}"
            )
        return "\n".join([head, *rows])


def job_step_uris(job_id: str, settings: Settings, limit: int | None = None) -> list[str]:
    """The step-record files of the job's batches (newest first) that exist."""
    uris = [b.steps_uri for b in BatchStore(settings).of_jobs({job_id}, limit) if b.steps_uri]
    return [u for u in uris if storage.exists(u, settings)]


def scan_steps(uris: list[str], settings: Settings) -> pl.LazyFrame:
    """The step records of many files as one lazy frame, with the step-record schema."""
    if not uris:
        raise NoStepRecords("no step records to read")
    frames = [
        steps_frame(uri, STEP_SCHEMA, settings).with_columns(pl.lit(i).alias("_run")) for i, uri in enumerate(uris)
    ]
    return pl.concat(frames, how="vertical")


def profile_steps(steps: pl.LazyFrame) -> TrafficProfile:
    """The profile of a lazy frame of step records (one or many runs; `_run` numbers the runs when present)."""
    frame = steps if "_run" in steps.collect_schema().names() else steps.with_columns(pl.lit(0).alias("_run"))
    run = pl.col("_run").cast(pl.String)
    frame = frame.with_columns(
        pl.concat_str([run, pl.col("trace_id")], separator="/").alias("trace_id"),
        pl.concat_str([run, pl.col("root_trace_id")], separator="/").alias("root_trace_id"),
        pl.concat_str([run, pl.col("parent_trace_id")], separator="/").alias("parent_trace_id"),
    )
    good_filter = pl.col("worker_id").is_not_null() & pl.col("error").is_null()
    counts = frame.select(
        pl.col("_run").n_unique().alias("runs"),
        (~good_filter & pl.col("tool_name").is_null()).sum().alias("failed"),
    ).collect()
    good = (
        frame.filter(good_filter)
        .sort(["trace_id", "step", "attempt"])
        .unique(subset=["trace_id", "step"], keep="last")
        .sort(["trace_id", "step"])
        .with_columns(
            (
                pl.col("prompt_tokens")
                - pl.col("prompt_tokens").shift(1).over("trace_id")
                - pl.col("output_tokens").shift(1).over("trace_id")
            ).alias("new_tokens"),
            (pl.col("started_at") + pl.col("engine_time_s") + pl.col("tool_time_s").fill_null(0.0)).alias("ended_at"),
        )
        .collect()
    )
    if good.height == 0:
        raise NoStepRecords("no step a worker served")
    roots = good.filter(pl.col("parent_trace_id").is_null())
    per_trace = good.group_by("trace_id").agg(pl.len().alias("steps"))
    first_steps = roots.sort("step").group_by("trace_id").first()
    children = (
        good.filter(pl.col("parent_trace_id").is_not_null()).group_by("trace_id").agg(pl.col("parent_trace_id").first())
    )
    spawning = children.group_by("parent_trace_id").agg(pl.len().alias("children"))
    held_s = pl.col("engine_time_s") + pl.col("tool_time_s").fill_null(0.0)
    families = good.group_by("root_trace_id").agg(
        pl.col("_run").first(),
        pl.col("started_at").min().alias("start"),
        pl.col("ended_at").max().alias("end"),
        pl.col("engine_time_s").sum().alias("busy_s"),
        ((pl.col("prompt_tokens") + pl.col("output_tokens")) * held_s).sum().alias("token_s"),
    )
    gaps = good.filter(pl.col("tool_name").is_not_null())
    tool_gaps = {
        str(tool): Distribution.of(gaps.filter(pl.col("tool_name") == tool)["tool_time_s"].to_list())
        for tool in sorted(gaps["tool_name"].unique().to_list())
    }
    prompt_total = int(good["prompt_tokens"].sum())
    root_ids = set(roots["trace_id"].to_list())
    root_families_with_children = set(good.filter(pl.col("parent_trace_id").is_not_null())["root_trace_id"].to_list())
    return TrafficProfile(
        runs=int(counts["runs"][0]),
        traces=per_trace.height,
        root_traces=len(root_ids),
        steps=good.height,
        failed_attempts=int(counts["failed"][0]),
        system_prompt_tokens=Distribution.of(first_steps["prompt_tokens"].to_list()),
        new_prompt_tokens=Distribution.of(good["new_tokens"].drop_nulls().to_list()),
        output_tokens=Distribution.of(good["output_tokens"].to_list()),
        steps_per_trace=Distribution.of(per_trace["steps"].to_list()),
        fan_out=Distribution.of(spawning["children"].to_list()),
        fan_out_share=round(len(root_families_with_children) / len(root_ids), 6) if root_ids else 0.0,
        tool_gap_s=tool_gaps,
        concurrency=Distribution.of(_in_flight(families["start"].to_list(), families["end"].to_list())),
        arrival_rate_per_s=_arrival_rate(families.group_by("_run").agg(pl.col("start"))["start"].to_list()),
        cached_ratio=round(int(good["cached_tokens"].sum()) / prompt_total, 6) if prompt_total else 0.0,
        host_tier_ratio=round(int(good["host_tier_tokens"].sum()) / prompt_total, 6) if prompt_total else 0.0,
        line_load=LineLoad(
            lines=families.height,
            span_s=float((families["end"] - families["start"]).sum()),
            busy_s=float(families["busy_s"].sum()),
            token_s=float(families["token_s"].sum()),
        ),
    )


def _in_flight(starts: list[float], ends: list[float]) -> list[float]:
    """Traces in flight just after every start and end (ends before starts at the same instant)."""
    events = sorted([(e, -1) for e in ends] + [(s, 1) for s in starts])
    level, samples = 0, []
    for _, change in events:
        level += change
        samples.append(float(level))
    return samples


def _arrival_rate(starts_by_run: list[list[float]]) -> float:
    """Root traces started per second: within each run, from its first start to its last, summed over runs."""
    arrivals = sum(len(starts) - 1 for starts in starts_by_run if starts)
    span = sum(max(starts) - min(starts) for starts in starts_by_run if starts)
    return round(arrivals / span, 6) if span > 0 else 0.0


def in_flight_start(job_id: str, settings: Settings, runs: int = 3) -> LineLoad | None:
    """What the job's last `runs` batches measured of their lines, for an adaptive run to start from (None: the job
    has no step records yet)."""
    try:
        return job_profile(job_id, settings, runs).line_load
    except NoStepRecords:
        return None


def job_profile(job_id: str, settings: Settings, runs: int | None = None) -> TrafficProfile:
    """The profile of the job's last `runs` batches (all of them by default)."""
    uris = job_step_uris(job_id, settings, runs)
    if not uris:
        raise NoStepRecords(f"job {job_id} has no batch with step records in {settings.store_uri}")
    logger.info("profiling %d step-record files of job %s", len(uris), job_id)
    return profile_steps(scan_steps(uris, settings))
