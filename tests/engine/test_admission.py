"""Admission decisions without servers: the worker's KV budget, and the router's placement by room."""

from __future__ import annotations

import asyncio
import functools
import time

import pytest

from pronk.engine.admission import AdmissionTimeout, BudgetExceeded, KvBudget, KvBudgetAdmission, make_admission
from pronk.engine.client import NotAdmitted
from pronk.engine.registry import FileRegistry, WorkerEntry
from pronk.engine.router import Router
from pronk.engine.worker_protocol import SamplingSpec, StepRequest, StepResult, WorkerStats

JOB = "job-0000beef"


def run_async(test):
    """Run an async test in its own event loop (the suite has no asyncio plugin)."""

    @functools.wraps(test)
    def wrapper(*args, **kwargs):
        return asyncio.run(test(*args, **kwargs))

    return wrapper


def budget(limit: int = 100, **kwargs) -> KvBudget:
    return KvBudget(limit, headroom=0.0, **kwargs)


async def admit(b: KvBudget, trace: str, tokens: int, started: bool = False, since: float = 0.0, wait: float = 1.0):
    await b.admit(trace, tokens, started=started, since=since, timeout_s=wait)


@run_async
async def test_fits_then_waits_and_release_admits():
    b = budget()
    await admit(b, "a", 60)
    assert (b.used, b.free, b.peak) == (60, 40, 60)
    waiting = asyncio.create_task(admit(b, "b", 50))
    await asyncio.sleep(0.01)
    assert not waiting.done() and len(b.waiters) == 1
    b.step_done("a", 60)
    await asyncio.sleep(0.01)
    assert not waiting.done(), "a trace in its tool gap still counts"
    b.release(["a"])
    await asyncio.wait_for(waiting, 1)
    assert b.used == 50 and b.peak == 60 and "a" not in b.resident


@run_async
async def test_step_larger_than_the_budget_is_refused_at_once():
    b = budget()
    with pytest.raises(BudgetExceeded, match="context_length"):
        await admit(b, "huge", 101, wait=10)
    assert not b.waiters and b.counts["refused"] == 1


@run_async
async def test_wait_is_bounded_and_leaves_the_queue():
    b = budget()
    await admit(b, "a", 90)
    started = time.monotonic()
    with pytest.raises(AdmissionTimeout):
        await admit(b, "b", 20, wait=0.05)
    assert time.monotonic() - started < 0.5
    assert not b.waiters and b.counts["timed_out"] == 1


@run_async
async def test_growth_reserves_only_the_difference():
    b = budget()
    await admit(b, "a", 40)
    b.step_done("a", 35)  # the step stopped early: the actual context is what stays resident
    assert b.used == 35
    await admit(b, "a", 70, started=True)
    assert b.used == 70 and b.resident["a"].running == 1


@run_async
async def test_started_traces_first_then_oldest_first():
    b = budget()
    await admit(b, "holder", 100)
    order: list[str] = []

    async def wait_in_line(trace: str, started: bool, since: float):
        await admit(b, trace, 30, started=started, since=since)
        order.append(trace)

    tasks = [
        asyncio.create_task(wait_in_line("new-late", False, 30.0)),
        asyncio.create_task(wait_in_line("new-early", False, 10.0)),
        asyncio.create_task(wait_in_line("started-late", True, 20.0)),
    ]
    await asyncio.sleep(0.01)
    b.release(["holder"])
    await asyncio.wait_for(asyncio.gather(*tasks), 1)
    assert order == ["started-late", "new-early", "new-late"]


@run_async
async def test_head_of_line_is_never_bypassed_by_a_smaller_newer_trace():
    b = budget()
    await admit(b, "holder", 60)
    big = asyncio.create_task(admit(b, "big-old", 60, since=1.0))
    await asyncio.sleep(0.01)
    small = asyncio.create_task(admit(b, "small-new", 10, since=2.0))
    await asyncio.sleep(0.01)
    assert not small.done(), "a newer trace must not jump the queue"
    b.release(["holder"])
    await asyncio.wait_for(asyncio.gather(big, small), 1)


