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
    from pronk.pronk_error import PronkError

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


def test_improve_progress_reads_the_round_begun_since_the_command_started_and_then_its_own_canary(tmp_path):
    import time

    from pronk.batches.schemas import LinesChecked
    from pronk.cli.terminal import improve_reading
    from pronk.improve.rounds import ImproveRound, RoundStore
    from pronk.leap.records import CanaryRecord, LeapRecord, LeapStore
    from pronk.settings import Settings

    settings = Settings(data_dir=tmp_path, storage_uri=str(tmp_path / "store"))
    rounds, leaps = RoundStore(settings), LeapStore(settings)
    job = "job-5a011201"
    earlier = ImproveRound(job_id=job, round=1, model="m", parent_version="m/1", started_at=time.time() - 60)
    rounds.save(earlier)
    read = improve_reading(job, time.time() - 1, settings)
    assert read() is None  # no round of this command yet: an earlier run's round is not shown

    record = ImproveRound(job_id=job, round=1, model="m", parent_version="m/2")
    record.progress.rollouts = LinesChecked(total=96, done=40)
    rounds.save(record)
    assert read() == ("round 1: rollouts checked", 40, 96)

    record.status, record.version = "leaping", "m/3"
    rounds.save(record)
    canary = CanaryRecord(worker_id="w0", labelled_set="s", lines=32, baseline_workers=["w1"])
    canary.checked = LinesChecked(total=64, done=12)
    leaps.save(LeapRecord(job_id=job, model="m", to_version="m/2", canary=canary))  # another Leap's canary
    assert read() == ("round 1: leaping", 0, None)
    leaps.save(LeapRecord(job_id=job, model="m", to_version="m/3", canary=canary))
    assert read() == ("round 1: canary lines checked", 12, 64)
