"""The API's routes in-process (TestClient) on a local store; the Prefect run starter is a recording double."""

from __future__ import annotations

import asyncio
import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from pronk.api.app import create_app
from pronk.api.batches.flow_runs import DRAIN_BATCH_QUEUE
from pronk.api.keys import ApiKeyStore
from pronk.batches.store import BatchStore
from pronk.settings import Settings
from tests.fakes import announce_worker


def line(i: int, model: str = "pronk-tiny", url: str = "/v1/chat/completions") -> str:
    body = {"model": model, "messages": [{"role": "user", "content": f"hi {i}"}], "max_tokens": 4}
    return json.dumps({"custom_id": f"r{i}", "method": "POST", "url": url, "body": body})


INTERNAL_URL = "http://127.0.0.1:4200/api"


class RecordingRuns:
    """A `DeploymentStarter` that counts the batch queue drainers it is asked to start; one started has yet to run
    until `running` is set."""

    def __init__(self):
        self.drainers = 0
        self.running = False
        self.refusals = 0
        """How many of the next starts fail as an overloaded Prefect server answers."""

    async def start(self, deployment: str, parameters: dict[str, Any], run_name: str, tags: list[str]) -> str:
        if self.refusals:
            self.refusals -= 1
            raise ConnectionError(f"Server error '503' for url '{INTERNAL_URL}/deployments/x/create_flow_run'")
        assert deployment == DRAIN_BATCH_QUEUE and parameters == {} and run_name.startswith("batch-queue-")
        self.drainers += 1
        return f"drainer-{self.drainers}"

    async def waiting(self, flow_run_id: str) -> bool:
        return not self.running


@pytest.fixture
def api(tmp_path: Path):
    settings = Settings(
        data_dir=tmp_path,
        storage_uri=str(tmp_path / "store"),
        s3_endpoint_url=None,
        api_auth=True,
        api_max_upload_bytes=4096,
        reconcile_interval_s=0,
        api_max_upload_lines=5,
        api_run_start_first_delay_s=0.0,
    )
    app = create_app(settings, runs=RecordingRuns())
    keys = ApiKeyStore(settings)
    alice, bob = keys.create()[0], keys.create()[0]
    with TestClient(app) as client:
        yield client, {"Authorization": f"Bearer {alice}"}, {"Authorization": f"Bearer {bob}"}, app.state.runs, tmp_path


def upload(client, headers, text: str, purpose: str = "batch"):
    return client.post(
        "/v1/files", headers=headers, files={"file": ("in.jsonl", text.encode())}, data={"purpose": purpose}
    )


def stored_contents(root: Path) -> list[Path]:
    return (
        sorted((root / "store" / "files" / "content").glob("*"))
        if (root / "store" / "files" / "content").exists()
        else []
    )


def assert_error(response, status: int, param: str | None = None):
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    if param is not None:
        assert error["param"] == param
    return error


def test_requests_without_a_valid_key_get_401_in_openai_shape(api):
    client, *_ = api
    assert assert_error(client.get("/v1/files"), 401)["code"] == "missing_api_key"
    error = assert_error(client.get("/v1/files", headers={"Authorization": "Bearer pk-wrong"}), 401)
    assert error["type"] == "authentication_error" and error["code"] == "invalid_api_key"
    assert client.get("/health").json() == {"status": "ok"}


def test_files_upload_list_read_download_delete_and_isolation(api):
    client, alice, bob, _, _ = api
    text = "\n".join(line(i) for i in range(3)) + "\n"
    ids = [upload(client, alice, text).json()["id"] for _ in range(3)]
    created = client.get(f"/v1/files/{ids[0]}", headers=alice).json()
    assert created["object"] == "file" and created["bytes"] == len(text) and created["purpose"] == "batch"
    assert "owner" not in created and "uri" not in created

    page = client.get("/v1/files", params={"limit": 2}, headers=alice).json()
    assert [f["id"] for f in page["data"]] == ids[::-1][:2] and page["has_more"] is True
    rest = client.get("/v1/files", params={"limit": 2, "after": page["last_id"]}, headers=alice).json()
    assert [f["id"] for f in rest["data"]] == [ids[0]] and rest["has_more"] is False
    assert client.get(f"/v1/files/{ids[0]}/content", headers=alice).text == text
    assert len(client.get("/v1/files", params={"purpose": "batch", "limit": 1}, headers=alice).json()["data"]) == 1
    assert client.get("/v1/files", params={"purpose": "batch_output"}, headers=alice).json()["data"] == []

    assert client.get("/v1/files", headers=bob).json()["data"] == []
    for path in (f"/v1/files/{ids[0]}", f"/v1/files/{ids[0]}/content"):
        assert_error(client.get(path, headers=bob), 404, "file_id")
    assert_error(client.delete(f"/v1/files/{ids[0]}", headers=bob), 404)

    assert client.delete(f"/v1/files/{ids[0]}", headers=alice).json() == {
        "id": ids[0],
        "object": "file",
        "deleted": True,
    }
    assert_error(client.get(f"/v1/files/{ids[0]}", headers=alice), 404)


