"""The official `openai` client drives pronk's API end to end: the stack's `pronk api` process (auth on), moto's
S3 server as the store, the run-batch deployment on the real Prefect server and real vLLM workers."""

from __future__ import annotations

import json
import time
from typing import Literal

import openai
import pytest
from pydantic import BaseModel

from pronk import storage
from pronk.api.keys import ApiKeyStore
from tests.peers import how_lines_ended

pytestmark = pytest.mark.e2e
JOB = "job-c0ffee01"
TERMINAL = {"completed", "failed", "expired", "cancelled"}
REPLAY_URL = "/v1/pronk/replay"


def request_line(custom_id: str, max_tokens: int, prompt: str = "Tell me a story") -> str:
    body = {
        "model": "pronk-tiny",
        "messages": [{"role": "user", "content": f"{prompt} {custom_id}"}],
        "max_tokens": max_tokens,
    }
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body})


def slow_line(custom_id: str) -> str:
    """A replay line that takes at least 3 s on any machine (its tool gaps are waits), with little
    compute. A run holds the job's 32 lines at once, so N of these take at least ceil(N / 32) * 3 s however fast
    the machine: a fault injected "mid-batch" really lands mid-batch."""
    steps = [{"new_prompt_tokens": 8, "output_tokens": 8, "tool_gap_s": gap} for gap in (1.5, 1.5)]
    shape = {
        "trace_id": custom_id,
        "system_prompt_tokens": 32,
        "steps": [*steps, {"new_prompt_tokens": 8, "output_tokens": 8}],
    }
    body = {"model": "pronk-tiny", "shape": shape}
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": REPLAY_URL, "body": body})


@pytest.fixture(scope="module")
def new_client(stack):
    """Make an openai client with a fresh API key (so each test sees only its own files and batches)."""
    keys = ApiKeyStore(stack)

    def make() -> openai.OpenAI:
        key, _ = keys.create(name="test")
        return openai.OpenAI(api_key=key, base_url=f"http://127.0.0.1:{stack.api_port}/v1", max_retries=0, timeout=60)

    return make


def wait_for(client: openai.OpenAI, batch_id: str, done, timeout_s: float = 240.0):
    """Poll the batch until `done(batch)`; returns it and every (status, finished) pair seen."""
    seen = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        batch = client.batches.retrieve(batch_id)
        counts = batch.request_counts
        seen.append((batch.status, counts.completed + counts.failed))
        if done(batch):
            return batch, seen
        time.sleep(0.3)
    raise AssertionError(f"batch {batch_id} not done after {timeout_s}s; last seen {seen[-3:]}")


def jsonl(client: openai.OpenAI, file_id: str | None) -> list[dict]:
    return [json.loads(line) for line in client.files.content(file_id).text.splitlines()] if file_id else []


