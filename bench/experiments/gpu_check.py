"""`bench/gpu_check.sh`: agent-long on a GPU, pronk against the stock round-robin baseline, in a few minutes.

A 3B-shaped Llama (Llama 3.2 3B's layers, heads and widths; the tiny model's 4,096-token vocabulary and
tokenizer) with `load_format="dummy"`: random weights made on the GPU, nothing downloaded. Two pronk
workers (`pronk.stack.worker`, every Herd mechanism on) and two stock vLLM servers share the GPU, each
with the same KV cache, sized so the working set oversubscribes it ~2.5x, and (`--host-tier-gib`, default 8)
the same KV host tier: vLLM's native CPU offloading, which `--kv-offloading-size` turns on. One round: the stock
servers with the tier behind round-robin, then stock servers without it, then pronk's bare loop with every
mechanism on, then pronk's with affinity only; the JSON is rewritten after each setup, so a run cut short still
leaves what it measured. It has not run on a GPU with vLLM yet: the one machine lent so far had no vLLM.

    bench/gpu_check.sh [--traces 48] [--concurrency 16] [--host-tier-gib 8] [--out bench/results/gpu_results.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import yaml

from bench.experiments.llama3b import KV_BYTES_PER_TOKEN, SHAPE
from bench.harness.agent_loop import OpenAIServers, replay
from bench.harness.baseline import VllmServers, untiered
from bench.harness.figures import BASELINE, UNTIERED, AgentRun, run_figures
from bench.harness.pronk_runs import ABLATIONS, bare_loop
from bench.harness.suite import relabel
from bench.harness.workload import PROFILES, cache_bounds, generate
from pronk.jobs.catalog import load_job_file
from pronk.jobs.schema import JobConfig
from pronk.settings import PROJECT_ROOT, Settings

JOB_ID = "job-a9e1609c"
MAX_MODEL_LEN = 16384


def make_model(out: Path) -> Path:
    """A 3B-shaped Llama directory: config only (vLLM makes dummy weights), the tiny model's tokenizer."""
    from pronk.models.tiny_model import VOCAB_SIZE, train_tokenizer

    out.mkdir(parents=True, exist_ok=True)
    train_tokenizer(out)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": VOCAB_SIZE,
        "max_position_embeddings": MAX_MODEL_LEN,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "bos_token_id": 1,
        "eos_token_id": 2,
        **SHAPE,
    }
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


def write_job(jobs_dir: Path, model: Path, concurrency: int, kv_tokens: int, host_tier_bytes: int = 0) -> JobConfig:
    job = {
        "job_id": JOB_ID,
        "name": "agent-long-gpu",
        "model": str(model),
        "served_model_name": "llama-3b-dummy",
        "device": "cuda",
        "workers": 2,
        "price_per_worker_hour": 1.0,
        "engine": {
            "max_model_len": MAX_MODEL_LEN,
            "dtype": "bfloat16",
            "load_format": "dummy",
            "max_num_seqs": 64,
            "kv_cache_memory_bytes": kv_tokens * KV_BYTES_PER_TOKEN,
            "gpu_memory_utilization": 0.2,
            "enable_prefix_caching": True,
            "enforce_eager": True,
        },
        "scheduling": {
            "max_concurrency": concurrency,
            "priority": True,
            "kv_pin_ttl_s": 30,
            "kv_pin_ttl": "auto",
            "routing": "trace_affinity",
            "admission": "kv_budget",
            "kv_budget_growth_steps": 3,
            "kv_host_tier_bytes": host_tier_bytes,
        },
        "harness": {"max_steps": 16, "step_max_tokens": 64, "step_timeout_s": 600, "trace_timeout_s": 900},
    }
    jobs_dir.mkdir(parents=True, exist_ok=True)
    path = jobs_dir / "agent-long-gpu.yaml"
    path.write_text(yaml.safe_dump(job, sort_keys=False))
    return load_job_file(path)


