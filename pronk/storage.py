"""Files on local disk or S3 through fsspec/s3fs: one way to read and write batch files and records."""

from __future__ import annotations

from typing import Any

import fsspec

from pronk.settings import Settings, get_settings


def storage_options(uri: str, settings: Settings | None = None) -> dict[str, Any]:
    settings = settings or get_settings()
    if uri.startswith("s3://") and settings.s3_endpoint_url:
        return {"client_kwargs": {"endpoint_url": settings.s3_endpoint_url}}
    return {}


def filesystem(uri: str, settings: Settings | None = None) -> fsspec.AbstractFileSystem:
    protocol = uri.split("://", 1)[0] if "://" in uri else "file"
    return fsspec.filesystem(protocol, **storage_options(uri, settings))


def read_bytes(uri: str, settings: Settings | None = None) -> bytes:
    with fsspec.open(uri, "rb", **storage_options(uri, settings)) as f:
        return f.read()


def write_bytes(uri: str, data: bytes, settings: Settings | None = None) -> None:
    fs = filesystem(uri, settings)
    parent = uri.rsplit("/", 1)[0]
    if "://" not in uri or uri.startswith("file://"):
        fs.makedirs(parent, exist_ok=True)
    with fsspec.open(uri, "wb", **storage_options(uri, settings)) as f:
        f.write(data)


def join(base: str, *parts: str) -> str:
    return "/".join([base.rstrip("/"), *parts])
