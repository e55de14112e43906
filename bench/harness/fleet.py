"""The job as every setup of a benchmark run meets it, for both drivers (`suite`, `agent_real`): pronk's stack up
for the run, the model every setup loads, its KV capacity per engine process, and the offline limit on its cores."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from bench.harness import offline_limit
from bench.harness.figures import LIMIT, AgentRun
from engine.worker import cores_for
from pronk.jobs.schema import JobConfig
from pronk.protocol.shapes import TraceShape
from pronk.settings import Settings
from pronk.worker_registry import worker_registry


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


def kv_tokens_per_worker(job: JobConfig, model_dir: Path) -> int:
    """Tokens one engine process's KV cache holds: the job's KV bytes over the model's bytes per token."""
    config = json.loads((model_dir / "config.json").read_text())
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    dtype_bytes = {"float32": 4, "float16": 2, "bfloat16": 2}.get(job.engine.dtype, 2)
    per_token = 2 * config["num_hidden_layers"] * config["num_key_value_heads"] * head_dim * dtype_bytes
    return (job.engine.kv_cache_memory_bytes or 0) // per_token


def limit_run(job: JobConfig, model_dir: Path, shapes: list[TraceShape], work_dir: Path) -> AgentRun:
    """The offline limit of `shapes` on the job's cores, engine args and KV bytes, grouping traces into 90% of the
    cache (the admission budget at its default 10% headroom; a job's own `kv_budget_headroom` is not read here)."""
    capacity = kv_tokens_per_worker(job, model_dir)
    out = offline_limit.run_limit(
        shapes,
        model_dir,
        job.engine.as_vllm_kwargs(),
        int(capacity * 0.9),
        [cores_for(i, job.cpu_cores_per_worker) for i in range(job.workers)],
        work_dir,
    )
    return AgentRun(
        name=LIMIT,
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
