"""Workers on the network: every request but a bare health probe carries the shared token, or gets 401."""

import asyncio
from types import SimpleNamespace

import httpx
import pytest
from fastapi.testclient import TestClient

from pronk.engine.auth import MissingToken, auth_headers, token_matches
from pronk.engine.client import WorkerClient, WorkerUnavailable
from pronk.engine.registry import FileRegistry
from pronk.engine.vllm_backend import VllmBackend
from pronk.engine.worker import advertise_url, create_app
from tests.engine.test_router import JOB, step

TOKEN = "s3cret-token"


@pytest.fixture
def worker(tmp_path):
    backend = VllmBackend("m", "m/1", "w0", JOB, {}, _engine=SimpleNamespace())
    return create_app(backend, FileRegistry(tmp_path), "http://10.0.0.2:8100", 1.0, lambda *a: None, token=TOKEN)


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("post", "/generate"),
        ("post", "/release"),
        ("get", "/stats"),
        ("get", "/weights"),
        ("post", "/weights/stage"),
        ("post", "/weights/reload"),
        ("get", "/docs"),
        ("get", "/openapi.json"),
        ("get", "/no-such-path"),
    ],
)
@pytest.mark.parametrize("headers", [{}, {"authorization": "Bearer wrong"}, {"authorization": TOKEN}])
def test_a_worker_refuses_every_request_without_the_token(worker, method, path, headers):
    response = getattr(TestClient(worker), method)(path, headers=headers)
    assert response.status_code == 401 and response.json() == {"detail": "missing or wrong worker token"}


def test_a_worker_serves_requests_with_the_token(worker):
    client = TestClient(worker, headers=auth_headers(TOKEN))
    assert client.get("/stats").json()["worker_id"] == "w0"
    assert client.get("/weights").json()["model_version"] == "m/1"


def test_health_stays_open_for_probes_but_names_nothing_without_the_token(worker):
    assert TestClient(worker).get("/health").json() == {"status": "ok"}
    assert TestClient(worker, headers={"authorization": "Bearer wrong"}).get("/health").json() == {"status": "ok"}
    full = TestClient(worker, headers=auth_headers(TOKEN)).get("/health").json()
    assert full == {"status": "ok", "worker_id": "w0", "model_version": "m/1"}


def test_token_matching_is_exact():
    assert token_matches(b"Bearer s3cret-token", TOKEN) and token_matches(b"bearer s3cret-token", TOKEN)
    for header in (None, b"", b"Bearer", b"Bearer s3cret", b"Bearer s3cret-token2", b"Basic s3cret-token"):
        assert not token_matches(header, TOKEN)


def test_an_empty_token_is_refused_on_both_sides(tmp_path):
    with pytest.raises(MissingToken):
        WorkerClient("")
    backend = VllmBackend("m", "m/1", "w0", JOB, {}, _engine=SimpleNamespace())
    with pytest.raises(MissingToken):
        create_app(backend, FileRegistry(tmp_path), "http://w0", 1.0, lambda *a: None, token="")


def test_the_client_sends_the_token_and_routes_around_a_worker_that_refuses_it():
    seen: list[str | None] = []

    def refuse(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("authorization"))
        return httpx.Response(401, json={"detail": "missing or wrong worker token"})

    client = WorkerClient(TOKEN)
    client._http = httpx.AsyncClient(transport=httpx.MockTransport(refuse), headers=auth_headers(TOKEN))
    with pytest.raises(WorkerUnavailable, match="HTTP 401"):
        asyncio.run(client.generate("http://w0", step()))
    assert seen == [f"Bearer {TOKEN}"]


def test_the_real_client_carries_the_token_header():
    assert WorkerClient(TOKEN)._http.headers["authorization"] == f"Bearer {TOKEN}"


@pytest.mark.parametrize(
    ("host", "port", "advertise", "url"),
    [
        ("127.0.0.1", 8100, None, "http://127.0.0.1:8100"),
        ("10.231.0.3", 8100, None, "http://10.231.0.3:8100"),
        ("0.0.0.0", 8100, "http://worker-0.pronk-workers:8100/", "http://worker-0.pronk-workers:8100"),
        ("::1", 8100, None, "http://[::1]:8100"),
    ],
)
def test_a_worker_announces_the_url_others_reach_it_by(host, port, advertise, url):
    assert advertise_url(host, port, advertise) == url


@pytest.mark.parametrize(("host", "advertise"), [("0.0.0.0", None), ("::", None), ("10.0.0.1", "10.0.0.1:8100")])
def test_an_unreachable_announcement_is_refused(host, advertise):
    with pytest.raises(ValueError):
        advertise_url(host, 8100, advertise)
