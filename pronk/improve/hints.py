"""Hints for the tasks no rollout solved: STaR's rationalization, with the task's tool call and answer as the hint.

Rejection sampling learns only from tasks the served version already solves now and then. A family it never solves
gives it nothing to learn from: in the first improve rounds (bench/notes/2026-12-05.md), search passed 0 of 12
samples a round and lookups ~10%, so each round trained on arithmetic the model already answered. STaR (Zelikman
et al., 2022) answers this with rationalization: show the model the answer of a task it failed, let it produce the
rest, keep what passes and train on it as if no hint had been given.

Here the hint is a training line's `reference` (`agent_training_set` writes one on every generated line): the tool call
that answers it and what the answer says. The model still writes the call (copying it or not), the tool runs it for
real, and the model writes its final answer after the tool's result, which the task's check judges as for any
sample. A passed hinted sample is trained on with the hint taken out of the question, so the model learns to make
that call from the question alone and to read the answer out of the result. The answer is in the hint because the
call alone did not lift the search family: with the right query shown, the model still answered 0 of 24 hinted
samples from the documents the search returned. The held-out set carries no references and is never hinted.
"""

from __future__ import annotations

import json
from typing import Any

from pronk.batches.input import split_lines
from pronk.protocol.bodies import ChatCompletionBody
from pronk.protocol.lines import ValidRequest

HINT_PREFIX = "\nHint: "


def hint_of(reference: dict[str, Any]) -> str:
    """A reference's hint: its call as a model's turn writes one (compact JSON, like the prompts' examples), and its
    answer."""
    call = json.dumps(reference["call"], separators=(",", ":"))
    return f"a tool call that answers this is {call}; the answer is {reference['answer']}."


def reference_hints(data: bytes) -> dict[str, str]:
    """custom id -> hint (`hint_of`) of every line of a labelled set (its bytes `data`) that carries a reference."""
    hints = {}
    for _, raw in split_lines(data):
        line: Any = json.loads(raw)
        reference = line.get("reference") if isinstance(line, dict) else None
        if isinstance(reference, dict) and isinstance(line.get("custom_id"), str):
            hints[line["custom_id"]] = hint_of(reference)
    return hints


def hinted_request(line: ValidRequest, hint: str) -> ValidRequest:
    """The line with `hint` appended to its last user message."""
    if not isinstance(line.body, ChatCompletionBody):
        raise ValueError(f"line {line.custom_id!r} is a replay: only chat and agent lines take a hint")
    messages = list(line.body.messages)
    last_user = max((i for i, m in enumerate(messages) if m.role == "user"), default=None)
    if last_user is None:
        raise ValueError(f"line {line.custom_id!r} has no user message to hint")
    messages[last_user] = messages[last_user].model_copy(
        update={"content": messages[last_user].text() + HINT_PREFIX + hint}
    )
    body = line.body.model_copy(update={"messages": messages})
    return ValidRequest(line.line, line.custom_id, body, line.check)


def without_hint(messages: list[dict[str, str]]) -> list[dict[str, str]]:
    """A hinted sample's transcript as the question alone would have started it: the hint cut from user turns."""
    return [{**m, "content": m["content"].split(HINT_PREFIX, 1)[0]} if m.get("role") == "user" else m for m in messages]
