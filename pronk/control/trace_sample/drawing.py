"""Sampled traces drawn in the Prefect UI: one task run per recorded step and tool call, linked as the trace ran.

They are drawn after the batch's flow run has ended, by the sample's drawer process (`drawer`),
yet each shows at the time it ran, inside the flow run on its timeline. The REST API cannot say that: it stamps
a task run's states, start and end with the server's clock. So each node is reported the way Prefect's own task
engine reports a task run: as events (one REST call a node, at `TASK_RUNS_PER_S`, well under what the server
records: ~30-100 task runs/s on 2 cores, measured), a `Running` one at the step's start and a `Completed` (or `Failed`)
one at its end, each carrying the task run with its start and end times, against the batch's flow run id, with
its upstream nodes' task run ids as its `task_inputs`, which is what draws the edges of the run's graph. The
server's task-run recorder writes them as sent (no orchestration rule restamps them). Nothing runs (no task
engine). Node ids, dynamic keys and event ids derive from the flow run id and the node's key, so drawing the same
sample again adds no task run.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.client.orchestration import PrefectClient
from prefect.client.schemas.actions import LogCreate
from prefect.client.schemas.filters import (
    TaskRunFilter,
    TaskRunFilterId,
    TaskRunFilterState,
    TaskRunFilterStateType,
)
from prefect.client.schemas.objects import State, StateType, TaskRun, TaskRunResult
from prefect.events import Event
from prefect.states import Completed, Failed, Running

from pronk.control.trace_sample.dag import DagNode

logger = logging.getLogger(__name__)

TASK_RUNS_PER_S = 40.0
MAX_TASK_RUNS = 600
"""Most task runs one batch's sample draws (~15 s at the pace above); traces past it are left out, and logged."""
CALLS_IN_FLIGHT = 4
"""Nodes' events awaiting the server at once."""
RECORD_WAIT_S = 15.0
"""The longest the drawer waits for the server's task-run recorder (it writes the events it has about once a
second) to have written every node it was sent."""
SHORTEST_RUN = timedelta(milliseconds=1)
"""A node's final state comes at least this long after its `Running` one: the recorder keeps a task run's later
state only when it is strictly later, so a node of no measured time would otherwise stay `Running`."""
SERVER_FIELDS = {
    "id",
    "created",
    "updated",
    "flow_run_id",
    "state_id",
    "state_type",
    "state_name",
    "state",
    "estimated_start_time_delta",
    "estimated_run_time",
}
"""A task run's fields its state events leave out, as Prefect's task engine does: the recorder takes the id and
the flow run from the event's resources, the state from the event, and derives the rest."""


@task(name="trace_node", cache_policy=NO_CACHE, persist_result=False)
def trace_node() -> None:
    """A recorded step (or tool call) of a sampled trace: the task its drawn task runs belong to; it never runs."""


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


def log_line(
    flow_run_id: str, message: str, task_run_id: uuid.UUID | None = None, at: datetime | None = None
) -> LogCreate:
    """An INFO line in the flow run's logs (and in the task run's, given one), logged `at` (else now)."""
    return LogCreate.model_validate(
        {
            "name": __name__,
            "level": logging.INFO,
            "message": message,
            "timestamp": at or datetime.now(UTC),
            "flow_run_id": flow_run_id,
            "task_run_id": task_run_id,
        }
    )


def node_times(node: DagNode) -> tuple[datetime, datetime]:
    """When the node's task run started and ended: when its step (or tool call) ran."""
    start = datetime.fromtimestamp(node.started_at, UTC)
    return start, max(datetime.fromtimestamp(node.ended_at, UTC), start + SHORTEST_RUN)


def state_event(task_run: TaskRun, state: State) -> Event:
    """The event Prefect's task engine emits when a task run enters `state`, dated at the state's timestamp.

    Its id is fixed by the task run and the state's type: the server keeps one state per id.
    """
    return Event.model_validate(
        {
            "id": uuid.uuid5(task_run.id, state.type.value),
            "occurred": state.timestamp,
            "event": f"prefect.task-run.{state.name}",
            "resource": {
                "prefect.resource.id": f"prefect.task-run.{task_run.id}",
                "prefect.resource.name": task_run.name,
                "prefect.state-name": state.name or "",
                "prefect.state-type": state.type.value,
                "prefect.orchestration": "client",
            },
            "related": [
                {"prefect.resource.id": f"prefect.flow-run.{task_run.flow_run_id}", "prefect.resource.role": "flow-run"}
            ],
            "payload": {
                "validated_state": {"type": state.type.value, "name": state.name, "message": state.message},
                "task_run": task_run.model_dump(mode="json", exclude_none=True, exclude=SERVER_FIELDS),
            },
        }
    )


