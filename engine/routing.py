"""Routing policies: small strategy classes that pick one worker out of the live candidates.

A job names its policy (`scheduling.routing`, typed `RoutingPolicyName`), so this module's imports stay light: a
job's schema imports it.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import TYPE_CHECKING, Literal, Protocol

if TYPE_CHECKING:
    from pronk.engine.registry import WorkerEntry
    from pronk.engine.worker_protocol import StepRequest

RoutingPolicyName = Literal["least_loaded", "round_robin", "trace_affinity"]


class RoutingPolicy(Protocol):
    def choose(
        self, candidates: list[WorkerEntry], in_flight: Mapping[str, int], request: StepRequest
    ) -> WorkerEntry: ...


def load_of(worker: WorkerEntry, in_flight: Mapping[str, int]) -> int:
    """Steps this router has in flight on the worker, plus what the worker says it has queued."""
    return in_flight.get(worker.worker_id, 0) + worker.stats.waiting


class LeastLoaded:
    """The worker with the fewest steps in flight; ties go to the lower worker id."""

    def choose(self, candidates, in_flight, request):
        return min(candidates, key=lambda w: (load_of(w, in_flight), w.worker_id))


class RoundRobin:
    """Each worker in turn, blind to load (the baseline a user would get from a plain load balancer)."""

    def __init__(self) -> None:
        self._counter = itertools.count()

    def choose(self, candidates, in_flight, request):
        ordered = sorted(candidates, key=lambda w: w.worker_id)
        return ordered[next(self._counter) % len(ordered)]


class TraceAffinity:
    """Steps of a trace (and its fan-out children, via `affinity_key`) go to the worker holding its prefix.

    The first step of a family goes to the least-loaded roomy worker and the family sticks there,
    unless that worker is busier than the least-loaded one by more than `slack` steps, or its KV
    cache is full while the best alternative has at least `kv_margin` more room; then the family
    moves (its prefix is recomputed once on the new worker). Fullness is compared between workers:
    under memory pressure every cache reports nearly full, and moving a trace then only throws its
    prefix away. A home with a KV host tier is never too full to keep its family: its engine copied
    the prefix to host memory, so staying costs a wait for room and a load, where a move recomputes
    the whole prefix. Dead workers never reach `choose`: the router passes live candidates only.
    """

    def __init__(
        self, slack: int = 8, full_kv_usage: float = 0.97, kv_margin: float = 0.15, max_families: int = 100_000
    ) -> None:
        self.slack = slack
        self.full_kv_usage = full_kv_usage
        self.kv_margin = kv_margin
        self.max_families = max_families
        self.homes: dict[str, str] = {}

    def _crowded(self, home: WorkerEntry, best: WorkerEntry) -> bool:
        if home.stats.host_tier is not None:
            return False
        usage = home.stats.kv_cache_usage
        return usage >= self.full_kv_usage and best.stats.kv_cache_usage <= usage - self.kv_margin

    def choose(self, candidates, in_flight, request):
        key = request.affinity_key or request.trace_id
        roomy = [w for w in candidates if w.stats.kv_cache_usage < self.full_kv_usage] or candidates
        best = min(roomy, key=lambda w: (load_of(w, in_flight), w.worker_id))
        if key is None:
            return best
        home = next((w for w in candidates if w.worker_id == self.homes.get(key)), None)
        if (
            home is not None
            and load_of(home, in_flight) <= load_of(best, in_flight) + self.slack
            and not self._crowded(home, best)
        ):
            return home
        if len(self.homes) >= self.max_families:
            self.homes.pop(next(iter(self.homes)))
        self.homes[key] = best.worker_id
        return best


POLICIES: dict[str, type] = {"least_loaded": LeastLoaded, "round_robin": RoundRobin, "trace_affinity": TraceAffinity}
"""Each `RoutingPolicyName`'s class (tests/engine/test_trace_routing.py keeps the two the same)."""


def make_policy(name: str) -> RoutingPolicy:
    try:
        return POLICIES[name]()
    except KeyError:
        raise ValueError(f"unknown routing policy {name!r}; choose one of {sorted(POLICIES)}") from None
