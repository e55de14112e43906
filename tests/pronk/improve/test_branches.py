"""Answer branches: which failed samples branch, what a branch's prompt is, and a branch run through the harness."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import pytest

from pronk.agents.harness import Harness, tool_turn
from pronk.agents.transcripts import TranscriptRecorder
from pronk.engine.worker_protocol import StepRequest, StepResult
from pronk.improve.branches import branch, branch_point, branch_requests
from pronk.improve.rollouts import Sample, rollout
from pronk.improve.selection import SelectionCounts, select
from tests.fakes import answered, tiny_harness
from tests.pronk.improve.test_rollouts import lines, sample

CALL = json.dumps({"tool": "sql", "arguments": {"query": "SELECT 2 + 2"}})


class CallingRouter:
    """Trace `TASK#i` calls sql first, then answers `answers[TASK][i]`; every step's prompt is kept by trace."""

    def __init__(self, answers: dict[str, dict[int, str]]):
        self.answers = answers
        self.sent: dict[str, list[list[dict[str, str]]]] = {}

    async def generate(self, request: StepRequest) -> StepResult:
        task, index = request.trace_id.split("#")
        messages = [{"role": m.role, "content": m.text()} for m in request.messages]
        self.sent.setdefault(request.trace_id, []).append(messages)
        if messages[-1]["role"] != "tool":
            return answered(request, CALL)
        return answered(request, json.dumps({"final": self.answers[task][int(index)]}))

    async def finish(self, trace_id: str) -> None:
        pass


@pytest.fixture
def harness(tmp_path):
    def make(router: CallingRouter) -> Harness:
        return tiny_harness(router, tmp_path, TranscriptRecorder())

    return make


def test_a_failed_samples_branch_answers_again_from_its_own_conversation_and_a_pass_is_kept(harness):
    router = CallingRouter({"lookup-1": {0: "5", 1: "6", 2: "5", 3: "4", 4: "7", 5: "4"}})
    runs = harness(router)
    samples = asyncio.run(rollout(lines("lookup-1"), runs, 2, 0.8, 0))
    assert [s.passed for s in samples] == [False, False]

    branches = asyncio.run(branch(samples, runs, 2, cap_per_task=2, temperature=0.8, seed=0, first_index=2))

    assert [(s.index, s.branch_of, s.passed) for s in branches] == [
        (2, 0, False),
        (3, 0, True),
        (4, 1, False),
        (5, 1, True),
    ]
    answer_prompt = router.sent["lookup-1#0"][-1]  # what sample 0's answer step was sent
    assert router.sent["lookup-1#3"] == [answer_prompt]  # one step, from the same conversation
    assert answer_prompt[-2:] == [{"role": "assistant", "content": CALL}, samples[0].transcript.messages[-2]]  # type: ignore[union-attr]
    assert [s.run.request.body.seed for s in branches] == [2, 3, 4, 5]  # type: ignore[union-attr]

    examples, report = select(samples + branches, cap_per_task=2)
    # both samples made the same call and read the same result, so their passed branches are one conversation
    assert [e.custom_id for e in examples] == ["lookup-1#3"]
    assert examples[0].messages == answer_prompt + [{"role": "assistant", "content": '{"final": "4"}'}]
    assert report.branches == SelectionCounts(tasks=1, samples=4, passed=2, kept=1)
    assert (report.samples, report.passed, report.kept) == (6, 2, 1)


def test_only_failed_plain_samples_of_tasks_under_the_cap_that_got_a_tool_result_branch(harness):
    router = CallingRouter({"arith-1": {0: "4", 1: "5"}, "lookup-1": {0: "5", 1: "4"}, "search-1": {0: "5", 1: "5"}})
    samples = asyncio.run(rollout(lines("arith-1", "lookup-1", "search-1"), harness(router), 2, 0.8, 0))

    requests = branch_requests(samples, 3, cap_per_task=1, temperature=0.8, seed=10, first_index=2)
    # arith-1 and lookup-1 have their one pass; search-1 branches both its samples, numbered on from 2
    assert [(r.task_id, r.index, r.branch_of) for r in requests] == [
        ("search-1", 2, 0),
        ("search-1", 3, 0),
        ("search-1", 4, 0),
        ("search-1", 5, 1),
        ("search-1", 6, 1),
        ("search-1", 7, 1),
    ]
    assert requests[0].request.custom_id == "search-1#2"
    first = requests[0].request.body
    assert first.harness is not None and first.harness.max_steps == 1  # type: ignore[union-attr]
    assert (first.temperature, first.seed) == (0.8, 12)  # type: ignore[union-attr]
    assert [m.role for m in first.messages] == ["user", "assistant", "tool"]  # type: ignore[union-attr]
    under_two = branch_requests(samples, 1, cap_per_task=2, temperature=0.8, seed=0, first_index=2)
    assert [(r.task_id, r.branch_of) for r in under_two] == [
        ("arith-1", 1),
        ("lookup-1", 0),
        ("search-1", 0),
        ("search-1", 1),
    ]
    hinted = [dataclasses.replace(s, hinted=True) for s in samples]
    assert branch_requests(hinted, 3, cap_per_task=2, temperature=0.8, seed=0, first_index=2) == []
    with pytest.raises(ValueError, match="above 0"):
        branch_requests(samples, 1, 1, 0.0, 0, 2)


def with_turns(failed: Sample, *turns: tuple[str, str]) -> Sample:
    """`failed` with a transcript of the harness's system prompt, its line's question, then `turns`."""
    question = failed.run.request.body.messages[0].text()  # type: ignore[union-attr]
    messages = [{"role": "system", "content": "tools"}, {"role": "user", "content": question}]
    messages += [{"role": role, "content": content} for role, content in turns]
    transcript = dataclasses.replace(failed.run.transcripts[0], messages=messages)
    return dataclasses.replace(failed, run=dataclasses.replace(failed.run, transcripts=[transcript]))


def test_a_branch_point_is_the_conversation_through_a_last_tool_turn_that_holds_a_result():
    failed = sample("lookup-1", 0, "failed", answer="5")
    assert branch_point(failed) is None  # answered without calling a tool
    ok = tool_turn("sql", True, "4")
    error = tool_turn("sql", False, "syntax error")
    final = json.dumps({"final": "5"})
    point = branch_point(with_turns(failed, ("assistant", CALL), ("tool", ok), ("assistant", final)))
    assert point is not None and [(m.role, m.text()) for m in point[1:]] == [("assistant", CALL), ("tool", ok)]
    assert (
        branch_point(with_turns(failed, ("assistant", CALL), ("tool", ok), ("assistant", CALL), ("tool", error)))
        is None
    )
