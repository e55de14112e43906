"""The lines a run keeps in flight: the adaptive target as a pure function of measured step and gap times and the KV
room, the semaphore whose limit it moves, and the controller that re-chooses it as lines finish."""

from __future__ import annotations

import asyncio

import pytest

from pronk.agents.outcomes import RequestOutcome
from pronk.agents.step_records import StepRecord
from pronk.batches.in_flight import (
    MIN_LINES,
    InFlight,
    InFlightSlots,
    LineLoad,
    in_flight_target,
    kv_room_tokens,
)
from pronk.batches.input import validate_input
from pronk.batches.run import BatchRun
from pronk.batches.schemas import Batch
from pronk.engine.registry import WorkerEntry
from pronk.engine.worker_protocol import WorkerStats
from pronk.jobs.catalog import resolve_job
from pronk.jobs.schema import JobConfig
from pronk.jobs.versions import with_changes
from pronk.settings import get_settings
from tests.pronk.batches.test_checked_lines import AnsweringHarness, line


def step(
    line: str, at: float, engine_s: float, gap_s: float = 0.0, context: int = 100, trace: str | None = None
) -> StepRecord:
    """A served step of `line`'s family that started at `at`, ran `engine_s` at its worker and waited `gap_s` on the
    tool it called; its prompt and output hold `context` tokens."""
    return StepRecord(
        trace_id=trace or line,
        step=0,
        root_trace_id=line,
        custom_id=line,
        worker_id="w0",
        prompt_tokens=context - 10,
        output_tokens=10,
        engine_time_s=engine_s,
        tool_time_s=gap_s,
        tool_name="python" if gap_s else None,
        started_at=at,
    )


def worker(index: int, device_tokens: int = 0, host_tokens: int = 0) -> WorkerEntry:
    stats = WorkerStats(
        worker_id=f"w{index}",
        job_id="job-c0ffee01",
        model_version="1",
        admission_limit_tokens=device_tokens,
        admission_host_limit_tokens=host_tokens,
    )
    return WorkerEntry(
        worker_id=f"w{index}", job_id="job-c0ffee01", url="http://w", pid=1, started_at=0, heartbeat_at=0, stats=stats
    )


def adaptive_job(max_concurrency: int = 2, max_num_seqs: int = 2, ceiling: int = 512) -> JobConfig:
    job = resolve_job("job-c0ffee01", get_settings(), versions=False)
    scheduling = {"concurrency": "adaptive", "max_concurrency": max_concurrency, "concurrency_ceiling": ceiling}
    return with_changes(job, {"scheduling": scheduling, "engine": {"max_num_seqs": max_num_seqs}})


def test_a_line_load_is_its_engine_seconds_its_span_and_the_kv_it_held():
    # step 1s, tool gap 3s, step 1s: 5 s of wall time, 2 s at an engine; a child ran beside the parent's gap
    records = [
        step("a", at=100.0, engine_s=1.0, gap_s=3.0, context=100),
        step("a", at=101.5, engine_s=0.5, context=50, trace="a.0.0"),
        step("a", at=104.0, engine_s=1.0, context=200),
    ]
    load = LineLoad.of(records)
    assert (load.lines, load.span_s, load.busy_s) == (1, 5.0, 2.5)
    assert load.token_s == 100 * 4.0 + 50 * 0.5 + 200 * 1.0
    assert load.running == 0.5 and load.resident_tokens == 625 / 5
    unserved = StepRecord(trace_id="b", step=0, root_trace_id="b", error="TimeoutError", started_at=0.0)
    assert LineLoad.of([unserved]) == LineLoad() and LineLoad().running == 0.0
    assert LineLoad.of(records) + LineLoad.of(records) == LineLoad(2, 10.0, 5.0, 2 * load.token_s)


def test_the_target_keeps_each_engine_busy_through_tool_gaps_by_littles_law():
    # a line is at an engine 1 s of every 4 s: 4 engines x 8 running requests need 4 x 8 x 4 = 128 lines in flight
    load = LineLoad(lines=10, span_s=40.0, busy_s=10.0, token_s=40.0 * 500)
    assert in_flight_target(load, workers=4, running_per_worker=8, kv_room_tokens=0, ceiling=4096) == 128
    # with no tool gaps a line is always at an engine: as many lines as requests the engines run
    busy = LineLoad(lines=10, span_s=10.0, busy_s=10.0)
    assert in_flight_target(busy, workers=4, running_per_worker=8, kv_room_tokens=0, ceiling=4096) == 32


