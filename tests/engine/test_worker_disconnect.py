"""A step whose caller gave up is cancelled in the worker, so the engine aborts it instead of generating for no one.
The caller is the workers' own client (`pronk.engine.client.WorkerClient`, over `pronk.engine.http_transport`): a
request it gives up on must close its connection for the worker to see it go."""

import asyncio
import contextlib

import httpx
import pytest
import uvicorn
from fastapi import FastAPI, Request
from pydantic import BaseModel

from pronk.engine.client import WorkerClient
from pronk.engine.worker import free_port, until_disconnected


class Step(BaseModel):
    seconds: float


def test_a_step_is_cancelled_when_its_caller_disconnects_and_finishes_when_it_stays():
    events: list[str] = []
    cancelled = asyncio.Event()

    async def work(seconds: float) -> dict:
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            events.append("cancelled")
            cancelled.set()
            raise
        events.append("finished")
        return {"slept": seconds}

    app = FastAPI()

    @app.post("/generate")
    async def generate(step: Step, http: Request) -> dict:
        """A body, read before the work starts, as a worker reads its step."""
        return await until_disconnected(http, work(step.seconds))

    async def scenario() -> None:
        port = free_port()
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
        serving = asyncio.create_task(server.serve())
        for _ in range(500):
            if server.started:
                break
            await asyncio.sleep(0.02)
        url = f"http://127.0.0.1:{port}/generate"
        workers = WorkerClient("token")  # the test app asks for none
        try:
            client = workers._http
            with pytest.raises(httpx.ReadTimeout):
                await client.post(url, json={"seconds": 30}, timeout=0.3)
            await asyncio.wait_for(cancelled.wait(), timeout=5)
            assert events == ["cancelled"]
            answer = await client.post(url, json={"seconds": 0.1}, timeout=5)
            assert answer.json() == {"slept": 0.1} and events == ["cancelled", "finished"]
        finally:
            await workers.aclose()
            server.should_exit = True
            with contextlib.suppress(asyncio.CancelledError):
                await serving

    asyncio.run(scenario())
