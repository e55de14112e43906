import asyncio
import json

import pytest

from pronk.agents.outcomes import Completion, LineFailure, RequestOutcome, Usage
from pronk.batches.labelled import LabelledSetError, compare_success, labelled_lines, run_labelled
from pronk.batches.schemas import CheckCounts
from pronk.jobs.catalog import resolve_job
from pronk.settings import get_settings


def _line(custom_id: str, check: dict | None, model: str = "some-other-model") -> str:
    line = {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": model, "messages": [{"role": "user", "content": "What is 2 + 2?"}]},
    }
    if check is not None:
        line["check"] = check
    return json.dumps(line)


def _job_with_set(tmp_path, lines: list[str]):
    path = tmp_path / "labelled.jsonl"
    path.write_text("\n".join(lines) + "\n")
    job = resolve_job("tiny-cpu", get_settings())
    return job.model_copy(update={"quality": job.quality.model_copy(update={"labelled_set": str(path)})})


def test_a_labelled_set_is_addressed_to_the_job_whatever_model_its_lines_name(tmp_path):
    job = _job_with_set(
        tmp_path, [_line("a", {"type": "number", "expected": 4}), _line("b", {"type": "exact", "expected": "4"})]
    )
    lines = labelled_lines(job, get_settings())
    assert [r.custom_id for r in lines] == ["a", "b"]
    assert {r.body.model for r in lines} == {job.served_model_name}


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        ([_line("a", {"type": "number", "expected": 4}), _line("b", None)], "line 'b' carries no check"),
        ([_line("a", {"type": "number", "expected": 4}), "{not json"], "line 2: "),
        ([_line("a", {"type": "regex", "pattern": "("})], "line 1: "),
    ],
)
def test_a_labelled_set_with_an_unchecked_or_invalid_line_is_refused_naming_it(tmp_path, lines, message):
    with pytest.raises(LabelledSetError, match=message):
        labelled_lines(_job_with_set(tmp_path, lines), get_settings())


def test_a_job_without_a_labelled_set_or_with_a_missing_file_is_refused(tmp_path):
    with pytest.raises(LabelledSetError, match=r"no quality\.labelled_set"):
        labelled_lines(resolve_job("tiny-cpu", get_settings()), get_settings())
    job = _job_with_set(tmp_path, [_line("a", {"type": "number", "expected": 4})])
    (tmp_path / "labelled.jsonl").unlink()
    with pytest.raises(LabelledSetError, match="cannot read"):
        labelled_lines(job, get_settings())


class _Recorder:
    def __init__(self):
        self.taken: list[str] = []

    def take_line(self, custom_id: str) -> list:
        self.taken.append(custom_id)
        return []


class _Harness:
    """Answers each line with a fixed text (None: the line fails), as a harness over some workers would."""

    def __init__(self, job, answers: dict[str, str | None]):
        self.job = job
        self.answers = answers
        self.recorder = _Recorder()
        self.transcripts = None

    async def run_line(self, request):
        text = self.answers[request.custom_id]
        if text is None:
            return RequestOutcome(request.line, request.custom_id, LineFailure("engine_error", "worker lost"))
        completion = Completion("agent", "r", "m", "1", "w", Usage(1, 0, 1), text=text)
        return RequestOutcome(request.line, request.custom_id, completion)


def test_a_labelled_run_tallies_checks_and_counts_a_line_that_failed_to_run_as_failed(tmp_path):
    job = _job_with_set(
        tmp_path,
        [
            _line("right", {"type": "number", "expected": 4}),
            _line("wrong", {"type": "number", "expected": 4}),
            _line("lost", {"type": "number", "expected": 4}),
        ],
    )
    harness = _Harness(job, {"right": "It is 4.", "wrong": "It is 5.", "lost": None})
    tally = asyncio.run(run_labelled(labelled_lines(job, get_settings()), harness))
    assert tally == CheckCounts(passed=1, failed=2)
    assert sorted(harness.recorder.taken) == ["lost", "right", "wrong"]


@pytest.mark.parametrize(
    ("current", "candidate", "worse"),
    [
        (CheckCounts(passed=12, failed=8), CheckCounts(passed=10, failed=10), False),  # 60% → 50%: noise at n=20
        (CheckCounts(passed=16, failed=4), CheckCounts(passed=4, failed=16), True),
        (CheckCounts(passed=20), CheckCounts(passed=0, failed=20), True),
        (CheckCounts(passed=5, failed=15), CheckCounts(passed=15, failed=5), False),  # better is never worse
        (CheckCounts(failed=20), CheckCounts(failed=20), False),
        (CheckCounts(unchecked=20), CheckCounts(failed=20), False),  # nothing checked on one side
        (CheckCounts(passed=600, failed=400), CheckCounts(passed=540, failed=460), True),  # 6 points at n=1000
    ],
)
def test_a_candidate_is_worse_only_when_its_success_rate_falls_beyond_noise(current, candidate, worse):
    verdict = compare_success(current, candidate)
    assert verdict.worse is worse
    assert ("beyond noise" in verdict.reason) is worse
