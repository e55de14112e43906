"""What a hostile tester tried against the API: ids that are paths, deep JSON, odd names, lying bodies, weights."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from pathlib import Path
from urllib.parse import quote

import pytest
import uvicorn
from fastapi.testclient import TestClient

from pronk.api.app import create_app
from pronk.api.body_limits import BodyLimits
from pronk.api.files.serving import content_disposition
from pronk.api.keys import ApiKeyStore
from pronk.engine.worker import free_port
from pronk.settings import Settings
from tests.pronk.api.test_routes import RecordingRuns, assert_error, line, upload
from tests.pronk.cli.test_cli import local_env, pronk


@pytest.fixture
def api(tmp_path: Path):
    """Auth on, a small JSON body limit and a short body timeout; `admin` holds an admin key's headers."""
    settings = Settings(
        data_dir=tmp_path,
        storage_uri=str(tmp_path / "store"),
        s3_endpoint_url=None,
        api_auth=True,
        api_max_body_bytes=64 * 1024,
        api_body_timeout_s=1.0,
        reconcile_interval_s=0,
        weights_root=tmp_path / "weights",
    )
    app = create_app(settings, runs=RecordingRuns())
    keys = ApiKeyStore(settings)
    user, admin = keys.create()[0], keys.create(admin=True)[0]
    with TestClient(app) as client:
        yield client, {"Authorization": f"Bearer {user}"}, {"Authorization": f"Bearer {admin}"}, settings


def create(client, headers, file_id):
    body = {"input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h"}
    return client.post("/v1/batches", headers=headers, json=body)


@pytest.mark.parametrize("file_id", ["../../batches/{batch}", "../records/{file}", "file\x00x", "f" * 300, ""])
def test_input_file_ids_that_are_not_ids_get_400_and_reveal_nothing(api, file_id):
    client, user, *_ = api
    file = upload(client, user, line(0)).json()["id"]
    batch = create(client, user, file).json()["id"]
    response = create(client, user, file_id.format(batch=batch, file=file))
    error = assert_error(response, 400, "input_file_id")
    assert batch not in error["message"] or "pattern" in error["message"]


@pytest.mark.parametrize("path", ["/v1/files/{bad}", "/v1/files/{bad}/content", "/v1/batches/{bad}"])
@pytest.mark.parametrize("bad", ["%00", "a%2F..%2F..", "x" * 300, "%F0%9F%90%90"])
def test_path_ids_are_checked_before_any_lookup(api, path, bad):
    client, user, *_ = api
    response = client.get(path.format(bad=bad), headers=user)
    assert response.status_code in (400, 404)
    assert set(response.json()["error"]) == {"message", "type", "param", "code"}


def test_a_deeply_nested_json_body_is_a_400(api):
    client, user, *_ = api
    deep = "[" * 200_000 + "]" * 200_000
    for body in (deep[:60_000], '{"input_file_id": ' + "[" * 5000 + "]" * 5000 + "}"):
        response = client.post("/v1/batches", headers={**user, "content-type": "application/json"}, content=body)
        assert_error(response, 400)


def test_a_deeply_nested_upload_is_stored_for_the_flow_to_reject_its_line(api):
    client, user, *_ = api
    response = upload(client, user, "[" * 200_000 + "]" * 200_000 + "\n" + line(1))
    assert response.status_code == 200, response.text
    assert response.json()["bytes"] > 400_000


def test_a_batch_shows_its_files_by_id_and_never_where_they_lie_on_the_server(api):
    from pronk.batches.store import BatchStore

    client, user, _, settings = api
    uploaded = upload(client, user, line(0)).json()
    created = create(client, user, uploaded["id"]).json()
    batches = BatchStore(settings)
    stored = batches.load(created["id"])
    stored.output_uri, stored.error_uri = f"{settings.store_uri}/o.jsonl", f"{settings.store_uri}/e.jsonl"
    stored.steps_uri = f"{settings.store_uri}/s.jsonl"
    batches.save(stored)
    for response in (
        client.get(f"/v1/batches/{created['id']}", headers=user),
        client.get("/v1/batches", headers=user),
        client.post(f"/v1/batches/{created['id']}/cancel", headers=user),
    ):
        assert response.status_code == 200, response.text
        assert "_uri" not in response.text and str(settings.data_dir) not in response.text


def test_the_api_schema_of_a_batch_names_its_files_by_id_only(api):
    client, *_ = api
    schemas = client.get("/openapi.json").json()["components"]["schemas"]
    batch = set(schemas["BatchObject"]["properties"])
    assert {"output_file_id", "error_file_id"} <= batch
    assert not batch & {"output_uri", "error_uri", "steps_uri", "owner"}
    assert "Batch" not in schemas