@pytest.mark.parametrize(
    ("text", "status", "code"),
    [
        ("x" * 5000, 413, "file_too_large"),
        ("x" * 200_000, 413, "file_too_large"),
        ("\n".join(line(i) for i in range(6)), 400, "too_many_lines"),
    ],
    ids=["over-bytes", "over-bytes-by-declared-length", "over-lines"],
)
def test_uploads_over_a_limit_are_refused_and_nothing_is_stored(api, text, status, code):
    client, alice, _, _, root = api
    error = assert_error(upload(client, alice, text), status, "file")
    assert error["code"] == code and ("limit" in error["message"] or "at most" in error["message"])
    assert stored_contents(root) == [] and client.get("/v1/files", headers=alice).json()["data"] == []


@pytest.mark.parametrize("text", ["", "\n", "  \n\t\n\r\n"], ids=["empty", "one-newline", "blank-lines"])
def test_an_upload_without_a_request_line_is_refused_and_nothing_is_stored(api, text):
    client, alice, _, _, root = api
    error = assert_error(upload(client, alice, text), 400, "file")
    assert error["code"] == "empty_file" and "no request lines" in error["message"]
    assert stored_contents(root) == [] and client.get("/v1/files", headers=alice).json()["data"] == []


def test_upload_needs_purpose_batch(api):
    client, alice, *_ = api
    assert_error(upload(client, alice, line(0), purpose="fine-tune"), 400, "purpose")


def create(client, headers, file_id, key: str | None = None, **extra):
    body = {"input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h", **extra}
    return client.post("/v1/batches", headers={**headers, **({"Idempotency-Key": key} if key else {})}, json=body)


def starts_done(client) -> None:
    """Wait for the drainer starts the API makes in the background."""
    client.portal.call(client.app.state.drainers.drain)


def queued(client) -> list[tuple[str, str]]:
    """(batch id, input URI) of each batch in the batch queue, first queued first."""
    return [(e.run.batch_id, e.run.input_uri) for e in client.app.state.drainers.queue.waiting()]


def test_batch_create_picks_the_job_serving_the_model_and_starts_a_run(api):
    client, alice, bob, runs, _ = api
    file_id = upload(client, alice, "\n".join(line(i) for i in range(3))).json()["id"]
    batch = create(client, alice, file_id, metadata={"team": "x"}).json()
    assert batch["object"] == "batch" and batch["status"] == "validating" and batch["job_id"] == "job-c0ffee01"
    assert (
        batch["model"] == "pronk-tiny" and batch["request_counts"]["total"] == 3 and batch["metadata"] == {"team": "x"}
    )
    assert batch["expires_at"] == batch["created_at"] + 24 * 3600
    starts_done(client)
    ((queued_id, input_uri),) = queued(client)
    assert "owner" not in batch and queued_id == batch["id"] and input_uri.endswith(f"{file_id}.jsonl")
    assert runs.drainers == 1
    assert client.get(f"/v1/batches/{batch['id']}", headers=alice).json()["id"] == batch["id"]
    assert_error(client.get(f"/v1/batches/{batch['id']}", headers=bob), 404, "batch_id")
    assert_error(client.post(f"/v1/batches/{batch['id']}/cancel", headers=bob), 404)
    assert_error(create(client, bob, file_id), 404, "file_id")

    unlimited = create(client, alice, file_id, completion_window="unlimited", job_id="job-c0ffee01").json()
    assert unlimited["expires_at"] is None and unlimited["completion_window"] == "unlimited"


