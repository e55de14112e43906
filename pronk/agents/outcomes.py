"""What running one batch line produced, typed: a completion (usage, version, workers, trace summary) or a failure.

The harness returns these; `pronk.batches.outputs` turns one into its output or error line, and the batch flow
counts usage and workers from them, so no one digs numbers back out of a response body.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Literal

from pronk.agents.step_records import TraceSummary

LineKind = Literal["chat", "agent", "replay"]
"""A plain one-step chat completion, an agent trace, or a replayed trace shape."""


@dataclass(slots=True)
class Usage:
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @classmethod
    def of(cls, summary: TraceSummary) -> Usage:
        return cls(summary.prompt_tokens, summary.cached_tokens, summary.output_tokens)


@dataclass(slots=True)
class Completion:
    """A line that completed. `worker_id` is the worker its body names; a trace's summary lists every worker."""

    kind: LineKind
    request_id: str
    model: str
    model_version: str
    worker_id: str
    usage: Usage
    text: str = ""
    finish_reason: str = "stop"
    queue_time_s: float = 0.0
    engine_time_s: float = 0.0
    trace_id: str = ""
    duration_s: float = 0.0
    summary: TraceSummary | None = None
    transcript: list[dict[str, str]] = field(default_factory=list)
    tool_calls: list[dict[str, Any]] | None = None
    """OpenAI's `tool_calls` of a client-tool line's answer (`pronk.agents.client_tools`); None: a text answer."""
    created: int = field(default_factory=lambda: int(time.time()))


@dataclass(slots=True)
class LineFailure:
    code: str
    message: str


@dataclass(slots=True)
class RequestOutcome:
    """One line's result: what it completed with, or why it failed."""

    line: int
    custom_id: str
    result: Completion | LineFailure

    @property
    def completion(self) -> Completion | None:
        return self.result if isinstance(self.result, Completion) else None
