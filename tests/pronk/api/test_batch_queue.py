"""A burst of small batches through the API queues instead of stampeding (issue 40), on the real stack (auth on,
the tiny job): one drainer process runs them, each as a run-batch subflow run, and never more flow-run processes
than the work pool's limit run at once."""

from __future__ import annotations

import asyncio
import json
import os
import signal

import httpx
import openai
import pytest

from bench.experiments.api_burst import PeakProcesses, flow_run_pids, input_file
from pronk.api.keys import ApiKeyStore
from tests.pronk.api.test_openai_client import REPLAY_URL, jsonl, slow_line, wait_for

pytestmark = pytest.mark.e2e
TERMINAL = {"completed", "failed", "expired", "cancelled"}
BATCHES = 12


async def create_all(base_url: str, key: str) -> list[str]:
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=120) as client:
        upload = await client.post(
            "/v1/files", files={"file": ("one.jsonl", input_file(1, "pronk-tiny"))}, data={"purpose": "batch"}
        )
        body = {"input_file_id": upload.json()["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"}
        answers = await asyncio.gather(*(client.post("/v1/batches", json=body) for _ in range(BATCHES)))
        assert {a.status_code for a in answers} == {200}
        ids = [a.json()["id"] for a in answers]
        for _ in range(600):
            batches = [(await client.get(f"/v1/batches/{i}")).json() for i in ids]
            if all(b["status"] in TERMINAL for b in batches):
                break
            await asyncio.sleep(0.5)
        assert [b["status"] for b in batches] == ["completed"] * BATCHES, batches
        for batch in batches:
            lines = (await client.get(f"/v1/files/{batch['output_file_id']}/content")).text.splitlines()
            assert [json.loads(line)["custom_id"] for line in lines] == ["r0"]
        return ids


async def run_batch_flow_runs(ids: list[str]) -> dict[str, str | None]:
    """Each batch's run-batch flow run: name -> its parent task run (set for a subflow run)."""
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName

    async with get_client() as client:
        runs = await client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=ids)))
    return {run.name: str(run.parent_task_run_id) if run.parent_task_run_id else None for run in runs}


def test_a_burst_of_one_line_batches_queues_within_the_pool_limit_and_all_complete(stack):
    key, _ = ApiKeyStore(stack).create(name="burst")
    with PeakProcesses(stack.data_dir) as peak:
        ids = asyncio.run(create_all(f"http://127.0.0.1:{stack.api_port}", key))
    assert 1 <= peak.peak <= stack.prefect_pool_concurrency < BATCHES
    runs = asyncio.run(run_batch_flow_runs(ids))
    assert sorted(runs) == sorted(ids)  # each batch is a flow run of its own, named by its id
    assert all(parent is not None for parent in runs.values())  # a subflow run of a drainer


def test_a_drainer_killed_with_its_prefect_worker_is_ended_and_its_batches_and_later_ones_complete(stack):
    """SIGKILL the Prefect worker's process group mid-way, the drainer with it, as an ordinary `pronk stack down` did
    in issue 65: no worker is left to mark the drainer crashed, and it held the deployment's only slot, so every later
    batch waited for good. Now `pronk stack up` ends it at once (its recorded process is gone), its subflow runs are
    resumed as runs of their own that run only what no run persisted, and a batch created after the kill runs too;
    every line still ends as exactly one output or error line, and no run of pronk's flows is left unended."""
    from pronk.control.dead_runs import find_dead
    from pronk.stack import embedded

    client = openai.OpenAI(
        api_key=ApiKeyStore(stack).create(name="kill")[0], base_url=f"http://127.0.0.1:{stack.api_port}/v1"
    )
    total = 64
    data = "\n".join(slow_line(f"r{i}") for i in range(total)).encode()
    uploaded = client.files.create(file=("slow.jsonl", data), purpose="batch")
    ids = [
        client.batches.create(input_file_id=uploaded.id, endpoint=REPLAY_URL, completion_window="24h").id  # type: ignore[arg-type]
        for _ in range(2)
    ]
    wait_for(client, ids[0], lambda b: b.status in TERMINAL or b.request_counts.completed > 0)
    assert len(flow_run_pids(stack.data_dir)) == 1
    os.killpg(embedded.read_state(stack)["prefect-worker"], signal.SIGKILL)
    one = client.files.create(file=("one.jsonl", slow_line("r0").encode()), purpose="batch")
    ids.append(client.batches.create(input_file_id=one.id, endpoint=REPLAY_URL, completion_window="24h").id)  # type: ignore[arg-type]
    embedded.up(stack, mlflow_ui=False)  # the worker starts again; the running parts are left alone
    assert asyncio.run(find_dead(judge_remote=False)) == []
    for batch_id, lines in zip(ids, (total, total, 1), strict=True):
        batch, _ = wait_for(client, batch_id, lambda b: b.status in TERMINAL, timeout_s=300)
        assert batch.status == "completed", batch
        outputs, errors = jsonl(client, batch.output_file_id), jsonl(client, batch.error_file_id)
        assert sorted(line["custom_id"] for line in outputs + errors) == sorted(f"r{i}" for i in range(lines))
