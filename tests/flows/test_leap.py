"""Leap end to end on the shared stack: two real vLLM workers, MLflow on SQLite, a real Prefect server.

Every test starts from the fleet serving version 1 with `pronk-tiny@live` on it, and the module
leaves it that way (other tests expect `pronk-tiny/1`).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import threading
import time
import uuid
from pathlib import Path

import httpx
import pytest
import torch
import uvicorn
from fastapi import FastAPI, HTTPException
from safetensors.torch import load_file, save_file

from pronk.engine.auth import auth_headers
from pronk.engine.client import WorkerClient
from pronk.engine.registry import Registry, WorkerEntry
from pronk.engine.worker import free_port
from pronk.engine.worker_protocol import SamplingSpec, StepRequest, WorkerStats
from pronk.jobs.catalog import resolve_job
from pronk.leap.records import LeapStore
from pronk.models.registry import (
    alias_version,
    latest_version,
    register_model_dir,
    resolve_model,
)
from pronk.settings import get_settings
from pronk.worker_registry import worker_registry
from pronk.worker_token import worker_token

pytestmark = pytest.mark.e2e
JOB = "job-c0ffee01"
MODEL = "pronk-tiny"
PROBES = [[50 + (37 * i + 11 * j) % 3000 for j in range(40)] for i in range(3)]
LONG_PROMPT = list(range(200, 1000))


def registry(settings) -> Registry:
    return worker_registry(settings)


def fleet(settings):
    return [w for w in registry(settings).live(JOB) if w.worker_id in (f"{JOB}-w0", f"{JOB}-w1")]


def run_leap(**params) -> dict:
    from pronk.flows.leap import leap

    return asyncio.run(leap(job_id=JOB, **params))


async def greedy(url: str, prompt: list[int], max_tokens: int = 16):
    client = WorkerClient(worker_token(get_settings()))
    try:
        sampling = SamplingSpec(max_tokens=max_tokens, temperature=0, ignore_eos=True)
        return await client.generate(
            url, StepRequest(request_id=f"probe-{uuid.uuid4().hex[:8]}", prompt_token_ids=prompt, sampling=sampling)
        )
    finally:
        await client.aclose()


def probe(url: str) -> list[list[int]]:
    """Greedy continuations of the probe prompts, one at a time (same batch shape on every worker)."""
    return [asyncio.run(greedy(url, prompt)).token_ids for prompt in PROBES]


def restore_v1(settings, v1: int) -> None:
    if {w.stats.model_version for w in fleet(settings)} != {f"{MODEL}/{v1}"} or alias_version(
        MODEL, "live", settings
    ) != v1:
        run_leap(version=v1)


@pytest.fixture(scope="module")
def versions(stack):
    """(v1, v2): the live version and one fine-tuned from it; the fleet and `live` end on v1 whatever happens."""
    from pronk.models.tiny_finetune import finetune

    v1 = alias_version(MODEL, "live", stack)
    v2 = finetune(stack, f"models:/{MODEL}/{v1}").version
    try:
        yield v1, v2
    finally:
        restore_v1(stack, v1)


@pytest.fixture
def on_v1(stack, versions):
    """Fleet on v1, and no other worker of the job still heartbeating (another test may have just killed one)."""
    deadline = time.monotonic() + 2 * stack.heartbeat_timeout_s
    while len(registry(stack).live(JOB)) > 2 and time.monotonic() < deadline:
        time.sleep(0.5)
    restore_v1(stack, versions[0])
    return versions


def batch_file(path, lines: int) -> str:
    rows = [
        {
            "custom_id": f"r{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": MODEL,
                "temperature": 0,
                "max_tokens": 64,
                "messages": [{"role": "user", "content": f"note {i}: the fleet"}],
            },
        }
        for i in range(lines)
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return str(path)


def held_slots(lines: int, hold_s: float) -> list[str]:
    """Replay lines that each hold one of the run's slots for at least `hold_s` (a tool gap), whatever the machine."""
    shape = {"system_prompt_tokens": 16, "steps": [{"new_prompt_tokens": 4, "output_tokens": 4, "tool_gap_s": hold_s}]}
    shape["steps"].append({"new_prompt_tokens": 4, "output_tokens": 4})
    return [
        json.dumps(
            {
                "custom_id": f"hold{i}",
                "method": "POST",
                "url": "/v1/pronk/replay",
                "body": {"model": MODEL, "shape": {"trace_id": f"hold{i}", **shape}},
            }
        )
        for i in range(lines)
    ]


