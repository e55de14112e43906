"""Admission by KV capacity: which traces a worker holds, and where a router places a new trace.

The worker side is `KvBudget`. Each engine worker owns one, sized from its engine's KV cache, so the
admission state is shared by every run of the job that sends steps to it, survives a flow-run restart,
works across hosts, and a worker that dies takes its budget with it. A trace's resident context
(last prompt + output tokens) is counted from its first admitted step until it ends, through its tool
gaps. A step is admitted only while the resident sum stays under capacity minus headroom; otherwise it
waits, started traces first and then oldest first (by the time the trace's family first asked), never
newest first, and for a bounded time: the caller then hears "not admitted" and may try elsewhere. When a
waiting started trace cannot fit, traces in a tool gap that started after it are paused smallest-first:
their KV pins are dropped and they stop counting; their next step re-admits them (and recomputes what the
engine evicted of their prefix meanwhile). A step larger than the whole budget is refused at once
(`context_length`), never queued.

Admitted traces grow by every step, so a new trace that fits today is paused tomorrow, and its prefix is
recomputed. A new trace therefore starts only while the budget also keeps room for `growth_steps` more steps
of every resident trace, at the growth per step measured on this worker (a running mean of what a started
trace's step adds to its reservation). More steps of room mean fewer pauses and less recompute, but fewer
traces resident to fill one another's tool gaps: prefill-heavy work gains, decode-heavy work loses, so it is a
per-job setting (`scheduling.kv_budget_growth_steps`) that the Herd tuner searches.

With a KV host tier (`pronk.engine.kv_tier`, `host_capacity_tokens`), a paused trace's blocks are already in host
memory, so pausing costs a copy back instead of a recompute, and the budget counts two tiers: admitted traces
within the engine's cache, paused ones within the host tier. A new trace that does not fit may then pause gapped
traces of any age, those whose tool gap is expected to last longest first (the step's pin TTL is the harness's
estimate of it), while the paused traces' context fits the host tier.

The router side is a small strategy chosen per job (`ADMISSION`): `none` sends steps as the routing
policy says; `kv_budget` asks workers to admit each step, places a new trace on the worker with the most
room for it (free budget less growth reserve) or at its family's home, and keeps a started trace on the worker
holding its prefix.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from pronk.engine.engine_error import EngineError
from pronk.engine.registry import WorkerEntry


class AdmissionTimeout(EngineError):
    """The step waited its bounded time without fitting: retry later or on another worker."""


class BudgetExceeded(EngineError):
    """The step alone needs more tokens than the worker's whole budget: it can never be admitted here."""


@dataclass(slots=True)
class Resident:
    """An admitted trace: its reserved context in tokens and how many of its steps are in flight; `age` orders
    traces oldest first (the family's start time, then the order they were admitted in)."""

    tokens: int
    age: tuple[float, int]
    running: int = 0
    touched_at: float = field(default_factory=time.monotonic)
    gap_until: float = 0.0
    """When its tool gap is expected to end (monotonic): the last step's end plus the gap the harness expects."""


@dataclass(slots=True)
class _Waiter:
    key: tuple[int, float, int]
    trace_id: str
    tokens: int
    since: float
    future: asyncio.Future[None]

    def __lt__(self, other: _Waiter) -> bool:
        return self.key < other.key


