"""Validate an OpenAI batch input file line by line: every line becomes a request or an error line."""

from __future__ import annotations

import json
from dataclasses import dataclass

from pydantic import ValidationError

from pronk.agents.spec import REPLAY_URL, ReplayBody, check_tools
from pronk.batches.schemas import (
    SERVED_URLS,
    ChatCompletionBody,
    ErrorCode,
    LineError,
    OutputLine,
)
from pronk.errors import PronkError
from pronk.jobs import JobConfig


class BatchInputError(PronkError, ValueError):
    """The input file as a whole cannot be used (unreadable or empty): the batch fails."""


@dataclass(slots=True)
class ValidRequest:
    line: int
    custom_id: str
    body: ChatCompletionBody | ReplayBody


@dataclass(slots=True)
class ValidatedInput:
    requests: list[ValidRequest]
    errors: list[OutputLine]
    total: int


def error_line(line: int, custom_id: str | None, code: str, message: str) -> OutputLine:
    """The error-file line for input line `line`; the message starts with the line number."""
    return OutputLine(custom_id=custom_id, error=LineError(code=code, message=f"line {line}: {message}", line=line))


def _validation_message(exc: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']} (got {e.get('input')!r:.80})" for e in exc.errors()
    )


def _check_line(number: int, text: str, job: JobConfig, seen: set[str]) -> ValidRequest | OutputLine:
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        return error_line(number, None, ErrorCode.INVALID_JSON, f"not valid JSON: {exc.msg} at column {exc.colno}")
    if not isinstance(raw, dict):
        return error_line(
            number, None, ErrorCode.INVALID_LINE, f"a line must be a JSON object, got {type(raw).__name__}"
        )
    custom_id = raw.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return error_line(number, None, ErrorCode.MISSING_CUSTOM_ID, f"missing or empty custom_id (got {custom_id!r})")
    if custom_id in seen:
        return error_line(
            number, custom_id, ErrorCode.DUPLICATE_CUSTOM_ID, f"custom_id {custom_id!r} appears on an earlier line"
        )
    seen.add(custom_id)
    if raw.get("method") != "POST":
        return error_line(
            number, custom_id, ErrorCode.INVALID_METHOD, f"method must be 'POST', got {raw.get('method')!r}"
        )
    if raw.get("url") not in SERVED_URLS:
        return error_line(
            number,
            custom_id,
            ErrorCode.UNSUPPORTED_URL,
            f"url {raw.get('url')!r} is not served; use one of {list(SERVED_URLS)}",
        )
    body = raw.get("body")
    if not isinstance(body, dict):
        return error_line(
            number, custom_id, ErrorCode.INVALID_BODY, f"body must be a JSON object, got {type(body).__name__}"
        )
    try:
        parsed = (ReplayBody if raw["url"] == REPLAY_URL else ChatCompletionBody).model_validate(body)
    except ValidationError as exc:
        return error_line(number, custom_id, ErrorCode.INVALID_BODY, _validation_message(exc))
    if parsed.model != job.served_model_name:
        return error_line(
            number,
            custom_id,
            ErrorCode.MODEL_MISMATCH,
            f"body.model {parsed.model!r} is not served by job {job.job_id} (which serves {job.served_model_name!r})",
        )
    problem = _agent_problem(parsed, job)
    if problem is not None:
        return error_line(number, custom_id, problem[0], problem[1])
    return ValidRequest(line=number, custom_id=custom_id, body=parsed)


def _agent_problem(body: ChatCompletionBody | ReplayBody, job: JobConfig) -> tuple[str, str] | None:
    if not isinstance(body, ChatCompletionBody) or body.tools is None:
        return None
    from pronk.agents.tools import job_tools

    return check_tools(body.tools, body.tool_choice, body.harness, job, set(job_tools(job.harness)))


def validate_input(data: bytes, job: JobConfig) -> ValidatedInput:
    """Split the file into valid requests and error lines; blank lines are skipped, not counted."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BatchInputError(f"input file is not UTF-8 text: {exc}") from exc
    requests: list[ValidRequest] = []
    errors: list[OutputLine] = []
    seen: set[str] = set()
    total = 0
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        total += 1
        checked = _check_line(number, line, job, seen)
        (requests if isinstance(checked, ValidRequest) else errors).append(checked)
    if total == 0:
        raise BatchInputError("input file has no request lines")
    return ValidatedInput(requests=requests, errors=errors, total=total)
