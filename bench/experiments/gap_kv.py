"""KV across tool-call gaps: cached-token ratio and traces/s with the TTL pin on vs off, under memory pressure.

One real vLLM worker (the tiny model, pronk's `PinningScheduler`) with a deliberately small KV
cache; many concurrent replayed agent traces whose prefixes together exceed it, with tool gaps
between steps. The baseline is the same worker with pins off (`kv_pin_ttl_s=0`: vLLM's plain LRU
prefix cache). Rounds alternate off/on; every round uses fresh token content so nothing carries
over. Prints per-round numbers, medians and the on/off ratios as JSON.

    .venv/bin/python -m bench.experiments.gap_kv [--traces 24] [--rounds 3] [--kv-mib 24] [--ttl 8] [--gap 0.6]
        [--system-tokens 640] [--output-tokens 32]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import yaml

JOB_ID = "job-9a9c0001"


def bench_shape(index: int, round_tag: str, gap_s: float, system_tokens: int, output_tokens: int = 32):
    from pronk.protocol.shapes import ShapeStep, TraceShape

    steps = [
        ShapeStep(
            new_prompt_tokens=96 + 32 * (i % 3),
            output_tokens=output_tokens,
            tool_gap_s=gap_s * (0.5 + (index + i) % 3 / 2),
        )
        for i in range(5)
    ]
    steps[-1].tool_gap_s = 0.0
    return TraceShape(trace_id=f"{round_tag}-t{index}", system_prompt_tokens=system_tokens, steps=steps)


async def one_round(
    router, traces: int, ttl: float, tag: str, gap_s: float, system_tokens: int, output_tokens: int
) -> dict:
    from pronk.agents.replay import run_shape

    started = time.monotonic()
    records = await asyncio.gather(
        *(
            run_shape(router, bench_shape(i, tag, gap_s, system_tokens, output_tokens), kv_pin_ttl_s=ttl)
            for i in range(traces)
        )
    )
    elapsed = time.monotonic() - started
    rows = [r for rec in records for r in rec.records]
    later = [r for r in rows if r.step > 0]
    prompt, cached = sum(r.prompt_tokens for r in later), sum(r.cached_tokens for r in later)
    return {
        "pin": ttl > 0,
        "traces": traces,
        "seconds": round(elapsed, 3),
        "traces_per_s": round(traces / elapsed, 4),
        "cached_ratio_after_step1": round(cached / prompt, 4),
        "prompt_tokens_after_step1": prompt,
        "recomputed_tokens": prompt - cached,
    }


def write_job(folder: Path, kv_mib: int) -> None:
    job = {
        "job_id": JOB_ID,
        "name": "gap-kv-bench",
        "model": "models:/pronk-tiny@live",
        "served_model_name": "pronk-tiny",
        "device": "cpu",
        "workers": 1,
        "cpu_cores_per_worker": 1,
        "price_per_worker_hour": 0.05,
        "max_concurrency": 64,
        "engine": {
            "max_model_len": 4096,
            "dtype": "float32",
            "max_num_seqs": 64,
            "kv_cache_memory_bytes": kv_mib << 20,
            "enable_prefix_caching": True,
            "enforce_eager": True,
        },
    }
    (folder / "gap-kv-bench.yaml").write_text(yaml.safe_dump(job))


async def measure(args, settings) -> list[dict]:
    from pronk.engine.router import Router
    from pronk.worker_registry import worker_registry
    from pronk.worker_token import worker_client

    router = Router(JOB_ID, worker_registry(settings), policy="trace_affinity", client=worker_client(settings))
    results = []
    try:
        await one_round(router, 4, 0.0, "warmup", 0.05, args.system_tokens, args.output_tokens)
        for n in range(args.rounds):
            for ttl in (0.0, args.ttl):
                result = await one_round(
                    router,
                    args.traces,
                    ttl,
                    f"r{n}-{'on' if ttl else 'off'}",
                    args.gap,
                    args.system_tokens,
                    args.output_tokens,
                )
                print(json.dumps(result), flush=True)
                results.append(result)
    finally:
        await router.aclose()
    return results


def summarise(results: list[dict]) -> dict:
    summary = {}
    for pin in (False, True):
        rows = [r for r in results if r["pin"] is pin]
        summary["on" if pin else "off"] = {
            "traces_per_s": statistics.median(r["traces_per_s"] for r in rows),
            "cached_ratio_after_step1": statistics.median(r["cached_ratio_after_step1"] for r in rows),
            "recomputed_tokens": statistics.median(r["recomputed_tokens"] for r in rows),
        }
    on, off = summary["on"], summary["off"]
    summary["ratio_on_over_off"] = {
        "traces_per_s": round(on["traces_per_s"] / off["traces_per_s"], 3),
        "cached_ratio_after_step1": round(
            on["cached_ratio_after_step1"] / max(off["cached_ratio_after_step1"], 1e-9), 3
        ),
    }
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=int, default=24, help="concurrent traces per round")
    parser.add_argument("--rounds", type=int, default=3, help="off/on pairs")
    parser.add_argument("--kv-mib", type=int, default=24, help="KV cache size of the worker (MiB)")
    parser.add_argument("--ttl", type=float, default=8.0, help="pin TTL in seconds when on")
    parser.add_argument("--gap", type=float, default=0.6, help="typical tool-call gap in seconds")
    parser.add_argument("--system-tokens", type=int, default=640, help="system prompt tokens of every trace")
    parser.add_argument("--output-tokens", type=int, default=32, help="tokens each step generates")
    args = parser.parse_args()

    data_dir = Path(os.environ.get("PRONK_DATA_DIR") or tempfile.mkdtemp(prefix="pronk-gapkv-"))
    jobs_dir = data_dir / "jobs"
    jobs_dir.mkdir(parents=True, exist_ok=True)
    write_job(jobs_dir, args.kv_mib)
    os.environ.update({"PRONK_DATA_DIR": str(data_dir), "PRONK_JOBS_DIR": str(jobs_dir)})

    from pronk.jobs.catalog import resolve_job
    from pronk.models.registry import ensure_tiny_model
    from pronk.settings import get_settings
    from pronk.stack.fleet import start_workers, wait_for_workers
    from pronk.stack.processes import stop

    get_settings.cache_clear()
    settings = get_settings()
    ensure_tiny_model(settings)
    job = resolve_job(JOB_ID, get_settings())
    pids = start_workers(job, settings)
    try:
        wait_for_workers(job, settings, pids)
        results = asyncio.run(measure(args, settings))
    finally:
        for pid in pids.values():
            stop(pid)
    print(json.dumps({"config": vars(args), "summary": summarise(results)}, indent=2))


if __name__ == "__main__":
    main()
