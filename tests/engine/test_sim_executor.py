"""The simulated engine behind pronk's own backend (`VllmBackend` over `AsyncLLM`, vLLM's scheduler and pronk's
`PinningScheduler`): a golden trace against an independent calculation of vLLM's scheduling with the same timing, a
weight swap, a JSON-constrained step, and the KV size a GPU's memory gives."""

import asyncio
import json
from collections import deque
from dataclasses import dataclass
from types import SimpleNamespace

import pytest

from pronk.engine.kv_retention import pin_settings
from pronk.engine.sim_executor import SimRunner, SimSettings, weight_bytes
from pronk.engine.step_timing import StepShape, TimingModel, load_timing
from pronk.engine.vllm_backend import VllmBackend
from pronk.engine.worker_protocol import SamplingSpec, StepRequest
from pronk.models.tiny_model import train_tokenizer
from pronk.settings import PROJECT_ROOT

ARCHITECTURE = PROJECT_ROOT / "data" / "sim" / "models" / "qwen3-8b"
TIMING = PROJECT_ROOT / "data" / "sim" / "timing" / "h100-vllm-qwen3-8b.json"
BLOCK, BUDGET, MAX_SEQS, BLOCKS = 16, 2048, 4, 1024
SPEED = 0.5
"""Simulated seconds per wall second: the test's own front end and the engine core share two busy cores."""


@dataclass
class Traced:
    """One request of the golden trace, and what the independent calculation makes of it."""

    name: str
    arrival_s: float
    prompt: list[int]
    max_tokens: int
    computed: int = 0
    outputs: int = 0
    hit: int = 0
    finished_s: float = 0.0


def trace() -> list[Traced]:
    """Two agent traces whose steps re-read a shared system prompt and their own growing history, a long prompt that
    needs two chunks of the step budget, and two short ones that queue behind `MAX_SEQS`."""
    system = list(range(10_000, 11_200))
    a, b = list(range(20_000, 21_000)), list(range(30_000, 31_000))
    requests = [Traced(f"a{k}", 0.12 * k, system + a[: 300 + 200 * k], 24 - 4 * k) for k in range(3)]
    requests += [Traced(f"b{k}", 0.03 + 0.12 * k, system + b[: 250 + 150 * k], 20) for k in range(3)]
    requests += [Traced("long", 0.06, list(range(40_000, 43_000)), 12)]
    requests += [
        Traced(f"short{i}", 0.09 + 0.005 * i, list(range(50_000 + 1000 * i, 50_400 + 1000 * i)), 16) for i in (0, 1)
    ]
    return sorted(requests, key=lambda r: r.arrival_s)


def block_keys(tokens: list[int]) -> list[tuple]:
    """A key per full block that names the block and every token before it, as vLLM's block hashes chain."""
    keys, key = [], ()
    for start in range(0, len(tokens) - BLOCK + 1, BLOCK):
        key = (hash(key), *tokens[start : start + BLOCK])
        keys.append(key)
    return keys


