"""The benchmark's workload: seeded agent trace shapes, their token content, a single-step batch file, and the
labelled set's real agent tasks made into long-context traces (`labelled_traces`, the `agent-real` profiles).

Where the ranges come from (the `reference` profile; GPU-sized):

- steps per trace 8–30: SWE-bench agent runs (SWE-agent, OpenHands) take tens of turns, BFCL
  multi-turn tasks a handful to ~20; 8–30 covers the body of both. Estimated from published
  summaries, not measured from a trace dump here.
- new prompt tokens per step 100–1,500, log-uniform: each step appends a tool result (a file
  view, a test log, a search hit list) or a short user turn; tool results are heavy-tailed.
  Estimated.
- output tokens per step 20–300, log-uniform: agents emit a short thought plus one tool call;
  the Continuum paper (tool-call gaps in SWE-bench/BFCL traces) describes the same
  long-input/short-output character. Estimated.
- tool-call gaps 0.05–2 s, log-uniform: a grep or a SQL query returns in tens of ms, a test run
  or a web call in seconds; Continuum reports gaps of this order dominating idle time. Estimated.
- fan-out: a few traces (15%) spawn 2–4 subagents of 2–6 steps each from their current prefix,
  as research agents and SWE "explore" subagents do. Estimated.
- system prompt plus tool schemas 1,000–4,000 tokens (typical for tool-using agents).

`agent-long` is the prefill-dominated regime of a GPU agent fleet (system 2–4k, +300–1,500 per step,
8–32 out, 6–12 steps, contexts up to 16k), run on the tiny model with 16k positions.

The tiny CPU model has `max_model_len` 4,096, so the `cpu` profile scales the token ranges down
(system 200–600, new 30–300, output 16–128, 8–20 steps) and caps every trace's context at
`max_context_tokens`: a trace stops adding steps before it would pass the cap (the generator
counts how many were cut). Gaps keep their real range: they are what gap-KV policy is about.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from pronk.protocol.bodies import ChatCompletionBody
from pronk.protocol.lines import ValidRequest
from pronk.protocol.shapes import ShapeStep, TraceShape
from pronk.settings import PROJECT_ROOT


class WorkloadProfile(BaseModel):
    """Ranges a workload is drawn from; every `(low, high)` pair is inclusive."""

    model_config = ConfigDict(extra="forbid")

    name: str
    traces: int = Field(ge=1, description="Root traces in the workload.")
    steps: tuple[int, int] = Field(description="Steps per root trace.")
    system_prompt_tokens: tuple[int, int] = Field(description="System prompt plus tool schemas.")
    new_prompt_tokens: tuple[int, int] = Field(description="Tokens a step appends (log-uniform).")
    output_tokens: tuple[int, int] = Field(description="Tokens a step generates (log-uniform).")
    tool_gap_s: tuple[float, float] = Field(description="Tool-call gap after a step (log-uniform).")
    fan_out_share: float = Field(ge=0, le=1, description="Share of root traces that fan out once.")
    children: tuple[int, int] = Field(description="Child traces per fan-out.")
    child_steps: tuple[int, int] = Field(description="Steps per child trace.")
    child_prompt_tokens: tuple[int, int] = Field(description="A child's own instructions, after the parent's prefix.")
    max_context_tokens: int = Field(ge=64, description="Cap on prompt plus output of any step (the model's context).")


PROFILES: dict[str, WorkloadProfile] = {
    "reference": WorkloadProfile(
        name="reference",
        traces=200,
        steps=(8, 30),
        system_prompt_tokens=(1000, 4000),
        new_prompt_tokens=(100, 1500),
        output_tokens=(20, 300),
        tool_gap_s=(0.05, 2.0),
        fan_out_share=0.15,
        children=(2, 4),
        child_steps=(2, 6),
        child_prompt_tokens=(50, 300),
        max_context_tokens=128_000,
    ),
    "cpu": WorkloadProfile(
        name="cpu",
        traces=48,
        steps=(8, 20),
        system_prompt_tokens=(200, 600),
        new_prompt_tokens=(30, 300),
        output_tokens=(16, 128),
        tool_gap_s=(0.05, 2.0),
        fan_out_share=0.15,
        children=(2, 4),
        child_steps=(2, 4),
        child_prompt_tokens=(20, 100),
        max_context_tokens=3840,
    ),
    # Prefill-dominated as on a GPU (bench/RESULTS.md "Calibration": recomputing a ~6k context costs
    # 17x decoding a step's 24 tokens alone on these CPUs, 89x its share of a 16-sequence batch). Run with
    # the `agent-long` job (16k positions through hf_overrides). No fan-out, so every trace is one chain.
    "agent-long": WorkloadProfile(
        name="agent-long",
        traces=30,
        steps=(6, 12),
        system_prompt_tokens=(2000, 4000),
        new_prompt_tokens=(300, 1500),
        output_tokens=(8, 32),
        tool_gap_s=(0.05, 2.0),
        fan_out_share=0.0,
        children=(0, 0),
        child_steps=(1, 1),
        child_prompt_tokens=(0, 0),
        max_context_tokens=16000,
    ),
    "smoke": WorkloadProfile(
        name="smoke",
        traces=4,
        steps=(2, 3),
        system_prompt_tokens=(64, 128),
        new_prompt_tokens=(16, 64),
        output_tokens=(8, 16),
        tool_gap_s=(0.05, 0.2),
        fan_out_share=0.5,
        children=(2, 2),
        child_steps=(1, 2),
        child_prompt_tokens=(8, 16),
        max_context_tokens=1024,
    ),
}


class _Draw:
    def __init__(self, seed: int):
        self.rng = random.Random(seed)

    def uniform_int(self, bounds: tuple[int, int]) -> int:
        return self.rng.randint(*bounds)

    def log_int(self, bounds: tuple[int, int]) -> int:
        return max(bounds[0], min(bounds[1], round(self.log_float((float(bounds[0]), float(bounds[1]))))))

    def log_float(self, bounds: tuple[float, float]) -> float:
        low, high = bounds
        return round(math.exp(self.rng.uniform(math.log(low), math.log(high))), 3)


class Workload(BaseModel):
    """The drawn shapes and what the context cap did to them."""

    profile: WorkloadProfile
    seed: int
    shapes: list[TraceShape]
    steps_cut_by_cap: int = Field(description="Steps dropped because the trace would pass max_context_tokens.")

    def total_steps(self) -> int:
        return sum(shape.total_steps() for shape in self.shapes)

    def total_output_tokens(self) -> int:
        return sum(shape.total_output_tokens() for shape in self.shapes)


def _steps(
    draw: _Draw, profile: WorkloadProfile, count: int, context: int, budget: int, fan_out_at: int | None, prefix: str
) -> tuple[list[ShapeStep], int, int]:
    """Up to `count` steps that keep the context under `budget`; returns (steps, context, steps cut)."""
    steps: list[ShapeStep] = []
    for index in range(count):
        new, out = draw.log_int(profile.new_prompt_tokens), draw.log_int(profile.output_tokens)
        if context + new + out > budget:
            return steps, context, count - index
        context += new + out
        children: list[TraceShape] = []
        if index == fan_out_at:
            for c in range(draw.uniform_int(profile.children)):
                own = draw.uniform_int(profile.child_prompt_tokens)
                child_steps, _, _ = _steps(
                    draw,
                    profile,
                    draw.uniform_int(profile.child_steps),
                    context + own,
                    profile.max_context_tokens,
                    None,
                    "",
                )
                if child_steps:
                    children.append(TraceShape(trace_id=f"{prefix}.c{c}", system_prompt_tokens=own, steps=child_steps))
        steps.append(
            ShapeStep(
                new_prompt_tokens=new,
                output_tokens=out,
                tool_gap_s=draw.log_float(profile.tool_gap_s),
                fan_out=children,
            )
        )
    return steps, context, 0


def generate(profile: WorkloadProfile | str, seed: int = 0, traces: int | None = None) -> Workload:
    """Draw `traces` root shapes (default: the profile's) reproducibly from `seed`."""
    profile = PROFILES[profile] if isinstance(profile, str) else profile
    draw = _Draw(seed)
    shapes, cut = [], 0
    for t in range(traces or profile.traces):
        trace_id = f"trace-{seed}-{t:04d}"
        system = draw.uniform_int(profile.system_prompt_tokens)
        count = draw.uniform_int(profile.steps)
        fan_out_at = draw.rng.randrange(max(1, count // 2)) if draw.rng.random() < profile.fan_out_share else None
        steps, _, dropped = _steps(draw, profile, count, system, profile.max_context_tokens, fan_out_at, trace_id)
        cut += dropped
        steps[-1] = steps[-1].model_copy(update={"tool_gap_s": 0.0})
        shapes.append(TraceShape(trace_id=trace_id, system_prompt_tokens=system, steps=steps))
    return Workload(profile=profile, seed=seed, shapes=shapes, steps_cut_by_cap=cut)


def write_shapes(workload: Workload, path: Path) -> Path:
    """One `TraceShape` JSON object per line."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(shape.model_dump_json() + "\n" for shape in workload.shapes))
    return path


def single_step_lines(
    count: int,
    model: str,
    seed: int = 0,
    prompt_words: tuple[int, int] = (40, 400),
    max_tokens: tuple[int, int] = (16, 128),
) -> list[dict]:
    """OpenAI batch lines of one chat completion each (greedy, so both runners generate the same text)."""
    rng = random.Random(seed)
    words = [
        "agent",
        "tool",
        "trace",
        "step",
        "prefix",
        "cache",
        "worker",
        "batch",
        "router",
        "engine",
        "model",
        "token",
        "query",
        "table",
        "result",
    ]
    lines = []
    for i in range(count):
        text = " ".join(rng.choice(words) for _ in range(rng.randint(*prompt_words)))
        body = {
            "model": model,
            "messages": [{"role": "system", "content": "You summarise records."}, {"role": "user", "content": text}],
            "max_tokens": rng.randint(*max_tokens),
            "temperature": 0.0,
        }
        lines.append(
            {"custom_id": f"single-{seed}-{i:05d}", "method": "POST", "url": "/v1/chat/completions", "body": body}
        )
    return lines


def write_single_step_file(path: Path, count: int, model: str, seed: int = 0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(line) + "\n" for line in single_step_lines(count, model, seed)))
    return path


def cache_bounds(workload: Workload, block_size: int) -> tuple[float, float]:
    """(mean final context of a root trace, the cached-token ratio if no KV were ever evicted).

    With no eviction a step finds cached every full block of what its trace (or its parent, for a
    child's first step) had read and written before; vLLM always recomputes a prompt's last token.
    """
    prompt_total = cached_total = 0
    finals = []

    def walk(shape: TraceShape, context: int) -> int:
        nonlocal prompt_total, cached_total
        seen = context
        context += shape.system_prompt_tokens
        for step in shape.steps:
            context += step.new_prompt_tokens
            prompt_total += context
            cached_total += min(seen, context - 1) // block_size * block_size
            context += step.output_tokens
            seen = context
            for child in step.fan_out:
                walk(child, context)
        return context

    for shape in workload.shapes:
        finals.append(walk(shape, 0))
    return sum(finals) / len(finals), cached_total / prompt_total


class LabelledProfile(BaseModel):
    """Real agent traces: the job's labelled lines, each trace given a document of its own to read first."""

    model_config = ConfigDict(extra="forbid")

    name: str
    traces: int = Field(ge=1, description="Traces per round, drawn from the labelled lines.")
    document_tokens: tuple[int, int] = Field(description="Length of a trace's document, drawn uniformly.")


LABELLED_PROFILES: dict[str, LabelledProfile] = {
    # 24 traces: 3x the `agent-real` job's 8 in flight. A document of 900-2,400 tokens after the ~450 of the harness's
    # prompt and the task puts a trace's first prompt at ~1.4-2.9k tokens (~2.2k on average), and its last (a tool
    # result and an answer or two later) at up to ~3.7k, under the job's 4,096-token cache.
    "agent-real": LabelledProfile(name="agent-real", traces=24, document_tokens=(900, 2400)),
    "agent-real-smoke": LabelledProfile(name="agent-real-smoke", traces=4, document_tokens=(100, 300)),
}

CHARS_PER_TOKEN = 3.25
"""What one SmolLM2 token holds of the documents' text (corpus prose and table rows), measured with its tokenizer."""

DOCUMENT_SOURCES = (PROJECT_ROOT / "data" / "corpus", PROJECT_ROOT / "data" / "tables")


def document_pieces() -> list[str]:
    """The paragraphs of the corpus and the rows of the tables (each row under its table's header)."""
    pieces = []
    for path in sorted(p for folder in DOCUMENT_SOURCES for p in folder.iterdir() if p.is_file()):
        text = path.read_text()
        if path.suffix == ".csv":
            header, *rows = text.splitlines()
            pieces += [f"{path.stem}: {header}\n{row}" for row in rows if row.strip()]
        else:
            pieces += [p.strip() for p in text.split("\n\n") if p.strip()]
    return pieces


def document(rng: random.Random, pieces: list[str], chars: int) -> str:
    """`chars` characters of the pieces in an order of `rng`'s, shuffled again each time they run out."""
    parts: list[str] = []
    length = 0
    while length < chars:
        batch = pieces[:]
        rng.shuffle(batch)
        parts += batch
        length += sum(len(p) + 2 for p in batch)
    return "\n\n".join(parts)[:chars]


def labelled_traces(
    lines: list[ValidRequest], profile: LabelledProfile, seed: int, traces: int | None = None
) -> list[ValidRequest]:
    """`traces` agent lines drawn reproducibly from `seed`: the labelled lines shuffled (again after each pass), each
    trace's first message (the line's system message) led by a document of its own, so its every step re-reads
    thousands of tokens. The task, its tools and its check are the line's; the custom id names the round and the
    trace."""
    rng = random.Random(seed)
    pieces = document_pieces()
    order: list[ValidRequest] = []
    out = []
    for index in range(traces or profile.traces):
        if not order:
            order = lines[:]
            rng.shuffle(order)
        line = order.pop()
        body = line.body
        if not isinstance(body, ChatCompletionBody):
            raise ValueError(f"labelled line {line.custom_id} is no chat completion")
        chars = round(rng.randint(*profile.document_tokens) * CHARS_PER_TOKEN)
        reading = f"Background reading:\n\n{document(rng, pieces, chars)}\n\n"
        first, *rest = body.messages
        messages = [first.model_copy(update={"content": reading + first.text()}), *rest]
        out.append(
            dataclasses.replace(
                line,
                custom_id=f"r{seed}-t{index:03d}-{line.custom_id}",
                body=body.model_copy(update={"messages": messages}),
            )
        )
    return out


def relabelled(lines: list[ValidRequest], label: str) -> list[ValidRequest]:
    """The same lines under custom ids (trace ids) of the setup's own."""
    return [dataclasses.replace(line, custom_id=f"{label}-{line.custom_id}") for line in lines]