def test_the_target_is_capped_by_the_kv_room_of_device_and_tier_and_by_the_ceiling():
    load = LineLoad(lines=10, span_s=40.0, busy_s=10.0, token_s=40.0 * 500)  # a line holds 500 tokens
    room = kv_room_tokens([worker(0, 9_000, 16_000), worker(1, 9_000, 16_000)])
    assert room == 50_000
    assert in_flight_target(load, workers=2, running_per_worker=64, kv_room_tokens=room, ceiling=4096) == 100
    assert in_flight_target(load, workers=2, running_per_worker=64, kv_room_tokens=18_000, ceiling=4096) == 36
    assert in_flight_target(load, workers=2, running_per_worker=64, kv_room_tokens=room, ceiling=40) == 40
    assert in_flight_target(load, workers=2, running_per_worker=64, kv_room_tokens=100, ceiling=40) == 1
    assert in_flight_target(LineLoad(), workers=2, running_per_worker=64, kv_room_tokens=room, ceiling=40) is None


def test_slots_move_their_limit_while_lines_wait():
    async def scenario() -> list[str]:
        slots = InFlightSlots(1)
        events: list[str] = []
        release = asyncio.Event()

        async def line(name: str) -> None:
            async with slots:
                events.append(f"start {name}")
                await release.wait()

        tasks = [asyncio.create_task(line(n)) for n in "abcd"]
        await asyncio.sleep(0)
        assert (slots.held, events) == (1, ["start a"])
        slots.resize(3)  # two waiting lines start at once, in arrival order
        await asyncio.sleep(0)
        assert (slots.held, events[1:]) == (3, ["start b", "start c"])
        tasks[3].cancel()  # a waiting line cancelled leaves nothing held
        slots.resize(1)
        release.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        assert slots.held == 0
        return events

    assert asyncio.run(scenario()) == ["start a", "start b", "start c"]


def test_a_fixed_job_keeps_max_concurrency_and_asks_nothing_of_the_workers():
    job = resolve_job("job-c0ffee01", get_settings(), versions=False)
    assert job.scheduling.concurrency == "fixed"

    def no_workers() -> list[WorkerEntry]:
        raise AssertionError("a fixed run reads no worker")

    in_flight = InFlight(job, start=LineLoad(lines=5, span_s=50.0, busy_s=5.0))
    in_flight.retarget(no_workers)
    for index in range(10):
        in_flight.observe([step(f"l{index}", at=0.0, engine_s=1.0, gap_s=9.0)], no_workers)
    assert in_flight.target == job.scheduling.max_concurrency
    assert [(p.target, p.source) for p in in_flight.points] == [(job.scheduling.max_concurrency, "fixed")]


def test_an_adaptive_run_starts_from_the_profile_then_follows_its_own_lines():
    clock = iter(float(t) for t in range(100))
    job = adaptive_job(max_concurrency=2, max_num_seqs=2)
    profile = LineLoad(lines=50, span_s=100.0, busy_s=50.0)  # earlier runs: half the time at an engine
    in_flight = InFlight(job, start=profile, clock=lambda: next(clock))
    assert in_flight.target == 2
    in_flight.retarget(lambda: [worker(0)])
    assert in_flight.target == 1 * 2 * 2  # one live worker x 2 running / 0.5
    for index in range(MIN_LINES):  # this run's lines spend 3 s of every 4 in tool calls
        in_flight.observe([step(f"l{index}", at=0.0, engine_s=1.0, gap_s=3.0)], lambda: [worker(0)])
    assert in_flight.target == 1 * 2 * 4
    in_flight.observe([step("one-more", at=0.0, engine_s=1.0, gap_s=2.6)], lambda: [worker(0)])
    assert in_flight.target == 8  # 1 x 2 x 19.6/5 = 7.84 rounds up to 8: no move
    in_flight.observe([step("slow", at=0.0, engine_s=1.0, gap_s=30.0)], lambda: [worker(0), worker(1, 10**6)])
    sources = [(p.target, p.source, p.lines) for p in in_flight.points]
    assert sources[:3] == [(2, "start", 0), (4, "profile", 50), (8, "run", MIN_LINES)]
    assert sources[3][1:] == ("run", MIN_LINES + 2) and sources[3][0] == in_flight.target > 8
    assert [p.at_s for p in in_flight.points] == sorted(p.at_s for p in in_flight.points)


