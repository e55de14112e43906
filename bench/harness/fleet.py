"""The job as every setup of a benchmark run meets it, for both drivers (`suite`, `agent_real`): pronk's stack up
for the run, the model every setup loads, its KV capacity per engine process, and the two offline limits on its
cores (`LIMITS`): what capacity and engine args each gives `bench.harness.offline_limit`'s runner."""

from __future__ import annotations

import contextlib
import json
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench.harness import offline_limit
from bench.harness.baseline import stock_host_tier
from bench.harness.figures import COMPUTE_LIMIT, LIMIT, AgentRun
from pronk.engine.worker import cores_for
from pronk.jobs.schema import JobConfig
from pronk.protocol.shapes import TraceShape
from pronk.settings import Settings
from pronk.worker_registry import worker_registry

log = logging.getLogger(__name__)


@contextlib.contextmanager
def pronk_fleet(settings: Settings, job: JobConfig):
    """pronk's stack (Prefect server and the job's workers): reuse a running one, or start one and stop it after."""
    from pronk.stack import embedded as stack

    owned = not stack.read_state(settings)
    try:  # a start that fails half way stops what it started too
        if len(worker_registry(settings).live(job.job_id)) < job.workers or owned:
            stack.up(settings, job.job_id, mlflow_ui=False, deploy=False)
        yield
    finally:
        if owned:
            stack.down(settings)


def job_model_dir(job: JobConfig, settings: Settings) -> Path:
    """The local directory of the job's model (an MLflow model is resolved, and fetched the first time): what every
    setup loads. Ask it once the stack is up, which registers the job's model."""
    from pronk.models.registry import resolve_model

    return resolve_model(job.model, settings).path


CPU_BLOCK_SIZE = 128  # vLLM's default KV block size on CPU (the job leaves block_size unset)

BUDGET_SHARE = 0.9
"""The share of a KV capacity the traces a limit admits at once may fill: the admission budget at its default 10%
headroom (a job's own `kv_budget_headroom` is not read here)."""

COMPUTE_LIMIT_KV_BYTES = 4 << 30
"""The most KV bytes one compute-only limit process is sized for: two of them beside the stack's own engines fit
the 23 GB development machine (on CPU the KV cache is RAM). Where `max_num_seqs` traces at once would need more,
fewer are admitted at once."""


def kv_bytes_per_token(job: JobConfig, model_dir: Path) -> int:
    """Bytes of KV one token takes in the job's engine: keys and values of every layer at the job's dtype."""
    config = json.loads((model_dir / "config.json").read_text())
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    dtype_bytes = {"float32": 4, "float16": 2, "bfloat16": 2}.get(job.engine.dtype, 2)
    return 2 * config["num_hidden_layers"] * config["num_key_value_heads"] * head_dim * dtype_bytes


def kv_tokens_per_worker(job: JobConfig, model_dir: Path) -> int:
    """Tokens one engine process's KV cache holds: the job's KV bytes over the model's bytes per token."""
    return (job.engine.kv_cache_memory_bytes or 0) // kv_bytes_per_token(job, model_dir)


def held_tokens(device_tokens: int, tier_tokens: int) -> int:
    """KV tokens an engine's device cache and its host tier hold together. The tier keeps a copy of every block the
    engine computed (vLLM's `OffloadingConnector` with `offload_prompt_only` off, for pronk and stock alike), so it
    mirrors the device rather than adding to it: together they hold the larger of the two. Grouping traces into the
    sum instead would overfill the tier by the device's size, and its LRU then evicts, step after step, the very
    prefix the next step needs first."""
    return max(device_tokens, tier_tokens)


