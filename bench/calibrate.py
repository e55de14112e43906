"""Calibrate the prefill-dominated regime: what a recompute costs against a step's decode on this machine.

Offline vLLM (`LLM`, one process, the tiny model's architecture with 16k positions, prefix caching on):
- prefill of N random token ids cold (fresh content) against warm (the same prompt cached, plus 64 new
  tokens), for N = 2,048 / 8,192 / 16,000;
- one decode iteration at 1 and at 16 concurrent sequences (the time of 33 generated tokens minus 1,
  over 32, with the prompts cached).
From these it prints the recompute-to-decode ratio of a profile's mean step: recomputing the mean context
against (a) one sequence decoding the step's output alone and (b) its share of a 16-sequence batch.

    .venv/bin/python -m bench.calibrate [--rounds 3] [--out bench/calibration.json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import statistics
import tempfile
import time
from pathlib import Path

LENGTHS = (2048, 8192, 16000)
MAX_MODEL_LEN = 16384


def _engine(model_dir: Path):
    from vllm import LLM

    return LLM(
        model=str(model_dir),
        max_model_len=MAX_MODEL_LEN,
        hf_overrides={"max_position_embeddings": MAX_MODEL_LEN},
        dtype="float32",
        kv_cache_memory_bytes=512 * 2**20,
        enable_prefix_caching=True,
        enforce_eager=True,
        max_num_seqs=32,
        max_num_batched_tokens=MAX_MODEL_LEN,
    )


def _timed(llm, prompts: list[list[int]], max_tokens: int) -> float:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0)
    started = time.perf_counter()
    llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    return time.perf_counter() - started


def _ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(100, 3000) for _ in range(n)]


def measure(llm, rounds: int, seed: int) -> dict:
    rng = random.Random(seed)
    prefill: dict[int, dict[str, list[float]]] = {n: {"cold_s": [], "warm_s": []} for n in LENGTHS}
    for _ in range(rounds):
        for n in LENGTHS:
            prompt = _ids(rng, n)
            prefill[n]["cold_s"].append(_timed(llm, [prompt], 1))
            prefill[n]["warm_s"].append(_timed(llm, [prompt + _ids(rng, 64)], 1))
    decode: dict[int, list[float]] = {1: [], 16: []}
    for _ in range(rounds):
        for batch in decode:
            prompts = [_ids(rng, 1024) for _ in range(batch)]
            _timed(llm, prompts, 1)
            one = _timed(llm, prompts, 1)
            many = _timed(llm, prompts, 33)
            decode[batch].append((many - one) / 32)
    return {
        "prefill": {str(n): {k: [round(v, 4) for v in vals] for k, vals in d.items()} for n, d in prefill.items()},
        "decode_iteration_s": {str(b): [round(v, 5) for v in vals] for b, vals in decode.items()},
    }


def _median(values: list[float]) -> float:
    return statistics.median(values)


def cold_prefill_s(figures: dict, tokens: int) -> float:
    """Cold prefill time at `tokens`, interpolated between the measured lengths (piecewise linear from 0)."""
    points = [(0, 0.0), *sorted((int(n), _median(d["cold_s"])) for n, d in figures["prefill"].items())]
    for (n0, t0), (n1, t1) in itertools.pairwise(points):
        if tokens <= n1:
            return t0 + (t1 - t0) * (tokens - n0) / (n1 - n0)
    return points[-1][1]


def recompute_ratio(figures: dict, mean_context: int, output_tokens: int) -> dict:
    """Recomputing a mean context against decoding one step's output, alone and as a share of 16 sequences."""
    recompute = cold_prefill_s(figures, mean_context)
    alone = _median(figures["decode_iteration_s"]["1"]) * output_tokens
    shared = _median(figures["decode_iteration_s"]["16"]) * output_tokens / 16
    return {
        "mean_context_tokens": mean_context,
        "output_tokens": output_tokens,
        "recompute_s": round(recompute, 4),
        "decode_alone_s": round(alone, 4),
        "decode_share_of_16_s": round(shared, 5),
        "ratio_alone": round(recompute / alone, 1),
        "ratio_share_of_16": round(recompute / shared, 1),
    }


def markdown(figures: dict, ratios: list[dict]) -> str:
    lines = [
        "| prompt tokens | cold prefill (median, min-max) | warm (+64 new) | cold / warm |",
        "| --- | --- | --- | --- |",
    ]
    for n, d in figures["prefill"].items():
        cold, warm = d["cold_s"], d["warm_s"]
        lines.append(
            f"| {int(n):,} | {_median(cold):.3f} s ({min(cold):.3f}-{max(cold):.3f}) | {_median(warm):.3f} s "
            f"| {_median(cold) / _median(warm):.0f}x |"
        )
    lines += ["", "| concurrent sequences | one decode iteration (median, min-max) |", "| --- | --- |"]
    for b, vals in figures["decode_iteration_s"].items():
        lines.append(f"| {b} | {_median(vals) * 1e3:.1f} ms ({min(vals) * 1e3:.1f}-{max(vals) * 1e3:.1f}) |")
    lines += [
        "",
        "| profile step | recompute of the mean context | decode alone | share of 16 | ratio alone | ratio share |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in ratios:
        lines.append(
            f"| {r['mean_context_tokens']:,} context, {r['output_tokens']} out | {r['recompute_s']:.3f} s "
            f"| {r['decode_alone_s']:.3f} s | {r['decode_share_of_16_s']:.4f} s | {r['ratio_alone']}:1 "
            f"| {r['ratio_share_of_16']}:1 |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    args = parser.parse_args()

    from pronk.models.tiny_model import make_tiny_model

    with tempfile.TemporaryDirectory(prefix="pronk-calibrate-") as tmp:
        llm = _engine(make_tiny_model(Path(tmp) / "model"))
        figures = measure(llm, args.rounds, args.seed)
    # today's CPU profile (mean final context ~1.4k, 32 out) and agent-long (mean context ~6k, 24 out)
    ratios = [recompute_ratio(figures, 1400, 32), recompute_ratio(figures, 6000, 24)]
    result = {"figures": figures, "ratios": ratios}
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    print(markdown(figures, ratios))


if __name__ == "__main__":
    main()
