"""Validate an OpenAI batch input file line by line: every line becomes a request or an error line."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from pydantic import TypeAdapter, ValidationError

from pronk.agents.validation import check_tools
from pronk.jobs.schema import JobConfig
from pronk.pronk_error import PronkError
from pronk.protocol.bodies import REPLAY_URL, SERVED_URLS, ChatCompletionBody, ReplayBody
from pronk.protocol.checks import Check
from pronk.protocol.error_codes import ErrorCode
from pronk.protocol.lines import OutputLine, ValidRequest, error_line

logger = logging.getLogger(__name__)


class BatchInputError(PronkError, ValueError):
    """The input file as a whole cannot be used (unreadable or empty): the batch fails."""


PromptTokens = Callable[[ChatCompletionBody], "int | None"]
"""Counts (or soundly bounds) a plain chat line's prompt tokens; None when it cannot tell."""


@dataclass(slots=True)
class InputLimits:
    """What one line may be: its bytes before parsing, and a prompt counter to check it fits the job's context."""

    max_line_bytes: int = 4 * 1024 * 1024
    prompt_tokens: PromptTokens | None = None


@dataclass(slots=True)
class ValidatedInput:
    requests: list[ValidRequest]
    errors: list[OutputLine]
    total: int


def _validation_message(exc: ValidationError, root: str = "body") -> str:
    return "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or root}: {e['msg']} (got {e.get('input')!r:.80})" for e in exc.errors()
    )


CHECK = TypeAdapter(Check)


MAX_INT_DIGITS = 64
"""Longest integer literal a line may hold; Python's own int-string limit (4,300 digits) is far too generous."""


def _parse_int(literal: str) -> int:
    if len(literal.lstrip("-")) > MAX_INT_DIGITS:
        raise ValueError(f"an integer of {len(literal.lstrip('-'))} digits (the limit is {MAX_INT_DIGITS})")
    return int(literal)


def _parse_constant(name: str) -> float:
    raise ValueError(f"{name} is not JSON")


def parse_line(raw: bytes) -> tuple[Any, None] | tuple[None, str]:
    """Decode and parse one line on its own: `(value, None)`, or `(None, why it is not JSON)`."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return None, f"not UTF-8 text: byte {raw[exc.start]:#04x} at column {exc.start + 1}"
    try:
        return json.loads(text, parse_int=_parse_int, parse_constant=_parse_constant), None
    except json.JSONDecodeError as exc:
        return None, f"not valid JSON: {exc.msg} at column {exc.colno}"
    except RecursionError:
        return None, "not valid JSON: nested too deeply"
    except ValueError as exc:
        return None, f"not valid JSON: {exc}"


def _check_line(
    number: int, data: bytes, job: JobConfig, seen: set[str], limits: InputLimits
) -> ValidRequest | OutputLine:
    if len(data) > limits.max_line_bytes:
        return error_line(
            number,
            None,
            ErrorCode.LINE_TOO_LARGE,
            f"the line has {len(data)} bytes; the limit is {limits.max_line_bytes} (PRONK_MAX_LINE_BYTES)",
        )
    raw, problem = parse_line(data)
    if problem is not None:
        return error_line(number, None, ErrorCode.INVALID_JSON, problem)
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
    agent_problem = _agent_problem(parsed, job) or _length_problem(parsed, job, limits)
    if agent_problem is not None:
        return error_line(number, custom_id, agent_problem[0], agent_problem[1])
    check = None
    if raw.get("check") is not None:
        if isinstance(parsed, ReplayBody):
            return error_line(number, custom_id, ErrorCode.INVALID_CHECK, "a replay line has no answer to check")
        try:
            check = CHECK.validate_python(raw["check"])
        except ValidationError as exc:
            return error_line(number, custom_id, ErrorCode.INVALID_CHECK, "check: " + _validation_message(exc, "check"))
    return ValidRequest(line=number, custom_id=custom_id, body=parsed, check=check)


def _length_problem(
    body: ChatCompletionBody | ReplayBody, job: JobConfig, limits: InputLimits
) -> tuple[str, str] | None:
    if isinstance(body, ReplayBody):
        longest = body.shape.longest_prompt()
        if longest < job.engine.max_model_len:
            return None
        return (
            ErrorCode.REQUEST_REJECTED,
            f"the shape's longest step has a {longest}-token prompt; job {job.job_id}'s max_model_len is"
            f" {job.engine.max_model_len} (prompt and at least one output token)",
        )
    asked = body.max_completion_tokens or body.max_tokens
    cap = job.output_token_cap
    if asked is not None and asked > cap:
        field = "max_completion_tokens" if body.max_completion_tokens else "max_tokens"
        return ErrorCode.INVALID_BODY, f"{field}: {asked} is more than job {job.job_id} allows ({cap})"
    if limits.prompt_tokens is None or body.tools is not None:
        return None
    tokens = limits.prompt_tokens(body)
    if tokens is not None and tokens >= job.engine.max_model_len:
        return (
            ErrorCode.REQUEST_REJECTED,
            f"the prompt has at least {tokens} tokens; job {job.job_id}'s max_model_len is {job.engine.max_model_len}"
            " (prompt and at least one output token)",
        )
    return None


def _agent_problem(body: ChatCompletionBody | ReplayBody, job: JobConfig) -> tuple[str, str] | None:
    if not isinstance(body, ChatCompletionBody) or body.tools is None:
        return None
    from pronk.agents.tools import tool_names

    return check_tools(body.tools, body.tool_choice, body.harness, job, tool_names(job))


def split_lines(data: bytes) -> Iterator[tuple[int, bytes]]:
    """Numbered non-blank lines, split on `\\n` only (as the upload counts them): U+2028, U+0085 or a bare
    `\\r` inside a line are part of it."""
    for number, line in enumerate(data.split(b"\n"), start=1):
        if line.strip():
            yield number, line


def is_blank(chunks: Iterable[bytes]) -> bool:
    """Whether a batch input (its bytes, in pieces of any size) holds no request line: nothing but whitespace, so
    `split_lines` finds no line that is not blank."""
    return not any(chunk.strip() for chunk in chunks)


def validate_input(data: bytes, job: JobConfig, limits: InputLimits | None = None) -> ValidatedInput:
    """Split the file into valid requests and error lines; blank lines are skipped, not counted.

    Each line is decoded, parsed and validated alone: whatever goes wrong with one line, even an
    unexpected exception, becomes that line's error line.
    """
    limits = limits or InputLimits()
    requests: list[ValidRequest] = []
    errors: list[OutputLine] = []
    seen: set[str] = set()
    total = 0
    for number, line in split_lines(data):
        total += 1
        try:
            checked = _check_line(number, line, job, seen, limits)
        except Exception as exc:
            logger.exception("line %d could not be validated", number)
            checked = error_line(number, None, ErrorCode.INVALID_LINE, f"could not be validated: {type(exc).__name__}")
        if isinstance(checked, ValidRequest):
            requests.append(checked)
        else:
            errors.append(checked)
    if total == 0:
        raise BatchInputError("input file has no request lines")
    return ValidatedInput(requests=requests, errors=errors, total=total)