def test_file_content_of_a_file_with_an_emoji_name_is_served_with_an_rfc6266_name(api):
    client, user, *_ = api
    name = "donnée 🐐.jsonl"
    uploaded = client.post(
        "/v1/files", headers=user, files={"file": (name, line(0).encode())}, data={"purpose": "batch"}
    ).json()
    response = client.get(f"/v1/files/{uploaded['id']}/content", headers=user)
    assert response.status_code == 200 and response.text == line(0)
    disposition = response.headers["content-disposition"]
    assert disposition == f"attachment; filename=\"donn_e _.jsonl\"; filename*=UTF-8''{quote(name, safe='')}"
    assert (
        content_disposition('a"b\\c\r\n.jsonl')
        == "attachment; filename=\"a_b_c__.jsonl\"; filename*=UTF-8''a%22b%5Cc%0D%0A.jsonl"
    )


def test_a_json_body_over_the_limit_is_refused_before_it_is_read(api):
    client, user, *_ = api
    body = json.dumps({"input_file_id": "file_x", "endpoint": "x", "completion_window": "24h", "pad": "x" * 70_000})
    error = assert_error(client.post("/v1/batches", headers=user, content=body), 413)
    assert error["code"] == "request_too_large" and "65536" in error["message"]


def bounded_call(settings: Settings, messages: list[dict], headers: list[tuple[bytes, bytes]]) -> list[dict]:
    """Drive the app as an ASGI server would, with a body that arrives as `messages` and then never ends."""
    app = create_app(settings)
    sent: list[dict] = []
    pending = list(messages)

    async def receive():
        if pending:
            return pending.pop(0)
        await asyncio.sleep(3600)

    async def send(message):
        sent.append(message)

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/batches",
        "raw_path": b"/v1/batches",
        "query_string": b"",
        "headers": headers,
        "http_version": "1.1",
        "scheme": "http",
        "server": ("127.0.0.1", 8000),
        "client": ("127.0.0.1", 1),
        "root_path": "",
    }
    asyncio.run(asyncio.wait_for(app(scope, receive, send), timeout=10))
    return sent


def test_a_body_that_stops_arriving_ends_in_408(api):
    *_, settings = api
    started = time.monotonic()
    sent = bounded_call(
        settings,
        [{"type": "http.request", "body": b'{"input', "more_body": True}],
        [(b"content-type", b"application/json"), (b"content-length", b"1000")],
    )
    assert sent[0]["status"] == 408 and time.monotonic() - started < 5
    assert json.loads(sent[1]["body"])["error"]["code"] == "request_timeout"


def test_a_chunked_body_that_grows_past_the_limit_ends_in_413(api):
    *_, settings = api
    chunk = {"type": "http.request", "body": b"x" * 40_000, "more_body": True}
    sent = bounded_call(settings, [chunk, chunk, chunk], [(b"content-type", b"application/json")])
    assert sent[0]["status"] == 413


def test_a_lying_content_length_does_not_hang_a_real_server(tmp_path):
    settings = Settings(
        data_dir=tmp_path,
        storage_uri=str(tmp_path / "store"),
        s3_endpoint_url=None,
        api_body_timeout_s=1.0,
        reconcile_interval_s=0,
    )
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(settings), host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        while not server.started:
            time.sleep(0.05)
        with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
            started = time.monotonic()
            conn.sendall(
                b"POST /v1/batches HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b'Content-Length: 100000\r\n\r\n{"input_file_id"'
            )
            reply = conn.recv(4096)
        assert reply.startswith(b"HTTP/1.1 408") and time.monotonic() - started < 5
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def test_body_limits_leave_websockets_and_lifespan_alone():
    calls = []

    async def app(scope, receive, send):
        calls.append(scope["type"])

    asyncio.run(BodyLimits(app, Settings(storage_uri="/tmp/x"))({"type": "lifespan"}, None, None))
    assert calls == ["lifespan"]


WEIGHT_CALLS = [
    ("/v1/weights/upload", lambda source: {"source": source, "model": "pronk-tiny"}),
    ("/v1/weights/reload", lambda source: {"pronk-tiny": source}),
]


@pytest.mark.parametrize(("path", "body"), WEIGHT_CALLS, ids=["upload", "reload"])
def test_weight_routes_refuse_keys_without_the_admin_scope(api, path, body):
    client, user, *_ = api
    error = assert_error(client.post(path, headers=user, json=body("models:/pronk-tiny/2")), 403)
    assert error["code"] == "admin_required" and error["type"] == "permission_error"
    assert "--admin" in error["message"]


