"""One run of an enrichment, Prefect-free: the rows it asks as agent lines, the answers read back, and its record.

The enrich flow is the recipe over these (plan, write the lines, run them as a batch, read the answers, finish);
`finish` merges the answers into a new version of the table and appends the run to the enrichment's history.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from datetime import UTC, datetime

import polars as pl

from pronk import storage
from pronk.enrich.answers import Answer, AnswerParser
from pronk.enrich.history import EnrichRun, History
from pronk.enrich.lines import check_job, input_file
from pronk.enrich.spec import EnrichSpec, EnrichSpecError
from pronk.enrich.table import Plan, merge, write_version
from pronk.jobs.schema import JobConfig
from pronk.protocol.ids import new_id
from pronk.settings import Settings


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def new_run_id() -> str:
    """A run's id: its start time, then 8 random hex digits (sorts by time)."""
    return f"{datetime.now(UTC):%Y%m%dT%H%M%S}-{new_id('enrich')[-8:]}"


def check_fits(enrichment: EnrichSpec, job: JobConfig) -> None:
    """Refuse (`EnrichSpecError`, naming what is wrong) an enrichment its job (resolved by the caller from the spec's
    `job`) cannot run."""
    problems = check_job(enrichment, job)
    if problems:
        raise EnrichSpecError(f"spec {enrichment.name}: " + "; ".join(problems))


def custom_id(index: int) -> str:
    return f"row-{index}"


def lines_file(spec: EnrichSpec, job: JobConfig, plan: Plan) -> bytes:
    """The rows to ask as a batch input file, one agent line per row, named by the row's index; a row of the
    labelled sample carries a check of its expected values. The same rows make the same bytes."""
    todo = plan.rows[plan.todo]
    keys = todo.select(spec.key).rows()
    rows = [
        (custom_id(i), row, plan.labels.get(key)) for i, row, key in zip(plan.todo, todo.to_dicts(), keys, strict=True)
    ]
    return input_file(spec, job, rows)


@dataclass(slots=True)
class BatchAnswers:
    answers: dict[int, Answer]
    steps: int
    model_version: str | None
    labelled: int = 0
    """Asked rows of the labelled sample: each is a check, passed only by an answer with the expected values."""


def labelled_rows(spec: EnrichSpec, plan: Plan) -> set[int]:
    """The indices of the rows asked now that the labelled sample covers."""
    keys = plan.rows.select(spec.key).rows()
    return {i for i in plan.todo if keys[i] in plan.labels}


def batch_answers(spec: EnrichSpec, batch: dict, plan: Plan, settings: Settings) -> BatchAnswers:
    """Each asked row's answer from the batch's output and error files: typed values, or nulls and the reason, and
    how it checked against the row's labels (a labelled row whose line failed failed its check)."""
    labelled = labelled_rows(spec, plan)
    parser = AnswerParser(spec)
    wanted = {custom_id(i): i for i in plan.todo}
    answers: dict[int, Answer] = {}
    versions: list[str] = []
    for uri in (batch.get("output_uri"), batch.get("error_uri")):
        if not uri or not storage.exists(uri, settings):
            continue
        for raw in storage.read_bytes(uri, settings).splitlines():
            line = json.loads(raw)
            index = wanted.get(line.get("custom_id"))
            if index is None:
                continue
            if line.get("error"):
                answers[index] = parser.failed(f"{line['error']['code']}: {line['error']['message']}")
                answers[index].check = "failed" if index in labelled else "unchecked"
                continue
            body = line["response"]["body"]
            pronk_fields = body.get("pronk", {})
            versions.append(pronk_fields.get("model_version") or "")
            answers[index] = parser.parse(body["choices"][0]["message"]["content"])
            answers[index].check = pronk_fields.get("check", {}).get("status", "unchecked")
    steps = 0
    if batch.get("steps_uri") and storage.exists(batch["steps_uri"], settings):
        steps = pl.read_ndjson(storage.read_bytes(batch["steps_uri"], settings)).height
    model_version = max(set(versions), key=versions.count) if any(versions) else None
    return BatchAnswers(answers, steps, model_version, len(labelled))


@dataclass(slots=True)
class RunStart:
    """When and under which id a run started, and where the enrichment's results live."""

    run_id: str
    results: str
    started_at: str
    started: float


def start(results: str) -> RunStart:
    return RunStart(new_run_id(), results, now(), time.monotonic())


def finish(
    spec: EnrichSpec, plan: Plan, outcome: BatchAnswers, batch: dict, begun: RunStart, settings: Settings
) -> tuple[EnrichRun, pl.DataFrame]:
    """Merge the answers into a new version of the table, record the run in the history; the record and table."""
    table = merge(spec, plan, outcome.answers, begun.run_id, begun.started_at)
    version = write_version(begun.results, begun.run_id, table, settings)
    failed = sum(1 for a in outcome.answers.values() if a.error is not None) + len(plan.todo) - len(outcome.answers)
    cost = float(batch.get("processing_cost") or 0.0)
    filled = len(plan.todo) - failed
    passed = sum(1 for a in outcome.answers.values() if a.check == "passed")
    record = EnrichRun(
        run_id=begun.run_id,
        spec=spec.name,
        started_at=begun.started_at,
        finished_at=now(),
        rows=plan.rows.height,
        new=plan.new,
        changed=plan.changed,
        retried=plan.retried,
        skipped=plan.skipped,
        failed=failed,
        pending=plan.rows.height - plan.skipped - len(plan.todo),
        steps=outcome.steps,
        cost_usd=cost,
        tasks_per_dollar=filled / cost if cost > 0 else None,
        checked=outcome.labelled,
        passed=passed,
        model_version=outcome.model_version,
        batch_id=batch.get("id"),
        version_uri=version,
        duration_s=round(time.monotonic() - begun.started, 3),
    )
    History(begun.results, settings).append(record)
    return record, table
