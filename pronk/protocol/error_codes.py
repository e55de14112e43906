"""The stable codes of error lines."""

from __future__ import annotations


class ErrorCode:
    """Stable codes of error lines; clients match on these, so never rename one."""

    INVALID_JSON = "invalid_json"
    INVALID_LINE = "invalid_line"
    MISSING_CUSTOM_ID = "missing_custom_id"
    DUPLICATE_CUSTOM_ID = "duplicate_custom_id"
    INVALID_METHOD = "invalid_method"
    UNSUPPORTED_URL = "unsupported_url"
    INVALID_BODY = "invalid_body"
    INVALID_CHECK = "invalid_check"
    MODEL_MISMATCH = "model_mismatch"
    LINE_TOO_LARGE = "line_too_large"
    REQUEST_REJECTED = "request_rejected"
    ENGINE_UNAVAILABLE = "engine_unavailable"
    CONTEXT_LENGTH = "context_length"
    UNKNOWN_TOOL = "unknown_tool"
    INVALID_TOOL_SCHEMA = "invalid_tool_schema"
    MIXED_TOOLS = "mixed_tools"
    INVALID_TOOL_CALL = "invalid_tool_call"
    HARNESS_LIMIT_EXCEEDED = "harness_limit_exceeded"
    STEP_FAILED = "step_failed"
    CANCELLED = "batch_cancelled"
    EXPIRED = "batch_expired"
    RUN_FAILED = "batch_run_failed"
    QUEUE_WAITING = "batch_queue_waiting"
    """Not an error line: a queued batch's note on why it still waits (`Batch.errors`, cleared once it runs)."""