def test_an_adaptive_run_never_exceeds_its_kv_room_or_ceiling():
    job = adaptive_job(max_concurrency=4, max_num_seqs=64, ceiling=30)
    in_flight = InFlight(job)
    for index in range(MIN_LINES):  # each line holds 1,000 tokens through its steps and gaps
        in_flight.observe([step(f"l{index}", at=0.0, engine_s=1.0, gap_s=9.0, context=1000)], lambda: [])
    assert in_flight.target == 30  # no worker reports its KV room: only the ceiling caps
    in_flight.retarget(lambda: [worker(0, 4_000, 8_000)])
    assert in_flight.target == 12


@pytest.mark.parametrize("value", ["auto", "dynamic"])
def test_concurrency_is_fixed_or_adaptive(value):
    job = resolve_job("job-c0ffee01", get_settings(), versions=False)
    with pytest.raises(ValueError, match="concurrency"):
        with_changes(job, {"scheduling": {"concurrency": value}})


class PacedHarness(AnsweringHarness):
    """Answers every line after a short wait, counting the lines in flight; each line's step records say it spent
    1 s at an engine and 3 s in a tool call, holding 100 tokens; its router's live workers are `live`."""

    def __init__(self, custom_ids: list[str], live: list[WorkerEntry]):
        super().__init__(dict.fromkeys(custom_ids, "4"))
        self.router = self
        self.live = live
        self.running = 0
        self.most = 0

    def workers(self) -> list[WorkerEntry]:
        return self.live

    def take_line(self, custom_id: str) -> list[StepRecord]:
        return [step(custom_id, at=0.0, engine_s=1.0, gap_s=3.0, context=100)]

    async def run_line(self, request) -> RequestOutcome:
        self.running += 1
        self.most = max(self.most, self.running)
        await asyncio.sleep(0.005)
        self.running -= 1
        return await super().run_line(request)


def run_batch(job: JobConfig, live: list[WorkerEntry], lines: int = 40) -> tuple[BatchRun, PacedHarness]:
    custom_ids = [f"r{i}" for i in range(lines)]
    validated = validate_input("\n".join(line(c) for c in custom_ids).encode(), job)
    batch = Batch(input_file_id="file-x", job_id=job.job_id, model="pronk-tiny", price_per_worker_hour=1.0)
    run = BatchRun(batch, job, validated.requests)
    harness = PacedHarness(custom_ids, live)
    asyncio.run(run.run_lines(harness, 0, len(run.todo)))  # type: ignore[arg-type]
    return run, harness


def test_a_fixed_batch_run_keeps_its_max_concurrency_in_flight():
    job = with_changes(
        resolve_job("job-c0ffee01", get_settings(), versions=False), {"scheduling": {"max_concurrency": 3}}
    )
    run, harness = run_batch(job, [worker(0)])
    assert harness.most == 3 and run.batch.request_counts.completed == 40
    assert [(p.target, p.source) for p in run.batch.in_flight] == [(3, "fixed")]


@pytest.mark.parametrize(
    ("live", "target"),
    [([worker(0)], 1 * 2 * 4), ([worker(0, device_tokens=300, host_tokens=300)], 600 // 100)],
    ids=["gaps", "kv-room"],
)
def test_an_adaptive_batch_run_raises_its_lines_in_flight_to_its_target(live, target):
    """Lines spend 3 s of every 4 in tool calls: one worker running 2 requests needs 8 lines in flight, or as many
    as its KV room holds at 100 tokens a line."""
    run, harness = run_batch(adaptive_job(max_concurrency=2, max_num_seqs=2), live)
    assert harness.most == target and run.batch.request_counts.completed == 40
    assert [(p.target, p.source) for p in run.batch.in_flight] == [(2, "start"), (target, "run")]
    figures = {row["figure"]: row["value"] for row in run.summary_table()}
    assert figures["concurrency"] == "adaptive"
    assert (figures["lines in flight (last target)"], figures["lines in flight (most)"]) == (target, target)
