"""Trace-affinity routing and the KV pin table, without a server."""

from __future__ import annotations

import time
from typing import get_args

from pronk.engine.kv_retention import PinTable, scheduler_class
from pronk.engine.registry import WorkerEntry
from pronk.engine.routing import POLICIES, RoutingPolicyName, make_policy
from pronk.engine.trace_hints import retention_hints
from pronk.engine.worker_protocol import HostTierStats, StepRequest, WorkerStats


def worker(worker_id: str, waiting: int = 0, kv: float = 0.0, host_tier: bool = False) -> WorkerEntry:
    stats = WorkerStats(
        worker_id=worker_id,
        job_id="job-0000beef",
        model_version="m/1",
        waiting=waiting,
        kv_cache_usage=kv,
        host_tier=HostTierStats(capacity_bytes=1 << 29) if host_tier else None,
    )
    return WorkerEntry(
        worker_id=worker_id,
        job_id="job-0000beef",
        url=f"http://{worker_id}",
        pid=1,
        started_at=0,
        heartbeat_at=time.time(),
        stats=stats,
    )


def step(trace_id: str, key: str | None = None) -> StepRequest:
    return StepRequest(request_id="s", prompt_token_ids=[1], trace_id=trace_id, affinity_key=key)


def test_a_trace_and_its_children_stick_to_one_worker_while_load_allows():
    policy = make_policy("trace_affinity")
    workers = [worker("w0"), worker("w1")]
    first = policy.choose(workers, {}, step("t1")).worker_id
    other = policy.choose(workers, {first: 1}, step("t2")).worker_id
    assert other != first
    assert policy.choose(workers, {first: 3}, step("t1")).worker_id == first
    assert policy.choose(workers, {first: 3}, step("t1.0.0", key="t1")).worker_id == first


def test_a_busy_full_or_missing_home_moves_the_trace():
    policy = make_policy("trace_affinity")
    workers = [worker("w0"), worker("w1")]
    home = policy.choose(workers, {}, step("t")).worker_id
    away = "w1" if home == "w0" else "w0"
    assert policy.choose(workers, {home: 20}, step("t")).worker_id == away
    assert policy.choose(workers, {}, step("t")).worker_id == away
    full = [worker(away, kv=0.99), worker(home)]
    assert policy.choose(full, {}, step("t")).worker_id == home
    assert policy.choose([worker(away)], {}, step("t")).worker_id == away


def test_a_trace_stays_home_when_every_cache_is_nearly_full():
    policy = make_policy("trace_affinity")
    home = policy.choose([worker("w0"), worker("w1")], {}, step("t")).worker_id
    away = "w1" if home == "w0" else "w0"
    pressed = [worker(home, kv=0.99), worker(away, kv=0.95)]
    assert policy.choose(pressed, {}, step("t")).worker_id == home


def test_a_full_home_with_a_host_tier_keeps_its_trace_but_a_busy_one_does_not():
    policy = make_policy("trace_affinity")
    home = policy.choose([worker("w0"), worker("w1")], {}, step("t")).worker_id
    away = "w1" if home == "w0" else "w0"
    full_home = [worker(home, kv=0.99, host_tier=True), worker(away, host_tier=True)]
    assert policy.choose(full_home, {}, step("t")).worker_id == home  # the prefix waits on the home's host tier
    assert policy.choose(full_home, {home: 20}, step("t")).worker_id == away


def test_all_policies_are_registered():
    assert {"round_robin", "least_loaded", "trace_affinity"} == set(POLICIES) == set(get_args(RoutingPolicyName))


def test_pin_table_budget_ttl_and_release():
    freed: list[list[int]] = []
    table = PinTable(budget_blocks=10, free=freed.append)
    assert table.fits("a", 6)
    table.add("a", [1] * 6, kv_pin_ttl_s=5, now=0)
    assert not table.fits("b", 5) and table.fits("b", 4) and table.fits("a", 10)
    table.add("b", [2] * 4, kv_pin_ttl_s=1, now=0)
    table.expire(now=2)
    assert "b" not in table.pins and table.released["ttl"] == 1 and freed == [[2] * 4]
    table.add("a", [3] * 7, kv_pin_ttl_s=5, now=2)
    assert table.pinned_blocks == 7 and freed[-1] == [1] * 6 and table.released["next_step"] == 1
    table.release_all("reset")
    assert table.pins == {} and table.pinned_blocks == 0 and table.released["reset"] == 1


def test_retention_hints_and_scheduler_paths():
    hints = {"trace_id": "t", "kv_pin_ttl_s": 3.0}
    assert retention_hints("t", 3) == {**hints, "kv_transfer_params": hints}  # the host tier's policy reads these
    assert scheduler_class("cpu") == "pronk.engine.kv_retention.PinningScheduler"
    assert scheduler_class("cuda") == "pronk.engine.kv_retention.AsyncPinningScheduler"
