"""An engine worker: one persistent process holding a job's model in vLLM, serving steps over HTTP (for an
`engine.backend: sim` job, vLLM's own scheduler over a simulated forward pass: `pronk.engine.sim_executor`).

Started by `python -m pronk.stack.worker --job JOB [--index N] [--host ADDR --advertise URL]` (or `pronk worker
start`), which resolves the job and its model and calls `serve`. It binds 127.0.0.1 unless told otherwise,
announces itself in the registry (under the URL other hosts reach it by) with a heartbeat carrying its load,
and withdraws on SIGTERM. Every request but a bare `GET /health` must carry the shared token (`pronk.engine.auth`).
Given a TLS context (`pronk.engine.tls.server_context`) it serves HTTPS on its socket and announces an `https://` URL.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import ssl
import time
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from fastapi import FastAPI, HTTPException, Request

from pronk.engine.admission import AdmissionTimeout, BudgetExceeded
from pronk.engine.auth import TokenAuth, auth_headers
from pronk.engine.registry import Registry, RegistryUnavailable, WorkerEntry
from pronk.engine.vllm_backend import VllmBackend
from pronk.engine.weight_swap import Stager, add_weight_routes
from pronk.engine.worker_protocol import ReleaseRequest, StepRequest, StepResult, WorkerStats

if TYPE_CHECKING:
    import uvicorn

log = logging.getLogger(__name__)
T = TypeVar("T")


async def until_disconnected(http: Request, work: Coroutine[Any, Any, T]) -> T:
    """Await `work` while its caller is still connected; cancel it when the caller goes away.

    A router that gives up on a step (its timeout, a cancelled trace) closes the connection, but an HTTP server
    does not cancel a handler on that: the engine would go on generating for no one, at full cost, while the
    router retries the step elsewhere. Cancelling the generation makes vLLM abort the request. The server says
    the caller went by the ASGI `http.disconnect` message, awaited as vLLM's own server awaits it: polling
    `Request.is_disconnected` for each step in flight took a twentieth of a worker's front-end CPU.
    """
    task = asyncio.ensure_future(work)
    caller_gone = asyncio.ensure_future(_disconnect(http))
    try:
        await asyncio.wait({task, caller_gone}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        raise HTTPException(status_code=499, detail="the caller went away; the step was abandoned")
    finally:
        for pending in (task, caller_gone):
            if not pending.done():
                pending.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await pending


async def _disconnect(http: Request) -> None:
    """Returns when the server says the caller disconnected (the request's body, if still unread, is dropped)."""
    while (await http.receive())["type"] != "http.disconnect":
        pass


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def bind_socket(host: str, port: int = 0) -> socket.socket:
    """A socket bound (not yet listening) to `host:port`, 0 picking a free port.

    A worker binds before it loads vLLM and serves on this very socket: a port picked by `free_port` and bound only
    after the model loads can be taken meanwhile (vLLM's own ports, any outgoing connection), and the worker would
    die with EADDRINUSE after its slowest step.
    """
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def cores_for(index: int, cores_per_worker: int) -> list[int]:
    """The CPU cores worker `index` is pinned to, wrapping around the machine's cores."""
    available = sorted(os.sched_getaffinity(0))
    start = index * cores_per_worker
    return sorted({available[(start + i) % len(available)] for i in range(cores_per_worker)})


def pin_to_cores(cores: list[int]) -> None:
    """Pin this process (and the engine processes it spawns) to `cores`, and tell vLLM's OpenMP the same."""
    os.sched_setaffinity(0, cores)
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(str(c) for c in cores)


def run_model_in_engine_process() -> None:
    """On CPU, run the model inside vLLM's EngineCore process rather than in a third process of its own.

    `AsyncLLM` always keeps EngineCore in its own process; vLLM's CPU platform then adds a multiprocess executor, one
    more spawned process that imports vLLM again, unless `VLLM_ENABLE_V1_MULTIPROCESSING` is off, and then it keeps
    the single-process executor that GPU engines of one device use. On 2 cores here that takes a tiny worker's start
    from ~54 s to ~40 s and 32 decodes of 64 tokens from 2.7-3.3 s to 2.3 s (one IPC hop fewer per step).
    """
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"


def create_app(
    backend: VllmBackend, registry: Registry, url: str, heartbeat_interval_s: float, stager: Stager, *, token: str
) -> FastAPI:
    """The worker's app; `url` is what it announces (other hosts reach it there), `token` what every caller sends."""
    auth_headers(token)  # refuses an empty token before anything is served
    started_at = time.time()

    def entry() -> WorkerEntry:
        return WorkerEntry(
            worker_id=backend.worker_id,
            job_id=backend.job_id,
            url=url,
            pid=os.getpid(),
            started_at=started_at,
            heartbeat_at=time.time(),
            stats=backend.stats(),
        )

    def announce() -> None:
        registry.announce(entry())

    async def heartbeat() -> None:
        """Announce every `heartbeat_interval_s`, off the event loop (the registry may be a database on another
        host); a registry out of reach costs missed beats, never the worker."""
        while True:
            try:
                await asyncio.to_thread(registry.announce, entry())
            except RegistryUnavailable as exc:
                log.warning("worker %s missed a heartbeat: %s", backend.worker_id, exc)
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
            try:
                registry.withdraw(backend.job_id, backend.worker_id)
            except RegistryUnavailable as exc:  # its entry goes stale and the routers drop it
                log.warning("worker %s could not withdraw: %s", backend.worker_id, exc)
            backend.shutdown()

    app = FastAPI(title=f"pronk engine worker {backend.worker_id}", lifespan=lifespan)
    app.add_middleware(TokenAuth, token=token)

    @app.post("/generate")
    async def generate(request: StepRequest, http: Request) -> StepResult:
        try:
            return await until_disconnected(http, backend.generate(request))
        except AdmissionTimeout as exc:
            raise HTTPException(status_code=429, detail=str(exc)) from exc
        except (ValueError, BudgetExceeded) as exc:
            raise HTTPException(status_code=400, detail=str(exc)) from exc

    @app.post("/release")
    async def release(request: ReleaseRequest) -> dict[str, int]:
        """Traces that ended: drop their KV pins and their admission."""
        await backend.release(request.trace_ids)
        return {"released": len(request.trace_ids)}

    @app.get("/health")
    async def health(request: Request) -> dict[str, str]:
        """Open to readiness probes; who the worker is and what it serves only for callers with the token."""
        if not request.state.authenticated:
            return {"status": "ok"}
        return {"status": "ok", "worker_id": backend.worker_id, "model_version": backend.model_version}

    @app.get("/stats")
    async def stats() -> WorkerStats:
        return backend.stats()

    add_weight_routes(app, backend, stager, on_change=announce)
    return app


COMPACT_JSON_OUTPUTS: dict[str, Any] = {"backend": "xgrammar", "disable_any_whitespace": True}
"""vLLM's structured-outputs config of every worker; the benchmark's stock servers get the same."""


def compact_json_outputs():
    """JSON-constrained steps without free whitespace: a random-weight model otherwise pads its calls with it."""
    from vllm.config import StructuredOutputsConfig

    return StructuredOutputsConfig(**COMPACT_JSON_OUTPUTS)


def serve(
    backend: VllmBackend,
    registry: Registry,
    stager: Stager,
    sock: socket.socket,
    url: str,
    heartbeat_interval_s: float,
    *,
    token: str,
    tls: ssl.SSLContext | None = None,
) -> None:
    """Serve `backend` on the bound `sock` until SIGTERM, announced to the registry as `url`; over HTTPS with `tls`.

    The caller (pronk's worker entry point) bound the socket (`bind_socket`), derived `url` from it
    (`advertise_url`), loaded its certificate (`pronk.engine.tls.server_context`) and built the backend from a job, all
    before this call.
    """
    app = create_app(backend, registry, url, heartbeat_interval_s, stager, token=token)
    http_server(app, tls).run(sockets=[sock])


def http_server(app: FastAPI, tls: ssl.SSLContext | None = None) -> uvicorn.Server:
    """uvicorn serving `app`: over TLS with the context `tls` when given (uvicorn's `ssl_context_factory` hands it
    the context as it is, so a pre-bound socket serves HTTPS), else plain HTTP."""
    import uvicorn

    factory = None if tls is None else (lambda config, default: tls)
    return uvicorn.Server(uvicorn.Config(app, log_level="warning", ssl_context_factory=factory))


def advertise_url(host: str, port: int, advertise: str | None, https: bool = False) -> str:
    """The URL a worker announces: `advertise` when given (trailing slash dropped), else `http(s)://host:port`.

    A worker serving TLS (`https`) announces an `https://` URL: a plain one would send its callers nowhere.
    """
    scheme = "https" if https else "http"
    if advertise:
        if not advertise.startswith(("http://", "https://")):
            raise ValueError(f"--advertise must be an http(s) URL, got {advertise!r}")
        if https and not advertise.startswith("https://"):
            raise ValueError(f"a worker serving TLS must advertise an https:// URL, got {advertise!r}")
        return advertise.rstrip("/")
    if host in ("0.0.0.0", "::", ""):
        raise ValueError(f"a worker bound to {host or 'every interface'!r} needs --advertise (the URL others call)")
    return f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"
