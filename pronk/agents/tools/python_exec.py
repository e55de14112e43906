"""The `python` tool: run model-written code in a bubblewrap sandbox with CPU, memory, wall-time and output limits."""

from __future__ import annotations

import asyncio
import os
import signal
import tempfile
from typing import Any

from pronk.agents.tools import scratch
from pronk.agents.tools.base import ToolContext, ToolError
from pronk.agents.tools.call_cgroup import CallCgroup
from pronk.agents.tools.sandbox import BWRAP_ENV, Sandbox, sandbox_unavailable
from pronk.jobs.schema import PythonToolLimits

SIGNALLED = 128  # bwrap exits 128 + N when the sandboxed program dies of signal N
SANDBOX_PROCESSES = 4
"""Processes of the sandbox itself in the call's cgroup beside the code's: the shell that joins it, bwrap's two,
and the launcher."""


def scratch_dump_limit(limits: PythonToolLimits) -> int:
    """Most bytes of a scratch dump read back: the tmpfs's size plus a tar header for each file it may keep."""
    return (limits.scratch_mb << 20) + scratch.MAX_FILES * 1024 + (1 << 20)


def _why(returncode: int, timed_out: bool, out_of_memory: bool, written: int, limits: PythonToolLimits) -> str:
    signum = returncode - SIGNALLED if returncode > SIGNALLED else -returncode if returncode < 0 else 0
    if timed_out:
        return f"killed: wall time limit of {limits.wall_s:g}s exceeded"
    if out_of_memory:
        return (
            f"killed: memory limit of {limits.memory_mb} MiB for the whole call exceeded (the kernel killed a "
            "process of the call; what it printed may be incomplete)"
        )
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

    def __init__(self, limits: PythonToolLimits, bwrap: str):
        """`bwrap`: the bubblewrap binary to isolate code with (the settings' `sandbox_bwrap`, handed down by whoever
        runs the tool)."""
        self.limits = limits
        self.parameters: dict[str, Any] = {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "Python source to run", "maxLength": 600}},
            "required": ["code"],
            "additionalProperties": False,
        }
        self.sandbox = Sandbox(bwrap, limits)

    async def run(self, arguments: dict[str, Any], context: ToolContext) -> str:
        code = arguments.get("code")
        if not isinstance(code, str):
            raise ToolError(f"python: 'code' must be a string, got {type(code).__name__}")
        why = await asyncio.to_thread(sandbox_unavailable, self.sandbox.bwrap)
        if why:
            raise ToolError(f"python: refused: no OS sandbox to run code in ({why})")
        limits = self.limits
        launch = await asyncio.to_thread(self.sandbox.prepare, context.scratch_dir, code)
        dump_limit = scratch_dump_limit(limits)
        dump = asyncio.create_task(asyncio.to_thread(scratch.read_dump, launch.dump, dump_limit))
        group = None
        with tempfile.TemporaryFile() as out:
            try:
                group = await asyncio.to_thread(
                    CallCgroup.create, limits.memory_mb << 20, limits.processes + SANDBOX_PROCESSES
                )
                process = await asyncio.create_subprocess_exec(
                    *(group.wrap(launch.command) if group else launch.command),
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=out,
                    stderr=asyncio.subprocess.STDOUT,
                    pass_fds=launch.fds,
                    env=BWRAP_ENV,
                    start_new_session=True,
                )
            except BaseException:
                if group:
                    await asyncio.to_thread(group.close)
                raise
            finally:
                launch.close()
            timed_out = False
            try:
                await asyncio.wait_for(process.wait(), limits.wall_s)
            except (TimeoutError, asyncio.CancelledError) as exc:
                # Killing bwrap kills the sandbox's PID 1 (--die-with-parent), and with it every process inside.
                timed_out = True
                os.killpg(process.pid, signal.SIGKILL)
                await process.wait()
                if isinstance(exc, asyncio.CancelledError):
                    raise
            finally:
                out_of_memory = group.ran_out_of_memory() if group else False
                if group:
                    await asyncio.to_thread(group.close)
            written = os.fstat(out.fileno()).st_size
            out.seek(0)
            output = out.read(limits.output_bytes + 1)
        dumped = await dump
        not_kept = None if timed_out else await asyncio.to_thread(scratch.keep, context.scratch_dir, dumped, dump_limit)
        assert process.returncode is not None
        text = output[: limits.output_bytes].decode("utf-8", "replace")
        if len(output) > limits.output_bytes:
            text += f"\n[output cut at {limits.output_bytes} bytes]"
        if not_kept:
            text += f"\n[scratch files: {not_kept}]"
        # A forked child killed for the call's memory limit fails the call even when its parent exits 0: its
        # part of the answer is missing.
        if process.returncode != 0 or timed_out or out_of_memory:
            why = _why(process.returncode, timed_out, out_of_memory, written, limits)
            raise ToolError(f"python: {why}\n{text}".rstrip())
        return text or "(no output)"