@pytest.mark.parametrize(
    ("lines", "extra", "param", "needle"),
    [
        ([line(0)], {"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata", "at most 16 pairs"),
        ([line(0)], {"metadata": {"k" * 65: "v"}}, "metadata", "limit is 64"),
        ([line(0)], {"metadata": {"k": "v" * 513}}, "metadata", "limit is 512"),
        ([line(0), line(1, url="/v1/embeddings")], {}, "endpoint", "/v1/embeddings"),
        ([line(0)], {"endpoint": "/v1/embeddings"}, "endpoint", "not served"),
        ([line(0)], {"job_id": "job-00000000"}, "job_id", "No job 'job-00000000'"),
        ([line(0, model="gpt-x")], {}, "job_id", "no job serves model 'gpt-x'"),
        ([line(0), line(1, model="gpt-x")], {}, "job_id", "2 models"),
        ([line(0, model="gpt-x")], {"job_id": "job-c0ffee01"}, "job_id", "serves model 'pronk-tiny'"),
        ([line(0)], {"completion_window": "1h"}, "completion_window", "24h"),
        ([line(0)], {"jobid": "job-c0ffee01"}, "jobid", "Extra inputs"),
    ],
    ids=[
        "17-pairs",
        "long-key",
        "long-value",
        "line-url",
        "endpoint",
        "unknown-job",
        "no-job",
        "two-models",
        "job-model",
        "window",
        "unknown-param",
    ],
)
def test_batch_create_refuses_unclear_requests_with_a_400_naming_the_param(api, lines, extra, param, needle):
    client, alice, _, runs, _ = api
    file_id = upload(client, alice, "\n".join(lines)).json()["id"]
    error = assert_error(create(client, alice, file_id, **extra), 400, param)
    assert needle in error["message"] and queued(client) == [] and runs.drainers == 0


def test_a_model_served_by_several_jobs_goes_to_the_one_with_live_workers(api):
    """smollm2-135m-instruct is served by the agent-real and smollm2-cpu job files; only one is up."""
    client, alice, _, _, tmp_path = api
    file_id = upload(client, alice, line(0, model="smollm2-135m-instruct")).json()["id"]
    error = assert_error(create(client, alice, file_id), 400, "job_id")
    assert "job-10d91d95 (agent-real)" in error["message"] and "job-5a011201 (smollm2-cpu)" in error["message"]

    job = "job-5a011201"
    announce_worker(Settings(data_dir=tmp_path), job, "smollm2-135m-instruct/1")
    created = create(client, alice, file_id)
    assert created.status_code == 200, created.text
    assert created.json()["job_id"] == job


def test_a_batch_on_a_file_without_request_lines_says_so(api):
    """A file recorded with no request line (uploaded before uploads were checked for one) cannot make a batch."""
    client, alice, _, runs, root = api
    file_id = upload(client, alice, line(0)).json()["id"]
    record = root / "store" / "files" / "records" / f"{file_id}.json"
    record.write_text(json.dumps({**json.loads(record.read_text()), "lines": 0, "models": [], "urls": []}))
    error = assert_error(create(client, alice, file_id), 400, "input_file_id")
    assert error["code"] == "empty_file" and "no request lines" in error["message"] and "models" not in error["message"]
    assert queued(client) == [] and runs.drainers == 0


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/files/{file}"),
        ("GET", "/v1/files/{file}/content"),
        ("DELETE", "/v1/files/{file}"),
        ("GET", "/v1/batches/{batch}"),
        ("POST", "/v1/batches/{batch}/cancel"),
    ],
)
def test_a_malformed_id_is_a_400_and_a_well_formed_unknown_id_a_404(api, method, path):
    client, alice, *_ = api
    param = "batch_id" if "batches" in path else "file_id"
    for file, batch in (("file-abc", "batch-abc"), ("nope", "nope"), ("file_" + "0" * 23, "batch_" + "A" * 24)):
        error = assert_error(client.request(method, path.format(file=file, batch=batch), headers=alice), 400, param)
        assert "pattern" in error["message"]
    unknown = path.format(file="file_" + "0" * 24, batch="batch_" + "0" * 24)
    assert assert_error(client.request(method, unknown, headers=alice), 404, param)["code"] == "not_found"


def test_a_batch_on_a_malformed_input_file_id_is_a_400_and_on_an_unknown_one_a_404(api):
    client, alice, *_ = api
    assert_error(create(client, alice, "file-abc"), 400, "input_file_id")
    assert_error(create(client, alice, "file_" + "0" * 24), 404, "file_id")


def test_batches_list_newest_first_with_cursor_pagination(api):
    client, alice, bob, _, _ = api
    file_id = upload(client, alice, line(0)).json()["id"]
    ids = [create(client, alice, file_id).json()["id"] for _ in range(3)]
    first = client.get("/v1/batches", params={"limit": 2}, headers=alice).json()
    assert first["object"] == "list" and [b["id"] for b in first["data"]] == ids[::-1][:2] and first["has_more"]
    assert first["first_id"] == ids[2] and first["last_id"] == ids[1] and "owner" not in first["data"][0]
    second = client.get("/v1/batches", params={"limit": 2, "after": first["last_id"]}, headers=alice).json()
    assert [b["id"] for b in second["data"]] == [ids[0]] and second["has_more"] is False
    assert client.get("/v1/batches", headers=bob).json()["data"] == []
    assert_error(client.get("/v1/batches", params={"limit": 101}, headers=alice), 400, "limit")


