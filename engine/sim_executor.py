"""A simulated engine: vLLM's own scheduler and KV cache manager, with the forward pass replaced by a timed wait.

vLLM v1 takes an executor class for `distributed_executor_backend`, and an executor is the whole of what runs the
model: the engine core asks it for the layers' KV cache specs and the memory they may fill, then hands it each
step's `SchedulerOutput` and takes back a `ModelRunnerOutput`. `SimExecutor` answers all of it from an
architecture config alone (no weights, no device): the specs of the config's attention layers, a KV size from
`num_gpu_blocks` or a GPU's memory, and for each step the time the timing model (`pronk.engine.step_timing`) gives that
step's batch, waited out at `speed_factor`, then one token for each request that reached the end of its prompt.
Everything else is vLLM's and pronk's own: continuous batching, chunked prefill, prefix caching, preemption,
`pronk.engine.kv_retention`'s pins, the output processor, `AsyncLLM`.

Outputs run to each request's `max_tokens`: the token written is the lowest id that decodes to text (a special token
would cost the front end's incremental detokenizer a re-decode of the whole output every step) and that none of the
request's stop token ids (end of sequence included) names. A step with a JSON schema gets the lowest token its grammar
allows instead, so the grammar holds; the text means nothing either way.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future
from dataclasses import asdict, dataclass, field
from typing import Any

from vllm.v1.core.sched.output import GrammarOutput, SchedulerOutput
from vllm.v1.executor.abstract import Executor
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheSpec
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.serial_utils import run_method
from vllm.v1.worker.worker_base import CompilationTimes

from pronk.engine.step_timing import StepShape, TimingModel, load_timing

log = logging.getLogger(__name__)

SIM_KEY = "pronk_sim"
"""Where `SimSettings` ride in vLLM's `additional_config` (the engine core process gets no other input)."""
PLAIN_IDS = 8
"""Candidates kept for the filler token: enough that a request's stop ids cannot name them all."""


@dataclass(slots=True)
class SimSettings:
    """What a simulated engine needs beyond vLLM's own arguments.

    `speed_factor` is simulated seconds per wall second: at 1 a step waits what the timing model says, at 0.1 ten
    times that (for fleets whose engines' own scheduling two cores cannot host at full speed). `gpu_memory_bytes`
    sizes the KV cache as vLLM does on a GPU (the `gpu_memory_utilization` share, less the weights and
    `activation_reserve_bytes`) unless vLLM's `num_gpu_blocks_override` fixes it.
    """

    timing: str
    speed_factor: float = 1.0
    gpu_memory_bytes: int | None = None
    activation_reserve_bytes: int = 2 << 30

    def engine_kwargs(self, kwargs: dict[str, Any], architecture: str, tokenizer: str) -> dict[str, Any]:
        """vLLM engine arguments `kwargs` made a simulated engine of the config in `architecture`, tokenized by
        the tokenizer in `tokenizer` (a directory)."""
        extra = {**(kwargs.get("additional_config") or {}), SIM_KEY: asdict(self)}
        return {
            **kwargs,
            "model": architecture,
            "tokenizer": tokenizer,
            "distributed_executor_backend": f"{__name__}.SimExecutor",
            "additional_config": extra,
        }


def weight_bytes(hf_config: Any, itemsize: int) -> int:
    """Bytes of a dense decoder's weights from its config: embeddings, attention and MLP projections, norms."""
    hidden, layers = hf_config.hidden_size, hf_config.num_hidden_layers
    head_dim = getattr(hf_config, "head_dim", None) or hidden // hf_config.num_attention_heads
    q = hf_config.num_attention_heads * head_dim
    kv = hf_config.num_key_value_heads * head_dim
    per_layer = hidden * (2 * q + 2 * kv) + 3 * hidden * hf_config.intermediate_size + 2 * hidden
    embeddings = hf_config.vocab_size * hidden * (1 if getattr(hf_config, "tie_word_embeddings", False) else 2)
    return (layers * per_layer + embeddings + hidden) * itemsize


