"""A batch's finished lines, persisted as they finish, so a crashed run loses at most what was in flight.

Each run of a batch appends numbered part objects (`results/<batch>/<run>-<seq>.jsonl`, one finished
line per row) and keeps one accounting object (`results/<batch>/runs/<run>.json`: the worker time it
held). S3 has no append, so a part is never rewritten: a run writes the next number instead. A run
started again for the same batch reads every part and runs only the lines none of them holds; the
final output and error files are assembled from the parts, sorted by input line.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel, Field, ValidationError

from pronk import storage
from pronk.agents.step_records import ToolCallCounts
from pronk.protocol.checks import CheckStatus
from pronk.protocol.lines import OutputLine
from pronk.settings import Settings

logger = logging.getLogger(__name__)


class FinishedLine(BaseModel):
    """One input line's final result, as persisted: its output (or error) line, usage and step records."""

    line: int = Field(ge=1, description="1-based line number in the input file.")
    output: OutputLine
    ok: bool = Field(description="True: the line goes to the output file; False: to the error file.")
    prompt_tokens: int = Field(default=0, ge=0)
    cached_tokens: int = Field(default=0, ge=0)
    completion_tokens: int = Field(default=0, ge=0)
    worker_id: str | None = None
    check: CheckStatus = Field(default="unchecked", description="How the check of the line's answer ended.")
    tool_calls: ToolCallCounts = Field(
        default_factory=ToolCallCounts, description="The line's steps meant as tool calls, also of a failed line."
    )
    steps: list[dict[str, Any]] = Field(default_factory=list, description="The line's step records.")
    row: dict[str, Any] = Field(default_factory=dict, description="The line's row of the run's per-trace table.")


class RunRecord(BaseModel):
    """What one run of the batch held: counted once in the batch's cost, however often the batch is resumed."""

    run: str
    flow_run_id: str | None = None
    started_at: float = Field(default_factory=time.time)
    worker_seconds: float = Field(default=0.0, ge=0)


def new_run_tag() -> str:
    """Sortable by start time, unique across processes."""
    return f"{int(time.time() * 1000):013d}-{secrets.token_hex(3)}"


class ResultParts:
    """The persisted results of one batch, across all its runs."""

    def __init__(self, batch_id: str, settings: Settings):
        self.settings = settings
        self.root = storage.join(self.settings.store_uri, "results", batch_id)
        self.runs_root = storage.join(self.root, "runs")

    def write_part(self, run: str, seq: int, lines: list[FinishedLine]) -> None:
        storage.write_bytes(storage.join(self.root, f"{run}-{seq:06d}.jsonl"), jsonl(lines), self.settings)

    def load(self) -> dict[int, FinishedLine]:
        """Every persisted line by input line; a row that does not parse is skipped (its line runs again)."""
        names = [n for n in storage.list_names(self.root, self.settings) if n.endswith(".jsonl")]
        finished: dict[int, FinishedLine] = {}
        datas = storage.read_many([storage.join(self.root, n) for n in names], self.settings)
        for name, data in zip(names, datas, strict=True):
            for row in (data or b"").split(b"\n"):
                if not row.strip():
                    continue
                try:
                    line = FinishedLine.model_validate_json(row)
                except ValidationError as exc:
                    logger.warning("skipping a malformed row of %s: %s", name, exc.errors()[:1])
                    continue
                finished.setdefault(line.line, line)
        return finished

    def productive_runs(self) -> int:
        """How many runs persisted at least one line (a part is named `<run>-<seq>.jsonl`)."""
        names = storage.list_names(self.root, self.settings)
        return len({n.rsplit("-", 1)[0] for n in names if n.endswith(".jsonl")})

    def save_run(self, record: RunRecord) -> None:
        storage.write_bytes(
            storage.join(self.runs_root, f"{record.run}.json"), record.model_dump_json().encode(), self.settings
        )

    def runs(self) -> list[RunRecord]:
        names = [n for n in storage.list_names(self.runs_root, self.settings) if n.endswith(".json")]
        datas = storage.read_many([storage.join(self.runs_root, n) for n in names], self.settings)
        records = []
        for data in datas:
            try:
                records.append(RunRecord.model_validate_json(data or b""))
            except ValidationError:
                continue
        return records

    def delete(self) -> None:
        """Drop the parts once the final files are written and the batch is terminal."""
        fs = storage.filesystem(self.root, self.settings)
        if fs.exists(self.root):
            fs.rm(self.root, recursive=True)


def jsonl(lines: Iterable[BaseModel]) -> bytes:
    """Pydantic models as JSON lines: a results part, an output or an error file."""
    return b"".join(line.model_dump_json().encode() + b"\n" for line in lines)
