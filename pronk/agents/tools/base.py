"""What every agent tool shares: the `Tool` protocol, the context a call runs in, its outcome, and `ToolError`.

The tool modules (python, sql, search) and the registry in `pronk.agents.tools` both import these from here, so no
tool module imports the package that loads it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from pronk.pronk_error import PronkError


class ToolError(PronkError):
    """A tool call that failed in an expected way; the message is what the model sees."""


@dataclass(slots=True)
class ToolContext:
    trace_id: str
    scratch_dir: Path


class Tool(Protocol):
    name: str
    description: str
    parameters: dict[str, Any]

    async def run(self, arguments: dict[str, Any], context: ToolContext) -> str: ...


@dataclass(slots=True)
class ToolOutcome:
    ok: bool
    text: str
    seconds: float
