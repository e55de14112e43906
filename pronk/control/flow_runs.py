"""Flow runs read, and ended: for runs whose process died without a hook (SIGKILL, OOM, a lost machine).

Such a flow run stays RUNNING in Prefect for good when no Prefect worker watched its process (`pronk enrich run`
runs the flow in its own process). The next run of the same work reads its state and marks it `Crashed`. Both calls
are bounded and best effort (`best_effort`): a Prefect server that is away costs the mark, never the run.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

from pronk.control.calls import best_effort

if TYPE_CHECKING:
    from prefect.client.schemas.objects import FlowRun


async def runs_of(
    flows: Sequence[str], states: Sequence[str], newest_first: bool = True, limit: int = 200
) -> list[FlowRun]:
    """The flow runs of the named flows in the given state types (`RUNNING`, `CRASHED`, …), by expected start."""
    from prefect import get_client
    from prefect.client.schemas.filters import (
        FlowFilter,
        FlowFilterName,
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType
    from prefect.client.schemas.sorting import FlowRunSort

    types = FlowRunFilterStateType(any_=[StateType(state) for state in states])
    sort = FlowRunSort.EXPECTED_START_TIME_DESC if newest_first else FlowRunSort.EXPECTED_START_TIME_ASC
    async with get_client() as client:
        return await client.read_flow_runs(
            flow_filter=FlowFilter(name=FlowFilterName(any_=list(flows))),
            flow_run_filter=FlowRunFilter(state=FlowRunFilterState(type=types)),
            sort=sort,
            limit=limit,
        )


async def _state_type(flow_run_id: str) -> str | None:
    from prefect import get_client

    async with get_client() as client:
        flow_run = await client.read_flow_run(uuid.UUID(flow_run_id))
    return flow_run.state_type.value if flow_run.state_type else None


async def flow_run_state(flow_run_id: str) -> str | None:
    """The flow run's state type (`RUNNING`, `CRASHED`, …), or None when Prefect does not answer or know it."""
    return await best_effort(f"reading flow run {flow_run_id}", _state_type(flow_run_id))


async def _set_ended(flow_run_id: str, state: Literal["CRASHED", "CANCELLED"], message: str) -> bool:
    from prefect import get_client
    from prefect.client.schemas.responses import SetStateStatus
    from prefect.states import Cancelled, Crashed, State

    ended: State[Any] = Crashed(message=message) if state == "CRASHED" else Cancelled(message=message)
    async with get_client() as client:
        result: Any = await client.set_flow_run_state(uuid.UUID(flow_run_id), ended, force=True)
    return result.status == SetStateStatus.ACCEPT


async def mark_ended(flow_run_id: str, state: Literal["CRASHED", "CANCELLED"], message: str) -> bool:
    """Set the flow run `Crashed` (or `Cancelled`) with the message, which gives back any concurrency slot it holds;
    False when Prefect refused or did not answer."""
    what = f"marking flow run {flow_run_id} {state.lower()}"
    return bool(await best_effort(what, _set_ended(flow_run_id, state, message)))


async def mark_crashed(flow_run_id: str, message: str) -> bool:
    """`mark_ended` as `Crashed`: its process is gone."""
    return await mark_ended(flow_run_id, "CRASHED", message)
