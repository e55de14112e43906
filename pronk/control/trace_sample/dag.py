"""A sampled trace family as a DAG: one node per step and one per tool call, linked as they ran.

Step → its tool → the next step; a `spawn_subagents` (or replayed `fan_out`) tool starts its children's first steps
as parallel branches, and the parent's next step waits for the children's last nodes. Prefect-free: `drawing` turns
the nodes into task runs, and MLflow gets the same sample's step records as traces.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from pronk.agents.step_records import StepRecord

NAME_CHARS = 48
"""Longest trace id a node's name shows (custom ids are hostile input: bounded and printable only)."""


def readable(text: str, limit: int = NAME_CHARS) -> str:
    """A trace id fit for a task run's name: printable characters only, at most `limit` of them."""
    clean = "".join(c if c.isprintable() else "?" for c in text)
    return clean if len(clean) <= limit else clean[: limit - 1] + "…"


@dataclass(slots=True)
class DagNode:
    """One task run of a sampled trace's DAG: a step or the tool call that followed it."""

    key: str
    name: str
    kind: str
    """`step` or `tool`."""
    trace_id: str
    step: int
    upstream: list[str] = field(default_factory=list)
    figures: dict[str, object] = field(default_factory=dict)
    failed: bool = False
    started_at: float = 0.0
    """When it ran, in seconds since the epoch: a step from its first attempt's start to its last attempt's end,
    its tool call from there for the tool's time (the step records' own convention, as in MLflow's spans)."""
    ended_at: float = 0.0

    @property
    def summary(self) -> str:
        """Every figure in one line: the message of the task run's final state."""
        f = self.figures
        if self.kind == "tool":
            text = f"{f['tool']} {'ok' if f['ok'] else 'failed'} in {f['tool_time_s']:.3f} s"
            text += f", {f['children']} child traces" if f.get("children") else ""
        else:
            text = (
                f"prompt {f['prompt_tokens']} tokens ({f['cached_tokens']} cached), {f['output_tokens']} out; "
                f"worker {f['worker'] or '-'}, model {f['model_version'] or '-'}; queue {f['queue_time_s']:.3f} s, "
                f"engine {f['engine_time_s']:.3f} s; attempts {f['attempts']}"
            )
        return text + (f"; error: {f['error']}" if f.get("error") else "")


def _final_attempts(records: Sequence[StepRecord]) -> dict[tuple[str, int], list[StepRecord]]:
    """Each step's attempts, in order (a retried step has several records, its last one is the step)."""
    attempts: dict[tuple[str, int], list[StepRecord]] = {}
    for r in sorted(records, key=lambda r: (r.trace_id, r.step, r.attempt)):
        attempts.setdefault((r.trace_id, r.step), []).append(r)
    return attempts


def _step_figures(tries: list[StepRecord]) -> dict[str, object]:
    last = tries[-1]
    figures: dict[str, object] = {
        "trace_id": last.trace_id,
        "step": last.step,
        "worker": last.worker_id,
        "model_version": last.model_version,
        "prompt_tokens": last.prompt_tokens,
        "cached_tokens": last.cached_tokens,
        "output_tokens": last.output_tokens,
        "queue_time_s": last.queue_time_s,
        "engine_time_s": last.engine_time_s,
        "finish_reason": last.finish_reason,
        "attempts": len(tries),
    }
    if last.error and last.tool_name is None:
        figures["error"] = last.error[:300]
    return figures


def _parent_step(child: str, parent: str) -> int | None:
    """The parent's step that spawned `child`: children are named `<parent>.<step>.<i>` by the harness and replay."""
    head = child[len(parent) + 1 :].split(".", 1)[0] if child.startswith(parent + ".") else ""
    return int(head) if head.isdigit() else None


def trace_dag(records: Sequence[StepRecord]) -> list[DagNode]:
    """The DAG of one trace family (a root trace and its children), in an order where upstream nodes come first."""
    attempts = _final_attempts(records)
    traces: dict[str, list[tuple[int, list[StepRecord]]]] = {}
    for (trace_id, step), tries in attempts.items():
        traces.setdefault(trace_id, []).append((step, tries))
    parents = {t: steps[0][1][-1].parent_trace_id for t, steps in traces.items()}
    children: dict[tuple[str, int], list[str]] = {}
    for trace_id, parent in parents.items():
        spawned_at = _parent_step(trace_id, parent) if parent is not None and parent in traces else None
        if parent is not None and spawned_at is not None:
            children.setdefault((parent, spawned_at), []).append(trace_id)
    nodes: dict[str, DagNode] = {}
    """Each node is added after its upstream nodes, so this order is one the DAG can be drawn in."""
    tails: dict[str, str] = {}
    """Each trace's last node, once drawn: what a parent's next step waits for."""

    def draw(trace_id: str, first_upstream: list[str]) -> None:
        upstream = first_upstream
        name = readable(trace_id)
        for step, tries in sorted(traces[trace_id], key=lambda s: s[0]):
            last = tries[-1]
            key = f"{trace_id}/{step}"
            started = tries[0].started_at
            step_end = max(started, last.started_at + last.engine_time_s)
            tool = last.tool_name
            label = tool or ("error" if last.error else (last.finish_reason or "final"))
            nodes[key] = DagNode(
                key,
                f"{name} step {step}: {label}",
                "step",
                trace_id,
                step,
                upstream,
                _step_figures(tries),
                failed=bool(last.error) and tool is None,
                started_at=started,
                ended_at=step_end,
            )
            upstream = [key]
            if tool is None:
                continue
            tool_key = f"{key}/tool"
            kids = children.get((trace_id, step), [])
            nodes[tool_key] = DagNode(
                tool_key,
                f"{name} step {step} tool: {readable(tool, 32)}",
                "tool",
                trace_id,
                step,
                [key],
                {
                    "trace_id": trace_id,
                    "step": step,
                    "tool": tool,
                    "ok": bool(last.tool_ok),
                    "tool_time_s": last.tool_time_s,
                    "children": len(kids),
                    **({"error": last.error[:300]} if last.error else {}),
                },
                failed=last.tool_ok is False,
                started_at=step_end,
                ended_at=step_end + last.tool_time_s,
            )
            for kid in kids:
                draw(kid, [tool_key])
            upstream = [tool_key] + [tails[k] for k in kids if k in tails]
        if upstream:
            tails[trace_id] = upstream[0]

    for trace_id in sorted(traces):  # a parent sorts before its children, which it draws: what is left are roots
        if f"{trace_id}/{min(s for s, _ in traces[trace_id])}" not in nodes:
            draw(trace_id, [])
    return list(nodes.values())  # in drawing order: every node after its upstream nodes
