"""Transcripts: the harness, given a TranscriptRecorder, keeps each trace's conversation exactly as it sent it to
the engine, with the model's last output; on a stand-in router that replays scripted outputs."""

from __future__ import annotations

import asyncio
import json

from pronk.agents.transcripts import TranscriptRecorder
from pronk.batches.input import validate_input
from pronk.engine.worker_protocol import StepRequest, StepResult
from pronk.jobs.catalog import resolve_job
from pronk.settings import get_settings
from tests.fakes import tiny_harness
from tests.pronk.agents.test_tool_calls import ScriptedRouter


class SentRouter(ScriptedRouter):
    """A scripted router that also keeps the messages of every step it was sent."""

    def __init__(self, outputs: list[str]):
        super().__init__(outputs)
        self.sent: list[list[dict[str, str]]] = []

    async def generate(self, request: StepRequest) -> StepResult:
        self.sent.append([{"role": m.role, "content": m.text()} for m in request.messages])
        return await super().generate(request)


def agent_line(tools: list[str], question: str = "How many companies are there?"):
    body = {
        "model": "pronk-tiny",
        "messages": [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": question}],
        "tools": [{"type": "function", "function": {"name": name}} for name in tools],
    }
    raw = {"custom_id": "line-1", "method": "POST", "url": "/v1/chat/completions", "body": body}
    (request,) = validate_input(json.dumps(raw).encode(), resolve_job("tiny-cpu", get_settings())).requests
    return request


def test_a_trace_is_kept_whole_as_sent_with_its_final_answer(tmp_path):
    call = '{"tool": "sql", "arguments": {"query": "SELECT COUNT(*) AS n FROM companies"}}'
    router = SentRouter([call, '{"final": "24"}'])
    transcripts = TranscriptRecorder()
    harness = tiny_harness(router, tmp_path, transcripts)
    outcome = asyncio.run(harness.run_line(agent_line(["sql"])))

    assert outcome.completion is not None and outcome.completion.text == "24"
    (transcript,) = transcripts.take_line("line-1")
    assert transcripts.take_line("line-1") == []  # handed over once
    assert transcript.is_root and transcript.trace_id == "line-1"
    assert (transcript.finish_reason, transcript.answer) == ("stop", "24")
    messages = transcript.messages
    assert [m["role"] for m in messages] == ["system", "system", "user", "assistant", "tool", "assistant"]
    assert messages[0]["content"].startswith("You are an agent.")  # the harness's prompt listing the tools
    assert messages[3]["content"] == call and messages[4]["content"].startswith("[sql ok] n\n24")
    assert messages[5]["content"] == '{"final": "24"}'
    # Each step was sent exactly the transcript up to that step's output.
    assert router.sent == [messages[:3], messages[:5]]


def test_fan_out_keeps_each_child_and_the_root_last(tmp_path):
    spawn = '{"tool": "spawn_subagents", "arguments": {"tasks": ["count them", "name one"]}}'
    router = SentRouter([spawn, '{"final": "child answer"}', '{"final": "child answer"}', '{"final": "done"}'])
    transcripts = TranscriptRecorder()
    harness = tiny_harness(router, tmp_path, transcripts)
    asyncio.run(harness.run_line(agent_line(["sql", "spawn_subagents"])))

    *children, root = transcripts.take_line("line-1")
    assert root.is_root and root.answer == "done"
    assert sorted(c.trace_id for c in children) == ["line-1.0.0", "line-1.0.1"]
    for child in children:
        assert child.parent_trace_id == "line-1" and child.answer == "child answer"
        assert child.messages[:4] == root.messages[:4]  # the parent's conversation through its spawn call
        assert child.messages[4]["content"].startswith("Sub-task")
    assert [m["role"] for m in root.messages][-2:] == ["tool", "assistant"]


def test_without_a_recorder_the_harness_keeps_none(tmp_path):
    router = SentRouter(['{"final": "24"}'])
    harness = tiny_harness(router, tmp_path)
    outcome = asyncio.run(harness.run_line(agent_line(["sql"])))
    assert harness.transcripts is None and outcome.completion is not None
