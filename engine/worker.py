"""An engine worker: one persistent process holding a job's model in vLLM, serving steps over HTTP on 127.0.0.1.

Run as `python -m engine.worker --job JOB [--index N]` (or `pronk worker start`). It announces itself in
the registry with a heartbeat carrying its load, and withdraws on SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import socket
import time

from fastapi import FastAPI, HTTPException

from engine.kv_retention import scheduler_class
from engine.protocol import ReleaseRequest, StepRequest, StepResult, WorkerStats
from engine.registry import Registry, WorkerEntry
from engine.vllm_backend import VllmBackend
from engine.weight_swap import add_weight_routes

log = logging.getLogger("pronk.worker")


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def cores_for(index: int, cores_per_worker: int) -> list[int]:
    """The CPU cores worker `index` is pinned to, wrapping around the machine's cores."""
    available = sorted(os.sched_getaffinity(0))
    start = index * cores_per_worker
    return sorted({available[(start + i) % len(available)] for i in range(cores_per_worker)})


def pin_to_cores(cores: list[int]) -> None:
    """Pin this process (and the engine processes it spawns) to `cores`, and tell vLLM's OpenMP the same."""
    os.sched_setaffinity(0, cores)
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(str(c) for c in cores)


def create_app(backend: VllmBackend, registry: Registry, url: str, heartbeat_interval_s: float) -> FastAPI:
    started_at = time.time()

    def announce() -> None:
        registry.announce(
            WorkerEntry(
                worker_id=backend.worker_id,
                job_id=backend.job_id,
                url=url,
                pid=os.getpid(),
                started_at=started_at,
                heartbeat_at=time.time(),
                stats=backend.stats(),
            )
        )

    async def heartbeat() -> None:
        while True:
            announce()
            await asyncio.sleep(heartbeat_interval_s)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        await backend.start()
        task = asyncio.create_task(heartbeat())
        log.warning("worker %s serving %s at %s", backend.worker_id, backend.model_version, url)
        try:
            yield
        finally:
            task.cancel()
            registry.withdraw(backend.job_id, backend.worker_id)
            backend.shutdown()

    app = FastAPI(title=f"pronk engine worker {backend.worker_id}", lifespan=lifespan)

    @app.post("/generate")
    async def generate(request: StepRequest) -> StepResult:
        try:
            return await backend.generate(request)
        except ValueError as exc:
            raise HTTPException(status_code=400, detail=str(exc)) from exc

    @app.post("/release")
    async def release(request: ReleaseRequest) -> dict[str, int]:
        await backend.release(request.trace_ids)
        return {"released": len(request.trace_ids)}

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok", "worker_id": backend.worker_id, "model_version": backend.model_version}

    @app.get("/stats")
    async def stats() -> WorkerStats:
        return backend.stats()

    add_weight_routes(app, backend, on_change=announce)
    return app


def compact_json_outputs():
    """JSON-constrained steps without free whitespace: a random-weight model otherwise pads its calls with it."""
    from vllm.config import StructuredOutputsConfig

    return StructuredOutputsConfig(backend="xgrammar", disable_any_whitespace=True)


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    from pronk.jobs import get_job
    from pronk.model_store import resolve_model
    from pronk.settings import get_settings

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--job", required=True, help="job id or name")
    parser.add_argument("--index", type=int, default=0, help="this worker's index within the job")
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (0 picks a free one)")
    args = parser.parse_args(argv)

    settings = get_settings()
    job = get_job(args.job)
    if job.device == "cpu":
        pin_to_cores(cores_for(args.index, job.cpu_cores_per_worker))
    model = resolve_model(job.model, settings)
    port = args.port or free_port()
    backend = VllmBackend(
        model_path=str(model.path),
        model_version=model.version,
        worker_id=f"{job.job_id}-w{args.index}",
        job_id=job.job_id,
        engine_kwargs={
            "served_model_name": job.served_model_name,
            "scheduler_cls": scheduler_class(job.device),
            "structured_outputs_config": compact_json_outputs(),
            **job.engine.as_vllm_kwargs(),
        },
    )
    registry = Registry.from_settings(settings)
    app = create_app(backend, registry, f"http://127.0.0.1:{port}", settings.heartbeat_interval_s)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    main()
