"""Dependencies of the routes, as `Annotated` aliases: settings, stores, the run starter, and the caller's owner."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from pronk.api.error_responses import ApiError
from pronk.api.idempotency import IdempotencyKeys
from pronk.api.keys import ApiKeyStore
from pronk.batches.file_store import FileStore
from pronk.batches.store import BatchStore
from pronk.settings import Settings
from pronk.stack.deployments import DeploymentStarter

LOCAL_OWNER = "local"
"""The one owner of everything when auth is off (the embedded default)."""


def get_settings_dep(request: Request) -> Settings:
    return request.app.state.settings


def get_files(request: Request) -> FileStore:
    return request.app.state.files


def get_batches(request: Request) -> BatchStore:
    return request.app.state.batches


def get_keys(request: Request) -> ApiKeyStore:
    return request.app.state.keys


def get_runs(request: Request) -> DeploymentStarter:
    return request.app.state.runs


def get_idempotency(request: Request) -> IdempotencyKeys:
    return request.app.state.idempotency


SettingsDep = Annotated[Settings, Depends(get_settings_dep)]
FilesDep = Annotated[FileStore, Depends(get_files)]
BatchesDep = Annotated[BatchStore, Depends(get_batches)]
KeysDep = Annotated[ApiKeyStore, Depends(get_keys)]
RunsDep = Annotated[DeploymentStarter, Depends(get_runs)]
"""Starts Prefect deployment runs: the batch queue's drainers, resumed batch runs (`pronk.api.batches.flow_runs`) and
Leaps (`pronk.api.weights.serving`)."""
IdempotencyDep = Annotated[IdempotencyKeys, Depends(get_idempotency)]

_bearer = HTTPBearer(auto_error=False, description="An API key from `pronk keys create` (when PRONK_API_AUTH=true).")


@dataclass(frozen=True, slots=True)
class Caller:
    """Who sent the request: the owner whose files and batches it may see, and whether it may change weights."""

    owner: str
    admin: bool


def current_caller(
    settings: SettingsDep, keys: KeysDep, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> Caller:
    """The caller of this request; with auth off, the one local owner, who is admin."""
    if not settings.api_auth:
        return Caller(LOCAL_OWNER, admin=True)
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
    return Caller(key.owner, key.admin)


CallerDep = Annotated[Caller, Depends(current_caller)]


def current_owner(caller: CallerDep) -> str:
    """The owner whose files and batches this request may see."""
    return caller.owner


def current_admin(caller: CallerDep) -> str:
    """The owner of an admin key (`pronk keys create --admin`); any other key gets 403."""
    if not caller.admin:
        raise ApiError(
            403,
            "This API key may not manage weights (upload, reload, status): use a key made with "
            "`pronk keys create --admin`.",
            code="admin_required",
        )
    return caller.owner


OwnerDep = Annotated[str, Depends(current_owner)]
AdminDep = Annotated[str, Depends(current_admin)]