@run_async
async def test_started_waiter_pauses_gapped_traces_smallest_first():
    paused: list[list[str]] = []
    b = budget(on_pause=paused.append)
    for trace, tokens, since in [("run", 30, 1.0), ("g30", 30, 2.0), ("g20", 20, 3.0), ("g10", 10, 4.0)]:
        await admit(b, trace, tokens, since=since)
    for trace, tokens in [("g30", 30), ("g20", 20), ("g10", 10)]:
        b.step_done(trace, tokens)  # now in tool gaps; "run" keeps a step in flight
    assert b.used == 90
    await admit(b, "run", 55, started=True, since=1.0)  # grows by 25 with 10 free: needs 15 more
    assert paused == [["g10", "g20"]]
    assert set(b.paused) == {"g10", "g20"} and b.used == 30 + 55
    # a paused trace's next step re-admits it as started (it goes before new traces)
    b.release(["g30"])
    await admit(b, "g10", 15, since=4.0)
    assert "g10" not in b.paused and b.resident["g10"].tokens == 15


@run_async
async def test_an_older_trace_is_never_paused_for_a_younger_one():
    """The oldest trace runs to its end; a trace resumed after a pause waits instead of pausing its elders."""
    paused: list[list[str]] = []
    b = budget(on_pause=paused.append)
    await admit(b, "old", 60, since=1.0)
    await admit(b, "young", 30, since=2.0)
    b.step_done("old", 60)
    b.step_done("young", 30)
    with pytest.raises(AdmissionTimeout):
        await admit(b, "young", 50, started=True, since=2.0, wait=0.05)
    assert paused == [] and "old" in b.resident
    await admit(b, "old", 75, started=True, since=1.0)  # the elder grows: the younger gapped trace makes room
    assert paused == [["young"]] and b.used == 75
    with pytest.raises(AdmissionTimeout):
        await admit(b, "young", 40, started=True, since=2.0, wait=0.05)
    assert paused == [["young"]] and b.resident["old"].tokens == 75


@run_async
async def test_a_new_trace_leaves_room_for_the_measured_growth_of_resident_traces():
    b = budget(growth_steps=2)
    await admit(b, "a", 20, since=1.0)
    assert b.growth_reserve == 0, "no growth measured yet"
    b.step_done("a", 20)
    await admit(b, "a", 30, started=True, since=1.0)  # a step adds 10 tokens to a's reservation
    b.step_done("a", 30)
    assert (b.step_growth, b.growth_reserve) == (10, 20)
    assert (b.free, b.new_trace_room) == (70, 50), "what placement is told a new trace gets"
    with pytest.raises(AdmissionTimeout):
        await admit(b, "new", 55, wait=0.05)  # fits the budget (30 + 55), not with a's next two steps (+ 20)
    await admit(b, "new", 50, since=2.0)
    assert b.used == 80
    await admit(b, "a", 40, started=True, since=1.0)  # a started trace is held only to the budget itself
    await admit(b, "a", 50, started=True, since=1.0)
    assert b.used == 100 and b.counts["paused"] == 0


@run_async
async def test_without_growth_steps_a_new_trace_fills_the_budget():
    b = budget()
    await admit(b, "a", 20)
    b.step_done("a", 20)
    await admit(b, "a", 30, started=True)
    await admit(b, "new", 70)
    assert b.used == 100 and b.growth_reserve == 0


@run_async
async def test_new_waiters_never_pause_anyone():
    paused: list[list[str]] = []
    b = budget(on_pause=paused.append)
    await admit(b, "gapped", 80)
    b.step_done("gapped", 80)
    with pytest.raises(AdmissionTimeout):
        await admit(b, "new", 30, wait=0.05)
    assert paused == [] and "gapped" in b.resident


@run_async
async def test_with_a_host_tier_a_new_trace_pauses_the_longest_gaps_that_fit_the_host():
    paused: list[list[str]] = []
    b = budget(on_pause=paused.append, host_capacity_tokens=35)
    for trace, tokens, gap_s in [("short", 30, 1.0), ("long", 30, 60.0), ("huge", 40, 600.0)]:
        await admit(b, trace, tokens)
        b.step_done(trace, tokens, kv_pin_ttl_s=gap_s)
    assert b.used == 100
    await admit(b, "new", 30)  # "huge" has the longest gap but not the host's room: "long" goes to the host
    assert paused == [["long"]] and b.paused == {"long": 30} and b.host_used == 30
    assert b.used == 100 and set(b.resident) == {"short", "huge", "new"}
    with pytest.raises(AdmissionTimeout):  # the host holds 5 more: pausing "short" (30) does not fit it
        await admit(b, "new2", 30, wait=0.05)
    b.release(["new"])
    await admit(b, "long", 30, started=True)  # back from its gap: the host tier no longer counts it
    assert b.host_used == 0 and "long" not in b.paused


