"""Enrichment jobs end to end on the real stack: typed columns, incremental runs, failed answers, schedule, S3."""

from __future__ import annotations

import asyncio
import io
import time
from pathlib import Path

import polars as pl
import pytest
import yaml

from pronk import storage
from pronk.enrich.table import CURRENT, read_current
from pronk.settings import PROJECT_ROOT

pytestmark = pytest.mark.e2e
ROWS = 6


def small_table() -> pl.DataFrame:
    return pl.read_csv(PROJECT_ROOT / "data" / "tables" / "companies.csv").head(ROWS)


def write_spec(folder: Path, table: str, results: str | None, **overrides) -> Path:
    spec = yaml.safe_load((PROJECT_ROOT / "deployments" / "enrichments" / "companies.yaml").read_text())
    spec.update({"table": table, "tools": ["search"], "max_steps": 2, "max_tokens": 64, "schedule": None})
    spec.update({"job": "tiny-cpu"})
    spec.update({"filter": None, **overrides})
    if results is not None:
        spec["results"] = results
    path = folder / f"{spec.get('name', 'companies')}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def enrich(spec: Path, limit: int | None = None) -> dict:
    from pronk.flows.enrich import enrich_table

    return asyncio.run(enrich_table(spec=str(spec), limit=limit))


def failed_rows(table: pl.DataFrame) -> int:
    return table.filter(pl.col("_error").is_not_null()).height


def assert_only_failed_rows_asked(run: dict, failed: int) -> None:
    """A run with no change skips every answered row and asks again only the `failed` ones, which the random model
    chose to fail; with none failed, no batch is made and no engine step runs."""
    assert (run["new"], run["changed"], run["retried"], run["skipped"]) == (0, 0, failed, ROWS - failed)
    if failed:
        assert run["steps"] >= failed and run["batch_id"] is not None
    else:
        assert run["steps"] == 0 and run["batch_id"] is None


@pytest.fixture(scope="module")
def local(stack, tmp_path_factory):
    folder = tmp_path_factory.mktemp("enrich")
    small_table().write_csv(folder / "companies.csv")
    return write_spec(folder, str(folder / "companies.csv"), str(folder / "results")), folder


@pytest.fixture(scope="module")
def first_run(local):
    spec, folder = local
    return enrich(spec), pl.read_parquet(folder / "results" / CURRENT)


def test_first_run_fills_the_columns_with_typed_values(first_run):
    run, table = first_run
    assert (run["rows"], run["new"], run["skipped"]) == (ROWS, ROWS, 0)
    assert run["steps"] >= ROWS and run["cost_usd"] > 0 and run["model_version"].startswith("pronk-tiny/")
    assert table.height == ROWS and table["company_id"].to_list() == list(range(1, ROWS + 1))
    # The shipped labels cover companies 1, 2, 3 and 5 of the first six: each of those answers was checked.
    assert run["checked"] == 4 and table.filter(pl.col("_check").is_in(["passed", "failed"])).height == 4
    assert table.schema["confidence"] == pl.Float64 and table.schema["sector"] == pl.String
    # How many rows the random model answers is its choice; every row is either answered or carries its error.
    answered = table.filter(pl.col("_error").is_null())
    assert answered.height == ROWS - run["failed"]
    assert answered["confidence"].is_between(0, 1).all() and answered["hq_country"].is_not_null().all()
    sectors = {"industrials", "consumer", "technology", "health", "energy", "financials", "services"}
    assert set(answered["sector"]) <= sectors


def test_a_second_run_with_no_change_asks_only_the_failed_rows(local, first_run):
    spec, folder = local
    assert_only_failed_rows_asked(enrich(spec), first_run[0]["failed"])
    history = [line for line in (folder / "results" / "history.jsonl").read_text().splitlines() if line]
    assert len(history) == 2 and len(list((folder / "results" / "versions").iterdir())) == 2


def test_changing_two_rows_re_enriches_exactly_those(local, first_run):
    spec, folder = local
    before = pl.read_parquet(folder / "results" / CURRENT)
    changed = small_table().with_columns(
        pl.when(pl.col("company_id").is_in([2, 5]))
        .then(pl.col("description") + " It also repairs what it sells.")
        .otherwise(pl.col("description"))
    )
    changed.write_csv(folder / "companies.csv")
    run = enrich(spec)
    assert run["changed"] == 2 and run["new"] == 0 and run["steps"] >= 2
    after = pl.read_parquet(folder / "results" / CURRENT)
    moved = after.join(before, on="company_id", suffix="_before").filter(pl.col("_run") != pl.col("_run_before"))
    retried = before.filter(pl.col("_error").is_not_null())["company_id"].to_list()
    assert sorted(moved["company_id"].to_list()) == sorted({2, 5, *retried})


def test_an_unparseable_answer_keeps_its_row_with_an_error(stack, tmp_path):
    small_table().write_csv(tmp_path / "companies.csv")
    # Eight tokens cannot hold the answer object: the answer is cut mid-JSON, whatever the model.
    spec = write_spec(tmp_path, str(tmp_path / "companies.csv"), str(tmp_path / "results"), tools=[], max_tokens=8)
    run = enrich(spec, limit=2)
    table = read_current(str(tmp_path / "results"), stack)
    assert table is not None and table.height == ROWS and run["failed"] == 2 and run["pending"] == ROWS - 2
    failed = table.filter(pl.col("_error").is_not_null())
    assert failed["company_id"].to_list() == [1, 2]
    assert failed["_error"].str.starts_with("unparseable answer").all()
    assert failed.select("sector", "hq_country", "summary", "confidence").null_count().row(0) == (2, 2, 2, 2)
    again = enrich(spec, limit=2)
    assert again["retried"] == 2 and again["new"] == 0


