import pytest

from pronk.batches.input import BatchInputError, validate_input
from pronk.batches.schemas import ErrorCode
from pronk.jobs import get_job
from tests.conftest import DATA


@pytest.fixture
def job():
    return get_job("tiny-cpu")


def test_mixed_file_splits_into_requests_and_coded_errors(job):
    validated = validate_input((DATA / "mixed_batch.jsonl").read_bytes(), job)
    assert validated.total == 10
    assert [r.custom_id for r in validated.requests] == ["ok-1", "ok-2", "ok-3"]
    codes = {e.error.line: e.error.code for e in validated.errors}
    assert codes == {
        2: ErrorCode.INVALID_JSON,
        3: ErrorCode.MISSING_CUSTOM_ID,
        4: ErrorCode.DUPLICATE_CUSTOM_ID,
        5: ErrorCode.UNSUPPORTED_URL,
        6: ErrorCode.INVALID_BODY,
        7: ErrorCode.MODEL_MISMATCH,
        10: ErrorCode.INVALID_LINE,
    }
    assert all(e.error.message.startswith(f"line {e.error.line}:") for e in validated.errors)
    assert len(validated.requests) + len(validated.errors) == validated.total


def test_body_errors_carry_the_offending_values(job):
    validated = validate_input((DATA / "mixed_batch.jsonl").read_bytes(), job)
    bad_body = next(e for e in validated.errors if e.custom_id == "bad-body")
    assert "temperature" in bad_body.error.message and "9" in bad_body.error.message
    wrong_model = next(e for e in validated.errors if e.custom_id == "wrong-model")
    assert "'gpt-4o'" in wrong_model.error.message and "'pronk-tiny'" in wrong_model.error.message


def test_max_completion_tokens_wins_over_default(job):
    validated = validate_input((DATA / "mixed_batch.jsonl").read_bytes(), job)
    ok2 = next(r for r in validated.requests if r.custom_id == "ok-2")
    assert ok2.body.output_limit(job.default_max_tokens) == 24


@pytest.mark.parametrize("data", [b"", b"\n\n  \n", b"\xff\xfe\x00"])
def test_empty_or_binary_file_fails_the_batch(job, data):
    with pytest.raises(BatchInputError):
        validate_input(data, job)
