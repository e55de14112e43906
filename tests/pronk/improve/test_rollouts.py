"""Rollouts through the real harness and `check_lines` on a stand-in router, and selection of the passed samples."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import pytest

from pronk.agents.outcomes import Completion, RequestOutcome, Usage
from pronk.agents.transcripts import Transcript, TranscriptRecorder
from pronk.batches.input import validate_input
from pronk.batches.labelled import CheckedLine
from pronk.batches.schemas import LinesChecked
from pronk.engine.worker_protocol import StepRequest, StepResult
from pronk.improve.hints import HINT_PREFIX, hinted_request
from pronk.improve.rollouts import Sample, rollout, sample_requests
from pronk.improve.selection import SelectionCounts, select
from pronk.jobs.catalog import resolve_job
from pronk.protocol.checks import CheckResult
from pronk.settings import get_settings
from tests.fakes import answered, tiny_harness


class AnsweringRouter:
    """Answers every step of trace `TASK#i` with the final answer `answers[TASK][i]`, keeping what each was sent."""

    def __init__(self, answers: dict[str, list[str]]):
        self.answers = answers
        self.sent: dict[str, list[dict[str, str]]] = {}
        self.sampling: dict[str, tuple[float, int | None]] = {}

    async def generate(self, request: StepRequest) -> StepResult:
        task, index = request.trace_id.split("#")
        self.sent[request.trace_id] = [{"role": m.role, "content": m.text()} for m in request.messages]
        self.sampling[request.trace_id] = (request.sampling.temperature, request.sampling.seed)
        return answered(request, json.dumps({"final": self.answers[task][int(index)]}))

    async def finish(self, trace_id: str) -> None:
        pass


def lines(*ids: str):
    raw = [
        {
            "custom_id": custom_id,
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": "pronk-tiny",
                "messages": [{"role": "user", "content": f"What is 2 + 2? ({custom_id})"}],
                "tools": [{"type": "function", "function": {"name": "sql"}}],
                "temperature": 0,
                "seed": 0,
            },
            "check": {"type": "number", "expected": 4},
        }
        for custom_id in ids
    ]
    return validate_input(
        "\n".join(json.dumps(r) for r in raw).encode(), resolve_job("tiny-cpu", get_settings())
    ).requests


def test_sample_requests_share_the_prompt_and_differ_by_id_and_seed():
    requests = sample_requests(lines("arith-1", "lookup-1"), samples_per_task=3, temperature=0.7, seed=10)
    assert [(r.task_id, r.index, r.request.custom_id) for r in requests][:4] == [
        ("arith-1", 0, "arith-1#0"),
        ("arith-1", 1, "arith-1#1"),
        ("arith-1", 2, "arith-1#2"),
        ("lookup-1", 0, "lookup-1#0"),
    ]
    bodies = [r.request.body for r in requests[:3]]
    assert [(b.temperature, b.seed) for b in bodies] == [(0.7, 10), (0.7, 11), (0.7, 12)]
    assert bodies[0].messages == bodies[1].messages == bodies[2].messages
    with pytest.raises(ValueError, match="above 0"):
        sample_requests(lines("arith-1"), 2, 0.0, 0)


def test_a_rollout_checks_every_sample_and_carries_its_transcript_and_records(tmp_path):
    router = AnsweringRouter({"arith-1": ["4", "5", "It is 4."], "lookup-1": ["no", "no", "no"]})
    harness = tiny_harness(router, tmp_path, TranscriptRecorder())
    progress = LinesChecked(total=2, done=2)  # two samples an earlier call of the round checked
    samples = asyncio.run(rollout(lines("arith-1", "lookup-1"), harness, 3, 0.8, 0, progress=progress))

    assert progress == LinesChecked(total=8, done=8)
    assert [(s.task_id, s.index, s.passed) for s in samples] == [
        ("arith-1", 0, True),
        ("arith-1", 1, False),
        ("arith-1", 2, True),
        ("lookup-1", 0, False),
        ("lookup-1", 1, False),
        ("lookup-1", 2, False),
    ]
    first = samples[0]
    assert first.transcript is not None and first.transcript.messages[-1]["content"] == '{"final": "4"}'
    assert first.transcript.messages[:-1] == router.sent["arith-1#0"]
    assert [r.custom_id for r in first.run.records] == ["arith-1#0"]
    assert router.sent["arith-1#0"] == router.sent["arith-1#1"] == router.sent["arith-1#2"]
    assert len({router.sampling[f"arith-1#{i}"] for i in range(3)}) == 3  # distinct step seeds, one temperature
    assert {t for t, _ in router.sampling.values()} == {0.8}


def test_a_rollout_needs_a_harness_that_keeps_transcripts(tmp_path):
    harness = tiny_harness(AnsweringRouter({}), tmp_path)
    with pytest.raises(ValueError, match="TranscriptRecorder"):
        asyncio.run(rollout(lines("arith-1"), harness, 2, 0.8, 0))


def sample(
    task: str, index: int, status: str, answer: str = "4", finish: str = "stop", question: str = "q", hinted=False
) -> Sample:
    request = dataclasses.replace(lines(task)[0], custom_id=f"{task}#{index}")
    messages = [{"role": "user", "content": question}, {"role": "assistant", "content": json.dumps({"final": answer})}]
    transcript = Transcript(f"{task}#{index}", f"{task}#{index}", None, messages, finish, answer)
    completion = Completion("agent", "r", "m", "1", "w", Usage(1, 0, 1), text=answer)
    run = CheckedLine(
        request,
        RequestOutcome(1, request.custom_id, completion),
        CheckResult(status=status),  # type: ignore[arg-type]
        [],
        0.0,
        [transcript],
    )
    return Sample(task, index, run, hinted)


def test_selection_keeps_distinct_answered_passes_capped_per_task_and_counts_by_family():
    samples = [
        sample("arith-1", 0, "passed"),
        sample("arith-1", 1, "passed"),  # the same conversation as sample 0: counted once
        sample("arith-1", 2, "passed", answer="It is 4."),
        sample("arith-1", 3, "passed", answer="4.0"),  # over the cap of 2
        sample("arith-2", 0, "failed", answer="5"),
        sample("lookup-1", 1, "passed", answer="4!"),
        sample("lookup-1", 0, "passed", answer="4", finish="max_steps"),  # passed, but never answered
    ]
    examples, report = select(samples, cap_per_task=2)

    assert [(e.task_id, e.custom_id, e.messages[-1]["content"]) for e in examples] == [
        ("arith-1", "arith-1#0", '{"final": "4"}'),
        ("arith-1", "arith-1#2", '{"final": "It is 4."}'),
        ("lookup-1", "lookup-1#1", '{"final": "4!"}'),
    ]
    assert report.model_dump() == {
        "tasks": 3,
        "samples": 7,
        "passed": 5,
        "kept": 3,
        "families": {
            "arith": SelectionCounts(tasks=2, samples=5, passed=4, kept=2).model_dump(),
            "lookup": SelectionCounts(tasks=1, samples=2, passed=1, kept=1).model_dump(),
        },
        "hinted": SelectionCounts().model_dump(),
        "branches": SelectionCounts().model_dump(),
    }


def test_hinted_samples_run_after_the_plain_ones_with_the_hint_in_the_question(tmp_path):
    router = AnsweringRouter({"lookup-1": ["no", "no", "4", "no"]})
    harness = tiny_harness(router, tmp_path, TranscriptRecorder())
    call = '{"tool":"sql","arguments":{"query":"SELECT 4"}}'
    hinted = hinted_request(lines("lookup-1")[0], call)
    samples = asyncio.run(rollout([hinted], harness, 2, 0.8, 0, first_index=2, hinted=True))

    assert [(s.index, s.hinted, s.passed) for s in samples] == [(2, True, True), (3, True, False)]
    assert router.sent["lookup-1#2"][-1]["content"].endswith(HINT_PREFIX + call)
    assert [s.run.request.body.seed for s in samples] == [2, 3]  # type: ignore[union-attr]


def test_a_kept_hinted_pass_is_trained_on_without_its_hint_and_counted_apart():
    hinted_question = "What is 2 + 2?" + HINT_PREFIX + '{"tool":"python","arguments":{"code":"2 + 2"}}'
    samples = [
        sample("lookup-1", 0, "failed", answer="5", question="What is 2 + 2?"),
        sample("lookup-1", 1, "passed", question=hinted_question, hinted=True),
        sample("lookup-1", 2, "failed", answer="3", question=hinted_question, hinted=True),
    ]
    examples, report = select(samples, cap_per_task=2)

    assert [e.messages[0]["content"] for e in examples] == ["What is 2 + 2?"]
    assert (report.tasks, report.samples, report.passed, report.kept) == (1, 3, 1, 1)
    assert report.hinted == SelectionCounts(tasks=1, samples=2, passed=1, kept=1)
