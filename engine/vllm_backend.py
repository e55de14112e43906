"""A vLLM `AsyncLLM` engine behind pronk's step protocol: generate, stats, shutdown."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from pronk.engine.admission import KvBudget
from pronk.engine.engine_error import EngineError
from pronk.engine.kv_retention import HOST_TIER_TOKENS_KEY, release_request_id, unpin_request_id
from pronk.engine.trace_hints import retention_hints
from pronk.engine.worker_protocol import HostTierStats, SamplingSpec, StepRequest, StepResult, WorkerStats

log = logging.getLogger(__name__)


@dataclass(slots=True)
class SchedulerSnapshot:
    """The newest scheduler numbers the engine reported, plus cumulative prefix-cache counts."""

    running: int = 0
    waiting: int = 0
    kv_cache_usage: float = 0.0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    preemptions: int = 0
    host_tier: HostTierStats | None = None


TIER_TRANSFERS = {
    "vllm:kv_offload_store_size_count": "stores",
    "vllm:kv_offload_store_bytes": "stored_bytes",
    "vllm:kv_offload_store_time": "store_seconds",
    "vllm:kv_offload_load_size_count": "loads",
    "vllm:kv_offload_load_bytes": "loaded_bytes",
    "vllm:kv_offload_load_time": "load_seconds",
}
"""vLLM's OffloadingConnector transfer counters (per report) -> the `HostTierStats` totals they add to."""


def _count_tier(tier: HostTierStats, scheduler_stats: Any, iteration_stats: Any) -> None:
    """Add one engine report's KV host tier numbers to `tier`."""
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import OffloadingConnectorStats

    if iteration_stats is not None:
        tier.loaded_tokens += iteration_stats.prompt_token_stats.external_kv_transfer
    if scheduler_stats is None:
        return
    lookups = scheduler_stats.connector_prefix_cache_stats
    if lookups is not None:
        tier.lookup_tokens += lookups.queries
        tier.hit_tokens += lookups.hits
    if scheduler_stats.kv_connector_stats:
        transfers = OffloadingConnectorStats(data=scheduler_stats.kv_connector_stats).reduce()
        for name, total in TIER_TRANSFERS.items():
            setattr(tier, total, getattr(tier, total) + transfers.get(name, 0))


def _kv_bytes_per_token(vllm_config: Any) -> int:
    """Bytes of K and V one token takes in every layer of the engine's cache (plain attention layers)."""
    model, parallel = vllm_config.model_config, vllm_config.parallel_config
    cache_dtype = vllm_config.cache_config.cache_dtype
    itemsize = model.dtype.itemsize if cache_dtype == "auto" else 1
    return 2 * model.get_num_layers(parallel) * model.get_num_kv_heads(parallel) * model.get_head_size() * itemsize


def _stat_logger_factory(snapshot: SchedulerSnapshot):
    """A vLLM stat logger class that copies each scheduler report into `snapshot`."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class SnapshotLogger(StatLoggerBase):
        def __init__(self, vllm_config: Any, engine_index: int = 0):
            pass

        def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0):
            if snapshot.host_tier is not None:
                _count_tier(snapshot.host_tier, scheduler_stats, iteration_stats)
            if iteration_stats is not None:
                snapshot.preemptions += iteration_stats.num_preempted_reqs
            if scheduler_stats is None:
                return
            snapshot.running = scheduler_stats.num_running_reqs
            snapshot.waiting = scheduler_stats.num_waiting_reqs
            snapshot.kv_cache_usage = scheduler_stats.kv_cache_usage
            cache = scheduler_stats.prefix_cache_stats
            if cache.reset:
                snapshot.prefix_cache_queries = snapshot.prefix_cache_hits = 0
            snapshot.prefix_cache_queries += cache.queries
            snapshot.prefix_cache_hits += cache.hits

        def log_engine_initialized(self):
            pass

    return SnapshotLogger


def _no_prometheus_logger():
    """A stand-in for vLLM's Prometheus stat logger, which vLLM adds to every engine unless it is given one of its
    own: a worker serves no /metrics (its /stats reads `SchedulerSnapshot`), and recording every engine iteration's
    counters and histograms took a tenth of a worker's front-end CPU."""
    from vllm.v1.metrics.loggers import PrometheusStatLogger

    class NoPrometheus(PrometheusStatLogger):
        def __init__(self, vllm_config: Any, engine_indexes: list[int] | None = None):
            pass

        def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0):
            pass

        def record_admission_rejection(self, reason: str) -> None:
            pass

        def record_sleep_state(self, sleep: int = 0, level: int = 0):
            pass

        def log_engine_initialized(self):
            pass

    return NoPrometheus