def start_workers(job: JobConfig, settings: Settings, logs: Path, timeout_s: float = 300.0) -> list[int]:
    """pronk's engine workers for the job, waited on until every one is in the registry."""
    import os

    from pronk.stack.processes import spawn
    from pronk.worker_registry import worker_registry

    env = {**os.environ, "PRONK_DATA_DIR": str(settings.data_dir), "PRONK_JOBS_DIR": str(settings.jobs_dir)}
    pids = [
        spawn(
            [sys.executable, "-m", "pronk.stack.worker", "--job", job.job_id, "--index", str(i)],
            logs / f"pronk-worker-{i}.log",
            env=env,
            cwd=PROJECT_ROOT,
        )
        for i in range(job.workers)
    ]
    deadline = time.monotonic() + timeout_s
    while len(worker_registry(settings).live(job.job_id)) < job.workers:
        if time.monotonic() > deadline:
            raise TimeoutError(f"pronk workers not up after {timeout_s}s; see {logs}")
        time.sleep(1.0)
    return pids


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--traces", type=int, default=48)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--oversubscription", type=float, default=2.5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--host-tier-gib", type=float, default=8.0, help="KV host tier per engine, GiB (0: none, one stock baseline)"
    )
    parser.add_argument("--out", type=Path, default=PROJECT_ROOT / "bench" / "results" / "gpu_results.json")
    args = parser.parse_args()

    from pronk.stack.processes import stop

    workload = generate(PROFILES["agent-long"], args.seed, args.traces)
    mean_context, ideal = cache_bounds(workload, 16)
    working_set = args.concurrency / 2 * mean_context
    kv_tokens = max(int(working_set / args.oversubscription), MAX_MODEL_LEN + 256)
    result: dict = {
        "meta": {
            "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "model": "Llama-3B-shaped, dummy weights, bf16",
            "traces": args.traces,
            "concurrency": args.concurrency,
            "kv_tokens_per_engine": kv_tokens,
            "working_set_tokens_per_engine": round(working_set),
            "ideal_cached_ratio": ideal,
            "host_tier_gib_per_engine": args.host_tier_gib,
            "complete": False,
        },
        "setups": {},
    }

    def save() -> None:
        args.out.write_text(json.dumps(result, indent=2, default=str) + "\n")

    save()
    work = Path(tempfile.mkdtemp(prefix="pronk-gpu-check-"))
    settings = Settings(data_dir=work / "data", jobs_dir=work / "jobs")
    pids: list[int] = []
    try:
        model = make_model(work / "model")
        job = write_job(settings.jobs_dir, model, args.concurrency, kv_tokens, int(args.host_tier_gib * 2**30))
        started = time.monotonic()
        pids = start_workers(job, settings, work / "logs")
        result["meta"]["workers_startup_s"] = round(time.monotonic() - started, 1)
        save()
        # Stock vLLM with the job's tier (native CPU offloading, vLLM's LRU: what --kv-offloading-size gives), and
        # without one; one set of servers at a time, so the GPU holds at most four engines.
        stock = [(BASELINE, job), (UNTIERED, untiered(job))] if job.scheduling.kv_host_tier_bytes else [(BASELINE, job)]
        for index, (name, stock_job) in enumerate(stock):
            with VllmServers(stock_job, model, work / f"logs-stock-{index}", job.workers) as servers:
                done = asyncio.run(
                    replay(
                        relabel(workload.shapes, f"base{index}"),
                        OpenAIServers(servers.urls, job.served_model_name),
                        args.concurrency,
                    )
                )
            result["setups"][name] = run_figures(AgentRun.from_replay(name, done, job.workers), ideal)
            save()
        for index, ablation in enumerate((ABLATIONS[-1], ABLATIONS[0])):
            done = asyncio.run(
                bare_loop(relabel(workload.shapes, f"abl{index}"), job, settings, args.concurrency, ablation)
            )
            figures = run_figures(AgentRun.from_replay(ablation.name, done, job.workers), ideal)
            for key, name in (("over_baseline", BASELINE), ("over_untiered", UNTIERED)):
                if name in result["setups"]:
                    figures[key] = figures["traces_per_s_steady"] / result["setups"][name]["traces_per_s_steady"]
            result["setups"][ablation.name] = figures
            save()
        result["meta"]["complete"] = True
    finally:
        for pid in pids:
            stop(pid)
        save()
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(result, indent=2, default=str))


if __name__ == "__main__":
    main()