def test_upload_create_poll_download_list_and_isolation(new_client):
    client = new_client()
    lines = [request_line(f"ok-{i}", 16) for i in range(6)] + ["{not json", json.dumps({"method": "POST"})]
    uploaded = client.files.create(file=("requests.jsonl", "\n".join(lines).encode()), purpose="batch")
    assert uploaded.purpose == "batch" and uploaded.bytes == len("\n".join(lines))

    batch = client.batches.create(
        input_file_id=uploaded.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata={"case": "e2e"},
        extra_body={"job_id": JOB},
    )
    assert batch.status == "validating" and batch.model == "pronk-tiny" and batch.model_extra["job_id"] == JOB
    batch, _ = wait_for(client, batch.id, lambda b: b.status in TERMINAL)
    assert batch.status == "completed", batch
    assert batch.request_counts.total == 8 and batch.request_counts.completed == 6 and batch.request_counts.failed == 2
    # A fast machine finishes 8 short lines between two polls, so the lifecycle is read from its stamps.
    assert batch.created_at <= batch.in_progress_at <= batch.finalizing_at <= batch.completed_at
    assert batch.metadata == {"case": "e2e"}
    assert batch.usage.input_tokens > 0 and batch.usage.output_tokens > 0
    assert batch.model_extra["processing_cost"] > 0 and batch.model_extra["price_per_worker_hour"] > 0

    outputs, errors = jsonl(client, batch.output_file_id), jsonl(client, batch.error_file_id)
    assert len(outputs) + len(errors) == len(lines)
    assert sorted(o["custom_id"] for o in outputs) == [f"ok-{i}" for i in range(6)]
    assert all(o["response"]["status_code"] == 200 and o["error"] is None for o in outputs)
    assert sorted(e["error"]["code"] for e in errors) == ["invalid_json", "missing_custom_id"]
    assert client.files.retrieve(batch.output_file_id).purpose == "batch_output"

    second = client.batches.create(
        input_file_id=uploaded.id,
        endpoint="/v1/chat/completions",
        completion_window="unlimited",
        extra_body={"job_id": JOB},
    )
    first_page = client.batches.list(limit=1)
    assert [b.id for b in first_page.data] == [second.id] and first_page.has_more
    assert [b.id for b in client.batches.list(limit=1)] == [second.id, batch.id]
    assert client.files.list(limit=1).has_more
    file_ids = [f.id for f in client.files.list(limit=1)]
    assert {uploaded.id, batch.output_file_id, batch.error_file_id} <= set(file_ids) and len(file_ids) == len(
        set(file_ids)
    )

    other = new_client()
    for call in (
        lambda: other.files.retrieve(uploaded.id),
        lambda: other.files.content(uploaded.id),
        lambda: other.files.delete(uploaded.id),
        lambda: other.batches.retrieve(batch.id),
        lambda: other.batches.cancel(second.id),
        lambda: other.files.content(batch.output_file_id),
    ):
        with pytest.raises(openai.NotFoundError):
            call()
    assert other.batches.list().data == [] and other.files.list().data == []
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(api_key="pk-not-a-key", base_url=str(client.base_url), max_retries=0).files.list()
    wait_for(client, second.id, lambda b: b.status in TERMINAL)


def test_cancel_mid_run_keeps_finished_results_and_ends_cancelled(new_client):
    client = new_client()
    total = 256  # >= 24 s of tool gaps on any machine: the run is still going when the cancel lands
    data = "\n".join(slow_line(f"r{i}") for i in range(total)).encode()
    uploaded = client.files.create(file=("long.jsonl", data), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint=REPLAY_URL, completion_window="24h")  # type: ignore[arg-type]
    assert batch.model_extra["job_id"] == JOB

    running, _ = wait_for(
        client, batch.id, lambda b: b.status in TERMINAL or (b.status == "in_progress" and b.request_counts.completed)
    )
    assert running.status == "in_progress" and 0 < running.request_counts.completed < total, running
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status == "cancelling" and cancelling.cancelling_at
    batch, seen = wait_for(client, batch.id, lambda b: b.status in TERMINAL)
    assert batch.status == "cancelled" and batch.cancelled_at and batch.completed_at is None
    assert {status for status, _ in seen} <= {"cancelling", "cancelled"}

    outputs, errors = jsonl(client, batch.output_file_id), jsonl(client, batch.error_file_id)
    assert sorted(line["custom_id"] for line in outputs + errors) == sorted(f"r{i}" for i in range(total))
    assert 0 < len(outputs) < total and len(errors) > 0
    assert {e["error"]["code"] for e in errors} == {"batch_cancelled"}
    counts = batch.request_counts  # the lines never started are pronk's `cancelled`, not `failed`
    assert (counts.total, counts.completed, counts.failed) == (total, len(outputs), 0)
    assert counts.model_extra == {"cancelled": len(errors)}
    with pytest.raises(openai.ConflictError):
        client.batches.cancel(batch.id)


