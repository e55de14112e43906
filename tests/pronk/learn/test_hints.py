"""Hints: the training set's reference calls, a line with its hint, and a transcript without it."""

from __future__ import annotations

import json

from pronk.batches.input import validate_input
from pronk.jobs.files import get_job
from pronk.learn.hints import HINT_PREFIX, hinted_request, reference_calls, without_hint
from pronk.learn.training_tasks import HELD_OUT, TRAINING_SET
from pronk.settings import get_settings


def test_every_training_line_has_a_reference_and_no_held_out_line_does():
    settings = get_settings()
    references = reference_calls(str(TRAINING_SET), settings)
    assert len(references) == len(TRAINING_SET.read_text().splitlines())
    assert json.loads(references["lookup-train-029"])["tool"] == "sql"
    assert reference_calls(str(HELD_OUT), settings) == {}


def test_a_hint_goes_after_the_last_question_and_comes_out_of_the_transcript():
    job = get_job("smollm2-cpu", get_settings())
    [line] = validate_input(TRAINING_SET.read_text().splitlines()[80].encode(), job).requests
    reference = reference_calls(str(TRAINING_SET), get_settings())[line.custom_id]
    hinted = hinted_request(line, reference)

    question = line.body.messages[-1].text()  # type: ignore[union-attr]
    assert hinted.body.messages[-1].text() == question + HINT_PREFIX + reference  # type: ignore[union-attr]
    assert hinted.body.messages[:-1] == line.body.messages[:-1]  # type: ignore[union-attr]
    assert (hinted.custom_id, hinted.check) == (line.custom_id, line.check)
    transcript = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": hinted.body.messages[-1].text()},  # type: ignore[union-attr]
        {"role": "assistant", "content": reference},
    ]
    assert without_hint(transcript) == [transcript[0], {"role": "user", "content": question}, transcript[2]]