class StepInvalid(EngineError, ValueError):
    """vLLM refused the step itself (prompt too long, bad sampling parameters): the worker answers 400."""


def _client_errors() -> tuple[type[BaseException], ...]:
    """The exceptions by which vLLM says a request is bad: ValueError and TypeError, and its own client errors."""
    from vllm.exceptions import VLLMClientError

    return (ValueError, TypeError, VLLMClientError)


class MixedWeightVersions(EngineError, RuntimeError):
    """A generation whose tokens came from two weight versions; never returned as a result."""


@dataclass(slots=True)
class WeightSwap:
    """One in-place weight swap: wall-clock times of pause request, paused (drained) and resumed."""

    from_version: str
    to_version: str
    pause_requested_at: float
    paused_at: float
    resumed_at: float


@dataclass
class VllmBackend:
    """Owns one `AsyncLLM`; `model_version` names the weights it serves.

    `kv_budget_headroom` and `kv_budget_growth_steps` size the admission budget (`pronk.engine.admission.KvBudget`).
    """

    model_path: str
    model_version: str
    worker_id: str
    job_id: str
    engine_kwargs: dict[str, Any]
    kv_budget_headroom: float = 0.1
    kv_budget_growth_steps: float = 0.0
    snapshot: SchedulerSnapshot = field(default_factory=SchedulerSnapshot)
    in_flight: int = 0
    requests_served: int = 0
    leap_state: str = "ready"
    staged_version: str | None = None
    budget: KvBudget | None = None
    seeded_sampling: bool = True
    _engine: Any = None
    _tokenizer: Any = None
    _pin_drops: set[asyncio.Task] = field(default_factory=set)

    async def start(self) -> None:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        # A simulated engine's kwargs name their own `model` (an architecture config; `model_path` is then where the
        # tokenizer and the weight versions live: pronk.engine.sim_executor.SimSettings.engine_kwargs).
        args = AsyncEngineArgs(**{"model": self.model_path, "disable_log_stats": False, **self.engine_kwargs})
        if args.kv_transfer_config is not None:
            tier_bytes = int(args.kv_transfer_config.kv_connector_extra_config.get("cpu_bytes_to_use", 0))
            self.snapshot.host_tier = HostTierStats(capacity_bytes=tier_bytes)
        self._engine = AsyncLLM.from_engine_args(
            args, stat_loggers=[_stat_logger_factory(self.snapshot), _no_prometheus_logger()]
        )
        self._tokenizer = self._engine.get_tokenizer()
        await self._engine.update_weight_version(self.model_version)
        self.seeded_sampling = self._engine.vllm_config.device_config.device_type != "cpu"
        cache = self._engine.vllm_config.cache_config
        capacity = (cache.num_gpu_blocks or 0) * (cache.block_size or 0)
        if capacity <= 0:
            log.warning("%s: the engine did not report its KV cache size; steps run without admission", self.worker_id)
            return
        tier = self.snapshot.host_tier
        host_tokens = tier.capacity_bytes // _kv_bytes_per_token(self._engine.vllm_config) if tier else 0
        self.budget = KvBudget(
            capacity,
            self.kv_budget_headroom,
            self.kv_budget_growth_steps,
            on_pause=self._drop_pins,
            host_capacity_tokens=host_tokens,
        )
        log.info(
            "%s: KV cache holds %d tokens, admission budget %d, host tier %d tokens",
            self.worker_id,
            capacity,
            self.budget.limit,
            host_tokens,
        )

    @property
    def priority_scheduling(self) -> bool:
        return self.engine_kwargs.get("scheduling_policy") == "priority"

    def _drop_pins(self, trace_ids: list[str]) -> None:
        """Admission paused these gapped traces: their pinned prefix blocks go back to the cache (and on a host tier
        their blocks stay ranked as a live trace's: only `release` says a trace ended)."""
        task = asyncio.get_running_loop().create_task(self._abort_ids([unpin_request_id(t) for t in trace_ids]))
        self._pin_drops.add(task)
        task.add_done_callback(self._pin_drops.discard)

    def shutdown(self) -> None:
        if self._engine is not None:
            self._engine.shutdown()
            self._engine = None

    def _sampling_params(self, spec: SamplingSpec):
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

        structured = StructuredOutputsParams(json=spec.json_schema) if spec.json_schema else None
        # On CPU a seed is dropped (OpenAI's `seed` is best effort): vLLM's CPU sampler cannot rewind a seeded
        # generator after a partial (chunked) prefill, so the engine core dies ("CPU Generator does not use
        # offset") and takes every step on the worker with it. Greedy sampling draws nothing, so needs none.
        seed = spec.seed if self.seeded_sampling and spec.temperature > 0 else None
        return SamplingParams(
            max_tokens=spec.max_tokens,
            temperature=spec.temperature,
            top_p=spec.top_p,
            seed=seed,
            stop=spec.stop,
            ignore_eos=spec.ignore_eos,
            structured_outputs=structured,
            # A step's answer is its final output. vLLM's default hands the front end a cumulative output for every
            # token (a copy of the tokens so far, a wake of the step's coroutine), CPU taken from the engines' cores
            # on a machine where they share them; its own OpenAI server asks for the final one only too.
            output_kind=RequestOutputKind.FINAL_ONLY,
        )

    def prompt_token_ids(self, request: StepRequest) -> list[int]:
        if request.prompt_token_ids is not None:
            return request.prompt_token_ids
        messages = [{"role": m.role, "content": m.text()} for m in request.messages or []]
        text = self._tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return self._tokenizer.encode(text, add_special_tokens=False)

    def _check_length(self, prompt_ids: list[int]) -> None:
        limit = self._engine.model_config.max_model_len
        if len(prompt_ids) >= limit:
            raise StepInvalid(
                f"the prompt has {len(prompt_ids)} tokens; max_model_len is {limit}"
                " (prompt and at least one output token)"
            )

    async def generate(self, request: StepRequest) -> StepResult:
        """One step; with admission hints, first wait (bounded) for room in the KV budget. A request vLLM refuses
        raises `StepInvalid`, whatever vLLM's own exception type."""
        from vllm.inputs import tokens_input

        started = time.monotonic()
        bad_request = _client_errors()
        try:
            prompt_ids = self.prompt_token_ids(request)
            self._check_length(prompt_ids)
            params = self._sampling_params(request.sampling)
        except bad_request as exc:
            raise StepInvalid(f"{type(exc).__name__}: {exc}") from exc
        if request.trace_id:
            params.extra_args = retention_hints(request.trace_id, request.kv_pin_ttl_s)
        since = request.trace_started_at or time.time()
        trace_id = request.trace_id
        budget = self.budget if request.admission is not None and trace_id is not None else None
        if budget is not None and request.admission is not None and trace_id is not None:
            await budget.admit(
                trace_id,
                len(prompt_ids) + request.sampling.max_tokens,
                started=request.admission.started,
                since=request.admission.since or since,
                timeout_s=request.admission.wait_s,
            )
        # vLLM's priority queue runs the lowest number first: the trace's start time in ms, earlier first
        ordering = {"priority": int(since * 1000)} if self.priority_scheduling else {}
        self.in_flight += 1
        final = None
        try:
            # Rendered token input, as vLLM's own server sends it: a raw prompt would take a hop through vLLM's
            # tokenizer thread pool first, for nothing to tokenize.
            async for output in self._engine.generate(tokens_input(prompt_ids), params, request.request_id, **ordering):
                final = output
        except bad_request as exc:
            raise StepInvalid(f"{type(exc).__name__}: {exc}") from exc
        finally:
            self.in_flight -= 1
            if budget is not None and trace_id is not None:
                output_tokens = len(final.outputs[0].token_ids) if final is not None else 0
                budget.step_done(trace_id, len(prompt_ids) + output_tokens, request.kv_pin_ttl_s)
        if final is None:
            raise EngineError(f"{self.worker_id}: the engine ended request {request.request_id} without output")
        self.requests_served += 1
        completion = final.outputs[0]
        metrics = final.metrics
        queue_time = max(0.0, metrics.scheduled_ts - metrics.queued_ts) if metrics else 0.0
        return StepResult(
            request_id=request.request_id,
            text=completion.text,
            token_ids=list(completion.token_ids),
            prompt_tokens=len(final.prompt_token_ids or []),
            cached_tokens=final.num_cached_tokens or 0,
            host_tier_tokens=int((final.kv_transfer_params or {}).get(HOST_TIER_TOKENS_KEY, 0)),
            completion_tokens=len(completion.token_ids),
            finish_reason=completion.finish_reason or "stop",
            model_version=self._generation_version(completion),
            worker_id=self.worker_id,
            queue_time_s=queue_time,
            engine_time_s=time.monotonic() - started,
        )

    async def release(self, trace_ids: list[str]) -> None:
        """Traces that ended: they leave the admission budget and their KV pins are dropped."""
        if self.budget is not None:
            self.budget.release(trace_ids)
        await self._abort_ids([release_request_id(t) for t in trace_ids])

    async def _abort_ids(self, request_ids: list[str]) -> None:
        """An abort of ids the pinning scheduler recognises (`pronk.engine.kv_retention.control_message`), sent straight
        to the engine core (the output processor would drop ids of requests it does not know)."""
        await self._engine.engine_core.abort_requests_async(request_ids)

    def stats(self) -> WorkerStats:
        stats = WorkerStats(
            worker_id=self.worker_id,
            job_id=self.job_id,
            model_version=self.model_version,
            running=self.snapshot.running,
            waiting=self.snapshot.waiting,
            in_flight=self.in_flight,
            kv_cache_usage=self.snapshot.kv_cache_usage,
            prefix_cache_queries=self.snapshot.prefix_cache_queries,
            prefix_cache_hits=self.snapshot.prefix_cache_hits,
            preemptions=self.snapshot.preemptions,
            requests_served=self.requests_served,
            leap_state=self.leap_state,
            staged_version=self.staged_version,
            host_tier=self.snapshot.host_tier.model_copy() if self.snapshot.host_tier else None,
        )
        budget = self.budget
        if budget is not None:
            stats.kv_capacity_tokens = budget.capacity_tokens
            stats.admission_limit_tokens = budget.limit
            stats.admission_free_tokens = budget.free
            stats.admission_new_trace_room_tokens = budget.new_trace_room
            stats.admission_resident_tokens = budget.used
            stats.admission_peak_tokens = budget.peak
            stats.admission_resident = len(budget.resident)
            stats.admission_waiting = len(budget.waiters)
            stats.admission_paused = len(budget.paused)
            stats.admission_host_limit_tokens = budget.host_limit
            stats.admission_host_tokens = budget.host_used if budget.host_limit else 0
            stats.admission_counts = dict(budget.counts)
        return stats

    def _generation_version(self, completion: Any) -> str:
        """The weight version that sampled this generation's tokens, as vLLM tracked it token by token."""
        versions = {span.version for span in completion.weight_versions or []}
        if len(versions) > 1:
            raise MixedWeightVersions(f"one generation was sampled by weights {sorted(versions)}")
        return versions.pop() if versions else self.model_version

    async def swap_weights(self, path: str, version: str) -> WeightSwap:
        """At a step boundary: drain in-flight generations (new ones queue), reload, reset the prefix cache, resume.

        Draining instead of freezing is what keeps every generation on one version. If the reload
        fails, the previous weights are reloaded before resuming, and the error is raised.
        """
        started = time.time()
        await self._engine.pause_generation(mode="wait", clear_cache=False)
        paused = time.time()
        try:
            await self._reload(path, version)
        except Exception:
            await self._reload(self.model_path, self.model_version)
            raise
        finally:
            await self._engine.resume_generation()
        resumed = time.time()
        previous = self.model_version
        self.model_path, self.model_version = path, version
        return WeightSwap(previous, version, started, paused, resumed)

    async def _reload(self, path: str, version: str) -> None:
        await self._engine.collective_rpc("reload_weights", kwargs={"weights_path": path, "is_checkpoint_format": True})
        if not await self._engine.reset_prefix_cache():
            raise RuntimeError(f"{self.worker_id}: prefix cache reset refused after loading {version}")
        await self._engine.update_weight_version(version)