def kv_footprint(shape: TraceShape, block_size: int) -> int:
    """KV tokens a trace holds at its end with nothing evicted, in whole blocks: its own final context, and each
    fan-out child's own tokens plus the block it shares only in part with its parent."""
    blocks = math.ceil(offline_limit.final_context(shape) / block_size)
    for step in shape.steps:
        blocks += sum(kv_footprint(child, block_size) // block_size + 1 for child in step.fan_out)
    return blocks * block_size


def admitted_footprint(shapes: list[TraceShape], capacity_tokens: int, max_traces: int | None, block_size: int) -> int:
    """The most KV tokens (`kv_footprint`) the traces of `shapes` that one offline process admits at once can hold.

    The runner admits at most `max_traces` of them, and either one alone or several whose final contexts fit
    `capacity_tokens` together: so they hold no more than the largest such number of footprints, nor than the
    capacity plus as many of the largest overheads (footprint less final context: block rounding and fan-out
    children), nor less than the largest trace alone."""
    footprints = [kv_footprint(shape, block_size) for shape in shapes]
    most = max_traces or len(shapes)
    overheads = sorted(
        (f - offline_limit.final_context(s) for f, s in zip(footprints, shapes, strict=True)), reverse=True
    )
    together = min(sum(sorted(footprints, reverse=True)[:most]), capacity_tokens + sum(overheads[:most]))
    return max(together, max(footprints, default=0))


@dataclass(frozen=True, slots=True)
class LimitPlan:
    """What one offline limit runs with: the setup's name, its work folder's name, the engine args of its processes,
    the KV tokens the traces admitted at once may fill, and the most traces admitted at once (None: no cap)."""

    name: str
    slug: str
    engine_args: dict
    capacity_tokens: int
    max_traces: int | None = None


def capacity_limit(job: JobConfig, model_dir: Path, shapes: list[TraceShape]) -> LimitPlan:
    """The capacity-matched limit: the job's engine args and KV bytes, and its KV host tier as stock vLLM gets it
    (`stock_host_tier`), with traces admitted while they fit `BUDGET_SHARE` of what device and tier hold together
    (`held_tokens`). A job without a tier gets its device cache alone: the limit the bench always ran."""
    per_token = kv_bytes_per_token(job, model_dir)
    args = job.engine.as_vllm_kwargs()
    if (tier := stock_host_tier(job)) is not None:
        args["kv_transfer_config"] = tier
    held = held_tokens(kv_tokens_per_worker(job, model_dir), job.scheduling.kv_host_tier_bytes // per_token)
    return LimitPlan(LIMIT, "limit", args, int(held * BUDGET_SHARE))


def compute_limit(job: JobConfig, model_dir: Path, shapes: list[TraceShape]) -> LimitPlan:
    """The compute-only limit: the job's `max_num_seqs` traces at once (fewer where their final contexts would pass
    `COMPUTE_LIMIT_KV_BYTES`), each process's KV cache sized to hold whatever it admits at once whole
    (`admitted_footprint`; never less than the job's own, which `max_model_len` must fit), and no host tier. Every
    step finds its whole prefix cached and the engine's batch is as full as it schedules, with no tool gap: only
    the compute is left, so no schedule of this work beats it."""
    per_token = kv_bytes_per_token(job, model_dir)
    block = job.engine.block_size or CPU_BLOCK_SIZE
    capacity = int(COMPUTE_LIMIT_KV_BYTES // per_token * BUDGET_SHARE)
    max_traces = job.engine.max_num_seqs
    largest = admitted_footprint(shapes, capacity, max_traces, block)
    kv_bytes = max((largest + block) * per_token, job.engine.kv_cache_memory_bytes or 0)  # + vLLM's null block
    args = job.engine.as_vllm_kwargs() | {"kv_cache_memory_bytes": kv_bytes}
    return LimitPlan(COMPUTE_LIMIT, "compute-limit", args, capacity, max_traces)


LIMITS: dict[str, Callable[[JobConfig, Path, list[TraceShape]], LimitPlan]] = {
    LIMIT: capacity_limit,
    COMPUTE_LIMIT: compute_limit,
}
"""Every limit setup of a round, by name: what plans it for the job and the round's shapes."""


def limit_run(plan: LimitPlan, job: JobConfig, model_dir: Path, shapes: list[TraceShape], work_dir: Path) -> AgentRun:
    """The offline limit `plan` of `shapes` on the job's cores, in `work_dir / plan.slug`."""
    log.info(
        "%s: traces admitted while within %d tokens and %s traces, a KV cache of %d MiB a process",
        plan.name,
        plan.capacity_tokens,
        f"at most {plan.max_traces}" if plan.max_traces else "any number of",
        (plan.engine_args.get("kv_cache_memory_bytes") or 0) >> 20,
    )
    out = offline_limit.run_limit(
        shapes,
        model_dir,
        plan.engine_args,
        plan.capacity_tokens,
        [cores_for(i, job.cpu_cores_per_worker) for i in range(job.workers)],
        work_dir / plan.slug,
        plan.max_traces,
    )
    return AgentRun(
        name=plan.name,
        wall_s=out["wall_s"],
        workers=job.workers,
        traces=out["traces"],
        steps=out["steps"],
        prompt_tokens=out["prompt_tokens"],
        cached_tokens=out["cached_tokens"],
        output_tokens=out["output_tokens"],
        trace_seconds=[],
        finished_s=out["finished_s"],
    )
