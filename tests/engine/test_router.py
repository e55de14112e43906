"""The router's choices and retries, against a registry on disk and a stand-in worker client."""

import asyncio
import time

import pytest

from pronk.engine.client import WorkerUnavailable
from pronk.engine.registry import FileRegistry, Registry, WorkerEntry
from pronk.engine.router import NoWorkerAvailable, Router
from pronk.engine.routing import make_policy
from pronk.engine.worker_protocol import StepRequest, StepResult, WorkerStats

JOB = "job-0000beef"


def announce(registry: Registry, worker_id: str, waiting: int = 0, heartbeat_at: float | None = None) -> None:
    registry.announce(
        WorkerEntry(
            worker_id=worker_id,
            job_id=JOB,
            url=f"http://{worker_id}",
            pid=1,
            started_at=0.0,
            heartbeat_at=time.time() if heartbeat_at is None else heartbeat_at,
            stats=WorkerStats(worker_id=worker_id, job_id=JOB, model_version="m/1", waiting=waiting),
        )
    )


class StandInClient:
    """Records which worker got each step; workers in `dead` fail like a crashed process."""

    def __init__(self, dead=(), delay_s: float = 0.0):
        self.dead = set(dead)
        self.delay_s = delay_s
        self.calls: list[str] = []

    async def generate(self, url, request):
        self.calls.append(url)
        await asyncio.sleep(self.delay_s)
        if url in self.dead:
            raise WorkerUnavailable(f"{url}: connection reset")
        return StepResult(
            request_id=request.request_id,
            text="x",
            token_ids=[1],
            prompt_tokens=3,
            cached_tokens=0,
            completion_tokens=1,
            finish_reason="stop",
            model_version="m/1",
            worker_id=url.removeprefix("http://"),
            queue_time_s=0.0,
            engine_time_s=0.0,
        )

    async def aclose(self):
        pass


def step(i: int = 0) -> StepRequest:
    return StepRequest(request_id=f"r{i}", prompt_token_ids=[1, 2, 3])


@pytest.fixture
def registry(tmp_path):
    return FileRegistry(tmp_path, heartbeat_timeout_s=5.0)


def test_least_loaded_spreads_concurrent_steps(registry):
    announce(registry, "w0")
    announce(registry, "w1")
    client = StandInClient(delay_s=0.05)
    router = Router(JOB, registry, "least_loaded", client=client)

    async def run():
        await asyncio.gather(*(router.generate(step(i)) for i in range(10)))

    asyncio.run(run())
    assert client.calls.count("http://w0") == 5 and client.calls.count("http://w1") == 5


def test_least_loaded_avoids_a_worker_with_a_queue(registry):
    announce(registry, "w0", waiting=8)
    announce(registry, "w1", waiting=0)
    client = StandInClient()
    asyncio.run(Router(JOB, registry, client=client).generate(step()))
    assert client.calls == ["http://w1"]


def test_round_robin_alternates_blind_to_load(registry):
    announce(registry, "w0", waiting=8)
    announce(registry, "w1")
    client = StandInClient()
    router = Router(JOB, registry, "round_robin", client=client)

    async def run():
        for i in range(4):
            await router.generate(step(i))

    asyncio.run(run())
    assert client.calls == ["http://w0", "http://w1", "http://w0", "http://w1"]


def test_stale_heartbeat_drops_the_worker(registry):
    announce(registry, "w0", heartbeat_at=time.time() - 60)
    announce(registry, "w1")
    client = StandInClient()
    asyncio.run(Router(JOB, registry, client=client).generate(step()))
    assert client.calls == ["http://w1"]


def test_step_is_resent_when_its_worker_dies(registry):
    announce(registry, "w0")
    announce(registry, "w1", waiting=3)
    client = StandInClient(dead={"http://w0"})
    router = Router(JOB, registry, client=client)
    result = asyncio.run(router.generate(step()))
    assert client.calls == ["http://w0", "http://w1"]
    assert result.worker_id == "w1" and result.request_id == "r0"


def test_a_step_whose_workers_all_failed_goes_to_the_first_that_comes_back(registry):
    """Both workers miss the step (an overloaded machine); w1 heartbeats again and the step's last try runs there."""
    announce(registry, "w0")
    announce(registry, "w1", waiting=3)
    client = StandInClient(dead={"http://w0", "http://w1"})
    router = Router(JOB, registry, client=client, refresh_interval_s=0.05)

    async def run():
        async def w1_comes_back():
            await asyncio.sleep(0.3)
            client.dead.clear()
            announce(registry, "w1")

        back = asyncio.create_task(w1_comes_back())
        result = await router.generate(step())
        await back
        return result

    result = asyncio.run(run())
    assert client.calls == ["http://w0", "http://w1", "http://w1"] and result.worker_id == "w1"


def test_a_router_given_only_some_workers_never_sends_a_step_elsewhere(registry):
    announce(registry, "w0")
    announce(registry, "w1", waiting=8)
    client = StandInClient()
    router = Router(JOB, registry, "least_loaded", client=client, only={"w1"})

    async def run():
        await asyncio.gather(*(router.generate(step(i)) for i in range(4)))

    asyncio.run(run())
    assert client.calls == ["http://w1"] * 4
    dead_end = Router(
        JOB, registry, client=StandInClient(), only={"w9"}, wait_for_worker_s=0.2, refresh_interval_s=0.05
    )
    with pytest.raises(NoWorkerAvailable):
        asyncio.run(dead_end.generate(step()))


def test_no_live_worker_is_a_clear_error(registry):
    announce(registry, "w0", heartbeat_at=time.time() - 60)
    router = Router(JOB, registry, client=StandInClient(), wait_for_worker_s=0.2, refresh_interval_s=0.05)
    with pytest.raises(NoWorkerAvailable, match=JOB):
        asyncio.run(router.generate(step()))


def test_unknown_policy_is_rejected():
    with pytest.raises(ValueError, match="round_robin"):
        make_policy("random")
