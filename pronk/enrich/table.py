"""The input table read with polars (lazily, local or S3), checked against the spec, and the enriched table's versions.

The enriched table lives under the spec's results folder:

    <results>/current.parquet          the current version (what readers read)
    <results>/versions/<run>.parquet   every version, one per run
    <results>/history.jsonl            one line per run (`pronk.enrich.history`)

A run writes its version first, then replaces `current.parquet` in one atomic step (an S3 PUT, or a
local write beside it and a rename): a reader sees the old version or the new one, never half of one,
and a run killed before that step leaves the previous version current.
"""

from __future__ import annotations

import io
import logging
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from pronk import storage
from pronk.enrich.answers import Answer, output_schema
from pronk.enrich.fingerprint import row_fingerprint, spec_fingerprint
from pronk.enrich.spec import RESERVED_COLUMNS, EnrichSpec, EnrichSpecError, TableFormat, format_of
from pronk.settings import Settings

logger = logging.getLogger(__name__)

CURRENT = "current.parquet"


def results_uri(spec: EnrichSpec, settings: Settings) -> str:
    return spec.results or storage.join(settings.store_uri, "enrichments", spec.name)


def scan(spec: EnrichSpec, settings: Settings) -> pl.LazyFrame:
    """The table as a lazy frame: local files are scanned in place, S3 objects fetched through `pronk.storage`."""
    return scan_uri(spec.table_uri(), spec.table_format, settings)


def scan_uri(uri: str, fmt: TableFormat, settings: Settings) -> pl.LazyFrame:
    source: Any = uri
    if "://" in uri and not uri.startswith("file://"):
        source = io.BytesIO(storage.read_bytes(uri, settings))
    else:
        source = uri.removeprefix("file://")
    if fmt == "parquet":
        return pl.scan_parquet(source) if isinstance(source, str) else pl.read_parquet(source).lazy()
    if fmt == "csv":
        return pl.scan_csv(source) if isinstance(source, str) else pl.read_csv(source).lazy()
    return pl.scan_ndjson(source) if isinstance(source, str) else pl.read_ndjson(source).lazy()


def read_rows(spec: EnrichSpec, settings: Settings) -> pl.DataFrame:
    """The rows to enrich (after the filter), checked: the template's and key's columns exist, keys are unique.

    Every problem raises `EnrichSpecError` naming the table and what is wrong, before any engine step.
    """
    uri = spec.table_uri()
    try:
        frame = scan(spec, settings)
        columns = frame.collect_schema().names()
    except Exception as exc:  # polars and fsspec raise many kinds; all mean the same here
        raise EnrichSpecError(f"table {uri}: cannot read it as {spec.table_format}: {exc}") from exc
    reserved = [c for c in columns if c in RESERVED_COLUMNS or c in spec.outputs]
    if reserved:
        raise EnrichSpecError(
            f"table {uri}: columns {reserved} are output or reserved column names of spec {spec.name}"
        )
    for what, wanted in (("key", spec.key), ("prompt template", spec.template_columns)):
        missing = [c for c in wanted if c not in columns]
        if missing:
            raise EnrichSpecError(f"table {uri}: the {what} names columns {missing} it lacks (it has {columns})")
    try:
        if spec.filter:
            frame = pl.SQLContext(frames={"t": frame}).execute(f"SELECT * FROM t WHERE {spec.filter}")
        rows = frame.collect()
    except Exception as exc:  # a bad filter or an unreadable body: the run fails, nothing written
        raise EnrichSpecError(f"table {uri}: cannot read its rows (filter {spec.filter!r}): {exc}") from exc
    null_keys = rows.filter(pl.any_horizontal(pl.col(spec.key).is_null()))
    if null_keys.height:
        raise EnrichSpecError(f"table {uri}: {null_keys.height} rows have a null key {spec.key}")
    duplicated = rows.filter(rows.select(spec.key).is_duplicated())
    if duplicated.height:
        keys = duplicated.select(spec.key).unique(maintain_order=True).head(5).rows()
        raise EnrichSpecError(f"table {uri}: duplicate keys {spec.key}: {keys} appear more than once")
    return rows


Labels = dict[tuple, dict[str, Any]]
"""A labelled sample: a row's key → the expected values of some of its output columns."""


def read_labels(spec: EnrichSpec, settings: Settings) -> Labels:
    """The spec's labelled sample (empty without `labels`); `EnrichSpecError` names what does not fit the spec."""
    uri = spec.labels_uri()
    if uri is None:
        return {}
    try:
        frame = scan_uri(uri, format_of(uri), settings).collect()
    except Exception as exc:  # polars and fsspec raise many kinds; all mean the same here
        raise EnrichSpecError(f"labels {uri}: cannot read them: {exc}") from exc
    missing = [c for c in spec.key if c not in frame.columns]
    unknown = [c for c in frame.columns if c not in spec.key and c not in spec.outputs]
    if missing or unknown:
        raise EnrichSpecError(
            f"labels {uri}: a labels table has the key {spec.key} and output columns {list(spec.outputs)} only"
            f" (missing {missing}, unknown {unknown})"
        )
    labelled = [c for c in frame.columns if c in spec.outputs]
    return {
        key: {name: value for name, value in values.items() if value is not None}
        for key, values in zip(frame.select(spec.key).rows(), frame.select(labelled).to_dicts(), strict=True)
    }


