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
