"""Trace shapes: the skeleton of an agent trace (lengths, gaps, fan-out) without its content.

Replay mode runs a shape with fixed lengths (`ignore_eos`, `max_tokens`), so tests and benchmarks
get realistic, deterministic agent traffic whatever the model's weights say.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class ShapeStep(BaseModel):
    """One step: new prompt tokens appended to the trace's prefix, tokens generated, then a tool gap."""

    model_config = ConfigDict(extra="forbid")

    new_prompt_tokens: int = Field(
        ge=1, description="Tokens appended to the prefix before this generation (tool result, user turn)."
    )
    output_tokens: int = Field(ge=1, description="Tokens this step generates (exactly, in replay).")
    tool_gap_s: float = Field(default=0.0, ge=0, description="Seconds the tool call after this step takes.")
    fan_out: list[TraceShape] = Field(
        default_factory=list, description="Child traces spawned after this step; they start from this step's prefix."
    )


class TraceShape(BaseModel):
    model_config = ConfigDict(extra="forbid")

    trace_id: str = Field(min_length=1)
    system_prompt_tokens: int = Field(ge=1, description="Length of the prefix every step re-reads.")
    shared_prefix_tokens: int = Field(
        default=0,
        ge=0,
        description="How many of the system prompt's first tokens every trace of the workload shares (a common "
        "system or tool prompt): replay makes them the same tokens in every trace.",
    )
    steps: list[ShapeStep] = Field(min_length=1)

    @model_validator(mode="after")
    def _shared_prefix_within_system_prompt(self) -> TraceShape:
        if self.shared_prefix_tokens > self.system_prompt_tokens:
            raise ValueError("shared_prefix_tokens must not exceed system_prompt_tokens")
        return self

    def total_steps(self) -> int:
        return sum(1 + sum(child.total_steps() for child in step.fan_out) for step in self.steps)

    def total_output_tokens(self) -> int:
        return sum(step.output_tokens + sum(c.total_output_tokens() for c in step.fan_out) for step in self.steps)

    def longest_prompt(self, prefix: int = 0) -> int:
        """Prompt tokens of this trace's longest step, its fan-out included (replay's lengths are exact), when the
        trace starts after `prefix` tokens of its parent."""
        context = prefix + self.system_prompt_tokens
        longest = 0
        for step in self.steps:
            context += step.new_prompt_tokens
            longest = max(
                longest, context, *(child.longest_prompt(context + step.output_tokens) for child in step.fan_out)
            )
            context += step.output_tokens
        return longest


ShapeStep.model_rebuild()
