"""The `sql` tool: polars SQL over the tables a job ships (every csv/parquet file in its tables folder)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import polars as pl

from pronk.agents.tools.base import ToolContext, ToolError

MAX_ROWS = 20


class SqlTool:
    name = "sql"
    parameters = {
        "type": "object",
        "properties": {"query": {"type": "string", "description": "One SELECT statement", "maxLength": 300}},
        "required": ["query"],
        "additionalProperties": False,
    }

    def __init__(self, tables_dir: Path):
        self.tables = {p.stem: p for p in sorted(tables_dir.glob("*")) if p.suffix in {".csv", ".parquet"}}
        listing = ", ".join(self.tables) or "none"
        self.description = f"Run a polars SQL SELECT over the tables {listing}; returns at most {MAX_ROWS} rows as CSV."

    def _frames(self) -> dict[str, pl.LazyFrame]:
        return {name: pl.scan_csv(p) if p.suffix == ".csv" else pl.scan_parquet(p) for name, p in self.tables.items()}

    def _query(self, query: str) -> str:
        try:
            frame = pl.SQLContext(self._frames(), eager=False).execute(query).head(MAX_ROWS).collect()
        except Exception as exc:
            raise ToolError(f"sql: {type(exc).__name__}: {exc}") from exc
        return frame.write_csv()

    async def run(self, arguments: dict[str, Any], context: ToolContext) -> str:
        query = arguments.get("query")
        if not isinstance(query, str) or not query.strip():
            raise ToolError(f"sql: 'query' must be a non-empty string, got {query!r}")
        return await asyncio.to_thread(self._query, query)
