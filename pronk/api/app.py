"""The FastAPI app behind `pronk api`: OpenAI-compatible Files and Batches, one router per resource.

Run it with `pronk api` (127.0.0.1, `PRONK_API_PORT`); the embedded stack starts it too.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from fastapi import FastAPI

from pronk.api.body_limits import BodyLimits
from pronk.api.error_responses import install_error_handlers
from pronk.api.idempotency import IdempotencyKeys
from pronk.api.keys import ApiKeyStore
from pronk.api.reconcile import Reconciler
from pronk.api.routes import batches, files, weights
from pronk.api.run_starts import RunStarts
from pronk.api.runs import BatchFlowRuns
from pronk.batches.file_store import FileStore
from pronk.batches.store import BatchStore
from pronk.settings import Settings, get_settings
from pronk.stack.deployments import DeploymentStarter, PrefectDeployments


def create_app(settings: Settings | None = None, runs: DeploymentStarter | None = None) -> FastAPI:
    """The app; `runs` starts deployment runs (default: on the Prefect server the settings name)."""
    settings = settings or get_settings()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        """The reconcile loop runs while the API serves; batches a previous process left unqueued are queued now."""
        checker = None
        if settings.reconcile_interval_s > 0:
            checker = asyncio.create_task(app.state.reconciler.loop())
        resubmitting = asyncio.create_task(app.state.run_starts.requeue_waiting())
        yield
        if checker is not None:
            checker.cancel()
        await resubmitting
        await app.state.run_starts.drain()

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
    app.state.run_starts = RunStarts(settings, app.state.runs, app.state.files, app.state.batches)
    app.state.reconciler = Reconciler(
        settings, BatchFlowRuns(), app.state.runs, app.state.batches, app.state.run_starts
    )
    app.state.idempotency = IdempotencyKeys(settings)
    install_error_handlers(app)
    app.add_middleware(BodyLimits, settings=settings)

    @app.get("/health", tags=["health"])
    def health() -> dict[str, str]:
        return {"status": "ok"}

    for router in (files.router, batches.router, weights.router):
        app.include_router(router, prefix="/v1")
    return app
