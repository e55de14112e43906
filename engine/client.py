"""HTTP client of the engine workers: steps, and a Leap's weight calls (stage, reload). Every request carries the
workers' shared token (`pronk.engine.auth`), and an `https://` worker is verified against the callers' CA bundle or the
system's trust store (`pronk.engine.tls`)."""

from __future__ import annotations

from pathlib import Path

import httpx
from pydantic import BaseModel

from pronk.engine.auth import auth_headers
from pronk.engine.engine_error import EngineError
from pronk.engine.http_transport import many_requests_client
from pronk.engine.tls import verify_context
from pronk.engine.worker_protocol import (
    ReloadRequest,
    ReloadResult,
    StageRequest,
    StageResult,
    StepRequest,
    StepResult,
    WorkerStats,
)


class StepRejected(EngineError):
    """The worker refused the step itself (bad request): retrying elsewhere will not help."""


class ContextTooLong(StepRejected):
    """The step's context is larger than the worker's whole KV budget: the trace ends with `context_length`."""


class NotAdmitted(EngineError):
    """The worker had no room for the step within its bounded wait: retry, here or on another worker."""


class WorkerUnavailable(EngineError):
    """The worker died or could not serve: the step can go to another worker."""


class WeightsRefused(EngineError):
    """The worker refused to stage the checkpoint (it does not fit the weights served, or cannot be read): another
    attempt cannot make it fit."""


class WorkerClient:
    def __init__(self, token: str, timeout_s: float = 600.0, ca_file: str | Path | None = None):
        """`ca_file`: the CA bundle `https://` workers' certificates are verified against (unset: the system's)."""
        self._http = many_requests_client(timeout_s, verify_context(ca_file), auth_headers(token))

    async def generate(self, url: str, request: StepRequest) -> StepResult:
        try:
            response = await self._http.post(
                f"{url}/generate",
                content=request.model_dump_json(exclude_none=True),
                headers={"content-type": "application/json"},
            )
        except httpx.TransportError as exc:
            raise WorkerUnavailable(f"{url}: {type(exc).__name__}: {exc}") from exc
        if response.status_code >= 500 or response.status_code == 401:
            # 401: the worker holds another token (a stale worker of another stack): route around it like a dead one.
            raise WorkerUnavailable(f"{url}: HTTP {response.status_code}: {response.text[:200]}")
        if response.status_code == 429:
            raise NotAdmitted(f"{url}: {response.text[:300]}")
        if response.status_code >= 400:
            rejected = ContextTooLong if "context_length" in response.text[:500] else StepRejected
            raise rejected(f"HTTP {response.status_code}: {response.text[:500]}")
        return StepResult.model_validate_json(response.content)

    async def release(self, url: str, trace_ids: list[str]) -> None:
        try:
            response = await self._http.post(f"{url}/release", json={"trace_ids": trace_ids})
        except httpx.TransportError as exc:
            raise WorkerUnavailable(f"{url}: {type(exc).__name__}: {exc}") from exc
        if response.status_code >= 400:
            raise WorkerUnavailable(f"{url}: HTTP {response.status_code} on release: {response.text[:200]}")

    async def healthy(self, url: str, timeout_s: float) -> bool:
        """Whether the worker answers `GET /health` within `timeout_s` (a probe of a worker holding steps)."""
        try:
            response = await self._http.get(f"{url}/health", timeout=timeout_s)
        except httpx.HTTPError:
            return False
        return response.status_code == 200

    async def stats(self, url: str) -> WorkerStats:
        response = await self._http.get(f"{url}/stats")
        response.raise_for_status()
        return WorkerStats.model_validate_json(response.content)

    async def stage_weights(self, url: str, model_uri: str) -> StageResult:
        """Have the worker download and validate `model_uri` while it keeps serving (`pronk.engine.weight_swap`).

        `WeightsRefused` when the worker refuses the checkpoint (HTTP 409: it does not fit; 400: it cannot be read).
        """
        return StageResult.model_validate_json(
            await self._weights_call(url, "/weights/stage", StageRequest(model_uri=model_uri), refusals=(400, 409))
        )

    async def reload_weights(self, url: str, version: str) -> ReloadResult:
        """Have the worker swap to a staged version at a step boundary (drain, reload, reset prefix cache, resume)."""
        return ReloadResult.model_validate_json(
            await self._weights_call(url, "/weights/reload", ReloadRequest(version=version))
        )

    async def _weights_call(self, url: str, path: str, body: BaseModel, refusals: tuple[int, ...] = ()) -> bytes:
        """The answer's body; `WorkerUnavailable` when the worker cannot be reached, `WeightsRefused` for a status in
        `refusals`, an `EngineError` naming the call for any other HTTP error."""
        try:
            response = await self._http.post(
                f"{url}{path}", content=body.model_dump_json(), headers={"content-type": "application/json"}
            )
        except httpx.TransportError as exc:
            raise WorkerUnavailable(f"{url}: {type(exc).__name__} on {path}: {exc}") from exc
        if response.status_code in refusals:
            raise WeightsRefused(f"{url}: {_detail(response)}")
        if response.status_code >= 400:
            raise EngineError(f"{url}: HTTP {response.status_code} on {path}: {response.text[:300]}")
        return response.content

    async def aclose(self) -> None:
        await self._http.aclose()


def _detail(response: httpx.Response) -> str:
    """FastAPI's `detail` of an error answer, else its text."""
    try:
        return str(response.json()["detail"])
    except (ValueError, KeyError, TypeError):
        return response.text[:300]
