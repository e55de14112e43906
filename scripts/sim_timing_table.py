"""Regenerate a simulated engine's timing table (data/sim/timing/*.json) from aisimulate's forward-pass model.

aisimulate (Apache-2.0) answers a forward pass's latency from NVIDIA's measured kernel data per GPU, serving
framework and version, and model. Its PyPI release 0.13.0 is a stub that downloads the real package from a host
outside the registry; the dev wheels are the real thing. Its declared dependencies pull jax and far more than this
needs, so install it into a venv of its own without them:

    python -m venv .simvenv
    .simvenv/bin/pip install --no-deps aisimulate==0.13.0.dev202610270000000085
    .simvenv/bin/pip install packaging pyyaml pydantic
    PYTHONPATH=. .simvenv/bin/python scripts/sim_timing_table.py --out data/sim/timing/h100-vllm-qwen3-8b.json

The table holds prefill, decode and mixed-step grids (`pronk.engine.step_timing.TimingTable`), the anchors the docs
quote, and how far the interpolated table strays from aisimulate itself on random steps.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from importlib.metadata import version
from pathlib import Path

from pronk.engine.step_timing import StepShape, TimingTable

PREFILL_REQUESTS = [1, 2, 4, 8, 16, 32, 64, 128, 256]
PREFILL_TOKENS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 32768]
PREFILL_CACHED = [0, 256, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144]
DECODE_REQUESTS = [1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024]
DECODE_CONTEXT = [1, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072]
OVERLAP_REQUESTS = [1, 4, 16, 64]
OVERLAP_TOKENS = [1, 16, 64, 256, 1024, 2048, 4096, 8192, 16384]
OVERLAP_DECODES = [1, 4, 16, 64, 256, 1024]


def perf_model(model: str, system: str, backend: str, backend_version: str):
    from aisimulate_core.sdk.rust_engine_step import ForwardPassPerfModelConfig, RustForwardPassPerfModel

    config = ForwardPassPerfModelConfig(
        model=model, system=system, backend=backend, worker_type="aggregated", backend_version=backend_version
    )
    return RustForwardPassPerfModel.best_available(config)


def step_ms(perf, prefill_requests: int, tokens: int, cached: int, decodes: int, decode_kv: int) -> float:
    """aisimulate's estimate of one step (its forward-pass metrics: counts and sums of the scheduled requests)."""
    scheduled = {}
    if prefill_requests:
        scheduled |= {
            "num_prefill_requests": prefill_requests,
            "sum_prefill_tokens": max(tokens, prefill_requests),
            "sum_prefill_kv_tokens": cached,
        }
    if decodes:
        scheduled |= {"num_decode_requests": decodes, "sum_decode_kv_tokens": decode_kv}
    return perf.estimate_forward_pass_time_ms({"scheduled_requests": scheduled})


def tables(perf) -> dict:
    def prefill(r: int, n: int, k: int) -> float:
        return step_ms(perf, r, n, k, 0, 0)

    def decode(b: int, context: int) -> float:
        return step_ms(perf, 0, 0, 0, b, b * context)

    def overlap(r: int, n: int, b: int) -> float:
        return prefill(r, n, 0) + decode(b, 1024) - step_ms(perf, r, n, 0, b, b * 1024)

    def r4(x: float) -> float:
        return round(x, 4)

    return {
        "prefill": {
            "requests": PREFILL_REQUESTS,
            "tokens": PREFILL_TOKENS,
            "cached": PREFILL_CACHED,
            "ms": [[[r4(prefill(r, n, k)) for k in PREFILL_CACHED] for n in PREFILL_TOKENS] for r in PREFILL_REQUESTS],
        },
        "decode": {
            "requests": DECODE_REQUESTS,
            "context": DECODE_CONTEXT,
            "ms": [[r4(decode(b, c)) for c in DECODE_CONTEXT] for b in DECODE_REQUESTS],
        },
        "overlap": {
            "requests": OVERLAP_REQUESTS,
            "tokens": OVERLAP_TOKENS,
            "decode_requests": OVERLAP_DECODES,
            "ms": [[[r4(overlap(r, n, b)) for b in OVERLAP_DECODES] for n in OVERLAP_TOKENS] for r in OVERLAP_REQUESTS],
        },
    }


def random_step(rng: random.Random) -> StepShape:
    """A step as vLLM's scheduler makes them: a few prefill chunks (some over a cached prefix) beside a batch of
    decoding sequences, within an 8,192-token step budget."""
    step = StepShape()
    for _ in range(rng.choice([0, 0, 1, 1, 1, 2, 4, 8])):
        step.add_prefill(int(2 ** rng.uniform(0, 13) / max(1, step.prefill_requests)), int(2 ** rng.uniform(0, 15)))
    for _ in range(rng.choice([0, 1, 4, 16, 32, 64, 128, 256]) if step.prefill_requests else rng.randint(1, 512)):
        step.add_decode(int(2 ** rng.uniform(6, 15)))
    return step


def check(perf, table: TimingTable, points: int, seed: int = 0) -> dict:
    """How far the interpolated table strays from aisimulate on `points` random steps (relative error)."""
    rng = random.Random(seed)
    errors = []
    for _ in range(points):
        step = random_step(rng)
        truth = step_ms(
            perf,
            step.prefill_requests,
            step.prefill_tokens,
            step.prefill_cached,
            step.decode_requests,
            step.decode_context,
        )
        errors.append(abs(table.seconds(step) * 1000 - truth) / truth)
    errors.sort()
    return {
        "steps": points,
        "seed": seed,
        "median_relative_error": round(statistics.median(errors), 4),
        "p95_relative_error": round(errors[int(0.95 * (len(errors) - 1))], 4),
        "max_relative_error": round(errors[-1], 4),
    }


ANCHORS = {
    "prefill 2048": (1, 2048, 0, 0, 0),
    "prefill 512 over 2048 cached": (1, 512, 2048, 0, 0),
    "decode 32 at 4096": (0, 0, 0, 32, 32 * 4096),
    "decode 1 at 4096": (0, 0, 0, 1, 4096),
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="Qwen/Qwen3-8B", help="an architecture aisimulate ships")
    parser.add_argument("--system", default="h100_sxm", help="GPU system: h100_sxm, h200_sxm, ...")
    parser.add_argument("--backend", default="vllm")
    parser.add_argument("--backend-version", default="0.24.0", help="a framework version with collected data")
    parser.add_argument("--check-steps", type=int, default=2000)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)

    perf = perf_model(args.model, args.system, args.backend, args.backend_version)
    data = {
        "kind": "table",
        "model": args.model,
        "system": args.system,
        "backend": args.backend,
        "backend_version": args.backend_version,
        "source": f"aisimulate {version('aisimulate')} RustForwardPassPerfModel (NVIDIA's measured kernel data)",
        "command": "PYTHONPATH=. .simvenv/bin/python " + " ".join(["scripts/sim_timing_table.py", *sys.argv[1:]]),
        "anchors_ms": {name: round(step_ms(perf, *shape), 3) for name, shape in ANCHORS.items()},
        **tables(perf),
    }
    data["check"] = check(perf, TimingTable.from_json(data), args.check_steps)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(data, separators=(",", ":")) + "\n")
    print(json.dumps({k: data[k] for k in ("source", "anchors_ms", "check")}, indent=2))


if __name__ == "__main__":
    main()
