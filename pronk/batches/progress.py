"""What a running batch does about once a second besides its lines: persist what finished, honour a stop, save its
record, and report its progress (to a callback: the Prefect layer's progress artifact); and `saved_every`, the same
once-a-second save for any other record whose counts move while it runs."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable

from pronk.batches.run import BatchRun
from pronk.batches.store import BatchStore

logger = logging.getLogger(__name__)

PERSIST_EVERY_S = 2.0
"""Finished lines are written as one part about this often: a crash loses at most this much, plus what was in flight."""

Progress = Callable[[float], Awaitable[None]]
"""Told the share of the batch's lines done, in percent, after every tick; must not raise."""


async def keep_progress(
    run: BatchRun, store: BatchStore, stopped: asyncio.Event, on_progress: Progress, interval_s: float = 1.0
) -> None:
    """Until `stopped`: about once a second, persist finished lines, check for a stop, save the record, report;
    once stopped, report where the run ended (the last tick may have come before its last lines finished).

    The record in the store is the source of truth: storage trouble is retried on the next tick, so it never
    stops the run.
    """
    total = max(run.batch.request_counts.total, 1)
    last_persist = time.monotonic()
    while not stopped.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopped.wait(), interval_s)
        if stopped.is_set():
            break
        if time.monotonic() - last_persist >= PERSIST_EVERY_S:
            last_persist = time.monotonic()
            seq, lines = run.take_pending()
            try:
                await asyncio.to_thread(run.persist, seq, lines)
            except Exception as exc:  # noqa: BLE001 - the next tick writes them again
                logger.warning("batch %s: persisting %d lines failed, retrying: %s", run.batch.id, len(lines), exc)
                run.pending[:0] = lines
        try:
            await asyncio.to_thread(run.check_stop, store)
            await asyncio.to_thread(store.save, run.batch)
        except Exception as exc:  # noqa: BLE001 - the next tick saves again
            logger.warning("batch %s: saving progress failed: %s", run.batch.id, exc)
        await on_progress(100.0 * run.done / total)
    await on_progress(100.0 * run.done / total)


@contextlib.asynccontextmanager
async def progress_kept(run: BatchRun, store: BatchStore, on_progress: Progress) -> AsyncIterator[None]:
    """`keep_progress` in the background for the duration of the block."""
    stopped = asyncio.Event()
    keeper = asyncio.create_task(keep_progress(run, store, stopped, on_progress))
    try:
        yield
    finally:
        stopped.set()
        await keeper


@contextlib.asynccontextmanager
async def saved_every(save: Callable[[], Awaitable[None]], interval_s: float = 1.0) -> AsyncIterator[None]:
    """`save` about every `interval_s` for the duration of the block, so a record whose counts move inside it (an
    improve round's rollouts and training, a Leap's canary) shows them to whoever reads it while it runs. A failed
    save is logged and made again at the next tick; a save under way when the block ends is awaited, so none lands
    after what the caller saves next."""
    stopped = asyncio.Event()

    async def keep() -> None:
        while not stopped.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopped.wait(), interval_s)
            if stopped.is_set():
                return
            try:
                await save()
            except Exception as exc:  # noqa: BLE001 - the next tick saves again
                logger.warning("saving progress failed, trying again: %s", exc)

    keeper = asyncio.create_task(keep())
    try:
        yield
    finally:
        stopped.set()
        await keeper