def test_leap_during_a_running_batch_switches_every_step_cleanly(stack, on_v1, tmp_path):
    from pronk.batches.schemas import Batch
    from pronk.batches.store import BatchStore
    from pronk.flows.batch import run_batch
    from pronk.flows.leap import leap
    from pronk.stack.fleet import start_workers, wait_for_workers
    from pronk.stack.processes import stop

    v1, v2 = on_v1
    w0 = fleet(stack)[0]
    before = probe(w0.url)
    asyncio.run(greedy(w0.url, LONG_PROMPT, 2))
    assert asyncio.run(greedy(w0.url, LONG_PROMPT, 2)).cached_tokens > 0

    # 64 chat lines, then 32 lines that hold all 32 of the run's slots for 30 s, then 64 chat lines: one chunk, so
    # lines take slots in file order. The Leap starts once the first 64 have finished, so it lands between the two
    # halves on any machine whose Leap takes under ~30 s, however fast it generates.
    chat = Path(batch_file(tmp_path / "chat.jsonl", 128)).read_text().splitlines()
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join(chat[:64] + held_slots(32, 30.0) + chat[64:]))
    record = Batch(input_file_id=str(path), job_id=JOB, model=MODEL)
    BatchStore(get_settings()).save(record)

    fresh: dict[str, int] = {}

    async def batch_with_a_leap_in_the_middle():
        batch = asyncio.create_task(
            run_batch(input_uri=str(path), job_id=JOB, output_dir=str(tmp_path), batch_id=record.id, chunk_size=160)
        )
        while BatchStore(get_settings()).load(record.id).request_counts.completed < 64:
            assert not batch.done(), "the batch ended before the Leap could start"
            await asyncio.sleep(0.2)
        leap_record = await leap(job_id=JOB, version=v2)
        assert not batch.done(), "the batch ended before the Leap did"
        # A worker started after the Leap must load v2; it loads while the batch's held slots run out.
        fresh.update(start_workers(resolve_job(JOB, get_settings()), stack, indices=range(2, 3)))
        return await batch, leap_record

    try:
        batch, record = asyncio.run(batch_with_a_leap_in_the_middle())
        assert record["status"] == "completed" and record["alias_moved"], record["message"]
        assert 0 < record["switch_seconds"] < 10
        assert alias_version(MODEL, "live", stack) == v2
        assert {w.stats.model_version for w in fleet(stack)} == {f"{MODEL}/{v2}"}
        assert batch["request_counts"] == {"total": 160, "completed": 160, "failed": 0, "cancelled": 0}
        lines = [json.loads(line) for line in Path(batch["output_uri"]).read_text().splitlines()]
        outputs = [o for o in lines if o["custom_id"].startswith("r")]
        fingerprints = [o["response"]["body"]["system_fingerprint"] for o in outputs]
        assert all(o["response"]["body"]["pronk"]["model_version"] == f for o, f in zip(outputs, fingerprints))
        assert set(fingerprints[:64]) == {f"{MODEL}/{v1}"}  # they finished before the Leap started
        assert f"{MODEL}/{v2}" in fingerprints[64:]

        first = asyncio.run(greedy(w0.url, LONG_PROMPT, 2))
        again = asyncio.run(greedy(w0.url, LONG_PROMPT, 2))
        assert (first.model_version, first.cached_tokens) == (f"{MODEL}/{v2}", 0), "the prefix cache survived the swap"
        assert again.cached_tokens > 0, "prefix-cache hits did not restart after the swap"

        after = {w.worker_id: probe(w.url) for w in fleet(stack)}
        assert all(tokens != before for tokens in after.values()), "the new weights produce the old outputs"
        wait_for_workers(resolve_job(JOB, get_settings()), stack, fresh)
        (entry,) = [w for w in registry(stack).live(JOB) if w.worker_id == f"{JOB}-w2"]
        assert entry.stats.model_version == f"{MODEL}/{v2}"
        assert all(tokens == probe(entry.url) for tokens in after.values())
    finally:
        for pid in fresh.values():
            stop(pid)


def wrong_shape_checkpoint(settings, v1: int, path):
    shutil.copytree(resolve_model(f"models:/{MODEL}/{v1}", settings).path, path)
    tensors = load_file(path / "model.safetensors")
    tensors["model.layers.1.mlp.up_proj.weight"] = tensors["model.layers.1.mlp.up_proj.weight"][:600].contiguous()
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    return path


