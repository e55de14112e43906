"""The enrich flow: keep a table's output columns filled by agents, asking only about new, changed or failed rows.

A recipe over `pronk.enrich.run`: check the spec and its job, plan the rows (fingerprints of each row's prompt
inputs; rows the current version already answered are skipped), run the rest as agent lines through the batch
flow's code (`run_batch`, inside this flow run: one code path with batches), read the answers back, and write the
table as a new version with its history.
"""

from __future__ import annotations

from prefect import flow, get_run_logger
from prefect.artifacts import acreate_markdown_artifact, acreate_table_artifact

from flows.batch import run_batch
from pronk import storage
from pronk.batches.run import end_batch
from pronk.control.calls import best_effort
from pronk.enrich import run as enrich_run
from pronk.enrich.history import summary_markdown
from pronk.enrich.table import results_uri
from pronk.protocol.ids import new_id
from pronk.settings import get_settings
from pronk.stack.prefect_env import show_pronk_logs
from tasks.enrich import plan_rows, read_answers

PREVIEW_ROWS = 20


@flow(name="enrich-table", log_prints=False)
async def enrich_table(spec: str, limit: int | None = None, batch_id: str | None = None) -> dict:
    """Fill a table's output columns with agents for the rows that are new or changed since the last run."""
    show_pronk_logs()
    logger = get_run_logger()
    settings = get_settings()
    enrichment, job = enrich_run.load_checked(spec)
    begun = enrich_run.start(results_uri(enrichment, settings))
    plan = plan_rows(enrichment, begun.results, settings, limit)
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
    outcome = enrich_run.BatchAnswers({}, 0, None)
    batch: dict = {}
    if plan.todo:
        batch_id = batch_id or new_id("batch")
        lines_uri = storage.join(begun.results, "inputs", f"{begun.run_id}.jsonl")
        enrich_run.write_lines(enrichment, job, plan.rows[plan.todo], plan.todo, lines_uri, settings)
        try:
            # The batch flow's own function inside this flow run: the same validation, chunk tasks, durable
            # parts, progress artifact and files as any batch, without a subflow's start-up (~1-2.5 s here).
            batch = await run_batch.fn(
                input_uri=lines_uri,
                job_id=job.job_id,
                output_dir=storage.join(begun.results, "batches", begun.run_id),
                batch_id=batch_id,
                metadata={"enrichment": enrichment.name, "enrich_run": begun.run_id},
            )
        except BaseException as exc:  # as run_batch's failure hook does: the batch ends with what finished
            try:
                end_batch(batch_id, "failed", f"the enrich run raised: {type(exc).__name__}: {exc}")
            except Exception:  # the API's reconcile loop ends it later; keep the first error
                logger.exception("enrichment %s: ending batch %s failed", enrichment.name, batch_id)
            raise
        outcome = read_answers(enrichment, batch, plan, settings)
    record, table = enrich_run.finish(enrichment, plan, outcome, batch, begun, settings)
    logger.info(
        "enrichment %s run %s: %d asked, %d failed, %d of %d labelled passed, %d steps, cost %.6f USD; version %s",
        enrichment.name,
        record.run_id,
        len(plan.todo),
        record.failed,
        record.passed,
        record.checked,
        record.steps,
        record.cost_usd,
        record.version_uri,
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