def node_events(flow_run_id: str, index: int, node: DagNode) -> list[Event]:
    """The node of the sample's `index`th DAG as its task run's two state events: `Running` at its start, then
    `Completed` (or `Failed`, with its figures as the message) at its end."""
    key = node_key(index, node)
    start, end = node_times(node)
    fields = {
        "id": node_id(flow_run_id, key),
        "name": node.name,
        "flow_run_id": flow_run_id,
        "task_key": trace_node.task_key,
        "dynamic_key": key,
        "task_inputs": {"upstream": [TaskRunResult(id=node_id(flow_run_id, f"{index}/{k}")) for k in node.upstream]},
        "expected_start_time": start,
        "start_time": start,
        "run_count": 1,
    }
    running = TaskRun.model_validate(fields)
    ended = TaskRun.model_validate(fields | {"end_time": end, "total_run_time": end - start})
    final: State[None] = (Failed if node.failed else Completed)(message=node.summary, timestamp=end)
    return [state_event(running, Running(timestamp=start)), state_event(ended, final)]


async def recorded(client: PrefectClient, ids: list[uuid.UUID], wait_s: float) -> int:
    """How many of the task runs `ids` the server has written in a final state, once all are or after `wait_s`."""
    final = TaskRunFilterStateType(any_=[StateType.COMPLETED, StateType.FAILED])
    query = TaskRunFilter(id=TaskRunFilterId(any_=ids), state=TaskRunFilterState(type=final, name=None))
    deadline = time.monotonic() + wait_s
    while True:
        response = await client.request("POST", "/task_runs/count", json={"task_runs": query.model_dump(mode="json")})
        count: int = response.json()
        if count >= len(ids) or time.monotonic() >= deadline:
            return count
        await asyncio.sleep(0.5)


async def draw_trace_dags(
    client: PrefectClient, flow_run_id: str, dags: Sequence[list[DagNode]], rate: float = TASK_RUNS_PER_S
) -> int:
    """Send every node of `dags` as a finished task run of the flow run, paced; how many the server wrote.

    Each node's figures are its final state's message and its one INFO log line (the task run page shows both),
    logged at the node's end. A node the server refuses is logged and left out; its downstream nodes still draw.
    """
    kept = within_budget(dags)
    if len(kept) < len(dags):
        logger.warning(
            "drawing %d of %d sampled traces: the rest would pass %d task runs", len(kept), len(dags), MAX_TASK_RUNS
        )
    pace, calls = Pace(rate), asyncio.Semaphore(CALLS_IN_FLIGHT)

    async def send(index: int, node: DagNode) -> uuid.UUID:
        events: list[dict[str, Any]] = [e.model_dump(mode="json") for e in node_events(flow_run_id, index, node)]
        await pace.wait()
        async with calls:
            await client.request("POST", "/events", json=events)
        return node_id(flow_run_id, node_key(index, node))

    nodes = [(i, node) for i, dag in enumerate(kept) for node in dag]
    sent = await asyncio.gather(*(send(i, node) for i, node in nodes), return_exceptions=True)
    failures = [s for s in sent if isinstance(s, BaseException)]
    if failures:
        logger.warning("%d of %d trace nodes were not drawn: %r", len(failures), len(nodes), failures[0])
    logs = [
        log_line(flow_run_id, node.summary, task_run_id, at=node_times(node)[1])
        for (_, node), task_run_id in zip(nodes, sent, strict=True)
        if isinstance(task_run_id, uuid.UUID)
    ]
    if not logs:
        return 0
    await client.create_logs(logs)
    drawn = await recorded(client, [log.task_run_id for log in logs if log.task_run_id is not None], RECORD_WAIT_S)
    if drawn < len(logs):
        logger.warning("the server wrote %d of %d trace nodes within %.0f s", drawn, len(logs), RECORD_WAIT_S)
    return drawn
