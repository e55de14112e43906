from pronk.cli.terminal import ANSWER_CHARS, answers_table


def output(custom_id: str, content: str, status: str | None) -> dict:
    body = {"choices": [{"message": {"content": content}}], "pronk": {"check": {"status": status}} if status else {}}
    return {"custom_id": custom_id, "response": {"body": body}}


def test_answers_show_one_row_per_line_by_custom_id_with_the_check_and_an_error_as_failed():
    lines = [
        output("b", "The capital\nof France is Paris.", "passed"),
        {"custom_id": "a", "error": {"code": "engine_error", "message": "line 1: worker lost"}},
        output("c", "x" * (ANSWER_CHARS + 50), None),
    ]
    rows = answers_table(lines, 3).splitlines()
    assert rows[0].split() == ["a", "failed", "error", "engine_error:", "line", "1:", "worker", "lost"]
    assert rows[1].split() == ["b", "passed", "The", "capital", "of", "France", "is", "Paris."]
    assert rows[2].split()[:2] == ["c", "unchecked"] and rows[2].endswith("x…")
    assert len(answers_table(lines, 2).splitlines()) == 2


def test_a_refusal_or_a_server_that_does_not_answer_is_one_line_and_anything_else_keeps_its_traceback():
    import httpx
    import pytest

    from pronk.cli.terminal import expected_failure
    from pronk.errors import PronkError

    assert expected_failure(PronkError("no job 'nope'")) == "no job 'nope'"
    request = httpx.Request("GET", "http://127.0.0.1:4977/api/deployments/name/run-batch/run-batch")
    with pytest.raises(RuntimeError) as prefects:
        try:
            raise httpx.ConnectError("All connection attempts failed", request=request)
        except httpx.ConnectError as exc:
            raise RuntimeError("Failed to reach API at http://127.0.0.1:4977/api/") from exc
    assert expected_failure(prefects.value) == (
        "cannot reach http://127.0.0.1:4977 (All connection attempts failed): is the stack up? "
        "`pronk stack up` starts it"
    )
    assert expected_failure(httpx.ConnectTimeout("")).startswith(
        "cannot reach a server this command needs (ConnectTimeout)"
    )
    assert expected_failure(RuntimeError("a bug")) is None
    with pytest.raises(AttributeError) as bug:
        try:
            raise httpx.ConnectError("All connection attempts failed", request=request)
        except httpx.ConnectError:
            raise AttributeError("a bug in the handler")  # noqa: B904 - the point: not caused by the error
    assert expected_failure(bug.value) is None
    assert expected_failure(KeyError("a bug")) is None
