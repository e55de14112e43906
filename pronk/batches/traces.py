"""A batch's traces as a person looks at them: the per-trace table, the sample drawn as DAGs, the tools' scratch.

The table has one row per line (its final state, kept with the line's persisted result so a resumed run's table
shows every line); the sample is a few lines, failed ones first, the rest spread over the input, whose step
records are drawn in the run's Prefect graph and logged to MLflow after the run (`pronk.control.trace_sample`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from pronk.agents.outcomes import LineFailure, RequestOutcome
from pronk.agents.trace_dag import SampleCandidate, choose_sample
from pronk.batches.results import FinishedLine
from pronk.settings import Settings

TABLE_ROWS = 500
"""Rows of the per-trace table before the sampled lines past them."""


class SampledTrace(BaseModel):
    """One sampled line: what drawing it needs."""

    line: int = Field(ge=1, description="1-based line number in the input file.")
    custom_id: str
    ok: bool = Field(description="False: the line ended in the error file.")
    steps: list[dict[str, Any]] = Field(description="The line's step records.")


def scratch_dir(settings: Settings, batch_id: str) -> Path:
    """Where the run's tools may write (the `python` tool's sandbox folders live under it)."""
    return settings.data_dir / "scratch" / batch_id


def trace_row(outcome: RequestOutcome) -> dict[str, object]:
    """A line's row of the per-trace table: its final state, as the Prefect UI shows it."""
    result = outcome.result
    if isinstance(result, LineFailure):
        return {"custom_id": outcome.custom_id, "state": "error", "finish_reason": result.code, "steps": 0}
    trace = result.summary
    calls = trace.tool_call_counts if trace else None
    return {
        "custom_id": outcome.custom_id,
        "state": "completed",
        "finish_reason": "replayed" if result.kind == "replay" else result.finish_reason,
        "steps": trace.steps if trace else 1,
        "traces": trace.traces if trace else 1,
        "tool_calls": sum(trace.tool_calls.values()) if trace else 0,
        "tool_calls_valid": f"{calls.valid}/{calls.total}" if calls and calls.total else "",
        "workers": ",".join(trace.workers if trace else [result.worker_id]),
        "cached_ratio": trace.cached_ratio if trace else None,
    }


def sample_of(finished: dict[int, FinishedLine], size: int) -> list[SampledTrace]:
    """The sampled lines of a batch (every run of it counts): failed ones first, the rest spread over the input."""
    candidates = [SampleCandidate(f.line, f.output.custom_id or "", not f.ok, len(f.steps)) for f in finished.values()]
    chosen = [finished[c.line] for c in choose_sample(candidates, size)]
    return [SampledTrace(line=f.line, custom_id=f.output.custom_id or "", ok=f.ok, steps=f.steps) for f in chosen]


def table_rows(finished: dict[int, FinishedLine], sample: list[SampledTrace]) -> list[dict[str, object]]:
    """The per-trace table: the first `TABLE_ROWS` lines, then every sampled line past them."""
    head = sorted(finished.values(), key=lambda f: f.line)[:TABLE_ROWS]
    in_head = {f.line for f in head}
    return [f.row for f in head] + [finished[t.line].row for t in sample if t.line not in in_head]


def trace_table(rows: list[dict[str, Any]], links: dict[str, str]) -> list[dict[str, Any]]:
    """The per-trace table's rows, each sampled one with its MLflow trace's URL."""
    return [{**row, "mlflow_trace": links.get(str(row.get("custom_id") or ""), "")} for row in rows]
