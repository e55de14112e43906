"""The companies enrichment's labelled sets for the improve loop: shipped files that are what the generator makes,
valid lines for the spec's job, made-up rows that never name a company of the table."""

from __future__ import annotations

import json

import polars as pl

from pronk.batches.input import validate_input
from pronk.enrich.spec import load_spec
from pronk.enrich.table import read_labels, scan
from pronk.improve.enrichment_sets import LABELLED, SECTOR_OF, held_out_file, training_file
from pronk.jobs.catalog import resolve_job
from pronk.settings import get_settings


def test_the_shipped_sets_are_the_generators_valid_lines_with_checks_and_no_table_company_in_training():
    settings = get_settings()
    spec = load_spec("companies")
    job = resolve_job(spec.job, settings)
    table = scan(spec, settings).collect()
    training = training_file(spec, job, table, 96, 0)
    held_out = held_out_file(spec, job, table, settings)
    assert (LABELLED / "companies-train.jsonl").read_bytes() == training
    assert (LABELLED / "companies-held-out.jsonl").read_bytes() == held_out

    for data, lines in ((training, 96), (held_out, len(read_labels(spec, settings)))):
        validated = validate_input(data, job)
        assert validated.errors == [] and len(validated.requests) == lines
    sectors = spec.outputs["sector"].enum or []
    rows = [json.loads(line) for line in training.splitlines()]
    assert {row["check"]["fields"]["sector"] for row in rows} == set(SECTOR_OF.values()) <= set(sectors)
    prompts = " ".join(row["body"]["messages"][-1]["content"] for row in rows)
    assert not any(name in prompts for name in pl.Series(table["name"]).to_list())