def expected(requests: list[Traced], timing: TimingModel) -> dict[str, object]:
    """vLLM v1's scheduling rules, computed apart from vLLM: each step first gives every running request its next
    tokens (a decode's one, a chunked prompt's rest) out of the step's token budget, then admits waiting requests
    first come first served while fewer than `MAX_SEQS` run and budget is left, each after its prefix-cache hit (the
    longest run of cached full blocks, short of the prompt's last token), its prompt cut to what the budget leaves. A
    block is cached once a step is given its tokens, so a request admitted later in the same step hits it. A step
    lasts what `timing` says; a request that reaches its prompt's end samples a token; requests arriving during a
    step wait for the next; the engine idles until the next arrival when nothing is left."""
    cached: set[tuple] = set()
    pending, waiting, running = deque(requests), deque(), []
    now, chunked, queued = 0.0, False, False
    while pending or waiting or running:
        while pending and pending[0].arrival_s <= now:
            waiting.append(pending.popleft())
        if not waiting and not running:
            now = pending[0].arrival_s
            continue
        budget, scheduled = BUDGET, []
        for request in running:
            tokens = min(len(request.prompt) + request.outputs - request.computed, budget)
            scheduled.append((request, tokens))
            budget -= tokens
        while waiting and len(running) < MAX_SEQS and budget > 0:
            request = waiting.popleft()
            limit = (len(request.prompt) - 1) // BLOCK
            keys = block_keys(request.prompt)
            hits = next((i for i in range(limit) if keys[i] not in cached), limit)
            request.hit = request.computed = hits * BLOCK
            tokens = min(len(request.prompt) - request.computed, budget)
            chunked |= tokens < len(request.prompt) - request.computed
            scheduled.append((request, tokens))
            running.append(request)
            budget -= tokens
            cached.update(block_keys(request.prompt[: request.computed + tokens]))
        queued |= bool(waiting)
        step = StepShape()
        for request, tokens in scheduled:
            if tokens == 1 and request.outputs:
                step.add_decode(request.computed)
            else:
                step.add_prefill(tokens, request.computed)
            cached.update(block_keys(request.prompt[: request.computed + tokens]))
        now += timing.seconds(step)
        for request, tokens in scheduled:
            request.computed += tokens
            if request.computed >= len(request.prompt) + request.outputs:
                request.outputs += 1
            if request.outputs == request.max_tokens:
                request.finished_s = now
                running.remove(request)
    return {"chunked": chunked, "queued": queued}


@pytest.fixture(scope="module")
def loop():
    loop = asyncio.new_event_loop()
    yield loop
    tasks = asyncio.all_tasks(loop)  # the engine client's output handlers, left after its shutdown
    for task in tasks:
        task.cancel()
    loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
    loop.close()


@pytest.fixture(scope="module")
def backend(loop, tmp_path_factory):
    tokenizer = tmp_path_factory.mktemp("tokenizer")
    train_tokenizer(tokenizer)
    (tokenizer / "config.json").write_text((ARCHITECTURE / "config.json").read_text())  # vLLM reads one beside it
    kwargs = {
        "scheduler_cls": "pronk.engine.kv_retention.PinningScheduler",
        "additional_config": pin_settings(0.5),
        "block_size": BLOCK,
        "num_gpu_blocks_override": BLOCKS,
        "max_num_batched_tokens": BUDGET,
        "max_num_seqs": MAX_SEQS,
        "max_model_len": 8192,
        "enforce_eager": True,
    }
    settings = SimSettings(timing=str(TIMING), speed_factor=SPEED)
    engine_kwargs = settings.engine_kwargs(kwargs, str(ARCHITECTURE), str(tokenizer))
    backend = VllmBackend(str(tokenizer), "sim/1", "w-sim", "job-51a00001", engine_kwargs)
    loop.run_until_complete(backend.start())
    yield backend
    backend.shutdown()


def step(request_id: str, prompt: list[int], max_tokens: int, **sampling) -> StepRequest:
    return StepRequest(
        request_id=request_id,
        prompt_token_ids=prompt,
        sampling=SamplingSpec(max_tokens=max_tokens, ignore_eos=True, temperature=0.0, **sampling),
    )


async def replay(backend: VllmBackend, requests: list[Traced]) -> dict[str, tuple[float, int]]:
    """Each request sent at its arrival (scaled to wall time): its simulated latency and prefix-hit tokens."""

    async def send(request: Traced) -> tuple[float, int]:
        await asyncio.sleep(request.arrival_s / SPEED)
        sent = asyncio.get_running_loop().time()
        result = await backend.generate(step(request.name, request.prompt, request.max_tokens))
        assert result.completion_tokens == request.max_tokens
        return (asyncio.get_running_loop().time() - sent) * SPEED, result.cached_tokens

    answers = await asyncio.gather(*(send(r) for r in requests))
    return {r.name: answer for r, answer in zip(requests, answers, strict=True)}


