"""The FastAPI app behind `pronk api`: OpenAI-compatible Files and Batches, and weights, one package per resource
(`files`, `batches`, `weights`: each its routes, its wire models and its serving logic).

Run it with `pronk api` (127.0.0.1, `PRONK_API_PORT`); the embedded stack starts it too, as uvicorn's factory
`pronk.api.app:from_environment`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from fastapi import FastAPI

from pronk.api.batches.drainers import Drainers
from pronk.api.batches.flow_runs import BatchFlowRuns
from pronk.api.batches.reconcile import Reconciler
from pronk.api.batches.routes import router as batches_router
from pronk.api.body_limits import BodyLimits
from pronk.api.error_responses import install_error_handlers
from pronk.api.files.routes import router as files_router
from pronk.api.idempotency import IdempotencyKeys
from pronk.api.keys import ApiKeyStore
from pronk.api.weights.routes import router as weights_router
from pronk.batches.file_store import FileStore
from pronk.batches.store import BatchStore
from pronk.settings import Settings, get_settings
from pronk.stack.deployments import DeploymentStarter, PrefectDeployments


def create_app(settings: Settings, runs: DeploymentStarter | None = None) -> FastAPI:
    """The app; `runs` starts deployment runs (default: on the Prefect server the settings name)."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        """The reconcile loop runs while the API serves; batches a previous process left unqueued are queued now."""
        checker = None
        if settings.reconcile_interval_s > 0:
            checker = asyncio.create_task(app.state.reconciler.loop())
        resubmitting = asyncio.create_task(app.state.drainers.requeue_waiting())
        yield
        if checker is not None:
            checker.cancel()
        await resubmitting
        await app.state.drainers.drain()

    app = FastAPI(
        title="pronk",
        summary="OpenAI-compatible Files and Batches API; batches are addressed to jobs and run through Prefect.",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.files = FileStore(settings)
    app.state.batches = BatchStore(settings)
    app.state.keys = ApiKeyStore(settings)
    app.state.runs = runs or PrefectDeployments(settings)
    app.state.drainers = Drainers(settings, app.state.runs, app.state.files, app.state.batches)
    app.state.reconciler = Reconciler(settings, BatchFlowRuns(), app.state.runs, app.state.batches, app.state.drainers)
    app.state.idempotency = IdempotencyKeys(settings)
    install_error_handlers(app)
    app.add_middleware(BodyLimits, settings=settings)

    @app.get("/health", tags=["health"])
    def health() -> dict[str, str]:
        return {"status": "ok"}

    for router in (files_router, batches_router, weights_router):
        app.include_router(router, prefix="/v1")
    return app


def from_environment() -> FastAPI:
    """The app of this process's settings (its `PRONK_*` environment): uvicorn's `--factory`, as the embedded stack,
    the API's image and its Kubernetes manifest run it."""
    return create_app(get_settings())
