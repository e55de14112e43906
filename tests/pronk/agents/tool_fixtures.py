"""Tools a test job adds by import path: one that always raises, one that never returns."""

from __future__ import annotations

import asyncio


class ExplodingTool:
    name = "explode"
    description = "Always raises."
    parameters = {
        "type": "object",
        "properties": {"why": {"type": "string"}},
        "required": ["why"],
        "additionalProperties": False,
    }

    async def run(self, arguments, context):
        raise RuntimeError(f"kaboom: {arguments.get('why')!r}")


class StuckTool:
    name = "stuck"
    description = "Never returns."
    parameters = {"type": "object", "properties": {}, "additionalProperties": False}

    async def run(self, arguments, context):
        await asyncio.sleep(3600)
