"""Hints: the training set's reference calls, a line with its hint, and a transcript without it."""

from __future__ import annotations

import json

from pronk.batches.input import validate_input
from pronk.improve.agent_training_set import HELD_OUT, TRAINING_SET
from pronk.improve.hints import HINT_PREFIX, hinted_request, reference_hints, without_hint
from pronk.jobs.catalog import resolve_job
from pronk.settings import get_settings


def test_every_training_line_has_a_hint_and_no_held_out_line_does():
    hints = reference_hints(TRAINING_SET.read_bytes())
    assert len(hints) == len(TRAINING_SET.read_text().splitlines())
    call = {"tool": "sql", "arguments": {"query": "SELECT industry FROM companies WHERE name = 'Kestrel Drones'"}}
    assert hints["lookup-train-029"] == (
        f"a tool call that answers this is {json.dumps(call, separators=(',', ':'))}; the answer is aerospace."
    )
    assert reference_hints(HELD_OUT.read_bytes()) == {}


def test_a_hint_goes_after_the_last_question_and_comes_out_of_the_transcript():
    job = resolve_job("smollm2-cpu", get_settings())
    [line] = validate_input(TRAINING_SET.read_text().splitlines()[80].encode(), job).requests
    hint = reference_hints(TRAINING_SET.read_bytes())[line.custom_id]
    hinted = hinted_request(line, hint)

    question = line.body.messages[-1].text()  # type: ignore[union-attr]
    assert hinted.body.messages[-1].text() == question + HINT_PREFIX + hint  # type: ignore[union-attr]
    assert hinted.body.messages[:-1] == line.body.messages[:-1]  # type: ignore[union-attr]
    assert (hinted.custom_id, hinted.check) == (line.custom_id, line.check)
    transcript = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": hinted.body.messages[-1].text()},  # type: ignore[union-attr]
        {"role": "assistant", "content": "{}"},
    ]
    assert without_hint(transcript) == [transcript[0], {"role": "user", "content": question}, transcript[2]]
