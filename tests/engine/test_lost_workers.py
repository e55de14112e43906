"""A step in flight on a worker that is lost (heartbeat stopped, or its host unreachable) moves to another worker
instead of waiting on a dead connection; a slow worker that is still there keeps its step."""

import asyncio
import time

import pytest

from pronk.engine.registry import FileRegistry
from pronk.engine.router import Router
from tests.engine.test_router import JOB, StandInClient, announce, step


class HangingClient(StandInClient):
    """Steps sent to `hanging` never come back, like a connection to a host whose link went down."""

    def __init__(self, hanging=(), unreachable=(), delay_s: float = 0.0):
        super().__init__(delay_s=delay_s)
        self.hanging = set(hanging)
        self.unreachable = set(unreachable)
        self.probes: list[str] = []

    async def generate(self, url, request):
        if url in self.hanging:
            self.calls.append(url)
            await asyncio.sleep(3600)
        return await super().generate(url, request)

    async def healthy(self, url, timeout_s):
        self.probes.append(url)
        return url not in self.unreachable


@pytest.fixture
def registry(tmp_path):
    return FileRegistry(tmp_path, heartbeat_timeout_s=5.0)


def router(registry, client) -> Router:
    return Router(JOB, registry, client=client, liveness_interval_s=0.1, refresh_interval_s=0.05)


def test_a_step_on_a_worker_whose_heartbeat_stops_moves_to_another(registry):
    announce(registry, "w0")
    announce(registry, "w1", waiting=3)
    client = HangingClient(hanging={"http://w0"})

    async def scenario():
        task = asyncio.create_task(router(registry, client).generate(step()))
        await asyncio.sleep(0.3)
        assert not task.done() and client.calls == ["http://w0"]
        announce(registry, "w0", heartbeat_at=time.time() - 60)  # w0's host lost the registry
        return await asyncio.wait_for(task, 5)

    result = asyncio.run(scenario())
    assert client.calls == ["http://w0", "http://w1"] and result.worker_id == "w1" and result.request_id == "r0"


def test_a_step_on_a_worker_that_stops_answering_moves_to_another(registry):
    """Its heartbeat may still reach the registry while the router cannot reach it: the probe tells."""
    announce(registry, "w0")
    announce(registry, "w1", waiting=3)
    client = HangingClient(hanging={"http://w0"}, unreachable={"http://w0"})
    result = asyncio.run(asyncio.wait_for(router(registry, client).generate(step()), 5))
    assert client.calls == ["http://w0", "http://w1"] and result.worker_id == "w1"
    assert client.probes == ["http://w0"]


def test_a_slow_worker_that_is_still_there_keeps_its_steps_and_is_probed_once_per_interval(registry):
    announce(registry, "w0")
    client = HangingClient(delay_s=0.45)
    routed = router(registry, client)

    async def many():
        return await asyncio.gather(*(routed.generate(step(i)) for i in range(20)))

    results = asyncio.run(many())
    assert {r.worker_id for r in results} == {"w0"} and len(client.calls) == 20
    assert 1 <= len(client.probes) <= 5  # 20 steps in flight for ~4 intervals share their probes
