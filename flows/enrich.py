"""The enrich flow: keep a table's output columns filled by agents, asking only about new, changed or failed rows.

Scan and check the table, fingerprint each row's prompt inputs with the spec's template and output
schema, skip rows whose fingerprint the current version already answered, run the rest as agent lines
through the batch flow's code (`run_batch`, inside this flow run: one code path with batches), parse each answer into
typed columns (or nulls and `_error`), and write the table as a new version atomically, with its history.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

from prefect import flow, get_run_logger
from prefect.artifacts import acreate_markdown_artifact, acreate_table_artifact

from flows.batch import run_batch
from pronk import storage
from pronk.batches.run import end_batch
from pronk.enrich.history import EnrichRun, History
from pronk.enrich.lines import check_job
from pronk.enrich.spec import EnrichSpecError, load_spec
from pronk.enrich.table import merge, results_uri, write_version
from pronk.jobs import get_job
from pronk.protocol.ids import new_id
from pronk.settings import get_settings
from pronk.stack.prefect_env import show_pronk_logs
from tasks.enrich import BatchAnswers, plan_rows, read_answers, write_lines
from tasks.prefect_calls import best_effort

PREVIEW_ROWS = 20


@flow(name="enrich-table", log_prints=False)
async def enrich_table(spec: str, limit: int | None = None, batch_id: str | None = None) -> dict:
    """Fill a table's output columns with agents for the rows that are new or changed since the last run."""
    show_pronk_logs()
    logger = get_run_logger()
    settings = get_settings()
    started, started_at = time.monotonic(), _now()
    enrichment = load_spec(spec)
    try:
        job = get_job(enrichment.job)
    except KeyError as exc:
        raise EnrichSpecError(f"spec {enrichment.name}: job {enrichment.job!r}: {exc}") from exc
    problems = check_job(enrichment, job)
    if problems:
        raise EnrichSpecError(f"spec {enrichment.name}: " + "; ".join(problems))
    results = results_uri(enrichment, settings)
    plan = plan_rows(enrichment, results, settings, limit)
    logger.info(
        "enrichment %s: %d rows; %d new, %d changed, %d to retry, %d unchanged (skipped); asking %d",
        enrichment.name,
        plan.rows.height,
        plan.new,
        plan.changed,
        plan.retried,
        plan.skipped,
        len(plan.todo),
    )
    run_id = f"{datetime.now(UTC):%Y%m%dT%H%M%S}-{new_id('enrich')[-8:]}"
    outcome = BatchAnswers({}, 0, None)
    batch: dict = {}
    if plan.todo:
        batch_id = batch_id or new_id("batch")
        lines_uri = storage.join(results, "inputs", f"{run_id}.jsonl")
        write_lines(enrichment, job, plan.rows[plan.todo], plan.todo, lines_uri, settings)
        try:
            # The batch flow's own function inside this flow run: the same validation, chunk tasks, durable
            # parts, progress artifact and files as any batch, without a subflow's start-up (~1-2.5 s here).
            batch = await run_batch.fn(
                input_uri=lines_uri,
                job_id=job.job_id,
                output_dir=storage.join(results, "batches", run_id),
                batch_id=batch_id,
                metadata={"enrichment": enrichment.name, "enrich_run": run_id},
            )
        except BaseException as exc:  # as run_batch's failure hook does: the batch ends with what finished
            try:
                end_batch(batch_id, "failed", f"the enrich run raised: {type(exc).__name__}: {exc}")
            except Exception:  # the API's reconcile loop ends it later; keep the first error
                logger.exception("enrichment %s: ending batch %s failed", enrichment.name, batch_id)
            raise
        outcome = read_answers(enrichment, batch, plan.todo, settings)
    table = merge(enrichment, plan, outcome.answers, run_id, started_at)
    version = write_version(results, run_id, table, settings)
    failed = sum(1 for a in outcome.answers.values() if a.error is not None) + len(plan.todo) - len(outcome.answers)
    cost = float(batch.get("processing_cost") or 0.0)
    filled = len(plan.todo) - failed
    record = EnrichRun(
        run_id=run_id,
        spec=enrichment.name,
        started_at=started_at,
        finished_at=_now(),
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
        model_version=outcome.model_version,
        batch_id=batch.get("id"),
        version_uri=version,
        duration_s=round(time.monotonic() - started, 3),
    )
    History(results, settings).append(record)
    logger.info(
        "enrichment %s run %s: %d asked, %d failed, %d steps, cost %.6f USD; version %s",
        enrichment.name,
        run_id,
        len(plan.todo),
        failed,
        outcome.steps,
        cost,
        version,
    )
    await best_effort(
        "summary", acreate_markdown_artifact(markdown=summary_markdown(record), description="enrichment summary")
    )
    await best_effort(
        "preview",
        acreate_table_artifact(
            table=table.head(PREVIEW_ROWS).to_dicts(), description=f"{enrichment.name}: first {PREVIEW_ROWS} rows"
        ),
    )
    return record.model_dump(mode="json")


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def summary_markdown(run: EnrichRun) -> str:
    tpd = f"{run.tasks_per_dollar:,.0f}" if run.tasks_per_dollar is not None else "n/a"
    return "\n".join(
        [
            f"# Enrichment `{run.spec}`, run `{run.run_id}`",
            "",
            "| rows | new | changed | retried | skipped | failed | pending | engine steps | cost (USD) | tasks/$ |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
            f"| {run.rows} | {run.new} | {run.changed} | {run.retried} | {run.skipped} | {run.failed} | {run.pending} "
            f"| {run.steps} | {run.cost_usd:.6f} | {tpd} |",
            "",
            f"Model version `{run.model_version or 'n/a'}`, batch `{run.batch_id or 'none'}`, "
            f"version `{run.version_uri}`.",
        ]
    )
