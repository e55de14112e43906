"""A job's labelled set (`quality.labelled_set`): batch lines that each carry a `check`, run on chosen workers to
measure a success rate, and the rule that says whether one configuration or model version answers worse than
another beyond noise.

The Herd's tuner (a candidate configuration against the job's current one) and Leap's canary (a new version on one
worker against the fleet's current version) both judge by `compare_success`, so both refuse on the same rule.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from dataclasses import dataclass, field

from pronk import storage
from pronk.agents.checks import run_check
from pronk.agents.harness import Harness
from pronk.agents.outcomes import Completion, RequestOutcome
from pronk.agents.step_records import StepRecord
from pronk.agents.tools import project_path
from pronk.agents.tools.python_exec import PythonTool
from pronk.agents.transcripts import Transcript
from pronk.batches.in_flight import InFlight
from pronk.batches.input import validate_input
from pronk.batches.schemas import CheckCounts, LinesChecked
from pronk.engine.registry import WorkerEntry
from pronk.jobs.schema import JobConfig
from pronk.pronk_error import PronkError
from pronk.protocol.checks import CheckResult, PythonCheck
from pronk.protocol.lines import ValidRequest
from pronk.settings import Settings

ONE_SIDED_Z = 1.645
"""A candidate is worse when its success rate is below the current one's at 95% one-sided confidence."""


class LabelledSetError(PronkError, ValueError):
    """The job's labelled set cannot be read, or a line of it is invalid or carries no check."""


@dataclass(frozen=True, slots=True)
class QualityVerdict:
    worse: bool
    reason: str
    current: CheckCounts
    candidate: CheckCounts


def compare_success(current: CheckCounts, candidate: CheckCounts, z: float = ONE_SIDED_Z) -> QualityVerdict:
    """Whether `candidate` passes fewer checks than `current` beyond noise: a one-sided two-proportion z-test.

    A small labelled set is noisy (20 lines at 60% move by ±11 points run to run), so a drop counts only when it is
    larger than `z` standard errors of the difference under the pooled rate.
    """
    if not current.checked or not candidate.checked:
        return QualityVerdict(False, "no line was checked: nothing to judge by", current, candidate)
    drop = (current.success_rate or 0.0) - (candidate.success_rate or 0.0)
    pooled = (current.passed + candidate.passed) / (current.checked + candidate.checked)
    error = math.sqrt(pooled * (1 - pooled) * (1 / current.checked + 1 / candidate.checked))
    both = f"{candidate.describe()} against {current.describe()}"
    if drop > 0 and (error == 0 or drop > z * error):
        return QualityVerdict(True, f"success rate fell beyond noise: {both}", current, candidate)
    return QualityVerdict(False, f"success rate holds within noise: {both}", current, candidate)


def _addressed_to(data: bytes, job: JobConfig) -> bytes:
    """The set's lines with `body.model` set to the job's model, so one set serves every job; a line that is not a
    JSON object with a body is left as it is for validation to name."""
    lines = []
    for raw in data.splitlines():
        try:
            value = json.loads(raw)
        except ValueError:
            lines.append(raw)
            continue
        if isinstance(value, dict) and isinstance(value.get("body"), dict):
            value["body"]["model"] = job.served_model_name
            raw = json.dumps(value).encode()
        lines.append(raw)
    return b"\n".join(lines)


def read_labelled_set(uri: str, settings: Settings) -> bytes:
    """A labelled set's bytes: `uri` is a path relative to the project root, or s3://…; LabelledSetError when it
    cannot be read."""
    source = uri if "://" in uri else str(project_path(uri))
    try:
        return storage.read_bytes(source, settings)
    except OSError as exc:
        raise LabelledSetError(f"cannot read the labelled set {uri}: {exc}") from exc


def labelled_lines(job: JobConfig, settings: Settings, uri: str | None = None) -> list[ValidRequest]:
    """A labelled set (default: the job's held-out `quality.labelled_set`), validated for the job; LabelledSetError
    names the first bad line."""
    uri = uri or job.quality.labelled_set
    if uri is None:
        raise LabelledSetError(f"job {job.job_id} has no quality.labelled_set")
    return labelled_requests(read_labelled_set(uri, settings), job, uri)


def labelled_requests(data: bytes, job: JobConfig, uri: str) -> list[ValidRequest]:
    """The lines of the labelled set `uri` (its bytes `data`, read by the caller), validated for the job."""
    validated = validate_input(_addressed_to(data, job), job)
    if validated.errors:
        first = validated.errors[0].error
        raise LabelledSetError(f"labelled set {uri}: {first.message if first else 'an invalid line'}")
    unchecked = [r.custom_id for r in validated.requests if r.check is None]
    if unchecked:
        raise LabelledSetError(f"labelled set {uri}: line {unchecked[0]!r} carries no check")
    return validated.requests


@dataclass(frozen=True, slots=True)
class CheckedLine:
    """One labelled line run through the harness: its outcome, its check's verdict, its step records (every attempt
    of its trace family), when it finished (time.monotonic) and, if the harness keeps them, its traces'
    transcripts (the root's last)."""

    request: ValidRequest
    outcome: RequestOutcome
    check: CheckResult
    records: list[StepRecord]
    finished_at: float
    transcripts: list[Transcript] = field(default_factory=list)


async def check_lines(
    lines: list[ValidRequest], harness: Harness, progress: LinesChecked | None = None
) -> list[CheckedLine]:
    """Run every line through `harness` (whose router picks the workers measured), within the job's lines in flight
    (`max_concurrency`, or the adaptive target: `pronk.batches.in_flight`), and check each answer; `progress` counts
    the lines given and those checked, as they are."""
    if progress is not None:
        progress.total += len(lines)
    predicates = any(isinstance(r.check, PythonCheck) for r in lines)
    python = PythonTool(harness.job.tools.python, harness.sandbox_bwrap) if predicates else None
    in_flight = InFlight(harness.job)

    def live_workers() -> list[WorkerEntry]:
        return harness.router.workers()

    async def one(request: ValidRequest) -> CheckedLine:
        async with in_flight.slots:
            outcome = await harness.run_line(request)
            finished_at = time.monotonic()
            records = harness.recorder.take_line(request.custom_id)
            in_flight.observe(records, live_workers)
        transcripts = [] if harness.transcripts is None else harness.transcripts.take_line(request.custom_id)
        answer = outcome.result.text if isinstance(outcome.result, Completion) else None
        check = await run_check(request.check, answer, python)
        if progress is not None:
            progress.done += 1
        return CheckedLine(request, outcome, check, records, finished_at, transcripts)

    in_flight.retarget(live_workers)
    return list(await asyncio.gather(*(one(r) for r in lines)))


def tally(checked: list[CheckedLine]) -> CheckCounts:
    statuses = [line.check.status for line in checked]
    return CheckCounts(
        passed=statuses.count("passed"), failed=statuses.count("failed"), unchecked=statuses.count("unchecked")
    )


async def run_labelled(
    lines: list[ValidRequest], harness: Harness, progress: LinesChecked | None = None
) -> CheckCounts:
    """Run every line through `harness` (whose router picks the workers measured) and tally the checks."""
    return tally(await check_lines(lines, harness, progress))
