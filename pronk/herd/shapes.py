"""Replay shapes from a job's step records: its real traces, rebuilt as `TraceShape`s with their exact lengths.

A trace's step k re-reads its prefix plus what step k added: `prompt[k] = prompt[k-1] + output[k-1] + new[k]`,
so the records give each step's new tokens, output tokens and tool gap exactly. A child trace starts from
its parent's prefix after the step that spawned it (the parent's last step that started before the child);
its own first prompt minus that prefix is its system prompt. What a root trace's first request (step 0's first
attempt a worker served) found cached can only have come from other traces (a common system or tool prompt): that
much of its system prompt is shared. A later attempt of step 0 may find the first attempt's own prefix cached, so
only the first counts.
Replaying these shapes re-runs the job's own traffic, token for token in length, against any configuration.
"""

from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import dataclass

import polars as pl

from pronk.protocol.shapes import ShapeStep, TraceShape


@dataclass(slots=True)
class _Step:
    step: int
    prompt: int
    output: int
    gap: float
    started_at: float


def _trace_steps(good: pl.DataFrame) -> tuple[dict[str, list[_Step]], dict[str, str | None]]:
    """Each trace's steps in order, and each trace's parent (None for a root)."""
    steps: dict[str, list[_Step]] = defaultdict(list)
    parents: dict[str, str | None] = {}
    for row in good.iter_rows(named=True):
        steps[row["trace_id"]].append(
            _Step(
                row["step"],
                row["prompt_tokens"],
                row["output_tokens"],
                row["tool_time_s"] or 0.0,
                row["started_at"],
            )
        )
        parents[row["trace_id"]] = row["parent_trace_id"]
    for rows in steps.values():
        rows.sort(key=lambda s: s.step)
    return steps, parents


def shapes_from_steps(steps: pl.LazyFrame, max_gap_s: float = 300.0) -> list[TraceShape]:
    """Every root trace of the step records as a shape (children as its fan-out); tool gaps capped at `max_gap_s`.

    Each step's last good attempt counts (a worker served it, no error); a trace with a missing step is cut
    before the gap (its remaining steps would not match what the records say).
    """
    frame = steps if "_run" in steps.collect_schema().names() else steps.with_columns(pl.lit(0).alias("_run"))
    run = pl.col("_run").cast(pl.String)
    served = (
        frame.filter(pl.col("worker_id").is_not_null())
        .with_columns(
            pl.concat_str([run, pl.col("trace_id")], separator="/").alias("trace_id"),
            pl.concat_str([run, pl.col("root_trace_id")], separator="/").alias("root_trace_id"),
            pl.concat_str([run, pl.col("parent_trace_id")], separator="/").alias("parent_trace_id"),
        )
        .collect()
    )
    first_cached = dict(
        served.filter(pl.col("step") == 0)
        .sort(["trace_id", "attempt"])
        .unique(subset=["trace_id"], keep="first")
        .select("trace_id", pl.col("cached_tokens").fill_null(0))
        .iter_rows()
    )
    good = (
        served.filter(pl.col("error").is_null())
        .sort(["trace_id", "step", "attempt"])
        .unique(subset=["trace_id", "step"], keep="last")
        .select(
            "trace_id",
            "root_trace_id",
            "parent_trace_id",
            "step",
            "prompt_tokens",
            "output_tokens",
            "tool_time_s",
            "started_at",
        )
    )
    by_trace, parents = _trace_steps(good)
    children: dict[str, list[str]] = defaultdict(list)
    for trace_id, parent in parents.items():
        if parent is not None and parent in by_trace:
            children[parent].append(trace_id)

    def build(trace_id: str, prefix: int) -> TraceShape | None:
        rows = by_trace[trace_id]
        if not rows or rows[0].step != 0:
            return None
        kept = [rows[0]]
        for row in rows[1:]:
            if row.step != kept[-1].step + 1:
                break
            kept.append(row)
        spawned: dict[int, list[str]] = defaultdict(list)
        for child in sorted(children.get(trace_id, [])):
            first = by_trace[child][0].started_at
            index = max((i for i, r in enumerate(kept) if r.started_at <= first), default=0)
            spawned[index].append(child)
        system = max(1, kept[0].prompt - prefix - 1)
        shape_steps = []
        for i, row in enumerate(kept):
            new = 1 if i == 0 else max(1, row.prompt - kept[i - 1].prompt - kept[i - 1].output)
            fan_out = [c for c in (build(child, row.prompt + row.output) for child in spawned.get(i, [])) if c]
            gap = 0.0 if fan_out or i == len(kept) - 1 else min(max_gap_s, max(0.0, row.gap))
            shape_steps.append(
                ShapeStep(
                    new_prompt_tokens=new, output_tokens=max(1, row.output), tool_gap_s=round(gap, 3), fan_out=fan_out
                )
            )
        shared = min(system, first_cached[trace_id]) if prefix == 0 else 0
        return TraceShape(
            trace_id=trace_id.replace("/", "-"),
            system_prompt_tokens=system,
            shared_prefix_tokens=shared,
            steps=shape_steps,
        )

    roots = sorted(t for t, p in parents.items() if p is None)
    return [shape for shape in (build(root, 0) for root in roots) if shape is not None]


def sample_shapes(shapes: list[TraceShape], count: int, seed: int = 0) -> list[TraceShape]:
    """`count` shapes drawn reproducibly (with replacement when there are fewer)."""
    rng = random.Random(seed)
    if count <= len(shapes):
        return rng.sample(shapes, count)
    return [rng.choice(shapes) for _ in range(count)]


def relabel(shapes: list[TraceShape], label: str) -> list[TraceShape]:
    """The same shapes under trace ids of their own (replay derives token content from the id, so no KV is shared
    with another trial's replay of the same shapes beyond the workload's shared prefix, as in live traffic)."""

    def one(shape: TraceShape, trace_id: str) -> TraceShape:
        steps = [
            s.model_copy(update={"fan_out": [one(c, f"{trace_id}.{i}.{j}") for j, c in enumerate(s.fan_out)]})
            for i, s in enumerate(shape.steps)
        ]
        return shape.model_copy(update={"trace_id": trace_id, "steps": steps})

    return [one(shape, f"{label}-{i:04d}") for i, shape in enumerate(shapes)]
