"""Start runs of Prefect deployments by name, without waiting for them: the process work pool's worker picks them up."""

from __future__ import annotations

from typing import Any, Protocol

from pronk.settings import Settings
from pronk.stack.prefect_env import configure_prefect


class DeploymentStarter(Protocol):
    async def start(self, deployment: str, parameters: dict[str, Any], run_name: str, tags: list[str]) -> str:
        """Start a run of `deployment` named `run_name` (also its idempotency key); return the flow run's id."""
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
