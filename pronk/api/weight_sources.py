"""Checkpoint sources the weights routes accept over HTTP: `models:/`, `s3://`, or a folder under the weights root.

A server path in a request body would let any caller register (and Leap a shared fleet to) whatever
the API process can read, so local paths are refused unless `PRONK_WEIGHTS_ROOT` names a folder,
and then only paths inside it (after resolving `..` and symlinks) are accepted.
"""

from __future__ import annotations

from pathlib import Path

from pronk.api.error_responses import ApiError
from pronk.models.registry import MODELS_SCHEME
from pronk.settings import Settings

REMOTE_SCHEMES = (MODELS_SCHEME, "s3://")
MAX_SOURCE = 1024


def allowed_source(uri: str, settings: Settings, param: str) -> str:
    """`uri` when the API may use it as a checkpoint source; otherwise a 400 that says what is accepted."""
    if len(uri) > MAX_SOURCE or "\x00" in uri:
        raise _refused(f"The source {uri[:80]!r}… is not a usable URI.", param)
    if uri.startswith(REMOTE_SCHEMES):
        return uri
    root = settings.weights_root
    if root is None:
        raise _refused(
            f"The source {uri!r} is a server path; over HTTP only models:/ and s3:// sources are accepted"
            " (set PRONK_WEIGHTS_ROOT to allow a folder on the server).",
            param,
        )
    if "://" in uri and not uri.startswith("file://"):
        raise _refused(f"The source {uri!r} has an unsupported scheme; use models:/, s3:// or a path.", param)
    try:
        path = Path(uri.removeprefix("file://")).resolve()
        inside = path.is_relative_to(root.resolve())
    except (OSError, ValueError, RuntimeError):
        inside = False
    if not inside:
        raise _refused(f"The source {uri!r} is not under the weights root of this server.", param)
    return str(path)


def _refused(message: str, param: str) -> ApiError:
    return ApiError(400, message, param=param, code="source_not_allowed")
