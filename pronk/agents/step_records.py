"""Step records: one row per model step (and per retried attempt) of every trace, as NDJSON beside the outputs.

The file `<batch id>_steps.jsonl` reads straight into polars (`pl.read_ndjson`). Each trace's
rows are also summarised in its output line, and a run's sampled traces (`pronk.control.trace_sample.dag`)
are logged to MLflow as one trace per root trace with agent, LLM and tool spans.
"""

from __future__ import annotations

import io
import json
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import polars as pl
from pydantic import computed_field
from pydantic.dataclasses import dataclass as pydantic_dataclass

from pronk import storage
from pronk.engine.worker_protocol import StepResult
from pronk.settings import Settings


@dataclass(slots=True)
class StepRecord:
    trace_id: str
    step: int
    root_trace_id: str
    parent_trace_id: str | None = None
    custom_id: str | None = None
    kind: str = "agent"
    attempt: int = 0
    worker_id: str | None = None
    model_version: str | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    host_tier_tokens: int = 0
    """Of `cached_tokens`, those loaded from the worker's KV host tier rather than found in its engine's cache."""
    output_tokens: int = 0
    queue_time_s: float = 0.0
    engine_time_s: float = 0.0
    tool_name: str | None = None
    tool_time_s: float = 0.0
    tool_ok: bool | None = None
    tool_call_parsed: bool | None = None
    """None: the step's output was no tool call (a final answer, a plain chat, a replayed step)."""
    tool_call_valid: bool | None = None
    """The call named a tool the step offered, with arguments valid against its schema."""
    error: str | None = None
    finish_reason: str | None = None
    started_at: float = field(default_factory=time.time)

    def take(self, result: StepResult) -> None:
        """Copy the engine's numbers for this step."""
        self.worker_id = result.worker_id
        self.model_version = result.model_version
        self.prompt_tokens = result.prompt_tokens
        self.cached_tokens = result.cached_tokens
        self.host_tier_tokens = result.host_tier_tokens
        self.output_tokens = result.completion_tokens
        self.queue_time_s = round(result.queue_time_s, 6)
        self.engine_time_s = round(result.engine_time_s, 6)
        self.finish_reason = result.finish_reason


class StepRecorder:
    """Holds a run's step records by line until the line finishes and `take_line` hands them over."""

    def __init__(self) -> None:
        self._by_line: dict[str | None, list[StepRecord]] = {}

    def add(self, record: StepRecord) -> StepRecord:
        self._by_line.setdefault(record.custom_id, []).append(record)
        return record

    def take_line(self, custom_id: str) -> list[StepRecord]:
        """The records of one finished line (its whole trace family), handed over once to be persisted with it."""
        return self._by_line.pop(custom_id, [])


def record_order(record: StepRecord) -> tuple[str, str, int, int]:
    """The order of the steps file: trace family, trace, step, attempt."""
    return (record.root_trace_id, record.trace_id, record.step, record.attempt)


def steps_ndjson(records: Iterable[StepRecord]) -> bytes:
    """Step records as NDJSON lines, in the order given."""
    return b"".join(json.dumps(asdict(r)).encode() + b"\n" for r in records)


@pydantic_dataclass(slots=True)
class ToolCallCounts:
    """The steps whose output was meant as a tool call, counted once per attempt: all of them (`total`), those
    that parsed as a call, and those valid against the schema of a tool the step offered."""

    total: int = 0
    parsed: int = 0
    valid: int = 0

    @computed_field  # type: ignore[prop-decorator]
    @property
    def validity(self) -> float | None:
        """Valid calls over all calls; None when there was no call."""
        return self.valid / self.total if self.total else None

    @classmethod
    def of(cls, records: Iterable[StepRecord]) -> ToolCallCounts:
        calls = [r for r in records if r.tool_call_parsed is not None]
        return cls(len(calls), sum(1 for r in calls if r.tool_call_parsed), sum(1 for r in calls if r.tool_call_valid))

    def add(self, other: ToolCallCounts) -> None:
        self.total += other.total
        self.parsed += other.parsed
        self.valid += other.valid


