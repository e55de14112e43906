"""The `python` tool: run model-written code in a bubblewrap sandbox with CPU, memory, wall-time and output limits."""

from __future__ import annotations

import asyncio
import os
import signal
import tempfile
from typing import Any

from pronk.agents.tools import ToolContext, ToolError
from pronk.agents.tools.sandbox import BWRAP_ENV, Sandbox, sandbox_unavailable
from pronk.jobs import PythonToolLimits
from pronk.settings import get_settings

SIGNALLED = 128  # bwrap exits 128 + N when the sandboxed program dies of signal N


def _why(returncode: int, timed_out: bool, written: int, limits: PythonToolLimits) -> str:
    signum = returncode - SIGNALLED if returncode > SIGNALLED else -returncode if returncode < 0 else 0
    if timed_out:
        return f"killed: wall time limit of {limits.wall_s:g}s exceeded"
    if signum in (signal.SIGXCPU, signal.SIGKILL):
        return f"killed: CPU time limit of {limits.cpu_s}s exceeded"
    if signum == signal.SIGXFSZ or written >= limits.output_bytes * 4:
        return f"killed: output limit of {limits.output_bytes * 4} bytes exceeded"
    if signum and signum in signal.valid_signals():
        return f"killed by signal {signal.Signals(signum).name}"
    return f"exit status {returncode}"


class PythonTool:
    name = "python"
    description = "Run Python 3 code in a sandbox (scratch folder only, no network); returns what it prints."

    def __init__(self, limits: PythonToolLimits, bwrap: str | None = None):
        self.limits = limits
        self.parameters: dict[str, Any] = {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "Python source to run", "maxLength": 600}},
            "required": ["code"],
            "additionalProperties": False,
        }
        self.sandbox = Sandbox(bwrap or get_settings().sandbox_bwrap, limits)

    async def run(self, arguments: dict[str, Any], context: ToolContext) -> str:
        code = arguments.get("code")
        if not isinstance(code, str):
            raise ToolError(f"python: 'code' must be a string, got {type(code).__name__}")
        why = await asyncio.to_thread(sandbox_unavailable, self.sandbox.bwrap)
        if why:
            raise ToolError(f"python: refused: no OS sandbox to run code in ({why})")
        launch = await asyncio.to_thread(self.sandbox.prepare, context.scratch_dir, code)
        with tempfile.TemporaryFile() as out:
            try:
                process = await asyncio.create_subprocess_exec(
                    *launch.command,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=out,
                    stderr=asyncio.subprocess.STDOUT,
                    pass_fds=launch.fds,
                    env=BWRAP_ENV,
                    start_new_session=True,
                )
            finally:
                launch.close()
            timed_out = False
            try:
                await asyncio.wait_for(process.wait(), self.limits.wall_s)
            except (TimeoutError, asyncio.CancelledError) as exc:
                # Killing bwrap kills the sandbox's PID 1 (--die-with-parent), and with it every process inside.
                timed_out = True
                os.killpg(process.pid, signal.SIGKILL)
                await process.wait()
                if isinstance(exc, asyncio.CancelledError):
                    raise
            written = os.fstat(out.fileno()).st_size
            out.seek(0)
            output = out.read(self.limits.output_bytes + 1)
        assert process.returncode is not None
        text = output[: self.limits.output_bytes].decode("utf-8", "replace")
        if len(output) > self.limits.output_bytes:
            text += f"\n[output cut at {self.limits.output_bytes} bytes]"
        if process.returncode != 0 or timed_out:
            raise ToolError(f"python: {_why(process.returncode, timed_out, written, self.limits)}\n{text}".rstrip())
        return text or "(no output)"
