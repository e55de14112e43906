"""The batch flow end to end: real vLLM workers, a real Prefect server, MLflow on SQLite."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from pronk.batches.store import BatchStore
from pronk.engine.auth import auth_headers
from pronk.jobs.catalog import resolve_job
from pronk.settings import get_settings
from pronk.stack.state import worker_name
from pronk.worker_token import worker_token
from tests.conftest import DATA
from tests.flows.deployment_runs import run_batch_deployment

pytestmark = pytest.mark.e2e
JOB = "job-c0ffee01"


def run(input_path: Path, out_dir: Path, **kwargs) -> dict:
    from pronk.flows.batch import run_batch

    return asyncio.run(run_batch(input_uri=str(input_path), job_id=JOB, output_dir=str(out_dir), **kwargs))


def read_jsonl(uri: str) -> list[dict]:
    return [json.loads(line) for line in Path(uri).read_text().splitlines()]


def test_mixed_file_gives_exactly_one_line_per_input_line(stack, tmp_path):
    batch = run(DATA / "mixed_batch.jsonl", tmp_path)
    outputs, errors = read_jsonl(batch["output_uri"]), read_jsonl(batch["error_uri"])

    assert batch["status"] == "completed"
    assert batch["request_counts"] == {"total": 10, "completed": 3, "failed": 7, "cancelled": 0}
    assert len(outputs) + len(errors) == 10
    assert [o["custom_id"] for o in outputs] == ["ok-1", "ok-2", "ok-3"]
    assert sorted(e["error"]["line"] for e in errors) == [2, 3, 4, 5, 6, 7, 10]
    assert all(e["response"] is None and e["error"]["code"] for e in errors)
    for line in outputs:
        assert line["error"] is None and line["response"]["status_code"] == 200
        body = line["response"]["body"]
        assert body["object"] == "chat.completion" and body["model"] == "pronk-tiny"
        assert body["usage"]["prompt_tokens"] > 0 and body["usage"]["completion_tokens"] > 0
        assert body["choices"][0]["finish_reason"] in {"stop", "length"}
        assert body["system_fingerprint"] == "pronk-tiny/1"
    assert next(o for o in outputs if o["custom_id"] == "ok-2")["response"]["body"]["usage"]["completion_tokens"] <= 24


def test_batch_record_follows_the_status_lifecycle_and_accounts_usage_and_cost(stack, tmp_path):
    batch = run(DATA / "sample_batch.jsonl", tmp_path, metadata={"team": "enrichment"})
    stored = BatchStore(get_settings()).load(batch["id"]).model_dump()
    assert stored["status"] == "completed"
    assert stored["created_at"] <= stored["in_progress_at"] <= stored["finalizing_at"] <= stored["completed_at"]
    assert stored["failed_at"] is None and stored["metadata"] == {"team": "enrichment"}
    outputs = read_jsonl(batch["output_uri"])
    assert len(outputs) == 32
    usage = stored["usage"]
    assert usage["input_tokens"] == sum(o["response"]["body"]["usage"]["prompt_tokens"] for o in outputs)
    assert usage["output_tokens"] == sum(o["response"]["body"]["usage"]["completion_tokens"] for o in outputs)
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    assert stored["worker_seconds"] > 0
    price = resolve_job(JOB, get_settings()).price_per_worker_hour
    assert stored["processing_cost"] == pytest.approx(stored["worker_seconds"] / 3600 * price)
    assert stored["tasks_per_dollar"] == pytest.approx(32 / stored["processing_cost"])


@pytest.mark.parametrize(
    ("content", "message"), [("", "no request lines"), (None, "cannot read input file")], ids=["empty", "missing"]
)
def test_empty_or_unreadable_input_fails_the_batch_with_a_message(stack, tmp_path, content, message):
    from pronk.batches.run import BatchFailed

    path = tmp_path / "input.jsonl"
    if content is not None:
        path.write_text(content)
    batch_id = f"batch_{tmp_path.name[-12:]}"
    with pytest.raises(BatchFailed, match=message):
        run(path, tmp_path / "out", batch_id=batch_id)
    stored = BatchStore(get_settings()).load(batch_id)
    assert stored.status == "failed" and stored.failed_at
    assert stored.errors.data[0].code == "invalid_input_file" and message in stored.errors.data[0].message


def test_cli_batch_run_prints_the_batch_object_last(stack, tmp_path):
    completed = subprocess.run(
        [
            str(Path(sys.executable).parent / "pronk"),
            "batch",
            "run",
            str(DATA / "mixed_batch.jsonl"),
            "--job",
            "tiny-cpu",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ},
    )
    assert completed.returncode == 0, completed.stderr
    batch = json.loads(completed.stdout.strip().splitlines()[-1])
    assert batch["status"] == "completed" and batch["request_counts"]["completed"] == 3
    assert Path(batch["output_uri"]).parent == tmp_path


def test_prefect_deployment_run_completes_a_batch_through_the_process_worker(stack, tmp_path):
    completed = run_batch_deployment(
        input_uri=DATA / "mixed_batch.jsonl", job_id=JOB, output_dir=tmp_path, batch_id="batch_fromdeployment"
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    stored = BatchStore(get_settings()).load("batch_fromdeployment")
    assert stored.status == "completed" and stored.request_counts.completed == 3
    assert len(read_jsonl(stored.output_uri)) + len(read_jsonl(stored.error_uri)) == 10


def test_a_killed_worker_has_its_steps_resent_and_a_sigtermed_one_withdraws(stack, tmp_path):
    """Two extra workers started together (one start-up instead of two): w2 is SIGKILLed while it holds steps,
    which other workers finish; w3 is SIGTERMed after the batch and leaves the registry."""
    from pronk.engine.registry import FileRegistry
    from pronk.stack.fleet import start_workers, wait_for_workers
    from pronk.stack.processes import alive

    job = resolve_job(JOB, get_settings())
    extra = start_workers(job, stack, indices=range(2, 4))
    wait_for_workers(job, stack, extra)
    lines = [
        json.dumps(
            {
                "custom_id": f"r{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {
                    "model": "pronk-tiny",
                    "messages": [{"role": "user", "content": f"story {i}"}],
                    "max_tokens": 256,
                },
            }
        )
        for i in range(24)
    ]
    path = tmp_path / "long.jsonl"
    path.write_text("\n".join(lines))
    pid, w3_pid = extra[worker_name(JOB, 2)], extra[worker_name(JOB, 3)]
    registry = FileRegistry(stack.registry_dir)
    (w2,) = [e for e in registry.live(JOB) if e.worker_id.endswith("-w2")]
    busy_at_kill: list[int] = []

    def kill_when_busy():
        # The worker's own /stats, not its heartbeat a second old: the kill lands while it holds steps.
        headers = auth_headers(worker_token(stack))
        deadline = time.monotonic() + 120
        try:
            while time.monotonic() < deadline:
                with contextlib.suppress(httpx.HTTPError):
                    response = httpx.get(f"{w2.url}/stats", headers=headers, timeout=5)
                    in_flight = response.raise_for_status().json()["in_flight"]
                    if in_flight > 0:
                        busy_at_kill.append(in_flight)
                        break
                time.sleep(0.02)
        finally:  # whatever happened above, w2 must not outlive the test (later tests count the fleet)
            os.killpg(pid, signal.SIGKILL)

    killer = threading.Thread(target=kill_when_busy)
    killer.start()
    try:
        batch = run(path, tmp_path)
        killer.join()
        assert busy_at_kill, "w2 never held a step, so nothing was resent"
        assert batch["request_counts"] == {"total": 24, "completed": 24, "failed": 0, "cancelled": 0}
        workers = {line["response"]["body"]["pronk"]["worker_id"] for line in read_jsonl(batch["output_uri"])}
        assert not any(w.endswith("-w2") for w in workers)

        assert any(e.worker_id.endswith("-w3") for e in registry.live(JOB))
        os.kill(w3_pid, signal.SIGTERM)
        deadline = time.monotonic() + 60
        while alive(w3_pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not alive(w3_pid)
        assert not any(e.worker_id.endswith("-w3") for e in registry.entries(JOB))
    finally:  # w3 must not outlive the test either
        with contextlib.suppress(ProcessLookupError):
            os.killpg(w3_pid, signal.SIGKILL)


def test_hostile_lines_each_end_in_one_line_and_a_too_long_prompt_never_runs(stack, tmp_path):
    def chat(custom_id: str, content: str = "Say hi.") -> dict:
        body = {"model": "pronk-tiny", "messages": [{"role": "user", "content": content}], "max_tokens": 4}
        return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}

    too_long = chat("too-long", " ".join(f"w{i}" for i in range(20_000)))
    replay_too_long = {
        "custom_id": "replay-too-long",
        "method": "POST",
        "url": "/v1/pronk/replay",
        "body": {
            "model": "pronk-tiny",
            "shape": {
                "trace_id": "long",
                "system_prompt_tokens": 5000,
                "steps": [{"new_prompt_tokens": 1, "output_tokens": 4}],
            },
        },
    }
    lines = [
        json.dumps(chat("ok")).encode(),
        json.dumps(chat("bad-byte")).encode().replace(b"Say", b"S\xffay"),
        json.dumps(chat("huge-int")).encode().replace(b'"body"', b'"n": ' + b"7" * 5000 + b', "body"'),
        json.dumps(chat("u2028", "one\u2028two"), ensure_ascii=False).encode(),
        json.dumps(chat("u0085", "one\u0085two"), ensure_ascii=False).encode(),
        json.dumps(chat("bare-cr")).encode().replace(b', "body"', b',\r"body"'),
        json.dumps(too_long).encode(),
        json.dumps(replay_too_long).encode(),
        json.dumps(chat("twenty-mb", "x" * (20 << 20))).encode(),
    ]
    path = tmp_path / "hostile.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")

    batch = run(path, tmp_path / "out")
    outputs, errors = read_jsonl(batch["output_uri"]), read_jsonl(batch["error_uri"])

    assert batch["status"] == "completed" and batch["request_counts"]["total"] == len(lines)
    assert len(outputs) + len(errors) == len(lines)
    assert sorted(o["custom_id"] for o in outputs) == ["bare-cr", "ok", "u0085", "u2028"]
    codes = {e["error"]["line"]: e["error"]["code"] for e in errors}
    assert codes == {
        2: "invalid_json",
        3: "invalid_json",
        7: "request_rejected",
        8: "request_rejected",
        9: "line_too_large",
    }
    # The long prompts (chat and replay) and the 20 MB line are refused before any worker: no step record, whatever
    # the machine's speed.
    steps = read_jsonl(batch["steps_uri"])
    assert {s["custom_id"] for s in steps} == {"ok", "u2028", "u0085", "bare-cr"}
