"""Answer branches: a failed sample's answer sampled again from its own conversation up to that answer.

In the improve runs' rollouts (bench/RESULTS.md), most failed samples had made a call whose result held the answer
and then answered something else, often the prompt example's answer: in one round, 42 of 49 failed search samples
and 41 of 108 failed lookups. Rejection sampling throws those traces away whole, so the search family gave about
one pass a round to learn from. A branch keeps the sample's conversation through its last tool result (the
model's own calls, the tools' real results) and samples the answer step alone again, at the rollout temperature
with a seed of its own: the line's messages followed by those turns, run as a one-step trace, whose one step the
harness makes an answer. The branch is checked like any sample, and a passed branch is a conversation the model
wrote whole, kept by selection like any other pass. Resampling a trace from an intermediate state is what
tree-structured rollouts do; here the branch point is the last one, the answer, which is where these traces fail.

Only a task with fewer passes than selection keeps (`cap_per_task`) is branched, only its plain samples, and only
those whose last tool turn is a result, not an error (4 of 106 such branches passed in one round); a branch's prompt
is the prefix its sample's trace already computed, so a worker whose prefix cache still holds it computes only the
answer.
"""

from __future__ import annotations

from collections import Counter

from pronk.agents.harness import Harness, tool_turn_ok
from pronk.batches.schemas import LinesChecked
from pronk.engine.worker_protocol import ChatMessage
from pronk.improve.rollouts import Sample, SampleRequest, run_samples, sample_request
from pronk.protocol.bodies import ChatCompletionBody, HarnessRequest


def branch_point(sample: Sample) -> list[ChatMessage] | None:
    """The prompt the sample's last answer followed: its line's messages and its trace's own turns through the last
    tool turn (None: that turn is an error, no tool returned in its trace, or it never ran)."""
    transcript = sample.transcript
    body = sample.run.request.body
    if transcript is None or not isinstance(body, ChatCompletionBody):
        return None
    turns = transcript.messages[1 + len(body.messages) :]  # after the harness's system prompt and the line's messages
    last_tool = max((i for i, m in enumerate(turns) if m["role"] == "tool"), default=None)
    if last_tool is None or not tool_turn_ok(turns[last_tool]["content"]):
        return None
    return list(body.messages) + [ChatMessage.model_validate(m) for m in turns[: last_tool + 1]]


def branch_requests(
    samples: list[Sample], branches: int, cap_per_task: int, temperature: float, seed: int, first_index: int
) -> list[SampleRequest]:
    """`branches` one-step requests from each failed plain sample of a task with fewer than `cap_per_task` passes,
    a sample's branches one after another (they share its prefix); a task's branch indexes (and seeds) count up from
    `first_index`."""
    if temperature <= 0:
        raise ValueError(f"branches sample at a temperature above 0, not {temperature}")
    passes = Counter(s.task_id for s in samples if s.passed)
    next_index: dict[str, int] = {}
    requests = []
    for sample in samples:
        if sample.passed or sample.hinted or sample.branch_of is not None or passes[sample.task_id] >= cap_per_task:
            continue
        prompt = branch_point(sample)
        body = sample.run.request.body
        if prompt is None or not isinstance(body, ChatCompletionBody):
            continue
        harness = (body.harness or HarnessRequest()).model_copy(update={"max_steps": 1})
        for _ in range(branches):
            index = next_index.get(sample.task_id, first_index)
            next_index[sample.task_id] = index + 1
            branch = body.model_copy(
                update={"messages": prompt, "harness": harness, "temperature": temperature, "seed": seed + index}
            )
            request = sample_request(sample.task_id, index, branch, sample.run.request)
            requests.append(SampleRequest(sample.task_id, index, request, branch_of=sample.index))
    return requests


async def branch(
    samples: list[Sample],
    harness: Harness,
    branches: int,
    cap_per_task: int,
    temperature: float,
    seed: int,
    first_index: int,
    progress: LinesChecked | None = None,
) -> list[Sample]:
    """Run and check the answer branches of `samples` (`branch_requests`) through `harness`; `progress` counts
    them asked and checked."""
    requests = branch_requests(samples, branches, cap_per_task, temperature, seed, first_index)
    return await run_samples(requests, harness, progress=progress) if requests else []
