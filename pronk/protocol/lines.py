"""A batch line as validated (`ValidRequest`), and the lines of output and error files in OpenAI's batch format."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, Field

from pronk.protocol.bodies import ChatCompletionBody, ReplayBody
from pronk.protocol.checks import Check
from pronk.protocol.ids import new_id


@dataclass(slots=True)
class ValidRequest:
    """A line that passed validation: its 1-based number, custom id, parsed body and how its answer is checked."""

    line: int
    custom_id: str
    body: ChatCompletionBody | ReplayBody
    check: Check | None = None


class LineError(BaseModel):
    code: str
    message: str
    line: int | None = Field(default=None, description="1-based line number in the input file.")


class ResponseEnvelope(BaseModel):
    status_code: int
    request_id: str
    body: dict[str, Any]


class OutputLine(BaseModel):
    """One line of an output or error file, in OpenAI's batch format."""

    id: str = Field(default_factory=lambda: new_id("batch_req"))
    custom_id: str | None
    response: ResponseEnvelope | None = None
    error: LineError | None = None


def error_line(line: int, custom_id: str | None, code: str, message: str) -> OutputLine:
    """The error-file line for input line `line`; the message starts with the line number."""
    return OutputLine(custom_id=custom_id, error=LineError(code=code, message=f"line {line}: {message}", line=line))
