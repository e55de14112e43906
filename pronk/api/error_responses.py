"""Every error the API returns has OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from pronk.pronk_error import PronkError

logger = logging.getLogger(__name__)

_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    409: "invalid_request_error",
}


class ApiError(PronkError):
    """An error answered to the client; `code` is a stable string clients may match on."""

    def __init__(
        self,
        status_code: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        type: str | None = None,
    ):
        super().__init__(message)
        self.status_code = status_code
        self.message = message
        self.param = param
        self.code = code
        self.type = type or _error_type(status_code)


def _error_type(status_code: int) -> str:
    return "server_error" if status_code >= 500 else _TYPES.get(status_code, "invalid_request_error")


def not_found(kind: str, object_id: str, param: str) -> ApiError:
    return ApiError(404, f"No {kind} found with id '{object_id}'.", param=param, code="not_found")


def error_response(status_code: int, message: str, type: str, param: str | None, code: str | None) -> JSONResponse:
    body = {"error": {"message": message, "type": type, "param": param, "code": code}}
    return JSONResponse(status_code=status_code, content=body)


async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
    return error_response(exc.status_code, exc.message, exc.type, exc.param, exc.code)


async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    errors = exc.errors()
    parts = []
    for error in errors:
        where = ".".join(str(p) for p in error["loc"] if p not in ("body", "query", "path"))
        parts.append(f"{where or 'body'}: {error['msg']} (got {error.get('input')!r:.80})")
    first = errors[0]["loc"] if errors else ()
    param = next((str(p) for p in first if p not in ("body", "query", "path")), None)
    return error_response(400, "Invalid request: " + "; ".join(parts), "invalid_request_error", param, "invalid_value")


async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    message = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
    if exc.status_code == 404 and message == "Not Found":
        message = f"Unknown request URL: {request.method} {request.url.path}."
    code, param = getattr(exc, "code", None), getattr(exc, "param", None)
    return error_response(exc.status_code, message, _error_type(exc.status_code), param, code)


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    logger.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return error_response(
        500, f"The server had an error processing the request: {type(exc).__name__}", "server_error", None, None
    )


def install_error_handlers(app: FastAPI) -> None:
    # Starlette types handlers as taking any Exception; each of these is registered for its own type only.
    app.add_exception_handler(ApiError, _api_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _validation_error)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, _http_error)  # type: ignore[arg-type]
    app.add_exception_handler(Exception, _unexpected)
