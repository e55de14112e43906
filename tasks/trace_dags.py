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

from prefect import allow_failure, task
from prefect.cache_policies import NO_CACHE
from prefect.states import Completed, Failed, State

from pronk.agents.trace_dag import DagNode

logger = logging.getLogger(__name__)

TASK_RUNS_PER_S = 40.0
MAX_TASK_RUNS = 600
"""Most task runs one batch's sample draws (~15 s at the pace above); traces past it are left out, and logged."""


@task(cache_policy=NO_CACHE, persist_result=False, log_prints=False)
async def trace_node(summary: str, failed: bool, upstream: list[Any]) -> State:
    """A recorded step (or tool call) of a sampled trace: its figures are its one log line (the task run page shows
    it) and its final state's message; a failed step or tool call ends Failed (red in the graph); `upstream`, its
    upstream nodes' final states, draws the edges.

    It returns no data: Prefect links results to task runs by `id()`, and shared small values (ints, interned
    strings) would draw edges that are not there. It has no tags either: each tag costs a task run two
    concurrency-limit calls to the server (measured: a chain of task runs went from ~10 ms to ~1 s a node).
    """
    logger.info("%s", summary)
    return Failed(message=summary) if failed else Completed(message=summary)


def within_budget(dags: Sequence[list[DagNode]], budget: int = MAX_TASK_RUNS) -> list[list[DagNode]]:
    """The whole DAGs that fit in `budget` task runs, in order (a DAG is drawn whole or not at all)."""
    kept, used = [], 0
    for dag in dags:
        if used + len(dag) <= budget:
            kept.append(dag)
            used += len(dag)
    return kept


class Pace:
    """Start times at most `rate` a second (a burst of one second's worth after an idle stretch)."""

    def __init__(self, rate: float):
        self.interval = 1.0 / rate
        self.next_at = time.monotonic()

    async def wait(self) -> None:
        now = time.monotonic()
        start = max(self.next_at, now - 1.0)
        self.next_at = start + self.interval
        if start > now:
            await asyncio.sleep(start - now)


async def draw_trace_dags(dags: Sequence[list[DagNode]], rate: float = TASK_RUNS_PER_S) -> int:
    """Run every node as a task run on this event loop once its upstream nodes have run, paced; how many ran.

    Each upstream node's final state is passed to its downstream nodes: Prefect records it in their `task_inputs`.
    Independent nodes (other traces, a fan-out's children) run concurrently, so the drawing takes about
    nodes / `rate` seconds rather than the sum of every task run's round trips. (Submitting them to the
    flow's thread pool instead cost ~65 ms of CPU per task run, mostly thread starts.)
    """
    kept = within_budget(dags)
    if len(kept) < len(dags):
        logger.warning(
            "drawing %d of %d sampled traces: the rest would pass %d task runs", len(kept), len(dags), MAX_TASK_RUNS
        )
    pace = Pace(rate)

    async def run(node: DagNode, upstream: list[asyncio.Task[State]]) -> State:
        states = [allow_failure(await u) for u in upstream]  # a failed step's successors are drawn all the same
        await pace.wait()
        runner = trace_node.with_options(task_run_name=node.name)
        return await runner(node.summary, node.failed, states, return_state=True)  # type: ignore[misc]

    runs: list[asyncio.Task[State]] = []
    for dag in kept:
        by_key: dict[str, asyncio.Task[State]] = {}
        for node in dag:  # upstream first, so every upstream task exists already
            by_key[node.key] = asyncio.create_task(run(node, [by_key[k] for k in node.upstream if k in by_key]))
            runs.append(by_key[node.key])
    states = await asyncio.gather(*runs, return_exceptions=True)
    return sum(1 for s in states if isinstance(s, State) and s.is_final())
