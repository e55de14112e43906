"""How many lines a run keeps in flight: the job's fixed `max_concurrency`, or a target chosen from what the run
measures (`scheduling.concurrency: adaptive`).

An agent trace alternates steps (at an engine) and tool calls (its engine idles for it), so a fixed number of lines
in flight leaves engines idle while their traces wait on tools. By Little's law, a line in flight keeps on average
`busy / span` requests at an engine (its steps' engine seconds over its wall seconds, children included); to keep
every engine `max_num_seqs` requests to run, a run needs `workers x max_num_seqs x span / busy` lines in flight. A
step's engine time includes its wait for admission and in vLLM's queue, so an overloaded fleet measures longer steps
and the target falls: the estimate corrects itself. Each line also holds KV while it is in flight (its context
through every step and the tool gap after it): the target is capped by what the workers' KV room holds, device
cache and host tier together (their admission budgets, `pronk.engine.admission`), over the KV a line keeps on average,
and by the job's `concurrency_ceiling`.

The measure is the last `WINDOW` finished lines of the run; until `MIN_LINES` have finished, the Herd's profile of
the job's earlier runs (when there is one), else `max_concurrency`. Every change of the target is recorded, with the
run's time, for the batch record (`Batch.in_flight`).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Callable, Iterable
from contextlib import suppress
from dataclasses import dataclass
from types import TracebackType

from pronk.agents.step_records import StepRecord
from pronk.batches.schemas import InFlightPoint
from pronk.engine.registry import WorkerEntry
from pronk.jobs.schema import JobConfig

WINDOW = 64
"""Finished lines the adaptive target is measured over: recent enough to follow a change of traffic."""
MIN_LINES = 4
"""Finished lines of the run before its own measure replaces the profile's (or `max_concurrency`)."""
HYSTERESIS = 0.1
"""The target moves only by at least this share of its value, and by at least 1: no churn on noise."""
MAX_POINTS = 256
"""Points of the recorded target kept; past them the last point follows the target."""


@dataclass(frozen=True, slots=True)
class LineLoad:
    """What finished lines asked of the engines, summed over the lines."""

    lines: int = 0
    span_s: float = 0.0
    """Wall seconds from each line's first step to the end of its last step or tool call."""
    busy_s: float = 0.0
    """Seconds the lines' steps were at an engine (admission and queue waits included), children's too."""
    token_s: float = 0.0
    """KV token-seconds: each step's context (prompt and output) times how long it was held (the step and the tool
    call after it)."""

    @classmethod
    def of(cls, records: Iterable[StepRecord]) -> LineLoad:
        """One finished line's load, from its step records (every attempt, children included); a line no worker
        served says nothing (zero lines)."""
        rows = list(records)
        served = [r for r in rows if r.worker_id is not None]
        if not served:
            return cls()
        start = min(r.started_at for r in rows)
        end = max(r.started_at + r.engine_time_s + r.tool_time_s for r in rows)
        return cls(
            lines=1,
            span_s=max(0.0, end - start),
            busy_s=sum(r.engine_time_s for r in served),
            token_s=sum((r.prompt_tokens + r.output_tokens) * (r.engine_time_s + r.tool_time_s) for r in served),
        )

    def __add__(self, other: LineLoad) -> LineLoad:
        return LineLoad(
            self.lines + other.lines,
            self.span_s + other.span_s,
            self.busy_s + other.busy_s,
            self.token_s + other.token_s,
        )

    @property
    def running(self) -> float:
        """Requests a line in flight keeps at an engine, on average."""
        return self.busy_s / self.span_s if self.span_s > 0 else 0.0

    @property
    def resident_tokens(self) -> float:
        """KV tokens a line in flight holds, on average."""
        return self.token_s / self.span_s if self.span_s > 0 else 0.0


def in_flight_target(
    load: LineLoad, *, workers: int, running_per_worker: int, kv_room_tokens: int, ceiling: int
) -> int | None:
    """Lines to keep in flight so that each of `workers` engines has `running_per_worker` requests to run while other
    lines wait on tools (`workers x running_per_worker / load.running`), capped by what `kv_room_tokens` (0: unknown)
    holds of `load.resident_tokens` per line, and by `ceiling`; at least 1. None when `load` measured no engine time.
    """
    if load.lines == 0 or load.busy_s <= 0 or load.span_s <= 0:
        return None
    wanted = math.ceil(workers * running_per_worker * load.span_s / load.busy_s)
    if kv_room_tokens > 0 and load.token_s > 0:
        wanted = min(wanted, math.floor(kv_room_tokens * load.span_s / load.token_s))
    return max(1, min(ceiling, wanted))