@dataclass(slots=True)
class TraceSummary:
    """Totals over the step records of one trace family; in this order, its fields end an output line's `trace`."""

    steps: int
    failed_attempts: int
    traces: int
    tool_calls: dict[str, int]
    tool_errors: int
    tool_call_counts: ToolCallCounts
    """Its `validity` ratio is left out of the output line (`as_dict`), which carries the counts."""
    workers: list[str]
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    cached_ratio: float
    engine_time_s: float
    tool_time_s: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarise(records: list[StepRecord]) -> TraceSummary:
    """Totals over the records of one trace family (a root trace and its children)."""
    failed = [r for r in records if r.error is not None and r.tool_name is None]
    done = [r for r in records if r.worker_id is not None]
    prompt = sum(r.prompt_tokens for r in done)
    cached = sum(r.cached_tokens for r in done)
    tools: dict[str, int] = {}
    for r in records:
        if r.tool_name:
            tools[r.tool_name] = tools.get(r.tool_name, 0) + 1
    return TraceSummary(
        steps=len(records) - len(failed),
        failed_attempts=len(failed),
        traces=len({r.trace_id for r in records}),
        tool_calls=tools,
        tool_errors=sum(1 for r in records if r.tool_ok is False),
        tool_call_counts=ToolCallCounts.of(records),
        workers=sorted({r.worker_id for r in records if r.worker_id}),
        prompt_tokens=prompt,
        cached_tokens=cached,
        output_tokens=sum(r.output_tokens for r in done),
        cached_ratio=round(cached / prompt, 4) if prompt else 0.0,
        engine_time_s=round(sum(r.engine_time_s for r in done), 6),
        tool_time_s=round(sum(r.tool_time_s for r in records), 6),
    )


def log_mlflow_traces(
    records: list[StepRecord],
    tracking_uri: str,
    experiment: str,
    artifact_root: Path,
    root_attributes: dict[str, str] | None = None,
) -> tuple[str, dict[str, str]]:
    """One MLflow trace per root trace (agent span → LLM and tool spans per step).

    Returns the experiment's id and each root trace's MLflow trace id. A new experiment keeps its trace
    data under `artifact_root` (MLflow's default is `./mlruns` of the cwd). `root_attributes` go on every
    root span (the batch's id, say).
    """
    import mlflow

    mlflow.set_tracking_uri(tracking_uri)
    if mlflow.get_experiment_by_name(experiment) is None:
        artifact_root.mkdir(parents=True, exist_ok=True)
        mlflow.create_experiment(experiment, artifact_location=artifact_root.as_uri())
    experiment_id = mlflow.set_experiment(experiment).experiment_id
    by_root: dict[str, list[StepRecord]] = {}
    for r in records:
        by_root.setdefault(r.root_trace_id, []).append(r)
    logged: dict[str, str] = {}
    for root_id, rows in by_root.items():
        rows.sort(key=lambda r: r.started_at)
        start = min(r.started_at for r in rows)
        end = max(r.started_at + r.engine_time_s + r.tool_time_s for r in rows)
        root = mlflow.start_span_no_context(
            name=f"trace {root_id}",
            span_type="AGENT",
            inputs={"custom_id": rows[0].custom_id},
            attributes={
                "pronk.root_trace_id": root_id,
                **{f"pronk.{k}": str(v) for k, v in summarise(rows).as_dict().items()},
                **(root_attributes or {}),
            },
            start_time_ns=int(start * 1e9),
        )
        for r in rows:
            llm = mlflow.start_span_no_context(
                name=f"{r.trace_id} step {r.step}",
                span_type="LLM",
                parent_span=root,
                start_time_ns=int(r.started_at * 1e9),
                attributes={k: v for k, v in asdict(r).items() if v is not None and not isinstance(v, (list, dict))},
            )
            llm.end(end_time_ns=int((r.started_at + r.engine_time_s) * 1e9))
            if r.tool_name:
                tool_start = r.started_at + r.engine_time_s
                tool_attributes: dict[str, Any] = {"ok": bool(r.tool_ok), "trace_id": r.trace_id, "step": r.step}
                span = mlflow.start_span_no_context(
                    name=r.tool_name,
                    span_type="TOOL",
                    parent_span=root,
                    start_time_ns=int(tool_start * 1e9),
                    attributes=tool_attributes,
                )
                span.end(end_time_ns=int((tool_start + r.tool_time_s) * 1e9))
        root.end(end_time_ns=int(end * 1e9))
        logged[root_id] = root.trace_id
    mlflow.flush_trace_async_logging()
    return experiment_id, logged


def steps_frame(uri: str, schema: Any, settings: Settings) -> pl.LazyFrame:
    """One step-records file as a lazy frame. An `s3://` file is read through pronk's store (its endpoint and
    credentials): polars' own object store does not take fsspec's options and would dial AWS instead."""
    if uri.startswith("s3://"):
        return pl.read_ndjson(io.BytesIO(storage.read_bytes(uri, settings)), schema=schema).lazy()
    return pl.scan_ndjson(uri, schema=schema)
