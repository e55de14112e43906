"""Durable batches on the real stack: finished lines survive a killed run, a resumed run runs only the rest,
and a Prefect server that stops answering mid-run neither freezes the batch's progress nor its end."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from uuid import UUID

import openai
import psutil
import pytest

from pronk import storage
from pronk.api.keys import ApiKeyStore
from pronk.batches.results import FinishedLine, ResultParts
from pronk.batches.schemas import TERMINAL_STATUSES, Batch
from pronk.batches.store import BatchStore
from pronk.protocol.lines import OutputLine, ResponseEnvelope
from pronk.settings import get_settings
from pronk.stack.embedded import read_state
from pronk.stack.prefect_env import prefect_environment
from tests.flows.deployment_runs import start_batch_deployment
from tests.pronk.api.test_openai_client import JOB, REPLAY_URL, jsonl, request_line, slow_line, wait_for

pytestmark = pytest.mark.e2e


def lines_of(uri: str) -> list[dict]:
    return [json.loads(x) for x in storage.read_bytes(uri, get_settings()).decode().splitlines()]


def flow_run_process(flow_run_id: str) -> psutil.Process | None:
    """The process the Prefect worker started for the flow run (its environment names the run)."""
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("PREFECT__FLOW_RUN_ID") == flow_run_id:
                return proc
        except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
    return None


def running_process(flow_run_id: str) -> psutil.Process | None:
    """The process running the flow run: its own, or for a subflow run its parent's (the batch queue's drainer runs
    API batches as subflow runs in its process)."""
    from prefect import get_client

    async def parent() -> str | None:
        async with get_client() as client:
            run = await client.read_flow_run(UUID(flow_run_id))
            if run.parent_task_run_id is None:
                return None
            return str((await client.read_task_run(run.parent_task_run_id)).flow_run_id)

    own = flow_run_process(flow_run_id)
    if own is not None:
        return own
    drainer = asyncio.run(parent())
    return flow_run_process(drainer) if drainer else None


def assert_each_line_once_with_exact_counts(batch, outputs: list[dict], errors: list[dict], total: int) -> None:
    assert sorted(line["custom_id"] for line in outputs + errors) == sorted(f"r{i}" for i in range(total))
    counts = batch.request_counts
    assert (counts.total, counts.completed, counts.failed) == (total, len(outputs), len(errors))
    usage = batch.usage
    assert usage.input_tokens == sum(o["response"]["body"]["usage"]["prompt_tokens"] for o in outputs)
    assert usage.output_tokens == sum(o["response"]["body"]["usage"]["completion_tokens"] for o in outputs)


def test_a_sigkilled_run_is_resumed_without_losing_or_repeating_a_line(stack):
    key, _ = ApiKeyStore(stack).create(name="durable")
    client = openai.OpenAI(api_key=key, base_url=f"http://127.0.0.1:{stack.api_port}/v1", max_retries=0, timeout=60)
    total = 128  # 4 waves of 32 lines, >= 12 s of tool gaps on any machine, so the kill lands mid-run
    data = "\n".join(slow_line(f"r{i}") for i in range(total)).encode()
    uploaded = client.files.create(file=("kill.jsonl", data), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint=REPLAY_URL, completion_window="24h")  # type: ignore[arg-type]
    parts = ResultParts(batch.id, get_settings())

    deadline = time.monotonic() + 180
    while not parts.load() and time.monotonic() < deadline:  # some lines finished and persisted
        time.sleep(0.1)
    first_run = BatchStore(get_settings()).load(batch.id).flow_run_id
    proc = running_process(first_run)
    assert proc is not None, f"no process for flow run {first_run}"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    kept = parts.load()  # persisted before the kill: these must come back unchanged, never run again
    assert 0 < len(kept) < total, f"the kill did not land mid-run: {len(kept)} of {total} persisted"
    assert BatchStore(get_settings()).load(batch.id).status == "in_progress"

    batch, _ = wait_for(client, batch.id, lambda b: b.status in TERMINAL_STATUSES, timeout_s=300)
    stored = BatchStore(get_settings()).load(batch.id)
    assert batch.status == "completed" and stored.flow_run_id != first_run
    outputs, errors = jsonl(client, batch.output_file_id), jsonl(client, batch.error_file_id)
    assert_each_line_once_with_exact_counts(batch, outputs, errors, total)
    by_custom_id = {line["custom_id"]: line["id"] for line in outputs + errors}
    assert all(by_custom_id[f.output.custom_id] == f.output.id for f in kept.values())
    assert not storage.exists(parts.root, get_settings())  # the parts go once the batch is terminal


def flow_run_state(flow_run_id: str) -> str | None:
    from prefect import get_client

    async def read() -> str | None:
        async with get_client() as client:
            state = (await client.read_flow_run(UUID(flow_run_id))).state
            return state.type.value if state else None

    return asyncio.run(read())


def test_a_prefect_retry_of_a_killed_run_runs_only_the_rest_in_the_same_flow_run(stack, tmp_path):
    from pronk.flows.batch import batch_id_of_flow_run

    total = 128  # 4 waves of 32 lines, >= 12 s of tool gaps on any machine, so the kill lands mid-run
    path = tmp_path / "input.jsonl"
    path.write_text("\n".join(slow_line(f"r{i}") for i in range(total)) + "\n")
    # Started without a batch id, as `prefect deployment run` users do: the API's reconcile loop leaves such runs
    # alone, so the retry below is the only thing that starts the batch again.
    flow_run_id = start_batch_deployment(input_uri=path, job_id=JOB, output_dir=tmp_path / "out")
    batch_id = batch_id_of_flow_run(flow_run_id)
    parts = ResultParts(batch_id, get_settings())
    deadline = time.monotonic() + 240
    while not parts.load() and time.monotonic() < deadline:
        time.sleep(0.1)
    proc = flow_run_process(flow_run_id)
    assert proc is not None, f"no process for flow run {flow_run_id}"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    kept = parts.load()
    assert 0 < len(kept) < total, f"the kill did not land mid-run: {len(kept)} of {total} persisted"
    deadline = time.monotonic() + 120
    while flow_run_state(flow_run_id) != "CRASHED":
        assert time.monotonic() < deadline, f"flow run {flow_run_id} is {flow_run_state(flow_run_id)}, not CRASHED"
        time.sleep(0.5)
    assert BatchStore(get_settings()).load(batch_id).status == "in_progress"

    retried = subprocess.run(
        [sys.executable, "-m", "prefect", "flow-run", "retry", flow_run_id],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **prefect_environment(get_settings())},
    )
    assert retried.returncode == 0, retried.stdout + retried.stderr
    deadline = time.monotonic() + 300
    while (stored := BatchStore(get_settings()).load(batch_id)).status not in TERMINAL_STATUSES:
        assert time.monotonic() < deadline, f"batch {batch_id} still {stored.status}"
        time.sleep(0.5)

    assert stored.status == "completed" and stored.flow_run_id == flow_run_id
    outputs, errors = lines_of(stored.output_uri), lines_of(stored.error_uri)
    assert_each_line_once_with_exact_counts(stored, outputs, errors, total)  # not 128 + what the first run did
    by_custom_id = {line["custom_id"]: line["id"] for line in outputs + errors}
    assert all(by_custom_id[f.output.custom_id] == f.output.id for f in kept.values())
    steps = Counter(s["custom_id"] for s in lines_of(stored.steps_uri))
    assert steps == {f"r{i}": 3 for i in range(total)}  # each line's three steps once: no line ran twice


def test_pronk_batch_resume_runs_only_the_lines_no_run_persisted(stack, tmp_path):
    total = 8
    path = tmp_path / "input.jsonl"
    path.write_text("\n".join(request_line(f"r{i}", 16) for i in range(total)) + "\n")
    batch = Batch(input_file_id=str(path), job_id=JOB, model="pronk-tiny")
    batch.output_uri = str(tmp_path / f"{batch.id}_output.jsonl")
    batch.error_uri = str(tmp_path / f"{batch.id}_error.jsonl")
    batch.mark("in_progress")
    BatchStore(get_settings()).save(batch)
    parts = ResultParts(batch.id, get_settings())
    earlier = [
        FinishedLine(
            line=i + 1,
            output=OutputLine(
                id=f"batch_req_earlier{i}",
                custom_id=f"r{i}",
                response=ResponseEnvelope(
                    status_code=200,
                    request_id=f"earlier{i}",
                    body={"usage": {"prompt_tokens": 1000, "completion_tokens": 10}},
                ),
            ),
            ok=True,
            prompt_tokens=1000,
            completion_tokens=10,
        )
        for i in range(3)
    ]
    parts.write_part("earlier", 1, earlier)

    completed = subprocess.run(
        [str(Path(sys.executable).parent / "pronk"), "batch", "resume", batch.id],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ},
    )
    assert completed.returncode == 0, completed.stderr
    stored = BatchStore(get_settings()).load(batch.id)
    assert stored.status == "completed"
    outputs = lines_of(stored.output_uri)
    assert [o["id"] for o in outputs[:3]] == [f"batch_req_earlier{i}" for i in range(3)]
    assert_each_line_once_with_exact_counts(stored, outputs, lines_of(stored.error_uri), total)
    assert stored.usage.input_tokens >= 3000
    steps = lines_of(stored.steps_uri)
    assert {s["custom_id"] for s in steps} == {f"r{i}" for i in range(3, total)}  # only the rest ran


def test_a_prefect_server_that_stops_answering_neither_freezes_nor_blocks_the_batch(stack, tmp_path):
    from pronk.flows.batch import run_batch

    total = 192  # 6 waves of 32 lines, >= 18 s of tool gaps on any machine, so Prefect stops answering mid-run
    path = tmp_path / "input.jsonl"
    path.write_text("\n".join(slow_line(f"r{i}") for i in range(total)) + "\n")
    batch = Batch(input_file_id=str(path), job_id=JOB, model="pronk-tiny")
    BatchStore(get_settings()).save(batch)
    runner = threading.Thread(
        target=lambda: asyncio.run(
            run_batch(input_uri=str(path), job_id=JOB, output_dir=str(tmp_path / "out"), batch_id=batch.id)
        ),
        daemon=True,
    )
    runner.start()
    store = BatchStore(get_settings())

    def finished() -> int:
        counts = store.load(batch.id).request_counts
        return counts.completed + counts.failed

    deadline = time.monotonic() + 120
    while finished() == 0 and time.monotonic() < deadline:
        time.sleep(0.2)
    server = psutil.Process(read_state(stack)["prefect-server"])
    server.suspend()  # SIGSTOP: every Prefect API call now hangs, the harder case than a refused connection
    try:
        stopped_at = finished()
        assert 0 < stopped_at < total and store.load(batch.id).status == "in_progress", "Prefect stopped too late"
        deadline = time.monotonic() + 240
        while store.load(batch.id).status not in TERMINAL_STATUSES and time.monotonic() < deadline:
            time.sleep(0.5)
        stored = store.load(batch.id)
        assert stored.status == "completed", f"{stored.status} with {finished()} of {total} while Prefect was down"
        assert finished() == total > stopped_at  # progress kept moving in the record
    finally:
        server.resume()
    runner.join(timeout=120)
    outputs, errors = lines_of(stored.output_uri), lines_of(stored.error_uri)
    assert_each_line_once_with_exact_counts(stored, outputs, errors, total)