@dataclass(slots=True)
class Plan:
    """Which rows this run asks the agent about, and how the others are counted."""

    rows: pl.DataFrame
    """The input rows with their `_fingerprint`."""
    todo: list[int]
    """Row indices to enrich now."""
    new: int
    changed: int
    skipped: int
    retried: int
    """Rows whose previous answer failed (their `_error` is set), asked again."""
    previous: pl.DataFrame | None
    labels: Labels = field(default_factory=dict)
    """The spec's labelled sample, read once when planning: the lines' checks and the answers' tally use it."""


def plan(
    spec: EnrichSpec,
    rows: pl.DataFrame,
    previous: pl.DataFrame | None,
    limit: int | None = None,
    labels: Labels | None = None,
) -> Plan:
    """Fingerprint every row and keep only those that are new, changed, or failed last time (up to `limit`)."""
    spec_part = spec_fingerprint(spec)
    inputs = rows.select(spec.template_columns).to_dicts()
    rows = rows.with_columns(pl.Series("_fingerprint", [row_fingerprint(spec_part, i) for i in inputs], pl.String))
    done: dict[tuple, tuple[str | None, str | None]] = {}
    if previous is not None:
        for key, fingerprint, error in zip(
            previous.select(spec.key).rows(), previous["_fingerprint"], previous["_error"], strict=True
        ):
            done[key] = (fingerprint, error)
    todo: list[int] = []
    new = changed = skipped = retried = 0
    for index, (key, fingerprint) in enumerate(zip(rows.select(spec.key).rows(), rows["_fingerprint"], strict=True)):
        seen = done.get(key)
        if seen is not None and seen[0] == fingerprint and seen[1] is None:
            skipped += 1
            continue
        if limit is not None and len(todo) >= limit:
            continue
        todo.append(index)
        if seen is None or seen[0] is None:
            new += 1
        elif seen[0] != fingerprint:
            changed += 1
        else:
            retried += 1
    return Plan(rows, todo, new, changed, skipped, retried, previous, labels or {})


def merge(spec: EnrichSpec, plan: Plan, answers: dict[int, Answer], run_id: str, at: str) -> pl.DataFrame:
    """The enriched table: every input row once, with this run's answers, the previous ones, or nulls.

    A row asked now takes its answer (or nulls and `_error`); a skipped row keeps its previous values; a
    row left for later (`--limit`) keeps what it had, with no fingerprint when it never had an answer.
    """
    dtypes = output_schema(spec)
    kept: dict[tuple, dict[str, Any]] = {}
    if plan.previous is not None:
        names = [n for n in (*spec.outputs, *RESERVED_COLUMNS) if n in plan.previous.columns]
        blank = dict.fromkeys((*spec.outputs, *RESERVED_COLUMNS))
        for key, values in zip(
            plan.previous.select(spec.key).rows(), plan.previous.select(names).to_dicts(), strict=True
        ):
            kept[key] = {**blank, **values}
    asked = set(plan.todo)
    records: list[dict[str, Any]] = []
    for index, key in enumerate(plan.rows.select(spec.key).rows()):
        if index in answers:
            answer = answers[index]
            record = {**answer.values, "_error": answer.error, "_check": answer.check}
            record.update(_enriched_at=at, _run=run_id)
            record["_fingerprint"] = plan.rows["_fingerprint"][index]
        elif index in asked:  # asked but no answer came back: retried next run
            record = {name: None for name in spec.outputs}
            record.update(
                _error="no answer",
                _check=None,
                _fingerprint=plan.rows["_fingerprint"][index],
                _enriched_at=at,
                _run=run_id,
            )
        elif key in kept:
            record = kept[key]
        else:
            record = {name: None for name in spec.outputs}
            record.update(_error=None, _check=None, _fingerprint=None, _enriched_at=None, _run=None)
        records.append(record)
    schema: dict[str, pl.DataType] = {**dtypes, **{name: pl.String() for name in RESERVED_COLUMNS}}
    added = pl.DataFrame(records, schema=schema, orient="row") if records else pl.DataFrame(schema=schema)
    inputs = plan.rows.drop("_fingerprint")
    return pl.concat([inputs, added.select(list(schema))], how="horizontal")


def read_current(results: str, settings: Settings) -> pl.DataFrame | None:
    uri = storage.join(results, CURRENT)
    if not storage.exists(uri, settings):
        return None
    return pl.read_parquet(io.BytesIO(storage.read_bytes(uri, settings)))


def write_version(results: str, run_id: str, table: pl.DataFrame, settings: Settings) -> str:
    """Write the run's version, then make it current in one atomic replace; return the version's URI."""
    buffer = io.BytesIO()
    table.write_parquet(buffer)
    data = buffer.getvalue()
    version = storage.join(results, "versions", f"{run_id}.parquet")
    storage.write_bytes(version, data, settings)
    storage.write_bytes(storage.join(results, CURRENT), data, settings)
    return version
