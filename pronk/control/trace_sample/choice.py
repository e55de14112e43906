"""Which traces of a batch a person sees, and the per-trace table shown beside them.

Recording every step as a Prefect task run would make the Prefect server the bottleneck (it records ~30-100 task
runs/s), so a run draws a sample: its failed traces first, then traces spread evenly over the input. The per-trace
table has one row per line (its final state, kept with the line's persisted result, `pronk.batches.outputs.trace_row`,
so a resumed run's table shows every line): the first `TABLE_ROWS` lines, then every sampled line past them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, Field

from pronk.batches.results import FinishedLine

TABLE_ROWS = 500
"""Rows of the per-trace table before the sampled lines past them."""


@dataclass(frozen=True, slots=True)
class SampleCandidate:
    """A finished line as the sample sees it."""

    line: int
    custom_id: str
    failed: bool
    steps: int


def choose_sample(candidates: Sequence[SampleCandidate], size: int) -> list[SampleCandidate]:
    """Up to `size` lines with steps: every failed one first (in input order), the rest spread evenly over the input.

    Returned in input order.
    """
    drawable = sorted((c for c in candidates if c.steps > 0), key=lambda c: c.line)
    if size <= 0 or not drawable:
        return []
    failed = [c for c in drawable if c.failed][:size]
    rest = [c for c in drawable if not c.failed]
    room = min(size - len(failed), len(rest))
    spread = [rest[(2 * i + 1) * len(rest) // (2 * room)] for i in range(room)] if room > 0 else []
    return sorted(failed + spread, key=lambda c: c.line)


class SampledTrace(BaseModel):
    """One sampled line: what drawing it needs."""

    line: int = Field(ge=1, description="1-based line number in the input file.")
    custom_id: str
    ok: bool = Field(description="False: the line ended in the error file.")
    steps: list[dict[str, Any]] = Field(description="The line's step records.")


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
