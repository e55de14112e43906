"""Calls to the Prefect API that a batch run makes for show (artifacts): bounded in time, never fatal.

The batch record in the store is the source of truth, so a Prefect server that is down or frozen
for a while costs the run its artifacts, never its progress or its end.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import TypeVar

logger = logging.getLogger(__name__)

T = TypeVar("T")

PREFECT_CALL_TIMEOUT_S = 5.0


async def best_effort(what: str, call: Awaitable[T], timeout_s: float = PREFECT_CALL_TIMEOUT_S) -> T | None:
    """The call's result, or None (logged) when the Prefect API fails or does not answer within `timeout_s`."""
    try:
        return await asyncio.wait_for(call, timeout_s)
    except Exception as exc:  # noqa: BLE001 - Prefect being away must not end the run
        logger.warning("%s skipped: the Prefect API did not answer (%s: %s)", what, type(exc).__name__, exc)
        return None
