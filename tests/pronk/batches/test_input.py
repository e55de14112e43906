import json

import pytest

from pronk.batches.input import BatchInputError, InputLimits, is_blank, validate_input
from pronk.batches.prompt_length import PromptLength
from pronk.jobs.catalog import resolve_job
from pronk.protocol.error_codes import ErrorCode
from pronk.settings import get_settings
from tests.conftest import DATA


@pytest.fixture
def job():
    return resolve_job("tiny-cpu", get_settings())


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


@pytest.mark.parametrize("data", [b"", b"\n\n  \n"])
def test_empty_file_fails_the_batch(job, data):
    assert is_blank([data[:1], data[1:]])
    with pytest.raises(BatchInputError):
        validate_input(data, job)


def test_a_file_with_one_request_line_in_any_piece_is_not_blank():
    assert not is_blank([b"\n \n", b"  ", b"{}", b"\n"]) and not is_blank([b"\r\n x"])


def chat_line(custom_id: str, content: str = "hi", **body) -> dict:
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": "pronk-tiny", "messages": [{"role": "user", "content": content}], **body},
    }


def jsonl(*lines: dict | bytes) -> bytes:
    return b"\n".join(line if isinstance(line, bytes) else json.dumps(line).encode() for line in lines) + b"\n"


def codes(validated) -> dict[int, str]:
    return {e.error.line: e.error.code for e in validated.errors}


def test_a_bad_byte_fails_its_line_only(job):
    bad = json.dumps(chat_line("bad")).encode().replace(b'"hi"', b'"h\xffi"')
    validated = validate_input(jsonl(chat_line("a"), bad, chat_line("b")), job)
    assert [r.custom_id for r in validated.requests] == ["a", "b"]
    assert codes(validated) == {2: ErrorCode.INVALID_JSON} and "0xff" in validated.errors[0].error.message


def test_a_binary_file_is_error_lines_not_a_crash(job):
    validated = validate_input(b"\xff\xfe\x00", job)
    assert validated.total == 1 and codes(validated) == {1: ErrorCode.INVALID_JSON}


@pytest.mark.parametrize("digits", [65, 5000, 100_000])
def test_a_huge_integer_fails_its_line_only(job, digits):
    huge = json.dumps(chat_line("huge")).encode().replace(b'"body"', b'"n": ' + b"9" * digits + b', "body"')
    validated = validate_input(jsonl(chat_line("a"), huge, chat_line("b")), job)
    assert [r.custom_id for r in validated.requests] == ["a", "b"]
    assert codes(validated) == {2: ErrorCode.INVALID_JSON} and f"{digits} digits" in validated.errors[0].error.message


def test_deep_nesting_fails_its_line_only(job):
    deep = b"[" * 200_000 + b"]" * 200_000
    validated = validate_input(jsonl(chat_line("a"), deep, chat_line("b")), job)
    assert [r.custom_id for r in validated.requests] == ["a", "b"]
    assert codes(validated) == {2: ErrorCode.INVALID_JSON}


@pytest.mark.parametrize("separator", ["\u2028", "\u0085", "\r", "\x0b", "\x1c"])
def test_only_newline_splits_lines(job, separator):
    lines = [chat_line(f"c{i}", f"one{separator}two") for i in range(3)]
    data = b"\n".join(json.dumps(line, ensure_ascii=False).encode() for line in lines)
    data = data.replace(b'"messages"', separator.encode() + b'"messages"') if separator == "\r" else data
    validated = validate_input(data, job)
    assert validated.total == 3 and len(validated.requests) == 3, codes(validated)
    assert validated.requests[0].body.messages[0].content == f"one{separator}two"


def test_a_line_over_the_byte_cap_is_refused_before_parsing(job):
    limits = InputLimits(max_line_bytes=2048)
    validated = validate_input(jsonl(chat_line("a"), chat_line("big", "x" * 5000), chat_line("b")), job, limits)
    assert [r.custom_id for r in validated.requests] == ["a", "b"]
    assert codes(validated) == {2: ErrorCode.LINE_TOO_LARGE}
    assert (
        "limit is 2048" in validated.errors[0].error.message
        and "PRONK_MAX_LINE_BYTES" in validated.errors[0].error.message
    )


@pytest.mark.parametrize("value", ["32", True, 32.0, 0, -1, 1_000_000_000])
@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_output_limits_are_strict_integers_within_the_jobs_cap(job, field, value):
    validated = validate_input(jsonl(chat_line("x", **{field: value})), job)
    assert codes(validated) == {1: ErrorCode.INVALID_BODY}
    assert field in validated.errors[0].error.message


