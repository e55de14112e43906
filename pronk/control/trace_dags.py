"""Sampled traces drawn in the Prefect UI: one task run per recorded step and tool call, linked as the trace ran.

They are drawn after the batch's flow run has ended, by the sample's drawer process (`pronk.control.trace_sample`):
each node is created through the Prefect client already final (`Completed`, or `Failed` for a failed step
or tool call), against the batch's flow run id, with its upstream nodes' task run ids as its `task_inputs`,
which is what draws the edges of the run's graph. Nothing runs (no task engine, no events to record): one
REST call a node, at `TASK_RUNS_PER_S`, well under what the server records (DESIGN.md: ~30-100 task
runs/s). Node ids and dynamic keys derive from the flow run id and the node's key, so drawing the same
sample again adds no task run.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.client.orchestration import PrefectClient
from prefect.client.schemas.actions import LogCreate
from prefect.client.schemas.objects import TaskRunResult
from prefect.states import Completed, Failed

from pronk.agents.trace_dag import DagNode

logger = logging.getLogger(__name__)

TASK_RUNS_PER_S = 40.0
MAX_TASK_RUNS = 600
"""Most task runs one batch's sample draws (~15 s at the pace above); traces past it are left out, and logged."""
CALLS_IN_FLIGHT = 4
"""Task-run creations awaiting the server at once (each is one short transaction on its database)."""


@task(name="trace_node", cache_policy=NO_CACHE, persist_result=False)
def trace_node() -> None:
    """A recorded step (or tool call) of a sampled trace: the task its drawn task runs belong to; it never runs.

    Its task runs carry no tags: each tag would cost a concurrency-limit lookup on the server.
    """


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


def node_key(dag_index: int, node: DagNode) -> str:
    """A node's dynamic key in the flow run: unique across the sample's DAGs, the same when drawn again."""
    return f"{dag_index}/{node.key}"


def node_id(flow_run_id: str, key: str) -> uuid.UUID:
    """A node's task run id, fixed by its flow run and key, so a downstream node can name it before it exists."""
    return uuid.uuid5(uuid.UUID(flow_run_id), key)


def log_line(flow_run_id: str, message: str, task_run_id: uuid.UUID | None = None) -> LogCreate:
    """An INFO line in the flow run's logs (and in the task run's, given one), logged now."""
    return LogCreate.model_validate(
        {
            "name": __name__,
            "level": logging.INFO,
            "message": message,
            "timestamp": datetime.now(UTC),
            "flow_run_id": flow_run_id,
            "task_run_id": task_run_id,
        }
    )


async def draw_trace_dags(
    client: PrefectClient, flow_run_id: str, dags: Sequence[list[DagNode]], rate: float = TASK_RUNS_PER_S
) -> int:
    """Create every node of `dags` as a final task run of the flow run, paced; how many were created.

    Each node's figures are its state's message and its one INFO log line (the task run page shows both).
    A node the server refuses is logged and left out; its downstream nodes still draw.
    """
    kept = within_budget(dags)
    if len(kept) < len(dags):
        logger.warning(
            "drawing %d of %d sampled traces: the rest would pass %d task runs", len(kept), len(dags), MAX_TASK_RUNS
        )
    pace, calls = Pace(rate), asyncio.Semaphore(CALLS_IN_FLIGHT)

    async def create(index: int, node: DagNode) -> uuid.UUID:
        key = node_key(index, node)
        upstream = [TaskRunResult(id=node_id(flow_run_id, f"{index}/{k}")) for k in node.upstream]
        await pace.wait()
        async with calls:
            task_run = await client.create_task_run(
                trace_node,
                flow_run_id=uuid.UUID(flow_run_id),
                dynamic_key=key,
                id=node_id(flow_run_id, key),
                name=node.name,
                state=Failed(message=node.summary) if node.failed else Completed(message=node.summary),
                task_inputs={"upstream": upstream},  # type: ignore[dict-item]
            )
        return task_run.id

    nodes = [(i, node) for i, dag in enumerate(kept) for node in dag]
    created = await asyncio.gather(*(create(i, node) for i, node in nodes), return_exceptions=True)
    failures = [c for c in created if isinstance(c, BaseException)]
    if failures:
        logger.warning("%d of %d trace nodes were not drawn: %r", len(failures), len(nodes), failures[0])
    logs = [
        log_line(flow_run_id, node.summary, task_run_id)
        for (_, node), task_run_id in zip(nodes, created, strict=True)
        if isinstance(task_run_id, uuid.UUID)
    ]
    if logs:
        await client.create_logs(logs)
    return len(logs)