class KvBudget:
    """One worker's admission state (module docstring); every method runs on the worker's event loop."""

    def __init__(
        self,
        capacity_tokens: int,
        headroom: float = 0.1,
        growth_steps: float = 0.0,
        on_pause: Callable[[list[str]], None] | None = None,
        idle_s: float = 1800.0,
        max_paused: int = 100_000,
        host_capacity_tokens: int = 0,
    ):
        self.capacity_tokens = capacity_tokens
        self.limit = max(1, int(capacity_tokens * (1.0 - headroom)))
        self.host_limit = int(host_capacity_tokens * (1.0 - headroom))
        self.growth_steps = growth_steps
        self.step_growth = 0.0
        self.on_pause = on_pause
        self.idle_s = idle_s
        self.max_paused = max_paused
        self.resident: dict[str, Resident] = {}
        self.paused: OrderedDict[str, int] = OrderedDict()
        """Paused traces -> their context in tokens (what the host tier holds for them, where there is one)."""
        self.waiters: list[_Waiter] = []
        self.used = 0
        self.peak = 0
        self.counts = {"admitted": 0, "waited": 0, "timed_out": 0, "refused": 0, "paused": 0}
        self._seq = itertools.count()

    @property
    def free(self) -> int:
        return max(0, self.limit - self.used)

    @property
    def host_used(self) -> int:
        """Tokens of the paused traces' context: what the host tier holds for them, where there is one."""
        return sum(self.paused.values())

    @property
    def growth_reserve(self) -> int:
        """Tokens a new trace must leave free: `growth_steps` steps of measured growth for every resident trace."""
        return int(self.growth_steps * self.step_growth * len(self.resident))

    @property
    def new_trace_room(self) -> int:
        """Tokens a new trace can be admitted into now: the free budget less the growth reserve it must leave."""
        return max(0, self.free - self.growth_reserve)

    def _extra(self, trace_id: str, tokens: int) -> int:
        entry = self.resident.get(trace_id)
        return max(0, tokens - entry.tokens) if entry else tokens

    async def admit(self, trace_id: str, tokens: int, *, started: bool, since: float, timeout_s: float) -> None:
        """Reserve `tokens` (the step's prompt plus its most output) for the trace; growth of an admitted trace
        reserves only the difference. Returns once admitted; raises `BudgetExceeded` or `AdmissionTimeout`."""
        if tokens > self.limit:
            self.counts["refused"] += 1
            raise BudgetExceeded(f"context_length: step needs {tokens} tokens, worker budget is {self.limit}")
        self._expire(time.monotonic())
        started = started or trace_id in self.resident or trace_id in self.paused
        waiter = _Waiter(
            (0 if started else 1, since, next(self._seq)),
            trace_id,
            tokens,
            since,
            asyncio.get_running_loop().create_future(),
        )
        bisect.insort(self.waiters, waiter)
        self._serve()
        if waiter.future.done():
            return
        self.counts["waited"] += 1
        try:
            await asyncio.wait_for(asyncio.shield(waiter.future), timeout_s)
        except TimeoutError:
            if waiter.future.done():  # admitted in the same tick the wait ran out
                return
            self._leave(waiter)
            self.counts["timed_out"] += 1
            raise AdmissionTimeout(
                f"trace {trace_id}: {tokens} tokens did not fit within {timeout_s}s ({self.free} of {self.limit} free)"
            ) from None
        except asyncio.CancelledError:  # the caller went away: its step will not run
            entry = self.resident.get(trace_id)
            if waiter.future.done() and entry is not None:
                self.step_done(trace_id, entry.tokens)
            else:
                self._leave(waiter)
            raise

    def _leave(self, waiter: _Waiter) -> None:
        self.waiters.remove(waiter)
        waiter.future.cancel()
        self._serve()

    def step_done(self, trace_id: str, tokens: int, kv_pin_ttl_s: float = 0.0) -> None:
        """A step of the trace finished: its resident context is now `tokens` (prompt + output) and, with no
        other step in flight, it is in a tool gap (pausable) expected to last the step's `kv_pin_ttl_s`."""
        entry = self.resident.get(trace_id)
        if entry is None:
            return
        entry.running = max(0, entry.running - 1)
        entry.touched_at = time.monotonic()
        entry.gap_until = entry.touched_at + kv_pin_ttl_s
        self.used += tokens - entry.tokens
        entry.tokens = tokens
        self._serve()

    def release(self, trace_ids: Iterable[str]) -> None:
        """The traces ended: stop counting them."""
        for trace_id in trace_ids:
            entry = self.resident.pop(trace_id, None)
            if entry is not None:
                self.used -= entry.tokens
            self.paused.pop(trace_id, None)
        self._serve()

    def _take(self, waiter: _Waiter) -> None:
        entry = self.resident.get(waiter.trace_id)
        if entry is not None and 0 < entry.tokens < waiter.tokens:
            growth = waiter.tokens - entry.tokens
            self.step_growth = growth if not self.step_growth else 0.9 * self.step_growth + 0.1 * growth
        if entry is None:
            entry = self.resident[waiter.trace_id] = Resident(0, (waiter.since, next(self._seq)))
            self.paused.pop(waiter.trace_id, None)
        self.used += max(0, waiter.tokens - entry.tokens)
        entry.tokens = max(entry.tokens, waiter.tokens)
        entry.running += 1
        entry.touched_at = time.monotonic()
        self.peak = max(self.peak, self.used)
        self.counts["admitted"] += 1
        waiter.future.set_result(None)

    def _serve(self) -> None:
        """Admit waiters in order while the head fits (a new trace with the growth reserve); a started head that
        does not fit pauses gapped traces."""
        while self.waiters:
            head = self.waiters[0]
            extra = self._extra(head.trace_id, head.tokens)
            reserve = self.growth_reserve if head.key[0] == 1 else 0
            if self.used + extra > self.limit and head.key[0] == 0:
                self._pause_for(self.used + extra - self.limit, head)
            elif self.used + extra + reserve > self.limit and self.host_limit:
                self._pause_to_host(self.used + extra + reserve - self.limit)
            if self.used + extra + reserve > self.limit:
                return
            self.waiters.pop(0)
            self._take(head)

    def _pause_for(self, shortfall: int, head: _Waiter) -> None:
        """Pause traces in a tool gap that started after `head`, smallest first, if that makes room for it.

        Only younger traces: an older trace is never paused for a younger one, so the oldest resident trace
        always runs to its end, and a trace resumed after a pause cannot in turn pause the traces that
        outgrew it (that back-and-forth recomputed whole prefixes over and over).
        """
        own = self.resident.get(head.trace_id)
        age = own.age if own is not None else (head.since, next(self._seq))
        gapped = sorted(
            (e.tokens, t)
            for t, e in self.resident.items()
            if e.running == 0 and t != head.trace_id and e.tokens > 0 and e.age > age
        )
        if sum(tokens for tokens, _ in gapped) < shortfall:
            return  # pausing all of them would not make room: wait for running steps to finish instead
        self._pause([trace_id for _, trace_id in gapped], shortfall)

    def _pause_to_host(self, shortfall: int) -> None:
        """With a host tier, make room for a new trace: pause gapped traces whose gap is expected to last longest
        first, while their context fits the host tier's room and only if that makes room enough."""
        room = self.host_limit - self.host_used
        gapped = sorted(
            ((e.gap_until, e.tokens, t) for t, e in self.resident.items() if e.running == 0 and e.tokens > 0),
            reverse=True,
        )
        chosen: list[str] = []
        for _, tokens, trace_id in gapped:
            if shortfall <= 0:
                break
            if tokens <= room:
                chosen.append(trace_id)
                room -= tokens
                shortfall -= tokens
        if shortfall <= 0:
            self._pause(chosen, shortfall=None)

    def _pause(self, trace_ids: list[str], shortfall: int | None) -> None:
        """Pause these traces in order, until `shortfall` tokens are free (None: all of them)."""
        paused: list[str] = []
        for trace_id in trace_ids:
            if shortfall is not None and shortfall <= 0:
                break
            tokens = self.resident.pop(trace_id).tokens
            self.used -= tokens
            if shortfall is not None:
                shortfall -= tokens
            self.paused[trace_id] = tokens
            paused.append(trace_id)
        while len(self.paused) > self.max_paused:
            self.paused.popitem(last=False)
        self.counts["paused"] += len(paused)
        if paused and self.on_pause:
            self.on_pause(paused)

    def _expire(self, now: float) -> None:
        """Drop gapped traces untouched for `idle_s`: their run died without releasing them."""
        stale = [t for t, e in self.resident.items() if e.running == 0 and now - e.touched_at > self.idle_s]
        for trace_id in stale:
            self.used -= self.resident.pop(trace_id).tokens


