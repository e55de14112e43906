"""The per-request trace hints: which trace a step belongs to and how long its prefix should wait for the next step.

The harness's router puts them in a step's `SamplingParams.extra_args`, where `pronk.engine.kv_retention`'s scheduler
reads them to pin the trace's prefix; the same hints ride in the request's `kv_transfer_params`, the only
per-request data the host tier's cache policy gets (`pronk.engine.kv_tier_policy`). Both read them from here, so neither
imports the other for them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

TRACE_KEY = "trace_id"
TTL_KEY = "kv_pin_ttl_s"
"""Each hint has the name of the setting it carries: the step protocol's `trace_id` and `kv_pin_ttl_s` (a job's
`scheduling.kv_pin_ttl_s`), so a setting keeps one name from the job file to the engine's scheduler."""


def retention_hints(trace_id: str, kv_pin_ttl_s: float) -> dict[str, Any]:
    """The hints a step carries in `SamplingParams.extra_args`, with a copy under `kv_transfer_params`."""
    hints = {TRACE_KEY: trace_id, TTL_KEY: float(kv_pin_ttl_s)}
    return {**hints, "kv_transfer_params": dict(hints)}


def read_hints(hints: Mapping[str, Any]) -> tuple[str | None, float]:
    """(trace id, pin TTL in seconds) from a request's hints; (None, 0.0) for a request without them."""
    trace_id = hints.get(TRACE_KEY)
    return (trace_id if isinstance(trace_id, str) else None), float(hints.get(TTL_KEY) or 0.0)