def test_a_wrong_shape_checkpoint_is_refused_and_the_fleet_keeps_serving_v1(stack, on_v1, tmp_path):
    from pronk.flows.leap import LeapRefused
    from pronk.models.checkpoints import CheckpointMismatch
    from pronk.models.versions import upload_checkpoint

    v1, _ = on_v1
    wrong = wrong_shape_checkpoint(stack, v1, tmp_path / "wrong")
    newest = latest_version(MODEL, stack)
    with pytest.raises(
        CheckpointMismatch, match=r"'model.layers.1.mlp.up_proj.weight' shape is \[600, 256\], expected \[688, 256\]"
    ):
        upload_checkpoint(str(wrong), MODEL, job_model=resolve_job(JOB, get_settings()).model, settings=stack)
    assert latest_version(MODEL, stack) == newest, "a refused checkpoint was registered"

    w0 = fleet(stack)[0]
    staged = httpx.post(
        f"{w0.url}/weights/stage", json={"model_uri": str(wrong)}, headers=auth_headers(worker_token(stack)), timeout=60
    )
    assert staged.status_code == 409 and "expected [688, 256]" in staged.json()["detail"]

    forced = register_model_dir(wrong, MODEL, settings=stack)
    with pytest.raises(LeapRefused, match="does not fit"):
        run_leap(version=forced)
    assert LeapStore(stack).latest(JOB).status == "refused"
    assert alias_version(MODEL, "live", stack) == v1
    for worker in fleet(stack):
        assert asyncio.run(greedy(worker.url, PROBES[0])).model_version == f"{MODEL}/{v1}"


def test_rolling_back_to_v1_restores_its_outputs(stack, on_v1):
    v1, v2 = on_v1
    url = fleet(stack)[0].url
    before = probe(url)
    assert run_leap(version=v2)["status"] == "completed"
    assert probe(url) != before
    record = run_leap(version=v1)
    assert record["status"] == "completed" and record["from_version"] == f"{MODEL}/{v2}"
    assert alias_version(MODEL, "live", stack) == v1
    assert probe(url) == before
    assert {w.stats.model_version for w in fleet(stack)} == {f"{MODEL}/{v1}"}


class StubWorker:
    """A worker that stages anything and never manages to reload: the one part of this test that is not real."""

    def __init__(self, settings, version: str):
        self.reloads = 0
        self.entry = WorkerEntry(
            worker_id=f"{JOB}-stub",
            job_id=JOB,
            url=f"http://127.0.0.1:{free_port()}",
            pid=os.getpid(),
            started_at=time.time(),
            heartbeat_at=time.time(),
            stats=WorkerStats(worker_id=f"{JOB}-stub", job_id=JOB, model_version=version),
        )
        self.registry = registry(settings)
        self.stopped = threading.Event()
        app = FastAPI()

        @app.post("/weights/stage")
        def stage(body: dict) -> dict:
            return {"worker_id": self.entry.worker_id, "version": body["model_uri"], "path": "", "seconds": 0.0}

        @app.post("/weights/reload")
        def reload(body: dict) -> dict:
            self.reloads += 1
            raise HTTPException(status_code=500, detail="injected reload failure")

        port = int(self.entry.url.rsplit(":", 1)[1])
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
        self.threads = [
            threading.Thread(target=self.server.run, daemon=True),
            threading.Thread(target=self._heartbeat, daemon=True),
        ]

    def _heartbeat(self) -> None:
        while not self.stopped.wait(0.5):
            self.registry.announce(self.entry.model_copy(update={"heartbeat_at": time.time()}))

    def __enter__(self):
        for thread in self.threads:
            thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started and time.monotonic() < deadline:
            time.sleep(0.05)
        self.registry.announce(self.entry)
        return self

    def __exit__(self, *exc) -> None:
        self.stopped.set()
        self.server.should_exit = True
        for thread in self.threads:
            thread.join(10)
        self.registry.withdraw(JOB, self.entry.worker_id)


def test_a_worker_that_cannot_switch_sends_the_others_back(stack, on_v1):
    from pronk.flows.leap import LeapFailed

    v1, v2 = on_v1
    with (
        StubWorker(stack, f"{MODEL}/{v1}") as stub,
        pytest.raises(LeapFailed, match="1 of 3 workers could not switch"),
    ):
        run_leap(version=v2)
    assert stub.reloads == 3
    record = LeapStore(stack).latest(JOB)
    assert record.status == "rolled_back" and "went back to" in record.message
    assert record.workers[stub.entry.worker_id].state == "failed"
    assert {record.workers[w.worker_id].state for w in fleet(stack)} == {"rolled_back"}
    assert alias_version(MODEL, "live", stack) == v1
    for worker in fleet(stack):
        assert asyncio.run(greedy(worker.url, PROBES[0])).model_version == f"{MODEL}/{v1}"


