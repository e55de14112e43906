"""Transcripts: each agent trace's whole conversation, exactly as the harness sent it to the engine, kept by line.

A transcript's messages are the last step's prompt (the harness's system prompt listing the tools, the line's own
messages, every assistant tool call and tool result) followed by the model's last output, so rendering them with
the model's chat template gives the text the worker served, token for token. This is what improving the weights
trains on (`pronk.improve`): a passed trace kept whole. Opt-in: a `Harness` given no `TranscriptRecorder` keeps none.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Transcript:
    """One trace of a line's trace family (the root, or a fan-out child) as it ended."""

    custom_id: str
    trace_id: str
    parent_trace_id: str | None
    messages: list[dict[str, str]]
    """`{"role", "content"}` dicts, as the worker renders them with its chat template."""
    finish_reason: str
    answer: str

    @property
    def is_root(self) -> bool:
        return self.parent_trace_id is None


class TranscriptRecorder:
    """Holds a run's transcripts by line until `take_line` hands them over, like `StepRecorder` its step records."""

    def __init__(self) -> None:
        self._by_line: dict[str, list[Transcript]] = {}

    def add(self, transcript: Transcript) -> None:
        self._by_line.setdefault(transcript.custom_id, []).append(transcript)

    def take_line(self, custom_id: str) -> list[Transcript]:
        """The transcripts of one finished line, its root's last (children end before their parent)."""
        return self._by_line.pop(custom_id, [])
