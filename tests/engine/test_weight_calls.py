"""A Leap's two calls to a worker through `WorkerClient`, against the worker's real `/weights/*` routes on a backend
whose engine only records the swap: typed answers, a refused checkpoint as `WeightsRefused`, other failures as
`EngineError` or `WorkerUnavailable`."""

import asyncio

import httpx
import pytest
from fastapi import FastAPI

from pronk.engine.client import WeightsRefused, WorkerClient, WorkerUnavailable
from pronk.engine.engine_error import EngineError
from pronk.engine.vllm_backend import VllmBackend
from pronk.engine.weight_swap import IncompatibleWeights, StagedWeights, add_weight_routes

URL = "http://w0"


class SwappingEngine:
    """The few `AsyncLLM` calls a weight swap makes, each one a success."""

    def __init__(self):
        self.loaded: list[str] = []

    async def pause_generation(self, mode: str, clear_cache: bool) -> None:
        pass

    async def resume_generation(self) -> None:
        pass

    async def collective_rpc(self, method: str, kwargs: dict) -> None:
        self.loaded.append(kwargs["weights_path"])

    async def reset_prefix_cache(self) -> bool:
        return True

    async def update_weight_version(self, version: str) -> None:
        pass


def stage(model_uri: str, current_path: str, current_version: str) -> StagedWeights:
    if model_uri == "models:/m/9":
        raise FileNotFoundError("no version 9 of m")
    if model_uri == "models:/m/3":
        raise IncompatibleWeights("checkpoint m/3 does not fit m/1: 'lm_head.weight' is [17, 8], expected [16, 8]")
    version = model_uri.removeprefix("models:/")
    return StagedWeights(version=version, path=f"/cache/{version}")


def client_of(app: FastAPI) -> WorkerClient:
    client = WorkerClient("t")
    client._http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app))
    return client


def weights_worker() -> tuple[VllmBackend, FastAPI]:
    """A worker serving `m/1` with only its `/weights/*` routes: it stages `m/2`, refuses `m/3`, cannot find `m/9`."""
    backend = VllmBackend("/cache/m/1", "m/1", "w0", "job-c0ffee01", {}, _engine=SwappingEngine())
    app = FastAPI()
    add_weight_routes(app, backend, stage)
    return backend, app


@pytest.fixture
def worker():
    backend, app = weights_worker()
    return backend, client_of(app)


def test_stage_then_reload_answer_typed_results(worker):
    backend, client = worker

    async def leap():
        staged = await client.stage_weights(URL, "models:/m/2")
        swapped = await client.reload_weights(URL, "m/2")
        await client.aclose()
        return staged, swapped

    staged, swapped = asyncio.run(leap())
    assert (staged.worker_id, staged.version, staged.path) == ("w0", "m/2", "/cache/m/2") and staged.seconds >= 0
    assert (swapped.from_version, swapped.to_version) == ("m/1", "m/2")
    assert swapped.pause_requested_at <= swapped.paused_at <= swapped.resumed_at
    assert backend.model_version == "m/2" and backend._engine.loaded == ["/cache/m/2"]


@pytest.mark.parametrize(
    ("model_uri", "detail"),
    [("models:/m/3", r"checkpoint m/3 does not fit m/1: .*\[17, 8\]"), ("models:/m/9", "no version 9 of m")],
    ids=["does-not-fit-409", "unreadable-400"],
)
def test_a_checkpoint_the_worker_refuses_is_weights_refused_with_its_reason(worker, model_uri, detail):
    backend, client = worker
    with pytest.raises(WeightsRefused, match=f"^{URL}: {detail}"):
        asyncio.run(client.stage_weights(URL, model_uri))
    assert backend.staged_version is None and backend.leap_state == "ready"


def test_reloading_a_version_never_staged_is_an_engine_error_not_a_refusal(worker):
    _, client = worker
    with pytest.raises(EngineError, match=r"HTTP 409 on /weights/reload: .*'m/2' is not staged") as caught:
        asyncio.run(client.reload_weights(URL, "m/2"))
    assert not isinstance(caught.value, WeightsRefused)


def test_a_worker_error_or_an_unreachable_worker_is_not_a_refusal():
    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.host == "gone":
            raise httpx.ConnectError("connection refused", request=request)
        return httpx.Response(500, text="reload blew up")

    client = WorkerClient("t")
    client._http = httpx.AsyncClient(transport=httpx.MockTransport(answer))
    with pytest.raises(EngineError, match="HTTP 500 on /weights/stage: reload blew up") as caught:
        asyncio.run(client.stage_weights(URL, "models:/m/2"))
    assert not isinstance(caught.value, WeightsRefused)
    with pytest.raises(WorkerUnavailable, match="ConnectError on /weights/reload"):
        asyncio.run(client.reload_weights("http://gone", "m/2"))
