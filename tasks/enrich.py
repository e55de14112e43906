"""Steps of the enrich flow: plan the rows, hand them to the batch flow as agent lines, read the answers back."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

import polars as pl
from prefect import task
from prefect.cache_policies import NO_CACHE

from pronk import storage
from pronk.enrich.answers import Answer, AnswerParser
from pronk.enrich.lines import input_file
from pronk.enrich.spec import EnrichSpec
from pronk.enrich.table import Plan, plan, read_current, read_rows
from pronk.jobs import JobConfig
from pronk.settings import Settings

logger = logging.getLogger(__name__)


@task(cache_policy=NO_CACHE)
def plan_rows(spec: EnrichSpec, results: str, settings: Settings, limit: int | None) -> Plan:
    """Read and check the table, fingerprint its rows, and choose those to ask (nothing is written here)."""
    rows = read_rows(spec, settings)
    logger.info("enrichment %s: read %d rows of %s", spec.name, rows.height, spec.table)
    return plan(spec, rows, read_current(results, settings), limit)


def custom_id(index: int) -> str:
    return f"row-{index}"


def write_lines(spec: EnrichSpec, job: JobConfig, todo: pl.DataFrame, indices: list[int], uri: str, settings) -> None:
    """The rows to ask as a batch input file, one agent line per row, named by the row's index."""
    rows = todo.to_dicts()
    storage.write_bytes(uri, input_file(spec, job, [(custom_id(i), r) for i, r in zip(indices, rows)]), settings)


@dataclass(slots=True)
class BatchAnswers:
    answers: dict[int, Answer]
    steps: int
    model_version: str | None


@task(cache_policy=NO_CACHE, retries=1, retry_delay_seconds=2)
def read_answers(spec: EnrichSpec, batch: dict, indices: list[int], settings: Settings) -> BatchAnswers:
    """Each asked row's answer from the batch's output and error files: typed values, or nulls and the reason."""
    parser = AnswerParser(spec)
    wanted = {custom_id(i): i for i in indices}
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
                continue
            body = line["response"]["body"]
            versions.append(body.get("pronk", {}).get("model_version") or "")
            answers[index] = parser.parse(body["choices"][0]["message"]["content"])
    steps = 0
    if batch.get("steps_uri") and storage.exists(batch["steps_uri"], settings):
        steps = pl.read_ndjson(storage.read_bytes(batch["steps_uri"], settings)).height
    model_version = max(set(versions), key=versions.count) if any(versions) else None
    return BatchAnswers(answers, steps, model_version)
