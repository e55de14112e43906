"""KV retention across tool-call gaps: a vLLM scheduler that pins a trace's prefix blocks for a TTL.

vLLM frees a finished request's KV blocks into an LRU free queue, so while a trace waits on a tool
other traffic can evict its prefix and the next step recomputes it. `PinningScheduler` (passed to
vLLM as `scheduler_cls`) takes an extra reference on the finished request's full, cached blocks when
the step asked for a pin (`SamplingParams.extra_args`, see `pronk.engine.trace_hints`), which keeps them out
of the free queue. The pin is released when the trace's next step has been scheduled (it now holds
the blocks itself), when the trace ends (the harness calls the worker's `/release`, which reaches
the scheduler as an internal abort of `release_request_id(trace)`), when admission pauses the trace
(`unpin_request_id`: the trace lives on), when the TTL passes, when the
pinned total would pass the pin share of the cache (`pin_settings`, in vLLM's `additional_config`; a full
table refuses new pins), or before a prefix-cache reset (weight swap).

With a KV connector (the host tier) no pin is taken: the connector has stored the trace's blocks on the host, so its
next step loads them back at the cost of a copy, and a pin would only hold device room that running steps need (in
the benchmark's rounds with the tier, pins lost throughput in 4 of 5). The TTL then only tells the tier's eviction
when the trace is expected back (`pronk.engine.kv_tier_policy`). The scheduler also tells each finished step how many of
its prompt tokens were loaded through the connector (`HOST_TIER_TOKENS_KEY`).

The vLLM classes are built on first attribute access (`__getattr__`), so importing this module for
its request ids and settings stays free of vLLM.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from pronk.engine.trace_hints import read_hints

RELEASE_PREFIX = "pronk-release:"
UNPIN_PREFIX = "pronk-unpin:"
HOST_TIER_TOKENS_KEY = "pronk_host_tier_tokens"
"""Where a finished request's `kv_transfer_params` carry the prompt tokens the KV connector loaded for it."""
MAX_FRACTION_KEY = "pronk_kv_pin_max_fraction"


def release_request_id(trace_id: str) -> str:
    """The request id whose (internal) abort tells `PinningScheduler` the trace ended."""
    return f"{RELEASE_PREFIX}{trace_id}"


def unpin_request_id(trace_id: str) -> str:
    """The request id whose (internal) abort tells `PinningScheduler` to drop the trace's pin: admission paused the
    trace, which lives on (on a host tier, its blocks stay ranked as a live trace's)."""
    return f"{UNPIN_PREFIX}{trace_id}"


def control_message(request_id: str) -> tuple[str, str] | None:
    """(`trace_end` or `paused`, trace id) for the ids `release_request_id` and `unpin_request_id` make; None for a
    request's own id."""
    for prefix, why in ((RELEASE_PREFIX, "trace_end"), (UNPIN_PREFIX, "paused")):
        if request_id.startswith(prefix):
            return why, request_id.removeprefix(prefix)
    return None


def pin_settings(max_fraction: float) -> dict[str, Any]:
    """What `PinningScheduler` reads from vLLM's `additional_config` (the engine core process gets no other input):
    the most of the cache pins may hold."""
    return {MAX_FRACTION_KEY: float(max_fraction)}


def scheduler_class(device: str) -> str:
    """The `scheduler_cls` path for a worker on `device` (GPU builds default to async scheduling)."""
    return f"pronk.engine.kv_retention.{'AsyncPinningScheduler' if device == 'cuda' else 'PinningScheduler'}"


def _hints(request: Any) -> tuple[str | None, float]:
    return read_hints(getattr(request.sampling_params, "extra_args", None) or {})


@dataclass(slots=True)
class Pin:
    blocks: list[Any]
    expires_at: float
    pinned_at: float = field(default_factory=time.monotonic)


class PinTable:
    """Pins by trace id, with a block budget; `release` hands blocks back to a `free` callback."""

    def __init__(self, budget_blocks: int, free):
        self.budget_blocks = budget_blocks
        self.free = free
        self.pins: dict[str, Pin] = {}
        self.pinned_blocks = 0
        self.released = {"next_step": 0, "trace_end": 0, "paused": 0, "ttl": 0, "refused": 0, "reset": 0}

    def release(self, trace_id: str, why: str) -> None:
        pin = self.pins.pop(trace_id, None)
        if pin is None:
            return
        self.pinned_blocks -= len(pin.blocks)
        self.released[why] += 1
        self.free(pin.blocks)

    def fits(self, trace_id: str, count: int) -> bool:
        """Whether `count` more blocks fit the budget once this trace's own pin is replaced.

        A full table refuses new pins rather than evicting old ones: a trace pinned earlier has
        waited longer, so its next step is likelier to come first (and a stable pinned set gets
        full hits, where churning pins would help nobody).
        """
        held = len(self.pins[trace_id].blocks) if trace_id in self.pins else 0
        return self.pinned_blocks - held + count <= self.budget_blocks

    def add(self, trace_id: str, blocks: list[Any], kv_pin_ttl_s: float, now: float) -> None:
        """Pin `blocks` (already referenced by the caller's `touch`); check `fits` first."""
        self.release(trace_id, "next_step")
        self.pins[trace_id] = Pin(blocks, now + kv_pin_ttl_s)
        self.pinned_blocks += len(blocks)

    def expire(self, now: float) -> None:
        for trace_id in [t for t, pin in self.pins.items() if pin.expires_at <= now]:
            self.release(trace_id, "ttl")

    def release_all(self, why: str) -> None:
        for trace_id in list(self.pins):
            self.release(trace_id, why)


