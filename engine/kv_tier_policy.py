"""Eviction on the KV host tier by trace state rather than plain recency (`TraceAwareCachePolicy`).

vLLM's offloading manager asks its cache policy which host chunks to drop when a store needs room; its LRU drops the
least recently used. In an agent fleet the worker knows more: a trace that ended will never read its blocks again,
and a trace in a tool gap will read them when its tool returns, which its step's pin TTL estimates (the harness
sizes the TTL from the measured gaps; with the tier the TTL pins nothing on the device, `pronk.engine.kv_retention`).
So the policy drops, in order:

1. chunks only finished traces used (the worker's `/release` of a trace reaches `trace_finished`);
2. chunks no trace is known to have used (requests without trace hints), least recently used first;
3. chunks of live traces, the one whose next step is expected last first (Belady's rule on the expected gaps),
   then least recently used.

A trace overdue by more than its own expected gap (its tool hangs, or it ended and no `/release` came, as when the
harness runs with neither pins nor admission) no longer counts as live: its chunks rank with those of no known trace
(2.), by recency. Without that, the oldest expected step would rank as needed soonest, and the tier would keep
abandoned traces ahead of every live one.

A chunk shared by several traces (a common system prompt, a parent's prefix under its fan-out) counts as live while
any of them is. The trace hints reach the policy in the request's `kv_transfer_params`
(`pronk.engine.trace_hints`), the only per-request data vLLM hands a cache policy. vLLM builds the policy
by name in the engine core process (`cache_policy_module_path`); the scheduler there tells it about finished traces
through `trace_finished`, so one engine per process is assumed, as vLLM's engine core process is.

Written against vllm 0.32's `LRUCachePolicy`, whose bookkeeping (`chunks`, `_ranks`, `_evictable`) it extends;
`pronk.engine.kv_tier.host_tier_config` selects it only on that release.
"""

from __future__ import annotations

import heapq
import time
import weakref
from collections import deque
from collections.abc import Sequence

from vllm.v1.kv_offload.base import OffloadKey, ReqContext
from vllm.v1.kv_offload.cpu.policies.base import ChunkStatus
from vllm.v1.kv_offload.cpu.policies.lru import LRUCachePolicy

from pronk.engine.trace_hints import read_hints

RECENTLY_FINISHED = 4096
"""Finished traces remembered, so a request's report arriving after its trace's release cannot revive the trace."""

_POLICIES: weakref.WeakSet[TraceAwareCachePolicy] = weakref.WeakSet()


def trace_finished(trace_id: str) -> None:
    """The trace ended (the harness released it): its chunks go first when the host tier needs room."""
    for policy in list(_POLICIES):
        policy.trace_finished(trace_id)


class TraceAwareCachePolicy(LRUCachePolicy):
    """vLLM's LRU policy whose eviction order puts finished traces first and live traces by expected next use."""

    def __init__(self, cache_capacity: int):
        super().__init__(cache_capacity)
        self.traces_of: dict[OffloadKey, set[str]] = {}
        """Live traces that used each chunk; an empty set: only finished traces did."""
        self.keys_of: dict[str, set[OffloadKey]] = {}
        self.next_use: dict[str, tuple[float, float]] = {}
        """When each live trace's next step is expected (its last step's end plus its pin TTL, monotonic), and until
        when it counts as live (as late again)."""
        self.finished: deque[str] = deque(maxlen=RECENTLY_FINISHED)
        _POLICIES.add(self)

    def on_request_finished(
        self,
        key_groups: Sequence[Sequence[OffloadKey]],
        insertion_only_keys: set[OffloadKey],
        reused_keys: set[OffloadKey],
        req_context: ReqContext,
    ) -> None:
        super().on_request_finished(key_groups, insertion_only_keys, reused_keys, req_context)
        trace_id, kv_pin_ttl_s = read_hints(req_context.kv_transfer_params or {})
        if trace_id is None or trace_id in self.finished:
            return
        now = time.monotonic()
        self.next_use[trace_id] = (now + kv_pin_ttl_s, now + 2 * kv_pin_ttl_s)
        keys = self.keys_of.setdefault(trace_id, set())
        for group in key_groups:
            for key in group:
                if key in self.chunks:
                    keys.add(key)
                    self.traces_of.setdefault(key, set()).add(trace_id)

    def trace_finished(self, trace_id: str) -> None:
        self.finished.append(trace_id)
        self.next_use.pop(trace_id, None)
        for key in self.keys_of.pop(trace_id, ()):
            traces = self.traces_of.get(key)
            if traces is not None:
                traces.discard(trace_id)

    def eviction_order(self, key: OffloadKey, now: float) -> tuple[int, float, int]:
        """Smallest first: (class, minus the expected next use, recency rank), at monotonic time `now`."""
        traces = self.traces_of.get(key)
        rank = self._ranks[key]
        if traces is None:
            return 1, 0.0, rank
        if not traces:
            return 0, 0.0, rank
        expected = [self.next_use.get(t, (0.0, 0.0)) for t in traces]
        live = [use for use, live_until in expected if live_until >= now]
        if not live:
            return 1, 0.0, rank
        return 2, -min(live), rank

    def evict(self, n: int, protected: set[OffloadKey]) -> list[tuple[OffloadKey, ChunkStatus]] | None:
        """`n` chunks in `eviction_order`, or None (and nothing changed) when fewer than `n` can go. A linear pass
        over the evictable chunks: a host tier holds thousands of chunks, and vLLM asks once per store batch."""
        if n == 0:
            return []
        candidates = [key for key in self._evictable if key not in protected]
        if len(candidates) < n:
            return None
        evicted = []
        now = time.monotonic()
        for key in heapq.nsmallest(n, candidates, key=lambda k: self.eviction_order(k, now)):
            self._evictable.remove(key)
            del self._ranks[key]
            evicted.append((key, self.chunks.pop(key)))
            self._forget(key)
        self._maybe_compact_heap()
        return evicted

    def remove(self, key: OffloadKey) -> None:
        super().remove(key)
        self._forget(key)

    def clear(self) -> None:
        super().clear()
        self.traces_of.clear()
        self.keys_of.clear()
        self.next_use.clear()

    def _forget(self, key: OffloadKey) -> None:
        for trace_id in self.traces_of.pop(key, ()):
            keys = self.keys_of.get(trace_id)
            if keys is not None:
                keys.discard(key)