def kv_room_tokens(workers: list[WorkerEntry]) -> int:
    """The KV tokens the workers' admission budgets hold: device cache and host tier, less the headroom (0 when no
    worker reports its cache)."""
    return sum(w.stats.admission_limit_tokens + w.stats.admission_host_limit_tokens for w in workers)


class InFlightSlots:
    """An asyncio semaphore whose limit may change: a lower limit lets no new line start until enough have ended, a
    higher one starts waiting lines at once; waiters start in arrival order."""

    def __init__(self, limit: int):
        self.limit = max(1, limit)
        self.held = 0
        self._waiters: deque[asyncio.Future[None]] = deque()

    def resize(self, limit: int) -> None:
        self.limit = max(1, limit)
        self._wake()

    async def __aenter__(self) -> None:
        if self.held < self.limit and not self._waiters:
            self.held += 1
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.cancelled():
                with suppress(ValueError):  # `_wake` may have dropped it already
                    self._waiters.remove(waiter)
            else:  # granted, then cancelled before it ran: give it back
                self._release()
            raise

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._release()

    def _release(self) -> None:
        self.held -= 1
        self._wake()

    def _wake(self) -> None:
        while self._waiters and self.held < self.limit:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                self.held += 1


class InFlight:
    """The lines one run keeps in flight (`slots`), re-chosen as its lines finish when the job's concurrency is
    adaptive, with the targets it chose over the run (`points`)."""

    def __init__(self, job: JobConfig, start: LineLoad | None = None, clock: Callable[[], float] = time.monotonic):
        scheduling = job.scheduling
        self.adaptive = scheduling.concurrency == "adaptive"
        self.workers = job.workers
        self.running_per_worker = job.engine.max_num_seqs
        self.ceiling = scheduling.concurrency_ceiling
        self.start = start if start is not None and start.lines else None
        self.window: deque[LineLoad] = deque(maxlen=WINDOW)
        self.clock = clock
        self.began = clock()
        first = min(scheduling.max_concurrency, self.ceiling) if self.adaptive else scheduling.max_concurrency
        self.slots = InFlightSlots(first)
        self.points = [InFlightPoint(at_s=0.0, target=first, source="fixed" if not self.adaptive else "start", lines=0)]

    @property
    def target(self) -> int:
        return self.slots.limit

    def measured(self) -> LineLoad | None:
        """The load the target is chosen from: the run's recent lines once there are enough, else the profile's."""
        if len(self.window) >= MIN_LINES:
            return sum(self.window, LineLoad())
        return self.start

    def observe(self, records: Iterable[StepRecord], live_workers: Callable[[], list[WorkerEntry]]) -> None:
        """A line finished with these step records: measure it and choose the target again (adaptive only)."""
        if not self.adaptive:
            return
        load = LineLoad.of(records)
        if load.lines:
            self.window.append(load)
        self.retarget(live_workers)

    def retarget(self, live_workers: Callable[[], list[WorkerEntry]]) -> None:
        """Choose the target from the measured load and the workers live now (adaptive only: a fixed run asks
        nothing of the workers)."""
        if not self.adaptive:
            return
        load = self.measured()
        if load is None:
            return
        workers = live_workers()
        wanted = in_flight_target(
            load,
            workers=len(workers) or self.workers,
            running_per_worker=self.running_per_worker,
            kv_room_tokens=kv_room_tokens(workers),
            ceiling=self.ceiling,
        )
        if wanted is None or abs(wanted - self.target) < max(1.0, HYSTERESIS * self.target):
            return
        self.slots.resize(wanted)
        point = InFlightPoint(
            at_s=round(self.clock() - self.began, 3),
            target=wanted,
            source="run" if len(self.window) >= MIN_LINES else "profile",
            lines=load.lines,
        )
        if len(self.points) < MAX_POINTS:
            self.points.append(point)
        else:
            self.points[-1] = point
