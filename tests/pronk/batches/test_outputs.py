"""The one builder of output lines: chat, agent and replay lines through the harness on a stand-in router.

The key lists are exactly those the output files had before the builder was one function; clients read them.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from pronk.agents.harness import Harness
from pronk.agents.outcomes import Completion
from pronk.agents.step_records import StepRecorder
from pronk.batches.input import validate_input
from pronk.batches.outputs import output_line, trace_row
from pronk.engine.router import NoWorkerAvailable
from pronk.engine.worker_protocol import StepRequest, StepResult
from pronk.jobs.catalog import resolve_job
from pronk.settings import get_settings

BWRAP = get_settings().sandbox_bwrap
"""The bubblewrap binary a harness's python tool isolates code with."""

TOP = ["id", "object", "created", "model", "system_fingerprint", "choices", "usage", "pronk"]
REPLAY_TOP = ["id", "object", "created", "model", "usage", "pronk"]
CHOICE = ["index", "message", "finish_reason", "logprobs"]
USAGE = ["prompt_tokens", "completion_tokens", "total_tokens", "prompt_tokens_details"]
SUMMARY = [
    "steps",
    "failed_attempts",
    "traces",
    "tool_calls",
    "tool_errors",
    "tool_call_counts",
    "workers",
    "prompt_tokens",
    "cached_tokens",
    "output_tokens",
    "cached_ratio",
    "engine_time_s",
    "tool_time_s",
]


class StandInRouter:
    """Answers every step (a final answer when the step is constrained to JSON); trace `down` finds no worker."""

    async def generate(self, request: StepRequest) -> StepResult:
        if request.trace_id == "down":
            raise NoWorkerAvailable("no live worker")
        n = min(request.sampling.max_tokens, 3)
        return StepResult(
            request_id=request.request_id,
            text='{"final": "done"}' if request.sampling.json_schema else "hello",
            token_ids=[9] * n,
            prompt_tokens=len(request.prompt_token_ids) if request.prompt_token_ids else 7,
            cached_tokens=2,
            completion_tokens=n,
            finish_reason="stop",
            model_version="m/1",
            worker_id="w0",
            queue_time_s=0.0012345678,
            engine_time_s=0.0098765432,
        )

    async def finish(self, trace_id: str) -> None:
        pass


SHAPE = {
    "trace_id": "s",
    "system_prompt_tokens": 10,
    "steps": [
        {
            "new_prompt_tokens": 3,
            "output_tokens": 2,
            "fan_out": [
                {"trace_id": "c", "system_prompt_tokens": 4, "steps": [{"new_prompt_tokens": 1, "output_tokens": 5}]}
            ],
        },
        {"new_prompt_tokens": 6, "output_tokens": 7},
    ],
}


def line(custom_id: str, url: str = "/v1/chat/completions", **body) -> str:
    body = {"model": "pronk-tiny", **body}
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body})


def run_lines(tmp_path: Path):
    job = resolve_job("tiny-cpu", get_settings())
    messages = [{"role": "user", "content": "go"}]
    validated = validate_input(
        "\n".join(
            [
                line("chat", messages=messages, max_tokens=4),
                line("down", messages=messages),
                line("agent", messages=messages, tools=[{"type": "function", "function": {"name": "sql"}}]),
                line("replay", url="/v1/pronk/replay", shape=SHAPE),
            ]
        ).encode(),
        job,
    )
    assert validated.errors == []
    harness = Harness(StandInRouter(), job, StepRecorder(), tmp_path, sandbox_bwrap=BWRAP)  # type: ignore[arg-type]

    async def run_all():
        return [await harness.run_line(r) for r in validated.requests]

    return {o.custom_id: o for o in asyncio.run(run_all())}


def test_chat_agent_and_replay_bodies_have_exactly_the_known_keys(tmp_path):
    outcomes = run_lines(tmp_path)

    chat = output_line(outcomes["chat"]).model_dump()
    body = chat["response"]["body"]
    assert list(body) == TOP and list(body["choices"][0]) == CHOICE and list(body["usage"]) == USAGE
    assert chat["response"]["request_id"] == body["id"] and body["id"].startswith("chatcmpl")
    assert (body["object"], body["model"], body["system_fingerprint"]) == ("chat.completion", "pronk-tiny", "m/1")
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "hello"}
    assert body["usage"] == {
        "prompt_tokens": 7,
        "completion_tokens": 3,
        "total_tokens": 10,
        "prompt_tokens_details": {"cached_tokens": 2},
    }
    assert body["pronk"] == {
        "model_version": "m/1",
        "worker_id": "w0",
        "queue_time_s": 0.001235,
        "engine_time_s": 0.009877,
    }

    agent = output_line(outcomes["agent"]).model_dump()["response"]["body"]
    assert list(agent) == TOP and list(agent["choices"][0]) == CHOICE and list(agent["usage"]) == USAGE
    assert list(agent["pronk"]) == ["model_version", "worker_id", "trace", "transcript"]
    assert list(agent["pronk"]["trace"]) == ["trace_id", "finish_reason", "duration_s", *SUMMARY]
    assert agent["choices"][0]["message"]["content"] == "done" and agent["pronk"]["trace"]["trace_id"] == "agent"
    assert agent["pronk"]["trace"]["tool_call_counts"] == {"total": 0, "parsed": 0, "valid": 0}  # answered at once
    assert agent["pronk"]["transcript"] == [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": '{"final": "done"}'},
    ]

    replay = output_line(outcomes["replay"]).model_dump()["response"]["body"]
    assert list(replay) == REPLAY_TOP and replay["object"] == "pronk.replay" and replay["id"].startswith("replay")
    assert list(replay["pronk"]) == ["model_version", "worker_id", "trace"]
    assert list(replay["pronk"]["trace"]) == ["trace_id", "duration_s", *SUMMARY]
    assert replay["usage"]["prompt_tokens"] == 13 + 20 + 21 and replay["usage"]["completion_tokens"] == 2 + 3 + 3
    assert replay["pronk"]["trace"]["traces"] == 2 and replay["pronk"]["trace"]["tool_calls"] == {"fan_out": 1}


def test_a_failed_line_becomes_its_error_line_and_the_outcomes_carry_usage_and_summaries(tmp_path):
    outcomes = run_lines(tmp_path)
    down = output_line(outcomes["down"])
    assert down.response is None and down.error is not None
    assert (down.error.code, down.error.message, down.error.line) == ("engine_unavailable", "line 2: no live worker", 2)
    assert outcomes["down"].completion is None

    replay = outcomes["replay"].completion
    assert isinstance(replay, Completion) and replay.summary is not None
    assert (replay.usage.prompt_tokens, replay.usage.cached_tokens, replay.usage.completion_tokens) == (
        54,
        6,
        2 + 3 + 3,
    )
    assert replay.worker_id == "w0" and replay.summary.workers == ["w0"]
    assert [trace_row(outcome)["finish_reason"] for outcome in outcomes.values()] == [
        "stop",
        "engine_unavailable",
        "stop",
        "replayed",
    ]