def _retention_mixin(base: type) -> type:
    from vllm.v1.request import RequestStatus

    pinnable = {RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH_CAPPED}

    class Retention(base):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            pool = self.kv_cache_manager.block_pool
            extra = self.vllm_config.additional_config
            fraction = float(extra.get(MAX_FRACTION_KEY, 0.5)) if isinstance(extra, dict) else 0.5
            self.pin_table = PinTable(
                int(pool.num_gpu_blocks * fraction), lambda blocks: pool.free_blocks(reversed(blocks))
            )
            self.awaiting_release: dict[str, Any] = {}
            self.loaded_tokens: dict[str, int] = {}

        def add_request(self, request) -> None:
            trace_id, _ = _hints(request)
            if trace_id and trace_id in self.pin_table.pins:
                self.awaiting_release[trace_id] = request
            super().add_request(request)

        def schedule(self, *args, **kwargs):
            self.pin_table.expire(time.monotonic())
            output = super().schedule(*args, **kwargs)
            for trace_id, request in list(self.awaiting_release.items()):
                if request.status != RequestStatus.WAITING:
                    del self.awaiting_release[trace_id]
                    self.pin_table.release(trace_id, "next_step")
            if self.connector is not None:
                self._note_loaded_tokens()
            return output

        def _note_loaded_tokens(self) -> None:
            """Keep each request's tokens loaded through the connector (the host tier) until it finishes: vLLM
            counts them in the request's prefill stats when it first schedules it, and hands those stats on (and
            drops them) with its first output."""
            for request_id, request in self.requests.items():
                stats = request.prefill_stats
                if stats is not None and stats.num_external_cached_tokens > 0:
                    self.loaded_tokens[request_id] = stats.num_external_cached_tokens

        def _connector_finished(self, request):
            """vLLM's hook for what a finished request tells its caller about KV transfer: the tokens it loaded."""
            delay_free, params = super()._connector_finished(request)
            loaded = self.loaded_tokens.pop(request.request_id, 0)
            if loaded:
                params = {**(params or {}), HOST_TIER_TOKENS_KEY: loaded}
            return delay_free, params

        def _free_request(self, request, delay_free_blocks: bool = False):
            trace_id, kv_pin_ttl_s = _hints(request)
            pin = self.connector is None and kv_pin_ttl_s > 0 and not delay_free_blocks
            if trace_id and pin and request.status in pinnable:
                self._pin(trace_id, request, kv_pin_ttl_s)
            return super()._free_request(request, delay_free_blocks)

        def _pin(self, trace_id: str, request, kv_pin_ttl_s: float) -> None:
            groups = self.kv_cache_manager.get_blocks(request.request_id).blocks
            blocks = [b for group in groups for b in group if b.block_hash is not None and not b.is_null]
            if not blocks:
                return
            if not self.pin_table.fits(trace_id, len(blocks)):
                self.pin_table.release(trace_id, "refused")
                return
            self.kv_cache_manager.block_pool.touch(blocks)
            self.pin_table.add(trace_id, blocks, kv_pin_ttl_s, time.monotonic())

        def finish_requests(self, request_ids, finished_status):
            if request_ids is not None:
                ids = [request_ids] if isinstance(request_ids, str) else list(request_ids)
                messages = [(i, control_message(i)) for i in ids]
                for message in (m for _, m in messages if m is not None):
                    why, trace_id = message
                    self.pin_table.release(trace_id, why)
                    if why == "trace_end" and self.connector is not None:
                        from pronk.engine.kv_tier_policy import trace_finished

                        trace_finished(trace_id)
                request_ids = [i for i, message in messages if message is None]
            return super().finish_requests(request_ids, finished_status)

        def reset_prefix_cache(self, *args, **kwargs):
            self.pin_table.release_all("reset")
            self.awaiting_release.clear()
            return super().reset_prefix_cache(*args, **kwargs)

    return Retention


def __getattr__(name: str) -> type:
    if name == "PinningScheduler":
        from vllm.v1.core.sched.scheduler import Scheduler

        cls = _retention_mixin(Scheduler)
    elif name == "AsyncPinningScheduler":
        from vllm.v1.core.sched.async_scheduler import AsyncScheduler

        cls = _retention_mixin(AsyncScheduler)
    else:
        raise AttributeError(name)
    cls.__name__ = cls.__qualname__ = name
    globals()[name] = cls
    return cls
