"""Agent tools: a name, a description, a JSON schema for the arguments, and `run`.

Built-ins are `python`, `sql` and `search`; `spawn_subagents` is handled by the harness itself (it
starts child traces). A job adds its own tools by import path (`package.module:object`, a class
built with the job's `ToolsConfig` or with no arguments, or a ready object). `run_tool` contains
whatever a tool does: an exception or an overrun becomes that step's tool error, never a crash.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import time
from pathlib import Path
from typing import Any

from pronk.agents.tools.base import Tool, ToolContext, ToolError, ToolOutcome
from pronk.jobs.schema import JobConfig, ToolsConfig
from pronk.settings import PROJECT_ROOT

SPAWN_SUBAGENTS = "spawn_subagents"


class SpawnSubagents:
    """Schema holder for the built-in fan-out tool; the harness runs it, never `run`."""

    name = SPAWN_SUBAGENTS
    description = "Start sub-agents, one per task, from the current conversation; returns each one's final answer."

    def __init__(self, max_fan_out: int):
        self.parameters = {
            "type": "object",
            "properties": {
                "tasks": {
                    "type": "array",
                    "items": {"type": "string", "maxLength": 160},
                    "minItems": 1,
                    "maxItems": max(max_fan_out, 1),
                }
            },
            "required": ["tasks"],
            "additionalProperties": False,
        }

    async def run(self, arguments: dict[str, Any], context: ToolContext) -> str:
        raise ToolError("spawn_subagents runs inside the harness")


def project_path(path: str) -> Path:
    """A job-file path: absolute as given, else relative to the project root."""
    candidate = Path(path)
    return candidate if candidate.is_absolute() else PROJECT_ROOT / candidate


BUILTIN_TOOLS = ("python", "sql", "search", SPAWN_SUBAGENTS)


def _builtin(name: str, config: ToolsConfig, max_fan_out: int, bwrap: str) -> Tool | None:
    if name == "python":
        from pronk.agents.tools.python_exec import PythonTool

        return PythonTool(config.python, bwrap)
    if name == "sql":
        from pronk.agents.tools.sql import SqlTool

        return SqlTool(project_path(config.sql.tables_dir))
    if name == "search":
        from pronk.agents.tools.search import SearchTool

        return SearchTool(project_path(config.search.corpus_dir))
    if name == SPAWN_SUBAGENTS:
        return SpawnSubagents(max_fan_out)
    return None


def _imported_object(path: str) -> Any:
    """The object a `package.module:object` entry names: a tool, or a class that makes one."""
    module_name, _, attribute = path.partition(":")
    if not module_name or not attribute:
        raise ValueError(f"tool {path!r} is neither a built-in nor a 'package.module:object' import path")
    return getattr(importlib.import_module(module_name), attribute)


def _imported(path: str, config: ToolsConfig) -> Tool:
    obj: Any = _imported_object(path)
    if inspect.isclass(obj):
        factory: Any = obj
        obj = factory(config) if inspect.signature(factory).parameters else factory()
    missing = [a for a in ("name", "description", "parameters", "run") if not hasattr(obj, a)]
    if missing:
        raise ValueError(f"tool {path!r} lacks {missing}")
    return obj


def load_tools(config: ToolsConfig, bwrap: str, max_fan_out: int = 4) -> dict[str, Tool]:
    """The job's tools by name (`bwrap`: the bubblewrap binary the python tool isolates code with; `max_fan_out`
    bounds spawn_subagents' tasks); a bad entry raises ValueError."""
    tools: dict[str, Tool] = {}
    for entry in config.enabled:
        tool = _builtin(entry, config, max_fan_out, bwrap) or _imported(entry, config)
        if tool.name in tools:
            raise ValueError(f"tool name {tool.name!r} given twice in the job's tools.enabled")
        tools[tool.name] = tool
    return tools


async def run_tool(
    tool: Tool, arguments: dict[str, Any], context: ToolContext, timeout_s: float, max_chars: int
) -> ToolOutcome:
    """Run one call; errors, exceptions and timeouts come back as `ok=False` with their text."""
    started = time.monotonic()
    try:
        call = tool.run(arguments, context)
        if not inspect.isawaitable(call):
            raise ToolError(f"tool {tool.name!r}: run() must be async")
        text, ok = str(await asyncio.wait_for(call, timeout_s)), True
    except TimeoutError:
        text, ok = f"tool {tool.name!r} timed out after {timeout_s:g}s", False
    except ToolError as exc:
        text, ok = str(exc), False
    except Exception as exc:  # noqa: BLE001 - a tool's bug must never end the trace or the worker
        text, ok = f"tool {tool.name!r} raised {type(exc).__name__}: {exc}", False
    if len(text) > max_chars:
        text = text[:max_chars] + f"\n[... {len(text) - max_chars} more characters cut]"
    return ToolOutcome(ok, text, time.monotonic() - started)


_LOADED: dict[str, dict[str, Tool]] = {}


def job_tools(job: JobConfig, bwrap: str) -> dict[str, Tool]:
    """The job's tools (`load_tools`), loaded once per distinct tools section, fan-out and sandbox in this process."""
    key = f"{job.tools.model_dump_json()}|{job.harness.max_fan_out}|{bwrap}"
    if key not in _LOADED:
        _LOADED[key] = load_tools(job.tools, bwrap, job.harness.max_fan_out)
    return _LOADED[key]


def tool_names(job: JobConfig) -> set[str]:
    """The names of the job's tools, none of them made: a built-in's own, an imported tool's (or tool class's)
    `name` (for validating lines against the job, where nothing runs)."""
    return {entry if entry in BUILTIN_TOOLS else _imported_object(entry).name for entry in job.tools.enabled}
