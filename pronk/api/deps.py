"""Dependencies of the routes, as `Annotated` aliases: settings, stores, the run starter, and the caller's owner."""

from __future__ import annotations

from typing import Annotated, Protocol

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from pronk.api.errors import ApiError
from pronk.api.keys import ApiKeyStore
from pronk.batches.files import FileStore
from pronk.batches.schemas import Batch
from pronk.batches.store import BatchStore
from pronk.settings import Settings

LOCAL_OWNER = "local"
"""The one owner of everything when auth is off (the embedded default)."""


class RunStarter(Protocol):
    async def start(self, batch: Batch, input_uri: str) -> str: ...


def get_settings_dep(request: Request) -> Settings:
    return request.app.state.settings


def get_files(request: Request) -> FileStore:
    return request.app.state.files


def get_batches(request: Request) -> BatchStore:
    return request.app.state.batches


def get_keys(request: Request) -> ApiKeyStore:
    return request.app.state.keys


def get_runs(request: Request) -> RunStarter:
    return request.app.state.runs


SettingsDep = Annotated[Settings, Depends(get_settings_dep)]
FilesDep = Annotated[FileStore, Depends(get_files)]
BatchesDep = Annotated[BatchStore, Depends(get_batches)]
KeysDep = Annotated[ApiKeyStore, Depends(get_keys)]
RunsDep = Annotated[RunStarter, Depends(get_runs)]

_bearer = HTTPBearer(auto_error=False, description="An API key from `pronk keys create` (when PRONK_API_AUTH=true).")


def current_owner(
    settings: SettingsDep, keys: KeysDep, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> str:
    """The owner whose files and batches this request may see."""
    if not settings.api_auth:
        return LOCAL_OWNER
    if credentials is None:
        raise ApiError(
            401,
            "You didn't provide an API key: send 'Authorization: Bearer <key>' (make one with `pronk keys create`).",
            code="missing_api_key",
            type="invalid_request_error",
        )
    key = keys.lookup(credentials.credentials)
    if key is None:
        secret = credentials.credentials
        raise ApiError(401, f"Incorrect API key provided: {secret[:6]}...{secret[-4:]}.", code="invalid_api_key")
    return key.owner


OwnerDep = Annotated[str, Depends(current_owner)]