@dataclass(slots=True)
class SimRunner:
    """The executor's one worker: answers the engine core's calls, times and samples each step."""

    vllm_config: Any
    settings: SimSettings
    timing: TimingModel
    plain_ids: list[int] = field(default_factory=lambda: list(range(PLAIN_IDS)))
    """The lowest token ids that decode to text, the filler's candidates."""
    requests: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Each scheduled request's prompt length and the token it writes."""
    scheduled: list[tuple[str, bool]] = field(default_factory=list)
    deadline: float = 0.0
    wall: float = 0.0

    def get_kv_cache_spec(self) -> dict[str, KVCacheSpec]:
        model, cache = self.vllm_config.model_config, self.vllm_config.cache_config
        parallel = self.vllm_config.parallel_config
        spec = FullAttentionSpec(
            block_size=cache.block_size,
            num_kv_heads=model.get_num_kv_heads(parallel),
            head_size=model.get_head_size(),
            dtype=model.dtype,
        )
        return {f"model.layers.{i}.self_attn.attn": spec for i in range(model.get_num_layers(parallel))}

    def determine_available_memory(self) -> int:
        cache, model = self.vllm_config.cache_config, self.vllm_config.model_config
        if cache.num_gpu_blocks_override is not None:
            return cache.num_gpu_blocks_override * sum(s.page_size_bytes for s in self.get_kv_cache_spec().values())
        if self.settings.gpu_memory_bytes is None:
            raise ValueError("a simulated engine needs num_gpu_blocks or a GPU memory size")
        usable = self.settings.gpu_memory_bytes * cache.gpu_memory_utilization
        weights = weight_bytes(model.hf_text_config, model.dtype.itemsize)
        return int(usable - weights - self.settings.activation_reserve_bytes)

    def get_supported_kv_cache_layouts(self) -> list[str]:
        return ["NHD"]

    def get_supported_tasks(self) -> tuple[str, ...]:
        return ("generate",)

    def compile_or_warm_up_model(self) -> CompilationTimes:
        return CompilationTimes(language_model=0.0, encoder=0.0)

    def execute_model(self, scheduler_output: SchedulerOutput) -> None:
        """Shape the step, set when its simulated forward pass ends, and note which requests sample a token."""
        step = StepShape()
        self.scheduled = []
        counts = scheduler_output.num_scheduled_tokens
        for new in scheduler_output.scheduled_new_reqs:
            prompt = len(new.prompt_token_ids or ())
            self.requests[new.req_id] = (prompt, self._filler(new.sampling_params))
            step.add_prefill(counts[new.req_id], new.num_computed_tokens)
            self.scheduled.append((new.req_id, new.num_computed_tokens + counts[new.req_id] >= prompt))
        cached = scheduler_output.scheduled_cached_reqs
        for req_id, computed, outputs in zip(
            cached.req_ids, cached.num_computed_tokens, cached.num_output_tokens, strict=True
        ):
            tokens, total = counts[req_id], self.requests[req_id][0] + outputs
            if tokens == 1 and outputs > 0:
                step.add_decode(computed)
            else:
                step.add_prefill(tokens, computed)
            self.scheduled.append((req_id, computed + tokens >= total))
        for req_id in scheduler_output.finished_req_ids:
            self.requests.pop(req_id, None)
        self._set_deadline(self.timing.seconds(step) / self.settings.speed_factor)

    def _set_deadline(self, wall: float) -> None:
        """When this step's forward pass ends. A step scheduled within the previous pass's length after it ended
        starts where it ended: vLLM on a GPU schedules the next step while the device runs the current one (async
        scheduling), so its own host time between steps costs nothing there, and is not charged here either. Past
        that, the engine was idle (or its host is too slow for the speed factor) and the pass starts now."""
        now = time.monotonic()
        start = self.deadline if 0 <= now - self.deadline <= self.wall else now
        self.deadline, self.wall = start + wall, wall

    def sample_tokens(self, grammar_output: GrammarOutput | None) -> ModelRunnerOutput:
        """Wait out the step, then one token for each request that finished its prompt (none for a prefill chunk)."""
        constrained = _grammar_choices(grammar_output)
        wait = self.deadline - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        req_ids = [req_id for req_id, _ in self.scheduled]
        sampled = [
            [constrained.get(req_id, self.requests[req_id][1])] if samples else [] for req_id, samples in self.scheduled
        ]
        return ModelRunnerOutput(
            req_ids=req_ids, req_id_to_index={r: i for i, r in enumerate(req_ids)}, sampled_token_ids=sampled
        )

    def _filler(self, params: Any) -> int:
        """The token a request with sampling `params` writes: the first plain id that stops nothing."""
        stops = params.all_stop_token_ids if params is not None else set()
        return next((i for i in self.plain_ids if i not in stops), self.plain_ids[-1])

    def take_draft_token_ids(self) -> None:
        return None

    def reload_weights(self, **_: Any) -> None:
        """A weight swap on a simulated engine: nothing to load (the backend keeps the version; vLLM resets the
        prefix cache)."""

    def initialize_from_config(self, kv_cache_configs: Any) -> None: ...
    def set_kv_cache_layout(self, layout_name: str) -> None: ...
    def synchronize_device(self) -> None: ...
    def reset_mm_cache(self) -> None: ...
    def reset_encoder_cache(self) -> None: ...
    def update_max_model_len(self, max_model_len: int) -> None: ...
    def shutdown(self) -> None: ...


