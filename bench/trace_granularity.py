"""Prefect granularity for traces: one task run per chunk of traces vs one per trace, on the real stack, and what
the sampled trace DAGs drawn after a batch add to its wall time.

Runs the same batch of replay traces through the `run-batch` flow, after one warm-up run, alternating
`chunk_size=1` (a task run per trace) and the default `chunk_size=64`, both with no sample drawn, and the
default chunks with the default sample (`trace_sample=10`); reports the flow run's wall time, how long after
it returned the sample's drawer had drawn the sample (the next run starts only then), task runs created, task
runs per second, and how many task runs the Prefect server still shows unfinished right after the flow returns
(its recording lag). Uses the stack of `PRONK_DATA_DIR` (start it with `pronk stack up`).

    .venv/bin/python -m bench.trace_granularity [--traces 200] [--steps 2] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path
from uuid import UUID

JOB = "job-c0ffee01"


def write_batch(path: Path, traces: int, steps: int) -> None:
    lines = []
    for i in range(traces):
        shape = {
            "trace_id": f"g{i}",
            "system_prompt_tokens": 64,
            "steps": [{"new_prompt_tokens": 16, "output_tokens": 4, "tool_gap_s": 0.05} for _ in range(steps - 1)]
            + [{"new_prompt_tokens": 16, "output_tokens": 4}],
        }
        lines.append(
            json.dumps(
                {
                    "custom_id": f"g{i}",
                    "method": "POST",
                    "url": "/v1/pronk/replay",
                    "body": {"model": "pronk-tiny", "shape": shape},
                }
            )
        )
    path.write_text("\n".join(lines) + "\n")


async def task_run_states(flow_run_id: str) -> dict[str, int]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterId,
        TaskRunFilter,
    )

    runs: list = []
    async with get_client() as client:
        while True:
            page = await client.read_task_runs(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[UUID(flow_run_id)])),
                task_run_filter=TaskRunFilter(),
                limit=200,
                offset=len(runs),
            )
            runs += page
            if len(page) < 200:
                break
    states: dict[str, int] = {}
    for run in runs:
        name = (run.state.name if run.state else None) or "none"
        states[name] = states.get(name, 0) + 1
    return states


async def sample_drawn(flow_run_id: str, deadline_s: float = 300.0) -> float | None:
    """Seconds until the sample's drawer has published the sample's markdown (its last act), polled every 0.25 s."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    started = time.monotonic()
    artifact_filter = ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[UUID(flow_run_id)]))
    async with get_client() as client:
        while time.monotonic() - started < deadline_s:
            if [a for a in await client.read_artifacts(artifact_filter=artifact_filter) if a.type == "markdown"]:
                return time.monotonic() - started
            await asyncio.sleep(0.25)
    return None


async def one(input_path: Path, out: Path, chunk_size: int, trace_sample: int) -> dict:
    from flows.batch import run_batch

    started = time.monotonic()
    batch = await run_batch(
        input_uri=str(input_path), job_id=JOB, output_dir=str(out), chunk_size=chunk_size, trace_sample=trace_sample
    )
    elapsed = time.monotonic() - started
    states = await task_run_states(batch["flow_run_id"])
    drawn_after = await sample_drawn(batch["flow_run_id"]) if trace_sample else None  # the next run starts after it
    await asyncio.sleep(5)
    settled = await task_run_states(batch["flow_run_id"])
    total = sum(settled.values())
    return {
        "chunk_size": chunk_size,
        "trace_sample": trace_sample,
        "traces": batch["request_counts"]["completed"],
        "seconds": round(elapsed, 3),
        "sample_drawn_after_s": None if drawn_after is None else round(drawn_after, 3),
        "task_runs": total,
        "task_runs_per_s": round(total / elapsed, 2),
        "unfinished_at_return": sum(v for k, v in states.items() if k not in {"Completed"}),
        "unfinished_after_5s": sum(v for k, v in settled.items() if k not in {"Completed"}),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=int, default=200)
    parser.add_argument("--steps", type=int, default=2, help="steps per trace")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each variant, alternating")
    args = parser.parse_args()
    from pronk.settings import get_settings
    from pronk.stack.prefect_env import configure_prefect

    configure_prefect(get_settings())
    folder = Path(tempfile.mkdtemp(prefix="pronk-granularity-"))
    write_batch(folder / "input.jsonl", args.traces, args.steps)
    asyncio.run(one(folder / "input.jsonl", folder / "warmup", 64, 0))
    variants = [(1, 0), (64, 0), (64, 10)] * args.rounds
    for n, (chunk_size, sample) in enumerate(variants):
        print(json.dumps(asyncio.run(one(folder / "input.jsonl", folder / f"out{n}", chunk_size, sample))), flush=True)


if __name__ == "__main__":
    main()
