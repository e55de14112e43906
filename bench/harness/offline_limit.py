"""The offline limits' wave runner: the same token work on vLLM's offline engine, with no tool gaps and no serving
stack.

Each of the job's N worker cores gets one `LLM` process (the engine args a limit gives it, prefix caching on,
pinned like the worker of that index) and every N-th trace (`process_shares`). A process runs its traces in groups
whose final contexts fit the capacity it is given together (and of at most `max_traces` traces), and a group in
waves: every trace's step k in one `generate` call, then step k+1 with the outputs appended (fan-out children join
the wave after their parent's step). So every step finds its trace's prefix held (no preemption, batches as full
as the group allows) and nothing waits on a tool. What capacity and engine args each limit gets is
`bench.harness.fleet`'s choice.

    python -m bench.harness.offline_limit --shapes S.jsonl --model DIR --engine-args JSON --capacity-tokens N \
        [--max-traces M] --out OUT.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from pronk.agents.replay import filler_tokens
from pronk.protocol.shapes import TraceShape


def final_context(shape: TraceShape) -> int:
    return shape.system_prompt_tokens + sum(s.new_prompt_tokens + s.output_tokens for s in shape.steps)


def fitting_groups(
    shapes: list[TraceShape], capacity_tokens: int, max_traces: int | None = None
) -> list[list[TraceShape]]:
    """Consecutive shapes grouped while their final contexts together fit `capacity_tokens` and there are at most
    `max_traces` of them (one at least)."""
    groups: list[list[TraceShape]] = []
    used = 0
    for shape in shapes:
        size = final_context(shape)
        if not groups or used + size > capacity_tokens or len(groups[-1]) == max_traces:
            groups.append([])
            used = 0
        groups[-1].append(shape)
        used += size
    return groups


@dataclass(slots=True)
class _Chain:
    """One trace (a root or a fan-out child) being run: its tokens so far and its next step."""

    trace_id: str
    shape: TraceShape
    tokens: list[int]
    root: bool
    next: int = 0


def process_shares(shapes: list[TraceShape], processes: int) -> list[list[TraceShape]]:
    """The shapes each of `processes` offline processes runs: every N-th one."""
    return [shapes[index::processes] for index in range(processes)]


def run_waves(llm, shapes: list[TraceShape], capacity_tokens: int, max_traces: int | None = None) -> dict:
    """Every shape's steps in order, group by group, wave by wave; figures in the bench's terms.

    A fan-out child joins the wave after its parent's step, on the parent's tokens, as the replay loop
    runs it (same trace ids, so the same token content); a root's end is its own last step.
    """
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    prompt_tokens = cached_tokens = output_tokens = steps = 0
    finished_s: list[float] = []
    started = time.monotonic()
    for group in fitting_groups(shapes, capacity_tokens, max_traces):
        chains = [
            _Chain(s.trace_id, s, filler_tokens(f"{s.trace_id}/system", s.system_prompt_tokens), root=True)
            for s in group
        ]
        while live := [c for c in chains if c.next < len(c.shape.steps)]:
            prompts, params = [], []
            for c in live:
                step = c.shape.steps[c.next]
                c.tokens = c.tokens + filler_tokens(f"{c.trace_id}/{c.next}", step.new_prompt_tokens)
                prompts.append(TokensPrompt(prompt_token_ids=c.tokens))
                params.append(SamplingParams(max_tokens=step.output_tokens, ignore_eos=True, temperature=0.0))
            outputs = llm.generate(prompts, params, use_tqdm=False)
            now = time.monotonic() - started
            for c, out in zip(live, outputs, strict=True):
                generated = list(out.outputs[0].token_ids)
                c.tokens = c.tokens + generated
                prompt_tokens += len(out.prompt_token_ids or [])
                cached_tokens += out.num_cached_tokens or 0
                output_tokens += len(generated)
                steps += 1
                for i, child in enumerate(c.shape.steps[c.next].fan_out):
                    child_id = f"{c.trace_id}.{c.next}.{i}"
                    own = filler_tokens(f"{child_id}/system", child.system_prompt_tokens)
                    chains.append(_Chain(child_id, child, c.tokens + own, root=False))
                c.next += 1
                if c.root and c.next == len(c.shape.steps):
                    finished_s.append(now)
    return {
        "wall_s": time.monotonic() - started,
        "traces": len(finished_s),
        "steps": steps,
        "prompt_tokens": prompt_tokens,
        "cached_tokens": cached_tokens,
        "output_tokens": output_tokens,
        "finished_s": finished_s,
    }


def run_limit(
    shapes: list[TraceShape],
    model_dir: Path,
    engine_args: dict,
    capacity_tokens: int,
    cores: list[list[int]],
    work_dir: Path,
    max_traces: int | None = None,
    timeout_s: float = 3600.0,
) -> dict:
    """The shapes split over one offline process per core set (pinned), run at once; their figures combined."""
    from bench.harness.baseline import pinned

    work_dir.mkdir(parents=True, exist_ok=True)
    procs = []
    for index, (core_set, share) in enumerate(zip(cores, process_shares(shapes, len(cores)), strict=True)):
        part = work_dir / f"limit-shapes-{index}.jsonl"
        part.write_text("".join(s.model_dump_json() + "\n" for s in share))
        out = work_dir / f"limit-{index}.json"
        out.unlink(missing_ok=True)
        argv = [
            sys.executable,
            "-m",
            "bench.harness.offline_limit",
            "--shapes",
            str(part),
            "--model",
            str(model_dir),
            "--engine-args",
            json.dumps(engine_args),
            "--capacity-tokens",
            str(capacity_tokens),
            *(["--max-traces", str(max_traces)] if max_traces else []),
            "--out",
            str(out),
        ]
        argv, env = pinned(argv, core_set)
        log = open(work_dir / f"limit-{index}.log", "ab")  # noqa: SIM115 - closed after the process ends
        procs.append(
            (subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **env}), out, log)
        )
    results = []
    try:
        for proc, out, _ in procs:
            if proc.wait(timeout=timeout_s) != 0:
                raise RuntimeError(f"offline limit exited {proc.returncode}; see {work_dir}")
            results.append(json.loads(out.read_text()))
    finally:
        for proc, _, log in procs:
            if proc.poll() is None:
                proc.kill()
            log.close()
    combined = {key: sum(r[key] for r in results) for key in ("traces", "steps", "prompt_tokens", "cached_tokens")}
    combined["output_tokens"] = sum(r["output_tokens"] for r in results)
    combined["wall_s"] = max(r["wall_s"] for r in results)
    combined["finished_s"] = sorted(t for r in results for t in r["finished_s"])
    return combined


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", type=Path, required=True)
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--engine-args", required=True, help="the job's engine args as JSON")
    parser.add_argument("--capacity-tokens", type=int, required=True, help="KV tokens a group of traces may fill")
    parser.add_argument("--max-traces", type=int, default=None, help="most traces in a group (default: no cap)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    from vllm import LLM

    from pronk.agents.replay import load_shapes

    llm = LLM(model=str(args.model), **json.loads(args.engine_args))
    args.out.write_text(
        json.dumps(run_waves(llm, load_shapes(args.shapes), args.capacity_tokens, args.max_traces)) + "\n"
    )


if __name__ == "__main__":
    main()
