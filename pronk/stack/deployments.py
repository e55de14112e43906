"""Start runs of Prefect deployments by name, without waiting for them: the process work pool's worker picks them up."""

from __future__ import annotations

import uuid
from typing import Any, Protocol

from pronk.settings import Settings
from pronk.stack.prefect_env import configure_prefect

API_TAG = "pronk-api"
"""The tag of every run the API starts (batch queue drainers, resumed batch runs, Leaps)."""


class DeploymentStarter(Protocol):
    async def start(self, deployment: str, parameters: dict[str, Any], run_name: str, tags: list[str]) -> str:
        """Start a run of `deployment` named `run_name` (also its idempotency key); return the flow run's id."""
        ...

    async def waiting(self, flow_run_id: str) -> bool:
        """Whether the flow run has yet to start (scheduled, waiting on a concurrency limit, or pending)."""
        ...


class PrefectDeployments:
    """The `DeploymentStarter` on the Prefect server the settings name."""

    def __init__(self, settings: Settings):
        configure_prefect(settings)

    async def start(self, deployment: str, parameters: dict[str, Any], run_name: str, tags: list[str]) -> str:
        from prefect.deployments import arun_deployment

        flow_run = await arun_deployment(
            name=deployment,
            parameters=parameters,
            timeout=0,
            as_subflow=False,
            flow_run_name=run_name,
            idempotency_key=run_name,
            tags=tags,
        )
        return str(flow_run.id)

    async def waiting(self, flow_run_id: str) -> bool:
        from prefect import get_client
        from prefect.client.schemas.objects import StateType

        async with get_client() as client:
            flow_run = await client.read_flow_run(uuid.UUID(flow_run_id))
        return flow_run.state_type in (StateType.SCHEDULED, StateType.PENDING)
