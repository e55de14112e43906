"""The offline limits' runner: the same token work on vLLM's offline engine, with no tool gaps and no serving
stack.

Each of the job's N worker cores gets one `LLM` process (the engine args a limit gives it, prefix caching on,
pinned like the worker of that index), and all of them take traces, in order, from one queue (`TraceQueue`): the
next goes to a process with the most KV room left, as pronk's router sends a trace to the engine with the most
room. A process takes the next trace while the final contexts of those it holds fit the capacity it is given (and
at most `max_traces` of them), again as soon as a trace ends and frees its room, and sends each trace's next step
the moment its last one ends (fan-out children start after their parent's step). So every step finds its trace's
prefix held (no preemption), the engine's batch holds every admitted trace's step, and nothing waits on a tool, on
a wave's slowest trace, on a group's tail or on a share of traces fixed in advance. The processes start together
once every engine is loaded. What capacity and engine args each limit gets is `bench.harness.fleet`'s choice.

    python -m bench.harness.offline_limit --shapes S.jsonl --model DIR --engine-args JSON --capacity-tokens N \
        [--max-traces M] [--queue DIR --processes N --index I] --out OUT.json
"""

from __future__ import annotations

import argparse
import fcntl
import json
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from pronk.agents.replay import filler_tokens, system_tokens
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


class TraceQueue:
    """The shapes a limit's processes take their traces from, in order. The next goes to a process whose KV room
    left holds its final context and is no less than any other's, as pronk's router sends a trace to the engine
    with the most room. Between processes, the next index and each one's room are kept in the file `claims` (JSON,
    written by `share`) under an exclusive lock; a process alone keeps its index in memory."""

    def __init__(self, shapes: list[TraceShape], claims: Path | None = None, index: int = 0):
        self.shapes = shapes
        self.claims = claims
        self.index = index
        self._next = 0

    @staticmethod
    def share(claims: Path, processes: int) -> None:
        """Start the file `processes` take from: the first shape next, every process with all its room."""
        claims.write_text(json.dumps({"next": 0, "room": {str(i): math.inf for i in range(processes)}}))

    def take(self, room: float) -> TraceShape | None:
        """The next shape, taken, if its final context fits this process's `room` and no other has more (KV tokens
        free; infinite for a process that holds nothing, negative for one that may hold no more); None otherwise,
        or when none is left."""
        if self.claims is None:
            shape = self._fitting(self._next, room)
            if shape is not None:
                self._next += 1
            return shape
        with self.claims.open("r+") as file:
            fcntl.flock(file, fcntl.LOCK_EX)  # released when the file closes
            state = json.loads(file.read())
            state["room"][str(self.index)] = room
            most = max(state["room"].values())
            shape = self._fitting(state["next"], room) if room >= most else None
            if shape is not None:
                state["next"] += 1
            file.seek(0)
            file.write(json.dumps(state))
            file.truncate()
            return shape

    def _fitting(self, index: int, room: float) -> TraceShape | None:
        return self.shapes[index] if index < len(self.shapes) and final_context(self.shapes[index]) <= room else None


def start_together(folder: Path, index: int, processes: int, timeout_s: float = 600.0) -> None:
    """Mark process `index` ready in `folder` and wait until all `processes` are: the engines load at their own pace,
    and one that started taking traces first would take more than its share."""
    (folder / f"ready-{index}").touch()
    deadline = time.monotonic() + timeout_s
    while sum(1 for _ in folder.glob("ready-*")) < processes:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the other offline limit processes were not ready within {timeout_s:.0f} s")
        time.sleep(0.02)


def run_rolling(engine, queue: TraceQueue, capacity_tokens: int, max_traces: int | None = None) -> dict:
    """The steps of every shape this process takes from `queue`, in order on `engine` (vLLM's `LLMEngine`), a
    trace's next step sent the moment its last one ends; figures in the bench's terms.

    Root traces are taken while their final contexts together fit `capacity_tokens` and there are at most
    `max_traces` of them (one at least), each when no other process has more room (`TraceQueue`); a root's room
    frees when it and every fan-out child of it have ended. Every engine step looks for the next roots to take. A
    fan-out child starts after its parent's step, on the parent's tokens, as the replay loop runs it (same trace
    ids, so the same token content); a root's end is its own last step.
    """
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind

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

    def room() -> float:
        """The KV tokens this process may still take: a trace is taken where its final context fits them."""
        if not families:
            return math.inf
        return -1 if len(families) == max_traces else capacity_tokens - used

    def admit() -> None:
        nonlocal used
        while (shape := queue.take(room())) is not None:
            families[shape.trace_id] = _Family(final_context(shape))
            used += families[shape.trace_id].size
            send(_Chain(shape.trace_id, shape.trace_id, shape, system_tokens(shape.trace_id, shape)))

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
                family.live += 1
                send(_Chain(child_id, chain.root_id, child, chain.tokens + system_tokens(child_id, child)))
            chain.next += 1
            if chain.next < len(chain.shape.steps):
                send(chain)
                continue
            if chain.trace_id == chain.root_id:
                finished_s.append(time.monotonic() - started)
            family.live -= 1
            if family.live == 0:
                used -= families.pop(chain.root_id).size
        admit()  # every engine step: another process may have taken what did not fit here, or left it
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
    """The shapes run by one offline process per core set (pinned), all taking from one queue and starting
    together; their figures combined."""
    from bench.harness.baseline import pinned

    work_dir.mkdir(parents=True, exist_ok=True)
    queue = work_dir / "queue"
    queue.mkdir(exist_ok=True)
    for stale in queue.iterdir():
        stale.unlink()
    TraceQueue.share(queue / "claims", len(cores))
    all_shapes = work_dir / "limit-shapes.jsonl"
    all_shapes.write_text("".join(s.model_dump_json() + "\n" for s in shapes))
    procs = []
    for index, core_set in enumerate(cores):
        out = work_dir / f"limit-{index}.json"
        out.unlink(missing_ok=True)
        argv = [
            sys.executable,
            "-m",
            "bench.harness.offline_limit",
            "--shapes",
            str(all_shapes),
            "--model",
            str(model_dir),
            "--engine-args",
            json.dumps(engine_args),
            "--capacity-tokens",
            str(capacity_tokens),
            *(["--max-traces", str(max_traces)] if max_traces else []),
            "--queue",
            str(queue),
            "--processes",
            str(len(cores)),
            "--index",
            str(index),
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
    parser.add_argument(
        "--queue", type=Path, default=None, help="the folder of the queue shared with other processes (default: none)"
    )
    parser.add_argument("--processes", type=int, default=1, help="how many processes share the queue")
    parser.add_argument("--index", type=int, default=0, help="this process's index among them")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    from vllm import LLM

    from pronk.agents.replay import load_shapes

    llm = LLM(model=str(args.model), **json.loads(args.engine_args))
    queue = TraceQueue(load_shapes(args.shapes), args.queue / "claims" if args.queue else None, args.index)
    if args.queue:
        start_together(args.queue, args.index, args.processes)
    out = run_rolling(llm.llm_engine, queue, args.capacity_tokens, args.max_traces)
    args.out.write_text(json.dumps(out) + "\n")


if __name__ == "__main__":
    main()
