"""Sampled traces drawn in the Prefect UI: one task run per recorded step and tool call, linked as the trace ran.

They run after the batch has ended, replay only the step records (no engine call) and are submitted at
`TASK_RUNS_PER_S`, well under what the server records (DESIGN.md: ~30-100 task runs/s), so a sample
never floods it. Each node's upstream futures are its arguments: Prefect records them as the task run's
`task_inputs` and draws the edges in the run's graph. A Prefect server that is away costs the drawing,
never the batch.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.states import Completed, State

from pronk.agents.trace_dag import DagNode

logger = logging.getLogger(__name__)

TASK_RUNS_PER_S = 40.0
MAX_TASK_RUNS = 600
"""Most task runs one batch's sample draws (~15 s at the pace above); traces past it are left out, and logged."""


@task(cache_policy=NO_CACHE, persist_result=False, log_prints=False)
async def trace_node(summary: str, upstream: list[Any]) -> State:
    """A recorded step (or tool call) of a sampled trace: its figures are its state's message (the UI shows it);
    `upstream`, its upstream nodes' final states, draws the edges.

    It returns no data: Prefect links results to task runs by `id()`, and shared small values (ints, interned
    strings) would draw edges that are not there.
    """
    return Completed(message=summary)


def within_budget(dags: Sequence[list[DagNode]], budget: int = MAX_TASK_RUNS) -> list[list[DagNode]]:
    """The whole DAGs that fit in `budget` task runs, in order (a DAG is drawn whole or not at all)."""
    kept, used = [], 0
    for dag in dags:
        if used + len(dag) <= budget:
            kept.append(dag)
            used += len(dag)
    return kept


async def draw_trace_dags(dags: Sequence[list[DagNode]], rate: float = TASK_RUNS_PER_S) -> int:
    """Run every node as a task run, one at a time on this event loop, upstream first, paced; return how many ran.

    Each upstream node's final state is passed to its downstream nodes: Prefect records it in their `task_inputs`.
    (Submitting them to the flow's thread pool instead cost ~65 ms of CPU per task run, mostly thread starts.)
    """
    kept = within_budget(dags)
    if len(kept) < len(dags):
        logger.warning(
            "drawing %d of %d sampled traces: the rest would pass %d task runs", len(kept), len(dags), MAX_TASK_RUNS
        )
    drawn = 0
    interval = 1.0 / rate
    next_at = time.monotonic()
    for dag in kept:
        by_key: dict[str, State] = {}
        for node in dag:
            delay = next_at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            next_at = max(next_at, time.monotonic() - 1.0) + interval
            runner = trace_node.with_options(task_run_name=node.name, tags=node.tags)
            upstream = [by_key[k] for k in node.upstream if k in by_key]
            by_key[node.key] = await runner(node.summary, upstream, return_state=True)  # type: ignore[misc]
            drawn += 1
    return drawn