def test_the_deployment_is_scheduled_and_runs_on_a_table_on_s3(stack, tmp_path):
    """`pronk stack up` deployed the shipped spec with its cron; a run of it with parameters reads and writes S3."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        DeploymentFilter,
        DeploymentFilterId,
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )
    from prefect.deployments import run_deployment

    async def schedule():
        async with get_client() as client:
            deployment = await client.read_deployment_by_name("enrich-table/companies")
            return deployment, [s.schedule for s in deployment.schedules]

    async def scheduled_runs(deployment_id):
        async with get_client() as client:
            return await client.read_flow_runs(
                deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id])),
                flow_run_filter=FlowRunFilter(
                    state=FlowRunFilterState(type=FlowRunFilterStateType(any_=["SCHEDULED"]))
                ),
            )

    deployment, schedules = asyncio.run(schedule())
    assert deployment.parameters == {"spec": "deployments/enrichments/companies.yaml"}
    assert [(s.cron, s.timezone) for s in schedules] == [("0 2 * * *", "UTC")]
    # Prefect's scheduler service really makes the nightly runs (with SQLAlchemy 2.1 it failed on every insert).
    deadline = time.monotonic() + 120
    while not (runs := asyncio.run(scheduled_runs(deployment.id))) and time.monotonic() < deadline:
        time.sleep(2)
    assert runs and all(r.expected_start_time.hour == 2 for r in runs), runs

    table_uri = "s3://pronk-test/tables/companies.csv"
    buffer = io.BytesIO()
    small_table().write_csv(buffer)
    storage.write_bytes(table_uri, buffer.getvalue(), stack)
    spec = write_spec(tmp_path, table_uri, None, name="companies-s3")
    started = time.monotonic()
    # An idempotency key, as pronk's own DeploymentStarter sends: on a busy SQLite Prefect server the client's retry
    # of a create that had committed made a second run, which enriched 3 more rows.
    flow_run = run_deployment(
        "enrich-table/companies",
        parameters={"spec": str(spec), "limit": 3},
        timeout=240,
        poll_interval=2,
        idempotency_key=str(spec),
    )
    assert flow_run.state is not None and flow_run.state.is_completed(), flow_run.state
    results = storage.join(stack.store_uri, "enrichments", "companies-s3")
    table = read_current(results, stack)
    assert table is not None and table.height == ROWS
    assert table.filter(pl.col("_run").is_not_null()).height == 3 and time.monotonic() - started < 240
    # Rows the model failed are asked again before new ones, within the same limit.
    failed = failed_rows(table)
    rest = enrich(spec, limit=3)
    assert (rest["retried"], rest["new"], rest["pending"]) == (failed, 3 - failed, failed)
    if rest["pending"]:
        enrich(spec)
    failed = failed_rows(read_current(results, stack))
    assert_only_failed_rows_asked(enrich(spec), failed)


def test_the_run_page_shows_pronk_info_logs(local, first_run):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    from pronk.flows.enrich import enrich_table

    spec, _ = local
    state = asyncio.run(enrich_table(spec=str(spec), return_state=True))
    flow_run_id = state.state_details.flow_run_id

    async def messages():
        async with get_client() as client:
            logs = await client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])))
            return [log.message for log in logs]

    # The flow's own logger and pronk's (`pronk.tasks.enrich`) both reach the run page at INFO.
    wanted = ("enrichment companies: 6 rows;", "enrichment companies: read 6 rows")
    deadline = time.monotonic() + 60  # Prefect ships logs in batches; a loaded server records them late
    while True:
        found = asyncio.run(messages())
        if all(any(w in m for m in found) for w in wanted):
            break
        assert time.monotonic() < deadline, found
        time.sleep(1)


def test_a_killed_runs_flow_run_is_marked_crashed_within_a_minute_by_the_api_not_the_next_run(stack, tmp_path):
    """`pronk enrich run` SIGKILLed mid-run runs no hook; the stack's API (its reconcile loop) sees its process gone
    and marks its flow run Crashed, leaving its marker for the next run's takeover."""
    import os
    import signal
    import subprocess
    import sys

    from pronk.control.flow_runs import flow_run_state
    from pronk.enrich.open_run import read_open_run

    table = pl.concat([small_table().with_columns(pl.col("company_id") + 1000 * i) for i in range(80)])
    table.write_csv(tmp_path / "companies.csv")
    spec = write_spec(tmp_path, str(tmp_path / "companies.csv"), None, name="killed-run")
    results = storage.join(stack.store_uri, "enrichments", "killed-run")
    run = subprocess.Popen([str(Path(sys.executable).with_name("pronk")), "enrich", "run", str(spec)])
    try:
        deadline = time.monotonic() + 120
        while (marker := read_open_run(results, stack)) is None or marker.flow_run_id is None:
            assert run.poll() is None and time.monotonic() < deadline, "the run ended before it could be killed"
            time.sleep(0.1)
        os.kill(marker.pid, signal.SIGKILL)
        run.wait(30)
    finally:
        if run.poll() is None:
            run.kill()
    killed = time.monotonic()
    while (state := asyncio.run(flow_run_state(marker.flow_run_id))) != "CRASHED":
        assert time.monotonic() - killed < 60, f"flow run {marker.flow_run_id} still {state} a minute after the kill"
        time.sleep(1)
    assert read_open_run(results, stack) == marker
