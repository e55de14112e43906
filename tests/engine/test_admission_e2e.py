"""Two concurrent runs of one job share its workers' KV budgets (real stack: two vLLM CPU workers)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from pronk.agents.replay import run_shape
from pronk.engine.client import WorkerClient
from pronk.engine.router import Router
from pronk.protocol.shapes import TraceShape
from pronk.worker_registry import worker_registry
from pronk.worker_token import worker_token

log = logging.getLogger(__name__)
pytestmark = pytest.mark.e2e
JOB = "job-c0ffee01"
TRACES_PER_RUN = 10


def shape(trace_id: str) -> TraceShape:
    """~1.8k tokens at the first step, ~2.4k at the last: 20 of them oversubscribe two 64 MiB caches."""
    steps = [{"new_prompt_tokens": 300, "output_tokens": 16, "tool_gap_s": 0.3} for _ in range(2)]
    steps.append({"new_prompt_tokens": 300, "output_tokens": 16})
    return TraceShape.model_validate({"trace_id": trace_id, "system_prompt_tokens": 1500, "steps": steps})


async def one_run(settings, name: str):
    router = Router(
        JOB,
        worker_registry(settings),
        policy="trace_affinity",
        admission="kv_budget",
        token=worker_token(settings),
    )
    try:
        return await asyncio.gather(
            *(run_shape(router, shape(f"{name}-{i}"), kv_pin_ttl_s=5.0) for i in range(TRACES_PER_RUN))
        )
    finally:
        await router.aclose()


async def worker_stats(settings):
    client = WorkerClient(worker_token(settings), timeout_s=10)
    try:
        return [await client.stats(w.url) for w in worker_registry(settings).live(JOB)]
    finally:
        await client.aclose()


def test_two_concurrent_runs_share_the_budget_and_complete_every_trace(stack):
    async def both():
        return await asyncio.gather(one_run(stack, "run-a"), one_run(stack, "run-b"))

    runs = asyncio.run(asyncio.wait_for(both(), 300))  # a bound, not a speed: 20 long prefills on a loaded machine
    for traces in runs:
        assert len(traces) == TRACES_PER_RUN
        for trace in traces:
            assert [r.step for r in trace.records] == [0, 1, 2]
            assert all(r.error is None and r.output_tokens == 16 for r in trace.records)
    stats = asyncio.run(worker_stats(stack))
    assert len(stats) == 2
    for s in stats:
        assert s.admission_limit_tokens > 0 and s.admission_limit_tokens < s.kv_capacity_tokens
        assert 0 < s.admission_peak_tokens <= s.admission_limit_tokens
        assert s.admission_resident == 0 and s.admission_waiting == 0  # every trace was released at its end
    for s in stats:
        log.info(
            "%s: capacity %d, limit %d, peak %d, counts %s",
            s.worker_id,
            s.kv_capacity_tokens,
            s.admission_limit_tokens,
            s.admission_peak_tokens,
            s.admission_counts,
        )
    counts = [s.admission_counts for s in stats]
    assert sum(c["admitted"] for c in counts) >= 2 * TRACES_PER_RUN * 3
    assert sum(c["waited"] for c in counts) > 0, f"the runs never contended for the budget: {stats}"
