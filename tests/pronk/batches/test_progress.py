"""The batch's progress keeper and the once-a-second saver of other records, without a server."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from pronk.batches.progress import keep_progress, saved_every


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


def test_a_record_is_saved_while_the_block_runs_and_a_save_under_way_ends_before_the_block_does():
    events: list[str] = []
    failures = iter([RuntimeError("storage hiccup")])

    async def save() -> None:
        events.append("save")
        if failure := next(failures, None):
            raise failure
        await asyncio.sleep(0.03)
        events.append("saved")

    async def block() -> None:
        async with saved_every(save, interval_s=0.01):
            await asyncio.sleep(0.1)
        events.append("after")

    asyncio.run(block())
    assert events.count("save") >= 2  # the failed save did not stop the next ones
    assert events[-2:] == ["saved", "after"]  # the last save finished before what follows the block
