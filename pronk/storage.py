"""Files on local disk or S3 through fsspec/s3fs: one way to read and write batch files and records."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import fsspec

from pronk.settings import Settings


def storage_options(uri: str, settings: Settings) -> dict[str, Any]:
    if not uri.startswith("s3://"):
        return {}
    # Other processes write the same bucket: a cached listing would hide their objects.
    options: dict[str, Any] = {"use_listings_cache": False}
    if settings.s3_endpoint_url:
        options["client_kwargs"] = {"endpoint_url": settings.s3_endpoint_url}
    return options


def filesystem(uri: str, settings: Settings) -> fsspec.AbstractFileSystem:
    protocol = uri.split("://", 1)[0] if "://" in uri else "file"
    return fsspec.filesystem(protocol, **storage_options(uri, settings))


def read_bytes(uri: str, settings: Settings) -> bytes:
    """One whole GET: unlike a file object's ranged reads, it cannot fail when another process rewrites the object."""
    return filesystem(uri, settings).cat_file(uri)


def write_bytes(uri: str, data: bytes, settings: Settings) -> None:
    """Replace the object at once: an S3 PUT is atomic, a local file is written beside it and renamed."""
    fs = filesystem(uri, settings)
    if "://" in uri and not uri.startswith("file://"):
        fs.pipe_file(uri, data)
        return
    path = Path(uri.removeprefix("file://"))
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.partial")
    partial.write_bytes(data)
    os.replace(partial, path)


def join(base: str, *parts: str) -> str:
    return "/".join([base.rstrip("/"), *parts])


def exists(uri: str, settings: Settings) -> bool:
    return filesystem(uri, settings).exists(uri)


def size(uri: str, settings: Settings) -> int:
    return int(filesystem(uri, settings).size(uri))


def delete(uri: str, settings: Settings) -> None:
    """Remove one object; a missing one is fine."""
    fs = filesystem(uri, settings)
    if fs.exists(uri):
        fs.rm_file(uri)


def list_names(prefix: str, settings: Settings) -> list[str]:
    """Names (last path part) of the objects directly under `prefix`, sorted; none when it does not exist."""
    fs = filesystem(prefix, settings)
    try:
        return sorted(path.rstrip("/").rsplit("/", 1)[-1] for path in fs.ls(prefix, detail=False))
    except FileNotFoundError:
        return []


def read_many(uris: list[str], settings: Settings) -> list[bytes | None]:
    """Read several objects of one folder at once (s3fs fetches them concurrently); None for a missing one."""
    if not uris:
        return []
    contents = filesystem(uris[0], settings).cat(uris, on_error="omit")
    by_name = {key.rstrip("/").rsplit("/", 1)[-1]: value for key, value in contents.items()}
    return [by_name.get(uri.rsplit("/", 1)[-1]) for uri in uris]


def iter_chunks(uri: str, settings: Settings, chunk_size: int = 1 << 20):
    """Yield the object's bytes a chunk at a time, so large files never sit in memory whole."""
    with fsspec.open(uri, "rb", **storage_options(uri, settings)) as f:
        while chunk := f.read(chunk_size):
            yield chunk
