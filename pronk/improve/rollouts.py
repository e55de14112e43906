"""Rollouts: every training line run k times through the harness at temperature > 0, each sample checked.

The k samples of a line share its messages, so its prompt (system prompt, tools, question) is one prefix the
workers' prefix cache computes once; they differ by seed (sample i: `seed + i`) and by custom id (`ID#i`), and run
one line after another so a line's samples are in flight together. Running and checking is
`pronk.batches.labelled.check_lines`, the canary's own; a sample carries its step records and transcripts.
Answer branches (`pronk.improve.branches`) and hinted samples (`pronk.improve.hints`) are numbered after a line's plain
ones, so every sample of a round has an id and a seed of its own.
"""

from __future__ import annotations

from dataclasses import dataclass

from pronk.agents.harness import Harness
from pronk.agents.transcripts import Transcript
from pronk.batches.labelled import CheckedLine, check_lines
from pronk.batches.schemas import LinesChecked
from pronk.improve.hints import without_hint
from pronk.protocol.bodies import ChatCompletionBody
from pronk.protocol.lines import ValidRequest

SAMPLE_SEPARATOR = "#"


@dataclass(frozen=True, slots=True)
class Sample:
    """One rollout of a training line: which line, which sample, its checked run, and whether it ran with a hint."""

    task_id: str
    index: int
    run: CheckedLine
    hinted: bool = False
    branch_of: int | None = None
    """For an answer branch (`pronk.improve.branches`): the index of the failed sample whose transcript it goes on."""

    @property
    def passed(self) -> bool:
        return self.run.check.status == "passed"

    @property
    def transcript(self) -> Transcript | None:
        """The root trace's transcript (None: the line failed before its trace ran)."""
        return next((t for t in reversed(self.run.transcripts) if t.is_root), None)

    def training_messages(self, transcript: Transcript) -> list[dict[str, str]]:
        """The transcript's messages as training sees them: a hinted sample's without its hint."""
        return without_hint(transcript.messages) if self.hinted else transcript.messages


@dataclass(frozen=True, slots=True)
class SampleRequest:
    """The request of one sample: its task, its index (its custom id is `TASK#INDEX`), the branch's parent sample."""

    task_id: str
    index: int
    request: ValidRequest
    branch_of: int | None = None


def sample_requests(
    lines: list[ValidRequest], samples_per_task: int, temperature: float, seed: int, first_index: int = 0
) -> list[SampleRequest]:
    """The k samples of each agent line, line by line; sample indexes (and seeds) start at `first_index`."""
    if temperature <= 0:
        raise ValueError(f"rollouts sample at a temperature above 0, not {temperature}")
    requests = []
    for line in lines:
        if not isinstance(line.body, ChatCompletionBody):
            raise ValueError(f"line {line.custom_id!r} is a replay: only chat and agent lines can be rolled out")
        for index in range(first_index, first_index + samples_per_task):
            body = line.body.model_copy(update={"temperature": temperature, "seed": seed + index})
            requests.append(SampleRequest(line.custom_id, index, sample_request(line.custom_id, index, body, line)))
    return requests


def sample_request(task_id: str, index: int, body: ChatCompletionBody, like: ValidRequest) -> ValidRequest:
    """Sample `index` of task `task_id`: `body`, with the line number and check of `like` (the task's line, or
    another of its samples)."""
    return ValidRequest(like.line, f"{task_id}{SAMPLE_SEPARATOR}{index}", body, like.check)


async def rollout(
    lines: list[ValidRequest],
    harness: Harness,
    samples_per_task: int,
    temperature: float,
    seed: int,
    first_index: int = 0,
    hinted: bool = False,
    progress: LinesChecked | None = None,
) -> list[Sample]:
    """Run every line `samples_per_task` times through `harness` (which must keep transcripts) and check each;
    `hinted`: the lines carry a hint (`pronk.improve.hints.hinted_request`) that training takes out again; `progress`
    counts the samples asked and checked."""
    requests = sample_requests(lines, samples_per_task, temperature, seed, first_index)
    return await run_samples(requests, harness, hinted, progress)


async def run_samples(
    requests: list[SampleRequest], harness: Harness, hinted: bool = False, progress: LinesChecked | None = None
) -> list[Sample]:
    """Run and check every sample's request through `harness` (which must keep transcripts)."""
    if harness.transcripts is None:
        raise ValueError("rollouts need a Harness with a TranscriptRecorder: selection trains on transcripts")
    checked = await check_lines([r.request for r in requests], harness, progress)
    return [Sample(r.task_id, r.index, run, hinted, r.branch_of) for r, run in zip(requests, checked, strict=True)]
