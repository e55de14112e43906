"""The batch's progress keeper, without a server: what it reports."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from pronk.batches.progress import keep_progress


def test_a_run_that_ends_between_ticks_reports_where_it_ended():
    """The lines finished after the last tick (here: before the first) still show: a completed batch reads 100%."""
    run = SimpleNamespace(batch=SimpleNamespace(id="b", request_counts=SimpleNamespace(total=8)), done=0)
    reported: list[float] = []

    async def on_progress(percent: float) -> None:
        reported.append(percent)

    async def lines_then_end() -> None:
        stopped = asyncio.Event()
        keeper = asyncio.create_task(keep_progress(run, None, stopped, on_progress, interval_s=60.0))
        await asyncio.sleep(0)
        run.done = 8
        stopped.set()
        await keeper

    asyncio.run(lines_then_end())
    assert reported == [100.0]
