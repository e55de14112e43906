"""TLS between engine workers and their callers: a worker's server context from its certificate files, and the
context every caller verifies a worker by.

A worker given a certificate and its key serves HTTPS (`pronk.engine.worker.serve`); its callers verify it against a CA
bundle when one is given, else against the system's trust store, never not at all. The shared token
(`pronk.engine.auth`) still authenticates the callers: TLS keeps it, and the steps, private on the wire.
"""

from __future__ import annotations

import functools
import ssl
from pathlib import Path

from pronk.engine.engine_error import EngineError


class TlsFileError(EngineError, ValueError):
    """A certificate, key or CA bundle file is missing, unreadable or not what it should be."""


def _readable(what: str, path: str | Path) -> None:
    try:
        with open(path, "rb") as file:
            file.read(1)
    except OSError as exc:
        raise TlsFileError(f"worker TLS {what} {path}: {exc.strerror or exc}") from exc


def server_context(cert_file: str | Path, key_file: str | Path) -> ssl.SSLContext:
    """The context a worker serves HTTPS with: its certificate (chain) and private key, both PEM files."""
    _readable("certificate", cert_file)
    _readable("key", key_file)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert_file, key_file)
    except ssl.SSLError as exc:
        raise TlsFileError(
            f"worker TLS certificate {cert_file} with key {key_file}: not a PEM certificate and its key ({exc})"
        ) from exc
    return context


@functools.cache
def _system_trust(paths: ssl.DefaultVerifyPaths) -> ssl.SSLContext:
    """The system trust store's context, loaded once a process for each place the store is read from (`paths`,
    which `SSL_CERT_FILE` and `SSL_CERT_DIR` move): loading it reads every certificate in the store (~20 ms of CPU
    here), and a client made for each short exchange (a benchmark reading the workers' /stats every second) paid
    that each time. Callers only verify by it, so they can share one; a CA bundle's context is loaded afresh each
    time, so a rotated bundle is read."""
    return ssl.create_default_context()


def verify_context(ca_file: str | Path | None) -> ssl.SSLContext:
    """What a caller verifies workers' certificates by: the CA bundle `ca_file` alone when given, else the system's
    trust store. Names and addresses are checked too; a plain `http://` worker URL never uses it."""
    if ca_file is None:
        return _system_trust(ssl.get_default_verify_paths())
    _readable("CA bundle", ca_file)
    try:
        return ssl.create_default_context(cafile=str(ca_file))
    except ssl.SSLError as exc:
        raise TlsFileError(f"worker TLS CA bundle {ca_file}: no PEM certificates in it ({exc})") from exc