def test_weights_over_http_refuse_a_wrong_shape_and_leap_through_the_deployment(stack, on_v1, tmp_path):
    from pronk.api.keys import ApiKeyStore

    v1, v2 = on_v1
    key, _ = ApiKeyStore(stack).create(name="leap", admin=True)
    api = httpx.Client(
        base_url=f"http://127.0.0.1:{stack.api_port}/v1", headers={"Authorization": f"Bearer {key}"}, timeout=120
    )
    wrong = wrong_shape_checkpoint(stack, v1, tmp_path / "wrong")
    refused = api.post("/weights/upload", json={"source": str(wrong), "model": MODEL, "job_id": JOB})
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "checkpoint_mismatch"
    assert "expected [688, 256]" in refused.json()["error"]["message"]

    started = api.post("/weights/reload", json={MODEL: f"models:/{MODEL}/{v2}"})
    assert started.status_code == 202, started.text
    (leap,) = started.json()["data"]
    assert (leap["job_id"], leap["to_version"]) == (JOB, f"{MODEL}/{v2}") and leap["flow_run_id"]
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        (job,) = api.get("/weights/status", params={"job_id": JOB}).json()["data"]
        if job["latest_leap"]["id"] == leap["leap_id"] and job["latest_leap"]["status"] not in (
            "queued",
            "canary",
            "staging",
            "reloading",
        ):
            break
        time.sleep(1)
    assert job["latest_leap"]["status"] == "completed", job["latest_leap"]
    assert {w["model_version"] for w in job["workers"]} == {f"{MODEL}/{v2}"}
    assert {w["leap_state"] for w in job["workers"]} == {"ready"}
    restore_v1(stack, v1)


def answers_anything(path, lines: int = 16) -> Path:
    """A labelled set whose check passes on any answer that is not empty (greedy, so each line answers the same way
    on the same weights)."""
    rows = [
        {
            "custom_id": f"q{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": MODEL,
                "temperature": 0,
                "max_tokens": 8,
                "messages": [{"role": "user", "content": f"canary {i}: say anything"}],
            },
            "check": {"type": "regex", "pattern": r"[\s\S]"},
        }
        for i in range(lines)
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return path


def speechless_checkpoint(settings, v1: int, path):
    """v1 with its output layer zeroed, worse by construction: every logit is 0, so greedy decoding takes the lowest
    token id, `<|pad|>`, a special token the detokenizer drops, and every answer is empty."""
    shutil.copytree(resolve_model(f"models:/{MODEL}/{v1}", settings).path, path)
    tensors = load_file(path / "model.safetensors")
    tensors["lm_head.weight"] = torch.zeros_like(tensors["lm_head.weight"])
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    return path


def test_the_canary_refuses_a_worse_version_and_lets_an_equal_one_through(stack, on_v1, tmp_path, monkeypatch):
    import pronk.flows.leap
    from pronk.flows.leap import LeapRefused

    v1, _ = on_v1
    job = resolve_job(JOB, get_settings())
    quality = job.quality.model_copy(update={"labelled_set": str(answers_anything(tmp_path / "labelled.jsonl"))})
    monkeypatch.setattr(
        pronk.flows.leap, "resolve_job", lambda job_id, settings: job.model_copy(update={"quality": quality})
    )
    worse = register_model_dir(speechless_checkpoint(stack, v1, tmp_path / "worse"), MODEL, settings=stack)
    same = register_model_dir(resolve_model(f"models:/{MODEL}/{v1}", stack).path, MODEL, settings=stack)
    try:
        with pytest.raises(LeapRefused, match=rf"canary refused: {MODEL}/{worse} on {JOB}-w0: 0/16 passed \(0%\)"):
            run_leap(version=worse)
        record = LeapStore(stack).latest(JOB)
        assert record.status == "refused" and "the fleet stays on" in record.message, record.message
        assert record.canary.worse and record.canary.baseline_workers == [f"{JOB}-w1"]
        assert record.workers[f"{JOB}-w0"].state == "rolled_back"
        assert alias_version(MODEL, "live", stack) == v1
        for worker in fleet(stack):
            assert asyncio.run(greedy(worker.url, PROBES[0])).model_version == f"{MODEL}/{v1}"

        passed = run_leap(version=same)
        assert passed["status"] == "completed" and passed["canary"]["worse"] is False, passed["message"]
        assert {w.stats.model_version for w in fleet(stack)} == {f"{MODEL}/{same}"}
        assert run_leap(version=v1, canary=False)["canary"] is None
    finally:
        monkeypatch.undo()
        restore_v1(stack, v1)
