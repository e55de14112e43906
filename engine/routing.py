"""Routing policies: small strategy classes that pick one worker out of the live candidates."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Protocol

from engine.protocol import StepRequest
from engine.registry import WorkerEntry


class RoutingPolicy(Protocol):
    def choose(self, candidates: list[WorkerEntry], in_flight: Mapping[str, int], request: StepRequest) -> WorkerEntry: ...


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


POLICIES: dict[str, type] = {"least_loaded": LeastLoaded, "round_robin": RoundRobin}


def make_policy(name: str) -> RoutingPolicy:
    try:
        return POLICIES[name]()
    except KeyError:
        raise ValueError(f"unknown routing policy {name!r}; choose one of {sorted(POLICIES)}") from None
