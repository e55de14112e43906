"""A worker's side of a Leap: stage new weights while serving the old ones, then swap them in place on request.

`POST /weights/stage` downloads a model URI into the worker's model cache and checks that it fits
the weights being served (same architecture, dtype, parameter shapes), all while generation goes
on. `POST /weights/reload` swaps to the staged version at a step boundary. The worker's state
(`ready → uploading → reloading → ready`, or `failed`) rides on its heartbeat for `pronk leap status`.
Their bodies are in `pronk.engine.worker_protocol`; callers make them with `WorkerClient.stage_weights` and
`reload_weights`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

from fastapi import FastAPI, HTTPException

from pronk.engine.engine_error import EngineError
from pronk.engine.vllm_backend import VllmBackend
from pronk.engine.worker_protocol import ReloadRequest, ReloadResult, StageRequest, StageResult


class IncompatibleWeights(EngineError, ValueError):
    """The staged checkpoint does not fit the weights being served (architecture, dtype or a parameter shape)."""


@dataclass(frozen=True, slots=True)
class StagedWeights:
    version: str
    path: str


# Resolve `model_uri` onto local disk and check it fits the checkpoint at `current_path` (serving `current_version`);
# raises IncompatibleWeights, FileNotFoundError or ValueError. Supplied by whoever starts the worker.
Stager = Callable[[str, str, str], StagedWeights]


class WeightSwapper:
    """Stages versions on disk and swaps the backend to one of them; one Leap at a time per worker."""

    def __init__(self, backend: VllmBackend, stager: Stager, on_change: Callable[[], None] = lambda: None):
        self.backend = backend
        self.stager = stager
        self.on_change = on_change
        self.staged: dict[str, str] = {backend.model_version: backend.model_path}
        self.lock = asyncio.Lock()

    def _set_state(self, state: str) -> None:
        self.backend.leap_state = state
        self.on_change()

    async def stage(self, model_uri: str) -> StageResult:
        started = time.monotonic()
        async with self.lock:
            self._set_state("uploading")
            try:
                staged = await asyncio.to_thread(
                    self.stager, model_uri, self.backend.model_path, self.backend.model_version
                )
            except Exception:
                self._set_state("ready")
                raise
            self.staged[staged.version] = staged.path
            self.backend.staged_version = staged.version
            self._set_state("ready")
        return StageResult(
            worker_id=self.backend.worker_id,
            version=staged.version,
            path=staged.path,
            seconds=time.monotonic() - started,
        )

    async def reload(self, version: str) -> ReloadResult:
        if version not in self.staged:
            raise LookupError(
                f"{self.backend.worker_id}: version {version!r} is not staged (staged: {sorted(self.staged)})"
            )
        async with self.lock:
            self._set_state("reloading")
            try:
                swap = await self.backend.swap_weights(self.staged[version], version)
            except Exception:
                self._set_state("failed")
                raise
            self.backend.staged_version = None
            self._set_state("ready")
        return ReloadResult(
            worker_id=self.backend.worker_id,
            from_version=swap.from_version,
            to_version=swap.to_version,
            pause_requested_at=swap.pause_requested_at,
            paused_at=swap.paused_at,
            resumed_at=swap.resumed_at,
        )


def add_weight_routes(
    app: FastAPI, backend: VllmBackend, stager: Stager, on_change: Callable[[], None] = lambda: None
) -> WeightSwapper:
    """Mount `/weights/stage`, `/weights/reload` and `GET /weights` on a worker's app.

    `on_change` announces a new state at once (the worker's heartbeat).
    """
    swapper = WeightSwapper(backend, stager, on_change)

    @app.post("/weights/stage")
    async def stage(request: StageRequest) -> StageResult:
        try:
            return await swapper.stage(request.model_uri)
        except IncompatibleWeights as exc:
            raise HTTPException(status_code=409, detail=str(exc)) from exc
        except (FileNotFoundError, ValueError) as exc:
            raise HTTPException(status_code=400, detail=str(exc)) from exc

    @app.post("/weights/reload")
    async def reload(request: ReloadRequest) -> ReloadResult:
        try:
            return await swapper.reload(request.version)
        except LookupError as exc:
            raise HTTPException(status_code=409, detail=str(exc)) from exc

    @app.get("/weights")
    async def weights() -> dict[str, object]:
        return {
            "worker_id": backend.worker_id,
            "model_version": backend.model_version,
            "leap_state": backend.leap_state,
            "staged": swapper.staged,
        }

    return swapper