def test_golden_trace_matches_vllms_scheduling_with_the_same_timing(backend, loop) -> None:
    warm = [Traced("warm", 0.0, list(range(60_000, 60_100)), 4)]
    loop.run_until_complete(replay(backend, warm))  # the engine's first request pays its set-up
    requests = trace()
    coverage = expected(requests, load_timing(TIMING))
    assert coverage == {"chunked": True, "queued": True}
    measured = loop.run_until_complete(replay(backend, trace()))
    for request in requests:
        latency, hit = measured[request.name]
        assert latency == pytest.approx(request.finished_s - request.arrival_s, rel=0.10), request.name
        assert hit == pytest.approx(request.hit, rel=0.02, abs=0), request.name
    assert sum(r.hit for r in requests) > 0


def test_weight_swap_changes_the_version_and_empties_the_prefix_cache(backend, loop) -> None:
    prompt = list(range(70_000, 70_500))
    first = loop.run_until_complete(backend.generate(step("p1", prompt, 2)))
    again = loop.run_until_complete(backend.generate(step("p2", prompt, 2)))
    swap = loop.run_until_complete(backend.swap_weights(backend.model_path, "sim/2"))
    after = loop.run_until_complete(backend.generate(step("p3", prompt, 2)))
    assert (first.model_version, again.cached_tokens) == ("sim/1", 496)
    assert (swap.from_version, swap.to_version) == ("sim/1", "sim/2")
    assert (after.model_version, after.cached_tokens) == ("sim/2", 0)


def test_a_json_constrained_step_keeps_to_its_grammar(backend, loop) -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    result = loop.run_until_complete(backend.generate(step("j1", [5, 6, 7], 24, json_schema=schema)))
    assert 0 < result.completion_tokens <= 24
    assert result.text.startswith("{")


def test_requests_preempted_for_kv_room_still_finish_at_full_length(backend, loop) -> None:
    """Four requests of 4,200 tokens each outgrow the 16,384-token cache near their end: vLLM preempts and
    recomputes, and the simulated engine follows its scheduler through it."""
    preempted = backend.snapshot.preemptions
    steps = [step(f"kv{i}", list(range(80_000 + 4000 * i, 83_900 + 4000 * i)), 300) for i in range(MAX_SEQS)]

    async def all_steps():
        return await asyncio.gather(*(backend.generate(s) for s in steps))

    results = loop.run_until_complete(all_steps())
    assert [r.completion_tokens for r in results] == [300] * MAX_SEQS
    assert backend.snapshot.preemptions > preempted


def test_stats_report_the_simulated_kv_cache(backend) -> None:
    stats = backend.stats()
    assert stats.model_version.startswith("sim/")
    assert stats.kv_capacity_tokens == BLOCKS * BLOCK


def test_gpu_memory_sizes_the_kv_cache_as_vllm_does() -> None:
    hf = SimpleNamespace(**json.loads((ARCHITECTURE / "config.json").read_text()))
    assert weight_bytes(hf, 2) == pytest.approx(16.4e9, rel=0.01)  # Qwen3-8B: 8.2 B parameters in bf16
    model = SimpleNamespace(hf_text_config=hf, dtype=SimpleNamespace(itemsize=2))
    cache = SimpleNamespace(num_gpu_blocks_override=None, gpu_memory_utilization=0.9)
    runner = SimRunner(
        SimpleNamespace(model_config=model, cache_config=cache),
        SimSettings(timing=str(TIMING), gpu_memory_bytes=80 << 30),
        load_timing(TIMING),
    )
    kv_bytes_per_token = 2 * hf.num_hidden_layers * hf.num_key_value_heads * hf.head_dim * 2
    tokens = runner.determine_available_memory() / kv_bytes_per_token
    assert 350_000 < tokens < 400_000
