"""The `python` tool: run model-written code in a subprocess with CPU, memory, wall-time and output limits."""

from __future__ import annotations

import asyncio
import os
import resource
import signal
import sys
import uuid
from pathlib import Path
from typing import Any

from pronk.agents.tools import ToolContext, ToolError
from pronk.jobs import PythonToolLimits

SANDBOX = Path(__file__).with_name("sandbox.py")


def _limit(limits: PythonToolLimits):
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s))
        memory = limits.memory_mb << 20
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        resource.setrlimit(resource.RLIMIT_FSIZE, (limits.output_bytes * 4, limits.output_bytes * 4))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    return apply


def _why(returncode: int, timed_out: bool, written: int, limits: PythonToolLimits) -> str:
    if timed_out:
        return f"killed: wall time limit of {limits.wall_s:g}s exceeded"
    if returncode == -signal.SIGXCPU or returncode == -signal.SIGKILL:
        return f"killed: CPU time limit of {limits.cpu_s}s exceeded"
    if returncode == -signal.SIGXFSZ or written >= limits.output_bytes * 4:
        return f"killed: output limit of {limits.output_bytes * 4} bytes exceeded"
    if returncode < 0:
        return f"killed by signal {signal.Signals(-returncode).name}"
    return f"exit status {returncode}"


class PythonTool:
    name = "python"
    description = "Run Python 3 code in a sandbox (scratch folder only, no network); returns what it prints."
    parameters = {
        "type": "object",
        "properties": {"code": {"type": "string", "description": "Python source to run", "maxLength": 600}},
        "required": ["code"],
        "additionalProperties": False,
    }

    def __init__(self, limits: PythonToolLimits):
        self.limits = limits

    async def run(self, arguments: dict[str, Any], context: ToolContext) -> str:
        code = arguments.get("code")
        if not isinstance(code, str):
            raise ToolError(f"python: 'code' must be a string, got {type(code).__name__}")
        context.scratch_dir.mkdir(parents=True, exist_ok=True)
        cell = context.scratch_dir / f"cell_{uuid.uuid4().hex[:8]}.py"
        cell.write_text(code)
        log = cell.with_suffix(".out")
        with open(log, "wb") as out:
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-I",
                str(SANDBOX),
                str(cell),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out,
                stderr=asyncio.subprocess.STDOUT,
                cwd=context.scratch_dir,
                env={"PATH": "/usr/bin:/bin"},
                preexec_fn=_limit(self.limits),
                start_new_session=True,
            )
            timed_out = False
            try:
                await asyncio.wait_for(process.wait(), self.limits.wall_s)
            except (TimeoutError, asyncio.CancelledError) as exc:
                timed_out = True
                os.killpg(process.pid, signal.SIGKILL)
                await process.wait()
                if isinstance(exc, asyncio.CancelledError):
                    raise
        with open(log, "rb") as f:
            output = f.read(self.limits.output_bytes + 1)
        text = output[: self.limits.output_bytes].decode("utf-8", "replace")
        if len(output) > self.limits.output_bytes:
            text += f"\n[output cut at {self.limits.output_bytes} bytes]"
        if process.returncode != 0 or timed_out:
            raise ToolError(
                f"python: {_why(process.returncode, timed_out, log.stat().st_size, self.limits)}\n{text}".rstrip()
            )
        return text or "(no output)"
