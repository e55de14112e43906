"""A line's typed outcome made into its OpenAI output or error line (the one builder of response bodies), and into
its row of the per-trace table (`trace_row`, persisted with the line, shown by `pronk.control.trace_sample.drawer`).

Chat and agent lines get a `chat.completion` body, replay lines a `pronk.replay` object; both carry
OpenAI's `usage` and a `pronk` object (model version, worker, and for traces the trace summary).
"""

from __future__ import annotations

from typing import Any

from pronk.agents.outcomes import Completion, LineFailure, RequestOutcome
from pronk.protocol.lines import OutputLine, ResponseEnvelope, error_line


def response_body(completion: Completion) -> dict[str, Any]:
    """The OpenAI response body of a completed line."""
    c = completion
    body: dict[str, Any] = {
        "id": c.request_id,
        "object": "pronk.replay" if c.kind == "replay" else "chat.completion",
        "created": c.created,
        "model": c.model,
    }
    if c.kind != "replay":
        body["system_fingerprint"] = c.model_version
        message: dict[str, Any] = {"role": "assistant", "content": c.text}
        if c.tool_calls:
            message = {"role": "assistant", "content": None, "tool_calls": c.tool_calls}
        body["choices"] = [{"index": 0, "message": message, "finish_reason": c.finish_reason, "logprobs": None}]
    body["usage"] = {
        "prompt_tokens": c.usage.prompt_tokens,
        "completion_tokens": c.usage.completion_tokens,
        "total_tokens": c.usage.total_tokens,
        "prompt_tokens_details": {"cached_tokens": c.usage.cached_tokens},
    }
    pronk: dict[str, Any] = {"model_version": c.model_version, "worker_id": c.worker_id}
    if c.kind == "chat":
        pronk["queue_time_s"] = round(c.queue_time_s, 6)
        pronk["engine_time_s"] = round(c.engine_time_s, 6)
    else:
        trace: dict[str, Any] = {"trace_id": c.trace_id}
        if c.kind == "agent":
            trace["finish_reason"] = c.finish_reason
        trace["duration_s"] = round(c.duration_s, 6)
        if c.summary is not None:
            trace.update(c.summary.as_dict())
        pronk["trace"] = trace
        if c.kind == "agent":
            pronk["transcript"] = c.transcript
    body["pronk"] = pronk
    return body


def output_line(outcome: RequestOutcome) -> OutputLine:
    """The output-file line of a completed outcome, or the error-file line of a failed one."""
    result = outcome.result
    if isinstance(result, LineFailure):
        return error_line(outcome.line, outcome.custom_id, result.code, result.message)
    body = response_body(result)
    return OutputLine(
        custom_id=outcome.custom_id, response=ResponseEnvelope(status_code=200, request_id=result.request_id, body=body)
    )


def trace_row(outcome: RequestOutcome) -> dict[str, object]:
    """A line's row of the per-trace table: its final state, as the Prefect UI shows it."""
    result = outcome.result
    if isinstance(result, LineFailure):
        return {"custom_id": outcome.custom_id, "state": "error", "finish_reason": result.code, "steps": 0}
    trace = result.summary
    calls = trace.tool_call_counts if trace else None
    return {
        "custom_id": outcome.custom_id,
        "state": "completed",
        "finish_reason": "replayed" if result.kind == "replay" else result.finish_reason,
        "steps": trace.steps if trace else 1,
        "traces": trace.traces if trace else 1,
        "tool_calls": sum(trace.tool_calls.values()) if trace else 0,
        "tool_calls_valid": f"{calls.valid}/{calls.total}" if calls and calls.total else "",
        "workers": ",".join(trace.workers if trace else [result.worker_id]),
        "cached_ratio": trace.cached_ratio if trace else None,
    }
