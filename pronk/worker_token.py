"""The engine workers' shared token, as pronk's processes find it: `PRONK_WORKER_TOKEN`, else a file the stack makes.

On one machine nobody needs to set anything: the first process that asks (`pronk stack up`, a worker,
a flow run) makes `<data_dir>/worker-token` with a random token, readable by its owner only (0600),
and every other process on that data dir reads it. Across hosts, set the same `PRONK_WORKER_TOKEN`
everywhere (a Kubernetes Secret, say): the file is then never read or made.

`worker_client` is how pronk's processes call workers: with the token, verifying `https://` workers against
`PRONK_WORKER_TLS_CA` (else the system's trust store).
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any

from pronk.engine.client import WorkerClient
from pronk.pronk_error import PronkError
from pronk.settings import Settings

TOKEN_FILE = "worker-token"


class WorkerTokenError(PronkError, RuntimeError):
    """The token file exists but holds no token, or is readable by others."""


def token_path(settings: Settings) -> Path:
    return settings.data_dir / TOKEN_FILE


def worker_token(settings: Settings) -> str:
    """The token every request to an engine worker carries and every worker demands."""
    if settings.worker_token is not None:
        return settings.worker_token.get_secret_value()
    path = token_path(settings)
    if not path.exists():
        _make(path)
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        raise WorkerTokenError(f"{path} is readable by others (mode {mode:o}); `chmod 600 {path}`")
    token = path.read_text().strip()
    if not token:
        raise WorkerTokenError(f"{path} is empty; delete it and a new token is made")
    return token


def worker_client(settings: Settings, **options: Any) -> WorkerClient:
    """A client of the engine workers carrying the token and trusting the CA bundle the settings name;
    `options` are the client's own (a timeout, say)."""
    return WorkerClient(worker_token(settings), ca_file=settings.worker_tls_ca, **options)


def _make(path: Path) -> None:
    """Write a new token in one step: made 0600 under a private name, then linked into place unless another
    process got there first (then its token stands)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, secrets.token_urlsafe(32).encode())
    finally:
        os.close(fd)
    try:
        os.link(tmp, path)
    except FileExistsError:
        pass
    finally:
        tmp.unlink(missing_ok=True)