def _plain_ids(model_config: Any) -> list[int]:
    """The `PLAIN_IDS` lowest token ids of the model's tokenizer that decode to visible text."""
    from vllm.tokenizers import cached_tokenizer_from_config

    tokenizer = cached_tokenizer_from_config(model_config)
    plain = (i for i in range(len(tokenizer)) if tokenizer.decode([i], skip_special_tokens=True).strip())
    return [next(plain) for _ in range(PLAIN_IDS)]


def _grammar_choices(grammar_output: GrammarOutput | None) -> dict[str, int]:
    """For each request under a grammar, the lowest token id its bitmask allows."""
    if grammar_output is None:
        return {}
    import numpy as np

    choices = {}
    for req_id, row in zip(grammar_output.structured_output_request_ids, grammar_output.grammar_bitmask, strict=False):
        words = np.asarray(row).view(np.uint32)
        allowed = np.flatnonzero(words)
        if len(allowed):
            word = int(words[allowed[0]])
            choices[req_id] = int(allowed[0]) * 32 + (word & -word).bit_length() - 1
    return choices


class SimExecutor(Executor):
    """vLLM's executor seam, served in the engine core's own process by one `SimRunner`."""

    def _init_executor(self) -> None:
        config = self.vllm_config
        if config.speculative_config is not None or config.kv_transfer_config is not None:
            raise ValueError("a simulated engine supports neither speculative decoding nor a KV connector")
        extra: dict[str, Any] = config.additional_config  # type: ignore[assignment]
        settings = SimSettings(**extra[SIM_KEY])
        self.runner = SimRunner(config, settings, load_timing(settings.timing))
        if not config.model_config.skip_tokenizer_init:
            self.runner.plain_ids = _plain_ids(config.model_config)
        log.info("simulated engine: timing %s at speed factor %s", settings.timing, settings.speed_factor)

    def collective_rpc(
        self,
        method: Any,
        timeout: float | None = None,
        args: tuple = (),
        kwargs: dict | None = None,
        non_block: bool = False,
    ) -> Any:
        result = [run_method(self.runner, method, args, kwargs or {})]
        return _done(result) if non_block else result

    def execute_model(self, scheduler_output: SchedulerOutput, non_block: bool = False) -> Any:
        self.runner.execute_model(scheduler_output)
        return _done(None) if non_block else None

    def sample_tokens(self, grammar_output: GrammarOutput | None, non_block: bool = False) -> Any:
        output = self.runner.sample_tokens(grammar_output)
        return _done(output) if non_block else output

    def check_health(self) -> None:
        return None


def _done(value: Any) -> Future:
    future: Future = Future()
    future.set_result(value)
    return future
