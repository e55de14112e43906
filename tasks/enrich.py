"""Prefect tasks of the enrich flow: plan the rows, read the answers back."""

from __future__ import annotations

import logging

from prefect import task
from prefect.cache_policies import NO_CACHE

from pronk.enrich.run import BatchAnswers, batch_answers
from pronk.enrich.spec import EnrichSpec
from pronk.enrich.table import Plan, plan, read_current, read_labels, read_rows
from pronk.settings import Settings

logger = logging.getLogger(__name__)


@task(cache_policy=NO_CACHE)
def plan_rows(spec: EnrichSpec, results: str, settings: Settings, limit: int | None) -> Plan:
    """Read and check the table and the labelled sample, fingerprint the rows, and choose those to ask (nothing is
    written here)."""
    rows = read_rows(spec, settings)
    logger.info("enrichment %s: read %d rows of %s", spec.name, rows.height, spec.table)
    return plan(spec, rows, read_current(results, settings), limit, read_labels(spec, settings))


@task(cache_policy=NO_CACHE, retries=1, retry_delay_seconds=2)
def read_answers(spec: EnrichSpec, batch: dict, plan: Plan, settings: Settings) -> BatchAnswers:
    """Each asked row's answer from the batch's output and error files: typed values, or nulls and the reason."""
    return batch_answers(spec, batch, plan, settings)