@run_async
async def test_with_a_host_tier_nothing_is_paused_unless_that_makes_room():
    paused: list[list[str]] = []
    b = budget(on_pause=paused.append, host_capacity_tokens=1000)
    await admit(b, "running", 80)
    await admit(b, "gapped", 20)
    b.step_done("gapped", 20, kv_pin_ttl_s=60.0)
    with pytest.raises(AdmissionTimeout):
        await admit(b, "new", 30, wait=0.05)  # a step in flight holds 80: pausing the 20 would not do
    assert paused == [] and b.host_used == 0


@run_async
async def test_cancelled_waiter_leaves_and_admitted_cancel_is_not_left_running():
    b = budget()
    await admit(b, "a", 90)
    task = asyncio.create_task(admit(b, "b", 20, wait=5))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not b.waiters


@run_async
async def test_untouched_gapped_traces_expire():
    b = budget(idle_s=0.0)
    await admit(b, "lost", 80)
    b.step_done("lost", 80)
    await asyncio.sleep(0.01)
    await admit(b, "next", 50)  # the lost run's trace is dropped on the next admission
    assert "lost" not in b.resident and b.used == 50


def test_unknown_admission_strategy_is_refused():
    with pytest.raises(ValueError, match="kv_budget"):
        make_admission("magic")


def entry(worker_id: str, free: int, waiting: int = 0, room: int | None = None) -> WorkerEntry:
    return WorkerEntry(
        worker_id=worker_id,
        job_id=JOB,
        url=f"http://{worker_id}",
        pid=1,
        started_at=0.0,
        heartbeat_at=time.time(),
        stats=WorkerStats(
            worker_id=worker_id,
            job_id=JOB,
            model_version="m/1",
            admission_free_tokens=free,
            admission_new_trace_room_tokens=free if room is None else room,
            admission_waiting=waiting,
        ),
    )


def test_placement_prefers_home_then_most_room_counting_own_pending():
    policy = KvBudgetAdmission()
    workers = [entry("w0", 1000), entry("w1", 3000)]
    assert policy.place(workers, None, {}).worker_id == "w1"
    assert policy.place(workers, "w0", {}).worker_id == "w0"
    assert policy.place(workers, None, {"w1": 2500}).worker_id == "w0"


def test_placement_counts_the_room_a_new_trace_gets_not_the_free_budget():
    policy = KvBudgetAdmission()
    # w1 has more free budget, but its growth reserve leaves a new trace less room than w0's
    workers = [entry("w0", 2000, room=2000), entry("w1", 3000, room=500)]
    assert policy.place(workers, None, {}).worker_id == "w0"
    # with equal room, the worker with fewer steps already waiting for room
    workers = [entry("w0", 0, waiting=3), entry("w1", 0, waiting=1)]
    assert policy.place(workers, None, {}).worker_id == "w1"


CHAT_PROMPT_TOKENS = 10  # what `BudgetClient` counts for a step sent as messages (a chat line), not token ids


