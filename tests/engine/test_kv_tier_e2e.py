"""The KV host tier on a real vLLM CPU engine (the worker's own scheduler, pronk's tiny model): a trace's prefix
that a flood of other traces evicted from the engine's cache is loaded back from host memory, and greedy output over
it is the same token for token as over the engine's own cached copy."""

from __future__ import annotations

import asyncio
import random
import time
import uuid

import pytest

from pronk.engine.kv_retention import pin_settings, scheduler_class
from pronk.engine.kv_tier import host_tier_config
from pronk.engine.vllm_backend import VllmBackend
from pronk.engine.worker_protocol import HostTierStats, SamplingSpec, StepRequest, StepResult
from pronk.models.registry import ensure_tiny_model, resolve_model

pytestmark = pytest.mark.e2e
TOKEN_BYTES = 4 * 2 * 2 * 64 * 4
"""The tiny model's KV per token in float32: 4 layers, K and V, 2 KV heads of 64."""
DEVICE_TOKENS = 2048
"""16 blocks of vLLM's 128 tokens (its block size on CPU)."""


def engine_kwargs() -> dict:
    import vllm
    from vllm.config import KVTransferConfig

    return {
        "dtype": "float32",
        "max_model_len": 1024,
        "kv_cache_memory_bytes": DEVICE_TOKENS * TOKEN_BYTES,
        "enable_prefix_caching": True,
        "enforce_eager": True,
        "scheduler_cls": scheduler_class("cpu"),
        "additional_config": pin_settings(0.5),
        "kv_transfer_config": KVTransferConfig(
            **host_tier_config(16 * DEVICE_TOKENS * TOKEN_BYTES, "cpu", vllm.__version__)
        ),
    }


def step(prompt: list[int], max_tokens: int, trace_id: str | None = None, kv_pin_ttl_s: float = 0.0) -> StepRequest:
    """With `kv_pin_ttl_s`, a step that asks to keep its trace's prefix pinned through its tool gap."""
    sampling = SamplingSpec(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    request_id = uuid.uuid4().hex
    return StepRequest(
        request_id=request_id, prompt_token_ids=prompt, sampling=sampling, trace_id=trace_id, kv_pin_ttl_s=kv_pin_ttl_s
    )


async def tier_after(backend: VllmBackend, loaded_before: int) -> HostTierStats:
    """The tier's counts once the engine has reported the load (its reports trail the outputs a little)."""
    deadline = time.monotonic() + 10
    while True:
        tier = backend.stats().host_tier
        assert tier is not None
        if tier.loaded_tokens > loaded_before or time.monotonic() > deadline:
            return tier
        await asyncio.sleep(0.2)


async def turns(backend: VllmBackend) -> tuple[StepResult, StepResult, HostTierStats, HostTierStats]:
    rng = random.Random(0)
    tokens = lambda n: [rng.randrange(10, 4000) for _ in range(n)]  # noqa: E731
    first = tokens(600)
    answer = await backend.generate(step(first, 8, "t", kv_pin_ttl_s=600))
    second = first + answer.token_ids + tokens(40)  # the trace's next step: its whole past is the prefix
    # it asks for a pin, which would keep its prefix in the engine through the flood: with the tier none is taken
    from_cache = await backend.generate(step(second, 16, "t", kv_pin_ttl_s=600))
    for _ in range(4):  # other traces, 3,600 tokens through a 2,048-token cache: the trace's blocks are evicted
        await backend.generate(step(tokens(900), 1))
    before = await tier_after(backend, -1)
    from_tier = await backend.generate(step(second, 16))
    return from_cache, from_tier, before, await tier_after(backend, before.loaded_tokens)


def test_a_prefix_evicted_from_the_engine_comes_back_from_the_host_tier_unchanged(settings):
    ensure_tiny_model(settings)
    model = resolve_model("models:/pronk-tiny@live", settings)
    backend = VllmBackend(str(model.path), f"pronk-tiny/{model.version}", "tier-w0", "job-tier", engine_kwargs())

    async def run():
        await backend.start()
        try:
            return await turns(backend)
        finally:
            backend.shutdown()

    from_cache, from_tier, before, after = asyncio.run(asyncio.wait_for(run(), 300))

    assert from_cache.cached_tokens >= 512  # the reference: the prefix from the engine's own cache
    assert after.loaded_tokens - before.loaded_tokens >= 512, (before, after)  # the prefix's 4 full blocks, at least
    assert after.hit_tokens > before.hit_tokens and after.loads > before.loads and after.loaded_bytes > 0
    assert before.stores > 0 and before.stored_bytes > 0 and after.capacity_bytes == 16 * DEVICE_TOKENS * TOKEN_BYTES
    assert from_tier.cached_tokens >= 512
    assert from_cache.host_tier_tokens == 0 and from_tier.host_tier_tokens >= 512  # the step says where its KV was
    assert from_tier.token_ids == from_cache.token_ids  # greedy output over the loaded KV is the same