def test_the_output_cap_is_max_model_len_minus_one_unless_the_job_sets_one(job):
    cap = job.engine.max_model_len - 1
    assert len(validate_input(jsonl(chat_line("x", max_tokens=cap)), job).requests) == 1
    assert len(validate_input(jsonl(chat_line("x", max_tokens=cap + 1)), job).errors) == 1
    small = job.model_copy(update={"max_output_tokens": 10})
    assert codes(validate_input(jsonl(chat_line("x", max_tokens=11)), small)) == {1: ErrorCode.INVALID_BODY}


class Tokenizer:
    """A stand-in byte tokenizer: one token per byte, a template of two tokens per message."""

    def __init__(self):
        self.loaded = 0

    def apply_chat_template(self, messages, add_generation_prompt, tokenize):
        return "".join(f"<{m['content']}>" for m in messages)

    def encode(self, text, add_special_tokens):
        return list(text.encode())

    def get_vocab(self):
        return {"<": 0, ">": 1, "x": 2, "xxxx": 3}


def test_a_prompt_beyond_max_model_len_is_rejected_without_a_worker(job):
    tokenizer = Tokenizer()
    loads = []
    counter = PromptLength(job, lambda: loads.append(1) or tokenizer)
    limit = job.engine.max_model_len
    data = jsonl(chat_line("short"), chat_line("fits", "x" * (limit - 3)), chat_line("long", "x" * limit))
    validated = validate_input(data, job, InputLimits(prompt_tokens=counter))
    assert [r.custom_id for r in validated.requests] == ["short", "fits"]
    assert codes(validated) == {3: ErrorCode.REQUEST_REJECTED}
    assert f"{limit + 2} tokens" in validated.errors[0].error.message
    assert loads == [1] and counter.tokenized == 2  # the short line was never tokenized


def test_a_prompt_longer_than_the_longest_tokens_allow_is_rejected_without_tokenizing(job):
    counter = PromptLength(job, Tokenizer)
    limit = job.engine.max_model_len
    validated = validate_input(jsonl(chat_line("huge", "x" * 4 * limit)), job, InputLimits(prompt_tokens=counter))
    assert codes(validated) == {1: ErrorCode.REQUEST_REJECTED} and counter.tokenized == 0
    assert f"at least {limit} tokens" in validated.errors[0].error.message


def test_a_replay_shape_whose_longest_step_passes_max_model_len_is_rejected_without_a_worker(job):
    limit = job.engine.max_model_len

    def replay_line(custom_id: str, shape: dict) -> dict:
        body = {"model": job.served_model_name, "shape": {"trace_id": custom_id, **shape}}
        return {"custom_id": custom_id, "method": "POST", "url": "/v1/pronk/replay", "body": body}

    def step(new: int, out: int = 4, fan_out: tuple = ()) -> dict:
        return {"new_prompt_tokens": new, "output_tokens": out, "fan_out": list(fan_out)}

    fits = {"system_prompt_tokens": limit - 20, "steps": [step(5), step(5)]}  # last prompt: limit - 6
    last_step = {"system_prompt_tokens": limit - 20, "steps": [step(5), step(5), step(2, out=1)]}  # limit
    child = {"trace_id": "child", "system_prompt_tokens": 10, "steps": [step(1)]}
    in_a_child = {"system_prompt_tokens": limit - 20, "steps": [step(5, fan_out=(child,))]}  # limit - 20 + 9 + 11
    data = jsonl(replay_line("fits", fits), replay_line("last-step", last_step), replay_line("in-a-child", in_a_child))
    validated = validate_input(data, job)
    assert [r.custom_id for r in validated.requests] == ["fits"]
    assert codes(validated) == {2: ErrorCode.REQUEST_REJECTED, 3: ErrorCode.REQUEST_REJECTED}
    assert f"a {limit}-token prompt" in validated.errors[0].error.message


def test_without_a_tokenizer_long_prompts_are_left_to_the_worker(job):
    def broken():
        raise OSError("no model")

    counter = PromptLength(job, broken)
    validated = validate_input(jsonl(chat_line("long", "x" * 10_000)), job, InputLimits(prompt_tokens=counter))
    assert len(validated.requests) == 1 and counter.tokenized == 0


def test_an_unexpected_exception_becomes_that_lines_error_line(job):
    def explode(body):
        raise RuntimeError("boom")

    validated = validate_input(jsonl(chat_line("a"), chat_line("b")), job, InputLimits(prompt_tokens=explode))
    assert validated.total == 2 and codes(validated) == {1: ErrorCode.INVALID_LINE, 2: ErrorCode.INVALID_LINE}
    assert "RuntimeError" in validated.errors[0].error.message
