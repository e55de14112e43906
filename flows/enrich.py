"""The enrich flow: keep a table's output columns filled by agents, asking only about new, changed or failed rows.

A recipe over `pronk.enrich.run`: check the spec and its job, plan the rows (fingerprints of each row's prompt
inputs; rows the current version already answered are skipped), run the rest as agent lines through the batch's
steps (`pronk.tasks.batch.run_opened_batch`, inside this flow run: one code path with batches), read the answers
back, and write the table as a new version with its history. While it asks rows, the run keeps an open-run marker
(`pronk.enrich.open_run`): a run after a crash marks the dead run's flow run crashed and runs on under its batch when
it asks the same lines.
"""

from __future__ import annotations

import polars as pl
from prefect import flow, get_run_logger, runtime
from prefect.artifacts import acreate_markdown_artifact, acreate_table_artifact

from pronk import storage
from pronk.batches.run import end_batch, open_batch
from pronk.batches.store import BatchStore
from pronk.control import flow_runs
from pronk.control.calls import best_effort
from pronk.control.dead_runs import record_process
from pronk.enrich import open_run
from pronk.enrich import run as enrich_run
from pronk.enrich.history import EnrichRun, summary_markdown
from pronk.enrich.spec import EnrichSpec, EnrichSpecError, load_spec
from pronk.enrich.table import results_uri
from pronk.jobs.catalog import UnknownJob, resolve_job
from pronk.jobs.schema import JobConfig
from pronk.protocol.ids import new_id
from pronk.settings import Settings, get_settings
from pronk.stack.prefect_env import show_pronk_logs
from pronk.tasks.batch import run_opened_batch
from pronk.tasks.enrich import plan_rows, read_answers

PREVIEW_ROWS = 20


@flow(name="enrich-table", log_prints=False, on_running=[record_process])
async def enrich_table(spec: str, limit: int | None = None, batch_id: str | None = None) -> dict:
    """Fill a table's output columns with agents for the rows that are new or changed since the last run."""
    show_pronk_logs()
    logger = get_run_logger()
    settings = get_settings()
    enrichment = load_spec(spec)
    try:
        job = resolve_job(enrichment.job, settings)
    except UnknownJob as exc:
        raise EnrichSpecError(f"spec {enrichment.name}: job {enrichment.job!r}: {exc}") from exc
    enrich_run.check_fits(enrichment, job)
    results = results_uri(enrichment, settings)
    flow_run_id = str(runtime.flow_run.id) if runtime.flow_run.id else None
    # A run that died without ending (SIGKILL, OOM) left its marker: refuse while it lives, else take over its work.
    earlier = await open_run.check_earlier(
        enrichment.name, results, settings, flow_run_id, flow_runs.flow_run_state, flow_runs.mark_crashed
    )
    if earlier is not None:
        logger.warning("enrichment %s: an earlier run ended without finishing: %s", enrichment.name, earlier.describe())
    begun = enrich_run.start(results)
    try:
        record, table = await _run(enrichment, job, begun, earlier, flow_run_id, settings, limit, batch_id)
    finally:  # a run that ends, well or not, closes its marker; only a killed process leaves it
        open_run.close(results, begun.run_id, settings)
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


async def _run(
    enrichment: EnrichSpec,
    job: JobConfig,
    begun: enrich_run.RunStart,
    earlier: open_run.OpenRun | None,
    flow_run_id: str | None,
    settings: Settings,
    limit: int | None,
    batch_id: str | None,
) -> tuple[EnrichRun, pl.DataFrame]:
    logger = get_run_logger()
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
    lines = enrich_run.lines_file(enrichment, job, plan) if plan.todo else None
    if earlier is not None:
        takeover = open_run.take_over(earlier, lines, job, settings)
        logger.warning("enrichment %s: %s", enrichment.name, takeover.why)
        if takeover.batch_id is not None:
            batch_id = takeover.batch_id  # its persisted lines are not asked again (`BatchRun.resume`)
        else:
            open_run.close(begun.results, earlier.run_id, settings)
    if lines is not None:
        batch_id = batch_id or new_id("batch")
        lines_uri = storage.join(begun.results, "inputs", f"{begun.run_id}.jsonl")
        open_run.open_run(
            enrichment.name, begun.results, begun.run_id, lines, lines_uri, batch_id, flow_run_id, settings
        )
        try:
            # The batch's own steps inside this flow run: the same validation, chunk tasks, durable parts,
            # progress artifact and files as any batch, without a subflow's start-up (~1-2.5 s here).
            opened = open_batch(
                BatchStore(settings),
                settings,
                job,
                lines_uri,
                batch_id,
                flow_run_id,
                output_dir=storage.join(begun.results, "batches", begun.run_id),
                metadata={"enrichment": enrichment.name, "enrich_run": begun.run_id},
            )
            batch = await run_opened_batch(opened, job, lines_uri, settings)
        except BaseException as exc:  # as run_batch's failure hook does: the batch ends with what finished
            try:
                end_batch(batch_id, job, "failed", f"the enrich run raised: {type(exc).__name__}: {exc}", settings)
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
    return record, table