class NoAdmission:
    """Steps go where the routing policy sends them, as many at once as the run keeps in flight."""

    enabled = False

    def place(self, candidates: list[WorkerEntry], home: str | None, pending: dict[str, int]) -> WorkerEntry | None:
        return None


class KvBudgetAdmission:
    """Workers admit each step by KV budget; a new trace goes to its family's home, else to the most room.

    Room is what a worker would admit a new trace into (its free budget less its growth reserve); among equals,
    the fewest steps already waiting there. `pending` holds tokens this router placed on each worker since it
    last read the workers' stats, so a burst of new traces spreads instead of all landing on the worker that
    advertised the most room.
    """

    enabled = True

    def place(self, candidates: list[WorkerEntry], home: str | None, pending: dict[str, int]) -> WorkerEntry | None:
        if not candidates:
            return None
        at_home = next((w for w in candidates if w.worker_id == home), None)
        if at_home is not None:
            return at_home
        return min(
            candidates,
            key=lambda w: (
                pending.get(w.worker_id, 0) - w.stats.admission_new_trace_room_tokens,
                w.stats.admission_waiting,
                w.worker_id,
            ),
        )


ADMISSION: dict[str, type] = {"none": NoAdmission, "kv_budget": KvBudgetAdmission}


def make_admission(name: str) -> NoAdmission | KvBudgetAdmission:
    try:
        return ADMISSION[name]()
    except KeyError:
        raise ValueError(f"unknown admission strategy {name!r}; choose one of {sorted(ADMISSION)}") from None
