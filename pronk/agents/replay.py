"""Replay mode: run a `TraceShape` through a router with fixed lengths, for exact, weight-independent traffic.

Every step sends prompt token ids (`ignore_eos`, `max_tokens` = the step's output tokens), so step k
of a trace has exactly `system_prompt_tokens + Σ new_prompt_tokens[≤k] + Σ output_tokens[<k]`
prompt tokens and exactly `output_tokens[k]` output tokens. The tokens the model generated are
appended to the trace's prefix, so the next step re-reads them (and can hit the prefix cache).
A fan-out child starts from its parent step's full prefix plus its own `system_prompt_tokens`;
children run concurrently with the parent's tool gap, and the parent resumes when all are done.

`run_shape` is Prefect-free: the batch flow and the benchmark's bare asyncio loop both call it.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

from pronk.agents.step_records import StepRecord, StepRecorder, TraceSummary, summarise
from pronk.agents.tool_gaps import ToolGaps
from pronk.engine.router import Router
from pronk.engine.worker_protocol import SamplingSpec, StepRequest
from pronk.protocol.ids import new_id
from pronk.protocol.shapes import TraceShape

TOKEN_LOW, TOKEN_HIGH = 16, 4000


@dataclass(slots=True)
class TraceRecord:
    """What replaying one shape did: its steps (and its children's), with totals."""

    trace_id: str
    records: list[StepRecord] = field(default_factory=list)
    duration_s: float = 0.0

    def summary(self) -> TraceSummary:
        return summarise(self.records)


def filler_tokens(key: str, count: int) -> list[int]:
    """`count` deterministic ordinary token ids for `key` (no special tokens, fine for any vocab ≥ 4000)."""
    rng = random.Random(key)
    return [rng.randrange(TOKEN_LOW, TOKEN_HIGH) for _ in range(count)]


def system_tokens(trace_id: str, shape: TraceShape) -> list[int]:
    """The system prompt `trace_id` replays for `shape`: the workload's shared prefix (the same tokens in every
    trace), then tokens of its own."""
    shared = shape.shared_prefix_tokens
    own = filler_tokens(f"{trace_id}/system", shape.system_prompt_tokens - shared)
    return filler_tokens("shared/system", shared) + own


async def run_shape(
    router: Router,
    shape: TraceShape,
    *,
    kv_pin_ttl_s: float = 0.0,
    recorder: StepRecorder | None = None,
    custom_id: str | None = None,
    trace_id: str | None = None,
    time_scale: float = 1.0,
    gaps: ToolGaps | None = None,
) -> TraceRecord:
    """Replay `shape` (and its fan-out) on `router`; `time_scale` multiplies its tool gaps.

    With `gaps` (`kv_pin_ttl: auto`), each pin lasts what `gaps` estimates for the step's gap kind
    (`replay_gap` or `fan_out`) instead of `kv_pin_ttl_s`, and every gap is measured into it.
    """
    record = TraceRecord(trace_id or shape.trace_id)
    started = time.monotonic()
    ttl = _PinTtl(kv_pin_ttl_s, gaps)
    await _replay(
        router, shape, record.trace_id, record.trace_id, None, [], record, recorder, custom_id, ttl, time_scale
    )
    record.duration_s = time.monotonic() - started
    return record


@dataclass(slots=True)
class _PinTtl:
    kv_pin_ttl_s: float
    gaps: ToolGaps | None

    def for_gap(self, kind: str) -> float:
        return self.gaps.ttl([kind]) if self.gaps is not None and self.kv_pin_ttl_s > 0 else self.kv_pin_ttl_s


async def _replay(router, shape, trace_id, root_id, parent_id, prefix, record, recorder, custom_id, ttl, scale) -> None:
    try:
        await _replay_steps(
            router, shape, trace_id, root_id, parent_id, prefix, record, recorder, custom_id, ttl, scale
        )
    finally:
        await router.finish(trace_id)


async def _replay_steps(
    router, shape, trace_id, root_id, parent_id, prefix, record, recorder, custom_id, ttl: _PinTtl, scale
) -> None:
    tokens = prefix + system_tokens(trace_id, shape)
    for index, step in enumerate(shape.steps):
        tokens = tokens + filler_tokens(f"{trace_id}/{index}", step.new_prompt_tokens)
        more = index < len(shape.steps) - 1
        row = StepRecord(
            trace_id=trace_id,
            step=index,
            root_trace_id=root_id,
            parent_trace_id=parent_id,
            custom_id=custom_id,
            kind="replay",
        )
        request = StepRequest(
            request_id=new_id("replay"),
            prompt_token_ids=tokens,
            sampling=SamplingSpec(max_tokens=step.output_tokens, ignore_eos=True, temperature=0.0),
            trace_id=trace_id,
            affinity_key=root_id,
            kv_pin_ttl_s=ttl.for_gap("fan_out" if step.fan_out else "replay_gap") if more else 0.0,
        )
        try:
            result = await router.generate(request)
        except Exception as exc:
            row.error = f"{type(exc).__name__}: {exc}"
            record.records.append(row)
            if recorder:
                recorder.add(row)
            raise
        row.take(result)
        record.records.append(row)
        if recorder:
            recorder.add(row)
        tokens = tokens + result.token_ids
        waits = [asyncio.sleep(step.tool_gap_s * scale)] if step.tool_gap_s else []
        waits += [
            _replay(
                router,
                child,
                f"{trace_id}.{index}.{i}",
                root_id,
                trace_id,
                tokens,
                record,
                recorder,
                custom_id,
                ttl,
                scale,
            )
            for i, child in enumerate(step.fan_out)
        ]
        if waits:
            gap_started = time.monotonic()
            await asyncio.gather(*waits)
            row.tool_name = "fan_out" if step.fan_out else "replay_gap"
            row.tool_ok, row.tool_time_s = True, round(time.monotonic() - gap_started, 6)
            if ttl.gaps is not None:
                ttl.gaps.observe(row.tool_name, row.tool_time_s)


def load_shapes(path: Path) -> list[TraceShape]:
    """Shapes from a JSONL file (one per line) or a JSON file (one shape or a list)."""
    text = path.read_text()
    if path.suffix == ".jsonl":
        return [TraceShape.model_validate_json(line) for line in text.splitlines() if line.strip()]
    raw = json.loads(text)
    return [TraceShape.model_validate(item) for item in (raw if isinstance(raw, list) else [raw])]