def test_cancel_shows_cancelling_at_once_and_refuses_a_finished_batch(api):
    client, alice, _, _, _ = api
    file_id = upload(client, alice, line(0)).json()["id"]
    batch_id = create(client, alice, file_id).json()["id"]
    cancelled = client.post(f"/v1/batches/{batch_id}/cancel", headers=alice).json()
    assert cancelled["status"] == "cancelling" and cancelled["cancelling_at"]
    assert client.get(f"/v1/batches/{batch_id}", headers=alice).json()["status"] == "cancelling"
    assert client.post(f"/v1/batches/{batch_id}/cancel", headers=alice).json()["status"] == "cancelling"

    store = client.app.state.batches
    done = store.load(batch_id)
    done.mark("completed")
    store.save(done)
    assert (
        assert_error(client.post(f"/v1/batches/{batch_id}/cancel", headers=alice), 409)["code"]
        == "batch_not_cancellable"
    )


def test_a_refused_drainer_start_is_tried_again_and_batches_wait_queued_until_one_starts(api):
    client, alice, _, runs, _ = api
    file_id = upload(client, alice, line(0)).json()["id"]
    runs.refusals = 2
    first = create(client, alice, file_id)
    assert first.status_code == 200 and first.json()["status"] == "validating"
    starts_done(client)
    assert runs.drainers == 1 and [batch_id for batch_id, _ in queued(client)] == [first.json()["id"]]

    runs.running, runs.refusals = True, 100  # the drainer runs, and Prefect refuses every start of the next one
    second = create(client, alice, file_id).json()
    starts_done(client)
    batch = client.get(f"/v1/batches/{second['id']}", headers=alice).json()
    assert batch["status"] == "validating" and runs.drainers == 1
    assert [batch_id for batch_id, _ in queued(client)] == [first.json()["id"], second["id"]]

    runs.refusals = 0  # Prefect answers again: the reconcile loop's next pass asks for a drainer
    drainers = client.app.state.drainers

    async def ask_again():
        drainers.want_drainer()
        await drainers.drain()

    client.portal.call(ask_again)
    assert runs.drainers == 2


def test_an_idempotency_key_makes_a_retried_create_return_the_first_batch(api):
    client, alice, bob, runs, _ = api
    file_id = upload(client, alice, line(0)).json()["id"]
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: create(client, alice, file_id, key="retry-1"), range(8)))
    assert {a.status_code for a in answers} == {200} and len({a.json()["id"] for a in answers}) == 1
    starts_done(client)
    assert len(queued(client)) == 1 and runs.drainers == 1
    assert create(client, alice, file_id, key="retry-2").json()["id"] != answers[0].json()["id"]
    other = create(client, alice, file_id, key="retry-1", metadata={"a": "b"})
    assert assert_error(other, 409, "Idempotency-Key")["code"] == "idempotency_key_reused"
    bob_file = upload(client, bob, line(0)).json()["id"]
    assert create(client, bob, bob_file, key="retry-1").json()["id"] != answers[0].json()["id"]
    spaced = create(client, alice, file_id, key="has space")
    assert assert_error(spaced, 400, "Idempotency-Key")["code"] == "invalid_key"


def test_a_burst_of_creates_answers_without_waiting_for_the_runs_to_start(api):
    client, alice, bob, runs, _ = api
    files = {who: upload(client, headers, line(0)).json()["id"] for who, headers in (("a", alice), ("b", bob))}
    slow = asyncio.Event()
    original = runs.start

    async def waits_for_prefect(*args):
        await slow.wait()
        return await original(*args)

    runs.start = waits_for_prefect
    requests = [(alice, files["a"], f"key-{i}") if i % 2 else (bob, files["b"], f"key-{i}") for i in range(40)]
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda r: create(client, r[0], r[1], key=r[2]), requests))
    assert all(a.status_code == 200 and a.json()["status"] == "validating" for a in answers)
    client.portal.call(slow.set)
    starts_done(client)
    ids = [a.json()["id"] for a in answers]
    assert sorted(batch_id for batch_id, _ in queued(client)) == sorted(set(ids))
    assert runs.drainers == 1  # many creates at once ask for one drainer


def test_a_restarted_api_queues_the_batches_left_validating_outside_the_queue(api):
    """A batch recorded by an API that died before queueing it is queued by the next API process, once; a batch
    already queued is not queued again."""
    client, alice, _, _, _ = api
    file_id = upload(client, alice, line(0)).json()["id"]
    started = create(client, alice, file_id).json()["id"]
    starts_done(client)
    settings = client.app.state.settings
    store = BatchStore(settings)
    lost = store.load(started).model_copy(update={"id": "batch_" + "7" * 24})
    store.create(lost)
    restarted = create_app(settings, runs=RecordingRuns())
    with TestClient(restarted) as again:
        deadline = time.monotonic() + 10
        while restarted.state.runs.drainers < 1 and time.monotonic() < deadline:
            again.portal.call(restarted.state.drainers.drain)
            time.sleep(0.05)
        assert sorted(batch_id for batch_id, _ in queued(again)) == sorted([started, lost.id])
    assert restarted.state.runs.drainers == 1
