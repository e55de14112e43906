"""The batch's task runs as plain functions, without a server: an unreadable input is the batch's input error, and
validation splits lines into requests and error lines with the job's limits."""

from __future__ import annotations

import json

import pytest

from pronk.batches.input import BatchInputError
from pronk.jobs.catalog import resolve_job
from pronk.settings import get_settings
from pronk.tasks.batch import read_input_file, validate_lines


def test_an_input_that_cannot_be_read_is_an_input_error_naming_it(tmp_path):
    with pytest.raises(BatchInputError, match=r"cannot read input file .*missing\.jsonl"):
        read_input_file.fn(str(tmp_path / "missing.jsonl"), get_settings())


def test_validation_keeps_one_request_or_one_error_line_per_input_line():
    settings = get_settings()
    job = resolve_job("tiny-cpu", settings)
    good = {
        "custom_id": "a",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": job.served_model_name, "messages": [{"role": "user", "content": "hi"}]},
    }
    validated = validate_lines.fn(f"{json.dumps(good)}\nnot json\n".encode(), job, settings)
    assert [r.custom_id for r in validated.requests] == ["a"] and validated.total == 2
    assert [e.error.code for e in validated.errors if e.error] == ["invalid_json"]