def test_an_oversized_upload_is_refused_and_nothing_is_stored(new_client, stack):
    client = new_client()
    content = storage.join(stack.store_uri, "files", "content")
    before = storage.list_names(content, stack)
    with pytest.raises(openai.APIStatusError) as refused:
        client.files.create(file=("big.jsonl", b"x" * (stack.api_max_upload_bytes + 1)), purpose="batch")
    assert refused.value.status_code == 413 and "too large" in refused.value.message
    assert storage.list_names(content, stack) == before and client.files.list().data == []


def test_client_tools_and_vllms_run_batch_lines_end_as_openai_ends_them(new_client):
    """A client-tool line (its one argument an enum, and as many tokens as the longest call the grammar allows has
    characters: a random model may spell it a character a token, so the call is never cut) comes back as
    tool_calls, and so does one whose tool openai.pydantic_function_tool wrote ($defs and $refs); the lines of
    vLLM's run-batch tests end as OpenAI ends them; every line validates against vLLM's BatchRequestOutput and the
    official client's types."""
    from openai.types.chat import ChatCompletion

    unit = {"type": "object", "properties": {"unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["unit"]}
    tools = [{"type": "function", "function": {"name": "get_temperature", "parameters": unit}}]

    class Leg(BaseModel):
        cabin: Literal["economy", "business"]

    class Trip(BaseModel):
        outbound: Leg
        legs: list[Leg]  # at most 4 items in the grammar: its longest call is 154 characters

    pydantic_tools = [openai.pydantic_function_tool(Trip)]  # $defs and $refs, as the client's helper writes them

    def line(custom_id: str, model: str = "pronk-tiny", **body) -> str:
        messages = [{"role": "user", "content": "Hello world!"}]
        body = {"model": model, "messages": messages, "max_completion_tokens": 32, **body}
        return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body})

    lines = [
        line("client-tool", tools=tools, tool_choice="required", max_completion_tokens=96),
        line("pydantic-tool", tools=pydantic_tools, tool_choice="required", max_completion_tokens=192),
        line("request-1"),
        line("request-2", max_completion_tokens=None, max_tokens=16),
        line("request-3", model="NonExistModel"),
        line("request-5", stream="True"),
    ]
    client = new_client()
    uploaded = client.files.create(file=("vllm.jsonl", "\n".join(lines).encode()), purpose="batch")
    batch = client.batches.create(
        input_file_id=uploaded.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        extra_body={"job_id": JOB},
    )
    batch, _ = wait_for(client, batch.id, lambda b: b.status in TERMINAL)
    written = jsonl(client, batch.output_file_id) + jsonl(client, batch.error_file_id)
    assert how_lines_ended(written) == {
        "client-tool": "ok",
        "pydantic-tool": "ok",
        "request-1": "ok",
        "request-2": "ok",
        "request-3": "model_mismatch",
        "request-5": "invalid_body",
    }
    (tool_line,) = [w for w in written if w["custom_id"] == "client-tool"]
    choice = ChatCompletion.model_validate(tool_line["response"]["body"]).choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
    assert choice.message.tool_calls[0].function.name == "get_temperature"
    assert json.loads(choice.message.tool_calls[0].function.arguments)["unit"] in ("celsius", "fahrenheit")
    (trip_line,) = [w for w in written if w["custom_id"] == "pydantic-tool"]
    (trip_call,) = ChatCompletion.model_validate(trip_line["response"]["body"]).choices[0].message.tool_calls or []
    Trip.model_validate_json(trip_call.function.arguments)

    bad_url = json.dumps({"custom_id": "request-4", "method": "POST", "url": "/bad_url", "body": {}})
    mixed = client.files.create(file=("bad.jsonl", (lines[1] + "\n" + bad_url).encode()), purpose="batch")
    with pytest.raises(openai.BadRequestError, match="/bad_url"):
        client.batches.create(input_file_id=mixed.id, endpoint="/v1/chat/completions", completion_window="24h")
