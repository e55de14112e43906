"""Request bodies, bounded: a size per route and a read timeout, so no body can hang or swamp the API.

uvicorn (h11) reads exactly the `Content-Length` a client declares: a client that declares more
than it sends would hold its request open for good, and nothing bounds a chunked body. This ASGI
middleware sits between Starlette's outermost error middleware and the routes; it answers a
declared length over the limit with 413 before reading anything, and wraps `receive` so a body
that grows past the limit ends in 413 and one that stalls ends in 408, both in OpenAI's error shape.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from pronk.api.error_responses import error_response
from pronk.pronk_error import PronkError
from pronk.settings import Settings

UPLOAD_PATH = "/v1/files"
MULTIPART_SLACK = 64 * 1024
"""Bytes a multipart envelope may add around an uploaded file."""


class BodyRefused(PronkError, HTTPException):
    """A request body over its size limit (413) or too slow to arrive (408); `code` is the error's stable code."""

    def __init__(self, status_code: int, message: str, code: str, param: str | None = None):
        super().__init__(status_code, message)
        self.code = code
        self.param = param


class BodyLimits:
    def __init__(self, app: ASGIApp, settings: Settings):
        self.app = app
        self.settings = settings

    def _limits(self, scope: Scope) -> tuple[int, float, bool]:
        """(most bytes, seconds, whether the seconds bound each read rather than the whole body)."""
        settings = self.settings
        if scope["method"] == "POST" and scope["path"].rstrip("/") == UPLOAD_PATH:
            return settings.api_max_upload_bytes + MULTIPART_SLACK, settings.api_body_timeout_s, True
        return settings.api_max_body_bytes, settings.api_body_timeout_s, False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit, timeout_s, per_read = self._limits(scope)
        declared = _content_length(scope)
        if declared is not None and declared > limit and not per_read:
            response = error_response(
                413,
                f"Request body is too large: {declared} bytes; the limit is {limit} bytes.",
                "invalid_request_error",
                None,
                "request_too_large",
            )
            await response(scope, receive, send)
            return
        await self.app(scope, _bounded_receive(receive, limit, timeout_s, per_read), send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _bounded_receive(receive: Receive, limit: int, timeout_s: float, per_read: bool) -> Receive:
    """`receive` refusing a body past `limit` bytes or slower than `timeout_s`; after the body it passes through."""
    state: dict[str, Any] = {"bytes": 0, "done": False, "deadline": time.monotonic() + timeout_s}

    async def bounded() -> Message:
        if state["done"]:
            return await receive()
        wait = timeout_s if per_read else state["deadline"] - time.monotonic()
        try:
            message = await asyncio.wait_for(receive(), timeout=max(wait, 0.0))
        except TimeoutError:
            raise BodyRefused(
                408, f"The request body did not arrive within {timeout_s:g} seconds.", "request_timeout"
            ) from None
        if message["type"] == "http.request":
            state["bytes"] += len(message.get("body", b""))
            if state["bytes"] > limit:
                if per_read:
                    raise BodyRefused(413, f"File is too large: the limit is {limit} bytes.", "file_too_large", "file")
                raise BodyRefused(413, f"Request body is too large: over {limit} bytes.", "request_too_large")
            state["done"] = not message.get("more_body", False)
        else:
            state["done"] = True
        return message

    return bounded
