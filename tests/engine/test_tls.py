"""TLS between workers and their callers: a worker's certificate files fail early and by name, a worker serves HTTPS
on its own bound socket, and a caller trusts the CA bundle it is given, else the system's store, never nothing."""

import asyncio
import threading
import time

import httpx
import pytest
from fastapi import FastAPI

from pronk.engine.client import WorkerClient, WorkerUnavailable
from pronk.engine.tls import TlsFileError, server_context, verify_context
from pronk.engine.worker import advertise_url, bind_socket, http_server
from tests.tls_certs import issue, make_ca

TOKEN = "t"


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pki")
    ca, other = make_ca(folder, "pronk-test-ca"), make_ca(folder, "another-ca")
    cert, key = issue(ca, folder, "worker", ["127.0.0.1"])
    return {"ca": ca.bundle, "other": other.bundle, "cert": cert, "key": key}


@pytest.fixture(scope="module")
def https_worker(pki):
    """A worker's HTTP server (`pronk.engine.worker.http_server`) on a pre-bound socket, with the certificate for
    127.0.0.1; yields its https:// URL."""
    app = FastAPI()

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/release")
    async def release() -> dict[str, int]:
        return {"released": 0}

    sock = bind_socket("127.0.0.1")
    server = http_server(app, server_context(pki["cert"], pki["key"]))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.started
    yield advertise_url("127.0.0.1", sock.getsockname()[1], None, https=True)
    server.should_exit = True
    thread.join(timeout=10)
    sock.close()


async def _release(client: WorkerClient, url: str) -> None:
    try:
        await client.release(url, ["trace"])
    finally:
        await client.aclose()


def test_a_caller_given_the_ca_bundle_reaches_an_https_worker(https_worker, pki):
    asyncio.run(_release(WorkerClient(TOKEN, ca_file=pki["ca"]), https_worker))


def test_a_caller_trusting_another_ca_is_refused(https_worker, pki):
    """Refused as a connection that failed (`httpx.ConnectError`), not as a slow one."""
    with pytest.raises(WorkerUnavailable, match=r"ConnectError: .*CERTIFICATE_VERIFY_FAILED"):
        asyncio.run(_release(WorkerClient(TOKEN, ca_file=pki["other"]), https_worker))


def test_without_a_ca_bundle_a_caller_trusts_the_systems_store_not_nothing(https_worker, pki, monkeypatch):
    with pytest.raises(WorkerUnavailable, match="CERTIFICATE_VERIFY_FAILED"):
        asyncio.run(_release(WorkerClient(TOKEN), https_worker))
    # OpenSSL's default store follows SSL_CERT_FILE: trusting the test CA there is trusting it system-wide.
    monkeypatch.setenv("SSL_CERT_FILE", str(pki["ca"]))
    asyncio.run(_release(WorkerClient(TOKEN), https_worker))


def test_callers_of_the_system_store_share_one_context_until_the_store_moves(pki, monkeypatch):
    shared = verify_context(None)
    assert verify_context(None) is shared
    monkeypatch.setenv("SSL_CERT_FILE", str(pki["ca"]))
    assert verify_context(None) is not shared


def test_plain_http_to_an_https_worker_gets_no_answer(https_worker):
    with pytest.raises(httpx.TransportError):
        httpx.get(https_worker.replace("https://", "http://") + "/health", timeout=5)


def test_a_worker_reached_by_a_name_its_certificate_lacks_is_refused(https_worker, pki):
    """The certificate names 127.0.0.1 alone: the same worker called as `localhost` fails the name check."""
    with pytest.raises(WorkerUnavailable, match="Hostname mismatch"):
        asyncio.run(_release(WorkerClient(TOKEN, ca_file=pki["ca"]), https_worker.replace("127.0.0.1", "localhost")))


def test_missing_or_unreadable_files_are_named(pki, tmp_path):
    missing = tmp_path / "nowhere.pem"
    with pytest.raises(TlsFileError, match=f"certificate {missing}: No such file"):
        server_context(missing, pki["key"])
    with pytest.raises(TlsFileError, match=f"key {missing}: No such file"):
        server_context(pki["cert"], missing)
    with pytest.raises(TlsFileError, match=f"CA bundle {tmp_path}: Is a directory"):
        verify_context(tmp_path)


def test_a_key_of_another_certificate_or_a_file_that_is_no_pem_is_refused(pki, tmp_path):
    _, other_key = issue(make_ca(tmp_path, "ca"), tmp_path, "other", ["127.0.0.1"])
    with pytest.raises(TlsFileError, match=f"certificate {pki['cert']} with key {other_key}"):
        server_context(pki["cert"], other_key)
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    with pytest.raises(TlsFileError, match=f"CA bundle {garbage}: no PEM certificates"):
        verify_context(garbage)


def test_callers_check_certificates_and_names_whatever_they_trust(pki):
    for context in (verify_context(None), verify_context(pki["ca"])):
        assert context.check_hostname and context.verify_mode.name == "CERT_REQUIRED"
    assert [c["subject"] for c in verify_context(pki["ca"]).get_ca_certs()] == [((("commonName", "pronk-test-ca"),),)]


@pytest.mark.parametrize(
    ("host", "advertise", "url"),
    [
        ("10.231.0.2", None, "https://10.231.0.2:8100"),
        ("::1", None, "https://[::1]:8100"),
        ("0.0.0.0", "https://worker-0.pronk-workers:8100/", "https://worker-0.pronk-workers:8100"),
    ],
)
def test_a_worker_serving_tls_announces_an_https_url(host, advertise, url):
    assert advertise_url(host, 8100, advertise, https=True) == url


def test_a_worker_serving_tls_refuses_to_announce_a_plain_url():
    with pytest.raises(ValueError, match="https://"):
        advertise_url("10.231.0.2", 8100, "http://10.231.0.2:8100", https=True)