class BudgetClient:
    """Stand-in workers, each admitting by its own `KvBudget` like the real worker does."""

    def __init__(self, budgets: dict[str, KvBudget]):
        self.budgets = budgets
        self.calls: list[tuple[str, str, bool]] = []

    async def generate(self, url, request: StepRequest):
        worker = url.removeprefix("http://")
        b = self.budgets[worker]
        prompt = len(request.prompt_token_ids) if request.prompt_token_ids is not None else CHAT_PROMPT_TOKENS
        tokens = prompt + request.sampling.max_tokens
        self.calls.append((worker, request.trace_id, request.admission.started))
        try:
            await b.admit(
                request.trace_id,
                tokens,
                started=request.admission.started,
                since=request.admission.since or request.trace_started_at,
                timeout_s=request.admission.wait_s,
            )
        except AdmissionTimeout as exc:
            raise NotAdmitted(str(exc)) from exc
        b.step_done(request.trace_id, tokens)
        return StepResult(
            request_id=request.request_id,
            text="",
            token_ids=[9] * request.sampling.max_tokens,
            prompt_tokens=prompt,
            cached_tokens=0,
            completion_tokens=request.sampling.max_tokens,
            finish_reason="length",
            model_version="m/1",
            worker_id=worker,
            queue_time_s=0.0,
            engine_time_s=0.0,
        )

    async def release(self, url, trace_ids):
        self.budgets[url.removeprefix("http://")].release(trace_ids)

    async def aclose(self):
        pass


def step(trace: str, tokens: int, family: str | None = None) -> StepRequest:
    return StepRequest(
        request_id=f"r-{trace}-{tokens}",
        prompt_token_ids=[5] * tokens,
        sampling=SamplingSpec(max_tokens=1),
        trace_id=trace,
        affinity_key=family or trace,
    )


@run_async
async def test_router_places_by_room_keeps_started_home_and_moves_on_when_not_admitted(tmp_path):
    registry = FileRegistry(tmp_path)
    registry.announce(entry("w0", 99))
    registry.announce(entry("w1", 49))
    budgets = {"w0": budget(), "w1": budget(50)}
    client = BudgetClient(budgets)
    router = Router(JOB, registry, client=client, admission="kv_budget", admission_wait_s=0.05)

    first = await router.generate(step("a", 59))
    assert first.worker_id == "w0"  # most room
    second = await router.generate(step("a", 69))
    assert second.worker_id == "w0" and client.calls[-1] == ("w0", "a", True)  # started: stays home
    # the router has placed ~70 tokens on w0 since the stats it read: w1 now looks roomier
    third = await router.generate(step("b", 39))
    assert third.worker_id == "w1"
    # w1 is full for c; w0 has room: c is refused by w1's budget in time and admitted on w0
    fourth = await router.generate(step("c", 19, family="b"))
    assert fourth.worker_id == "w0" and [c[0] for c in client.calls[-2:]] == ["w1", "w0"]
    # a trace that ends leaves its worker's budget
    await router.finish("a")
    assert "a" not in budgets["w0"].resident


@run_async
async def test_admission_orders_by_the_familys_start_even_when_the_caller_sets_the_engine_priority(tmp_path):
    """The benchmark's `+ admission` setup stamps every step with one engine priority; the worker's admission queue
    must still see each family's own start, or a paused trace could never again make room for itself."""
    registry = FileRegistry(tmp_path)
    registry.announce(entry("w0", 99))
    client = BudgetClient({"w0": budget()})
    sent: list[StepRequest] = []
    generate = client.generate

    async def spy(url, request):
        sent.append(request)
        return await generate(url, request)

    client.generate = spy  # type: ignore[method-assign]
    router = Router(JOB, registry, client=client, admission="kv_budget")
    for trace, family in [("old", "old"), ("old.child", "old"), ("young", "young"), ("old", "old")]:
        await router.generate(step(trace, 5, family).model_copy(update={"trace_started_at": 1.0}))
    assert {r.trace_started_at for r in sent} == {1.0}
    old, child, young, again = (r.admission.since for r in sent if r.admission is not None)
    assert old == child == again and old is not None and young is not None and 1.0 < old <= young


@run_async
async def test_router_without_admission_sends_no_hints(tmp_path):
    registry = FileRegistry(tmp_path)
    registry.announce(entry("w0", 0))
    seen: list[StepRequest] = []

    class Plain(BudgetClient):
        async def generate(self, url, request):
            seen.append(request)
            return StepResult(
                request_id=request.request_id,
                text="",
                token_ids=[1],
                prompt_tokens=1,
                cached_tokens=0,
                completion_tokens=1,
                finish_reason="stop",
                model_version="m/1",
                worker_id="w0",
                queue_time_s=0.0,
                engine_time_s=0.0,
            )

    router = Router(JOB, registry, client=Plain({}))
    await router.generate(step("a", 3))
    assert seen[0].admission is None and seen[0].trace_started_at is not None
