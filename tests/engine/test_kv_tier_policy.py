"""The host tier's eviction order (`pronk.engine.kv_tier_policy`): finished traces first, then chunks of no known trace,
then live traces by their expected next step (latest first), recency last."""

from __future__ import annotations

from vllm.v1.kv_offload.base import ReqContext
from vllm.v1.kv_offload.cpu.policies.base import ChunkStatus

from pronk.engine.kv_tier_policy import TraceAwareCachePolicy, trace_finished
from pronk.engine.trace_hints import retention_hints


def ready_chunk(chunk_id: int) -> ChunkStatus:
    chunk = ChunkStatus(chunk_id)
    chunk.ref_cnt = 0  # stored and not being read: evictable
    return chunk


def policy_with(keys: list[bytes]) -> TraceAwareCachePolicy:
    policy = TraceAwareCachePolicy(cache_capacity=len(keys))
    for i, key in enumerate(keys):
        policy.insert(key, ready_chunk(i))
    return policy


def finish_request(policy: TraceAwareCachePolicy, keys: list[bytes], trace_id: str | None, kv_pin_ttl_s: float) -> None:
    hints = retention_hints(trace_id, kv_pin_ttl_s)["kv_transfer_params"] if trace_id else None
    policy.on_request_finished([keys], set(), set(keys), ReqContext(req_id=f"r-{trace_id}", kv_transfer_params=hints))


def evicted(policy: TraceAwareCachePolicy, n: int, protected: set[bytes] | None = None) -> list[bytes]:
    chosen = policy.evict(n, protected or set())
    assert chosen is not None
    return [key for key, _ in chosen]


def test_finished_traces_go_first_then_unknown_chunks_then_the_trace_needed_last():
    policy = policy_with([b"soon", b"late", b"done", b"anon", b"shared"])
    finish_request(policy, [b"shared", b"soon"], "short-gap", 1.0)
    finish_request(policy, [b"shared", b"late"], "long-gap", 60.0)
    finish_request(policy, [b"done"], "ended", 1.0)
    finish_request(policy, [b"anon"], None, 0.0)
    trace_finished("ended")

    assert evicted(policy, 1) == [b"done"]
    assert evicted(policy, 1) == [b"anon"]
    assert evicted(policy, 1) == [b"late"]  # its trace's tool returns last
    assert evicted(policy, 1) == [b"soon"]  # "shared" is live through both traces, and needed as soon as "soon"
    assert evicted(policy, 1) == [b"shared"]
    assert policy.evict(1, set()) is None and policy.chunks == {}


def test_a_shared_chunk_stays_live_until_every_trace_using_it_ended():
    policy = policy_with([b"prefix", b"a-own"])
    finish_request(policy, [b"prefix", b"a-own"], "a", 5.0)
    finish_request(policy, [b"prefix"], "b", 5.0)
    trace_finished("a")
    assert evicted(policy, 1) == [b"a-own"]
    trace_finished("b")
    assert policy.traces_of[b"prefix"] == set() and policy.eviction_order(b"prefix", 0.0)[0] == 0


def test_a_trace_overdue_by_more_than_its_gap_ranks_with_unknown_chunks_by_recency(monkeypatch):
    import pronk.engine.kv_tier_policy as tier_policy

    clock = [100.0]
    monkeypatch.setattr(tier_policy.time, "monotonic", lambda: clock[0])
    policy = policy_with([b"abandoned", b"anon", b"live"])
    finish_request(policy, [b"abandoned"], "never-released", 10.0)  # expected back at 110, live until 120
    finish_request(policy, [b"anon"], None, 0.0)
    clock[0] = 125.0
    finish_request(policy, [b"live"], "in-a-gap", 60.0)
    assert policy.eviction_order(b"abandoned", 115.0)[0] == 2  # late, but not by more than its gap
    assert evicted(policy, 2) == [b"abandoned", b"anon"]  # least recently used of the two first
    assert evicted(policy, 1) == [b"live"]


def test_eviction_is_all_or_nothing_and_skips_protected_chunks():
    policy = policy_with([b"x", b"y"])
    assert policy.evict(2, {b"y"}) is None and set(policy.chunks) == {b"x", b"y"}
    assert evicted(policy, 1, {b"x"}) == [b"y"]


def test_a_report_arriving_after_its_trace_ended_does_not_revive_it():
    policy = policy_with([b"k"])
    trace_finished("t")
    finish_request(policy, [b"k"], "t", 30.0)
    assert "t" not in policy.next_use and b"k" not in policy.traces_of


def test_vllm_finds_the_policy_the_tier_config_names():
    from vllm.v1.kv_offload.cpu.policies.factory import CachePolicyFactory

    from pronk.engine.kv_tier import VLLM_CPU_VERSION, host_tier_config

    extra = host_tier_config(1 << 30, "cpu", VLLM_CPU_VERSION)["kv_connector_extra_config"]
    found = CachePolicyFactory.get_cache_policy_cls(extra["eviction_policy"], extra["cache_policy_module_path"])
    assert found is TraceAwareCachePolicy


def test_admission_pausing_a_trace_drops_its_pin_but_only_its_end_tells_the_host_tier(monkeypatch):
    import pronk.engine.kv_tier_policy as kv_tier_policy
    from pronk.engine.kv_retention import PinTable, _retention_mixin, release_request_id, unpin_request_id

    class Engine:
        def finish_requests(self, request_ids, finished_status):
            self.aborted = request_ids

    scheduler = object.__new__(_retention_mixin(Engine))  # the scheduler's abort path alone, no engine behind it
    scheduler.pin_table, scheduler.connector = PinTable(8, lambda blocks: None), object()
    scheduler.pin_table.add("paused", [1, 2], kv_pin_ttl_s=60, now=0)
    ended: list[str] = []
    monkeypatch.setattr(kv_tier_policy, "trace_finished", ended.append)
    scheduler.finish_requests([unpin_request_id("paused"), release_request_id("done"), "r-1"], None)
    assert scheduler.pin_table.pins == {} and scheduler.pin_table.released["paused"] == 1
    assert ended == ["done"] and scheduler.aborted == ["r-1"]  # the request's own id still reaches vLLM