def test_weights_status_names_jobs_and_worker_addresses_to_admin_keys_only(api):
    client, user, admin, _ = api
    error = assert_error(client.get("/v1/weights/status", headers=user), 403)
    assert error["code"] == "admin_required"
    assert client.get("/v1/weights/status", headers=admin).status_code == 200


@pytest.mark.parametrize(("path", "body"), WEIGHT_CALLS, ids=["upload", "reload"])
@pytest.mark.parametrize(
    "source",
    ["/etc", "{root}/../outside", "file:///etc", "http://example.com/ckpt", "{root}/ok\x00", "s" * 2000],
)
def test_weight_sources_are_models_s3_or_under_the_weights_root(api, path, body, source):
    client, _, admin, settings = api
    source = source.format(root=settings.weights_root)
    error = assert_error(client.post(path, headers=admin, json=body(source)), 400)
    assert error["code"] == "source_not_allowed"


def test_without_a_weights_root_no_server_path_is_accepted(tmp_path):
    from pronk.api.error_responses import ApiError
    from pronk.api.weights.serving import allowed_source

    settings = Settings(data_dir=tmp_path, storage_uri=str(tmp_path / "store"), weights_root=None)
    assert allowed_source("models:/m@live", settings, "source") == "models:/m@live"
    assert allowed_source("s3://b/ckpt", settings, "source") == "s3://b/ckpt"
    with pytest.raises(ApiError, match="PRONK_WEIGHTS_ROOT"):
        allowed_source(str(tmp_path), settings, "source")
    inside = Settings(data_dir=tmp_path, storage_uri=str(tmp_path / "store"), weights_root=tmp_path)
    assert allowed_source(f"file://{tmp_path}/a/../b", inside, "source") == str(tmp_path / "b")
    (tmp_path / "link").symlink_to("/etc")
    with pytest.raises(ApiError, match="not under the weights root"):
        allowed_source(str(tmp_path / "link"), inside, "source")


def test_with_auth_off_the_local_owner_is_admin(tmp_path):
    settings = Settings(
        data_dir=tmp_path,
        storage_uri=str(tmp_path / "store"),
        s3_endpoint_url=None,
        api_auth=False,
        reconcile_interval_s=0,
    )
    with TestClient(create_app(settings)) as client:
        response = client.post("/v1/weights/upload", json={"source": "/etc", "model": "pronk-tiny"})
    assert response.status_code == 400 and response.json()["error"]["code"] == "source_not_allowed"


def test_keys_create_admin_makes_an_admin_key_and_existing_keys_are_not(tmp_path):
    env = local_env(tmp_path)
    store = ApiKeyStore(Settings(data_dir=tmp_path, storage_uri=str(tmp_path / "store")))
    created = pronk(env, "keys", "create", "--admin", "--name", "ops")
    assert created.returncode == 0 and "admin" in created.stderr
    assert store.lookup(created.stdout.strip()).admin
    plain = pronk(env, "keys", "create").stdout.strip()
    assert not store.lookup(plain).admin
    assert "admin" in pronk(env, "keys", "list").stdout
    old = next(p for p in (tmp_path / "store" / "api_keys").iterdir() if store.lookup(plain).key_id in p.read_text())
    record = json.loads(old.read_text())
    del record["admin"]
    old.write_text(json.dumps(record))
    assert store.lookup(plain).admin is False


def test_malformed_keys_are_refused_without_a_lookup(api):
    client, *_ = api
    for key in [b"pk-../../files/records/x", b"pk-" + b"a" * 500, "pk-\u00e9".encode()]:
        response = client.get("/v1/files", headers={"Authorization": b"Bearer " + key})
        assert response.status_code == 401


def test_a_long_purpose_is_not_echoed_whole(api):
    client, headers = api[0], api[1]
    answer = client.post(
        "/v1/files", headers=headers, files={"file": ("in.jsonl", b"{}")}, data={"purpose": "p" * 5000}
    )
    assert answer.status_code == 400 and len(answer.text) < 400


@pytest.mark.parametrize("owner", [".", "..", "a/b", "a\n", "-a", "x" * 65])
def test_owners_that_would_name_odd_folders_are_refused(tmp_path, owner):
    with pytest.raises(ValueError, match="must be 1-64"):
        ApiKeyStore(Settings(data_dir=tmp_path, storage_uri=str(tmp_path / "store"))).create(owner=owner)
