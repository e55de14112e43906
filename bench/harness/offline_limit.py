"""The offline limits' runner: the same token work on vLLM's offline engine, with no tool gaps and no serving
stack.

Each of the job's N worker cores gets one `LLM` process (the engine args a limit gives it, prefix caching on,
pinned like the worker of that index) and every N-th trace (`process_shares`). A process admits its traces in
order while their final contexts fit the capacity it is given together (and at most `max_traces` of them), admits
the next the moment a trace ends and frees its room, and sends each trace's next step the moment its last one ends
(fan-out children start after their parent's step). So every step finds its trace's prefix held (no preemption),
the engine's batch holds every admitted trace's step, and nothing waits on a tool, on a wave's slowest trace or on
a group's tail. What capacity and engine args each limit gets is `bench.harness.fleet`'s choice.

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
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from pronk.agents.replay import filler_tokens
from pronk.protocol.shapes import TraceShape


def final_context(shape: TraceShape) -> int:
    return shape.system_prompt_tokens + sum(s.new_prompt_tokens + s.output_tokens for s in shape.steps)


@dataclass(slots=True)
class _Chain:
    """One trace (a root or a fan-out child) being run: its root's id, its tokens so far and its next step."""

    trace_id: str
    root_id: str
    shape: TraceShape
    tokens: list[int]
    next: int = 0

    @property
    def request_id(self) -> str:
        return f"{self.trace_id}/{self.next}"


@dataclass(slots=True)
class _Family:
    """A root trace admitted and the chains of it (the root and its fan-out children) still running."""

    size: int
    live: int = 1


def process_shares(shapes: list[TraceShape], processes: int) -> list[list[TraceShape]]:
    """The shapes each of `processes` offline processes runs: every N-th one."""
    return [shapes[index::processes] for index in range(processes)]


def run_rolling(engine, shapes: list[TraceShape], capacity_tokens: int, max_traces: int | None = None) -> dict:
    """Every shape's steps in order on `engine` (vLLM's `LLMEngine`), a trace's next step sent the moment its last
    one ends; figures in the bench's terms.

    Root traces are admitted in order while their final contexts together fit `capacity_tokens` and there are at
    most `max_traces` of them (one at least); a root's room frees when it and every fan-out child of it have ended,
    and the next waiting roots are admitted at once. A fan-out child starts after its parent's step, on the parent's
    tokens, as the replay loop runs it (same trace ids, so the same token content); a root's end is its own last
    step.
    """
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    waiting = deque(shapes)
    running: dict[str, _Chain] = {}
    families: dict[str, _Family] = {}
    used = 0
    prompt_tokens = cached_tokens = output_tokens = steps = 0
    finished_s: list[float] = []

    def send(chain: _Chain) -> None:
        step = chain.shape.steps[chain.next]
        chain.tokens = chain.tokens + filler_tokens(f"{chain.trace_id}/{chain.next}", step.new_prompt_tokens)
        params = SamplingParams(
            max_tokens=step.output_tokens,
            ignore_eos=True,
            temperature=0.0,
            output_kind=RequestOutputKind.FINAL_ONLY,
        )
        running[chain.request_id] = chain
        engine.add_request(chain.request_id, TokensPrompt(prompt_token_ids=chain.tokens), params)

    def admit() -> None:
        nonlocal used
        while waiting:
            size = final_context(waiting[0])
            if families and (used + size > capacity_tokens or len(families) == max_traces):
                return
            shape = waiting.popleft()
            families[shape.trace_id] = _Family(size)
            used += size
            system = filler_tokens(f"{shape.trace_id}/system", shape.system_prompt_tokens)
            send(_Chain(shape.trace_id, shape.trace_id, shape, system))

    started = time.monotonic()
    admit()
    while running:
        for out in engine.step():
            if not out.finished:
                continue
            chain = running.pop(out.request_id)
            generated = list(out.outputs[0].token_ids)
            chain.tokens = chain.tokens + generated
            prompt_tokens += len(out.prompt_token_ids or [])
            cached_tokens += out.num_cached_tokens or 0
            output_tokens += len(generated)
            steps += 1
            family = families[chain.root_id]
            for i, child in enumerate(chain.shape.steps[chain.next].fan_out):
                child_id = f"{chain.trace_id}.{chain.next}.{i}"
                own = filler_tokens(f"{child_id}/system", child.system_prompt_tokens)
                family.live += 1
                send(_Chain(child_id, chain.root_id, child, chain.tokens + own))
            chain.next += 1
            if chain.next < len(chain.shape.steps):
                send(chain)
                continue
            if chain.trace_id == chain.root_id:
                finished_s.append(time.monotonic() - started)
            family.live -= 1
            if family.live == 0:
                used -= families.pop(chain.root_id).size
                admit()
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
    parser.add_argument(
        "--capacity-tokens", type=int, required=True, help="KV tokens the traces admitted at once may fill"
    )
    parser.add_argument("--max-traces", type=int, default=None, help="most traces admitted at once (default: no cap)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    from vllm import LLM

    from pronk.agents.replay import load_shapes

    llm = LLM(model=str(args.model), **json.loads(args.engine_args))
    args.out.write_text(
        json.dumps(run_rolling(llm.llm_engine, load_shapes(args.shapes), args.capacity_tokens, args.max_traces)) + "\n"
    )


if __name__ == "__main__":
    main()
