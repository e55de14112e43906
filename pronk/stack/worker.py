"""The engine worker's entry point: resolve a job and its model, then serve them with `pronk.engine.worker.serve`.

Run as `python -m pronk.stack.worker --job JOB [--index N] [--host ADDR] [--advertise URL]` (or `pronk worker
start`). `engine/` knows nothing of jobs, settings or MLflow: everything it needs from them (the shared
worker token and the TLS certificate included) is resolved here and passed in.
"""

from __future__ import annotations

import argparse
import json
from functools import partial
from pathlib import Path
from typing import Any

from pronk.agents.tools import project_path
from pronk.engine.kv_retention import pin_settings, scheduler_class
from pronk.engine.tls import TlsFileError, server_context
from pronk.engine.vllm_backend import VllmBackend
from pronk.engine.weight_swap import IncompatibleWeights, StagedWeights
from pronk.engine.worker import (
    advertise_url,
    bind_socket,
    compact_json_outputs,
    cores_for,
    pin_to_cores,
    run_model_in_engine_process,
    serve,
)
from pronk.jobs.catalog import resolve_job
from pronk.jobs.schema import JobConfig
from pronk.models.checkpoints import CheckpointMismatch, check_compatible, read_spec
from pronk.models.registry import resolve_model
from pronk.settings import Settings, get_settings
from pronk.stack.state import worker_name
from pronk.worker_registry import worker_registry
from pronk.worker_token import worker_token


def stage_checkpoint(model_uri: str, current_path: str, current_version: str, settings: Settings) -> StagedWeights:
    """Bring `model_uri` onto local disk and check it has the served checkpoint's architecture, dtype and shapes."""
    model = resolve_model(model_uri, settings)
    try:
        check_compatible(read_spec(model.path), read_spec(Path(current_path)), model_uri, current_version)
    except CheckpointMismatch as exc:
        raise IncompatibleWeights(str(exc)) from exc
    return StagedWeights(version=model.version, path=str(model.path))


def host_tier(job: JobConfig) -> dict[str, Any]:
    """The engine argument that turns on the job's KV host tier, if it has one."""
    if not job.scheduling.kv_host_tier_bytes:
        return {}
    import vllm
    from vllm.config import KVTransferConfig

    from pronk.engine.kv_tier import host_tier_config

    config = host_tier_config(job.scheduling.kv_host_tier_bytes, job.device, vllm.__version__)
    return {"kv_transfer_config": KVTransferConfig(**config)}


def simulated(job: JobConfig, engine_kwargs: dict[str, Any], tokenizer: str) -> dict[str, Any]:
    """`engine_kwargs` made those of a simulated engine (pronk.engine.sim_executor) of the job's `sim` GPU; the job's
    model gives its tokenizer."""
    from pronk.engine.sim_executor import SimSettings

    sim = job.sim
    timing = project_path(sim.timing)
    timed_on = json.loads(timing.read_text()).get("system")
    if timed_on != sim.gpu:
        raise SystemExit(f"engine worker not started: sim.timing {sim.timing} is timed on {timed_on}, not {sim.gpu}")
    settings = SimSettings(str(timing), sim.speed_factor, sim.memory_bytes)
    blocks = {} if sim.num_gpu_blocks is None else {"num_gpu_blocks_override": sim.num_gpu_blocks}
    return settings.engine_kwargs({**engine_kwargs, **blocks}, str(project_path(sim.architecture)), tokenizer)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--job", required=True, help="job id or name")
    parser.add_argument("--index", type=int, default=0, help="this worker's index within the job")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (0.0.0.0: every interface)")
    parser.add_argument("--port", type=int, default=0, help="port to bind (0 picks a free one)")
    parser.add_argument(
        "--advertise",
        default=None,
        help="URL routers reach this worker by (default http://HOST:PORT, https:// with PRONK_WORKER_TLS_CERT)",
    )
    args = parser.parse_args(argv)

    settings = get_settings()
    token = worker_token(settings)
    job = resolve_job(args.job, settings)
    sock = bind_socket(args.host, args.port)
    # A taken port, a bad --host/--advertise or an unreadable certificate fails here, before vLLM loads.
    cert, key = settings.worker_tls_cert, settings.worker_tls_key
    try:
        tls = server_context(cert, key) if cert is not None and key is not None else None
    except TlsFileError as exc:
        raise SystemExit(f"engine worker not started: {exc}") from exc
    url = advertise_url(args.host, sock.getsockname()[1], args.advertise, https=tls is not None)
    if job.device == "cpu":
        pin_to_cores(cores_for(args.index, job.cpu_cores_per_worker))
        run_model_in_engine_process()
    model = resolve_model(job.model, settings)
    engine_kwargs = {
        "served_model_name": job.served_model_name,
        "scheduler_cls": scheduler_class(job.device),
        "structured_outputs_config": compact_json_outputs(),
        "additional_config": pin_settings(job.scheduling.kv_pin_max_fraction),
        **job.vllm_kwargs(),
        **host_tier(job),
    }
    if job.engine.backend == "sim":
        engine_kwargs = simulated(job, engine_kwargs, str(model.path))
    backend = VllmBackend(
        model_path=str(model.path),
        model_version=model.version,
        worker_id=worker_name(job.job_id, args.index),
        job_id=job.job_id,
        engine_kwargs=engine_kwargs,
        kv_budget_headroom=job.scheduling.kv_budget_headroom,
        kv_budget_growth_steps=job.scheduling.kv_budget_growth_steps,
    )
    serve(
        backend,
        worker_registry(settings),
        partial(stage_checkpoint, settings=settings),
        sock,
        url,
        settings.heartbeat_interval_s,
        token=token,
        tls=tls,
    )


if __name__ == "__main__":
    main()
