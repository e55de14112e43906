"""A batch's trace sample, drawn off the flow run's path: the order its flow run leaves, and the drawer that fills it.

Drawing the sample inside the flow run added 10-14 s to every batch's run (bench/RESULTS.md, "Trace
granularity"). So the flow run, once its results are written, only leaves an order in the store (the
sampled traces' step records and the per-trace table's rows) and starts `python -m pronk.control.trace_sample.drawer
<batch id>` in a session of its own, which outlives the flow run's process however the batch was started
(API, CLI, `prefect deployment run`). The drawer logs the sample to MLflow, draws its task runs into the
finished flow run, each at the time its step ran (`drawing`), then the per-trace table and the
sample's markdown (created last: its presence says the drawing is done).

One drawer runs at a time on a machine: it holds a lock (`logs/trace_samples.lock`) and draws every order placed
while it runs, one after another, so a burst of small batches (the batch queue's drainer ends dozens a minute) starts
one drawer, not one process importing Prefect and MLflow per batch. The lock is taken before the drawer starts and
passed to it, so no second drawer starts while the first is still importing; the drawer's pid is written into the lock
file (`pronk.control.trace_sample.lock`).

It is for show: it never touches the batch or its files. It deletes the order before it starts, so a
batch's sample is drawn at most once, and it lives at most `deadline_s(order)`: past it the process ends.
It draws only for a Prefect server that answers: before each order it checks the API's health, and when that fails
(the server is stopped) it ends, leaving the orders it has not taken in the store for the next drawer, rather than
wait `FLOW_END_WAIT_S` on each for a flow run's end that will never be reported. `pronk stack down` stops it too
(SIGTERM: it ends at once, the orders it has not taken left in the store).
Its own log goes to `logs/trace_samples.log`; a summary line goes to the flow run's logs.
"""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import json
import logging
import math
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from typing import Any

from prefect import get_client
from prefect.artifacts import acreate_table_artifact
from prefect.client.orchestration import PrefectClient
from prefect.client.schemas.actions import ArtifactCreate
from pydantic import BaseModel, Field, ValidationError

from pronk import storage
from pronk.agents.step_records import StepRecord, log_mlflow_traces
from pronk.agents.tools.scratch import scratch_dir
from pronk.batches.run import BatchRun
from pronk.control.calls import PREFECT_CALL_TIMEOUT_S, best_effort
from pronk.control.trace_sample.choice import TABLE_ROWS, SampledTrace, sample_of, table_rows, trace_table
from pronk.control.trace_sample.dag import DagNode, readable, trace_dag
from pronk.control.trace_sample.drawing import MAX_TASK_RUNS, RECORD_WAIT_S, TASK_RUNS_PER_S, draw_trace_dags, log_line
from pronk.control.trace_sample.lock import DRAWER_MODULE, record_holder, take_lock
from pronk.settings import PROJECT_ROOT, Settings, get_settings
from pronk.tracking import experiment_name

logger = logging.getLogger(__name__)

MLFLOW_BUDGET_S = 60.0
"""Longest the drawer waits on MLflow for the sample's traces (they are logged while the task runs are drawn)."""
GRACE_S = 30.0
"""A Prefect server that stops answering costs the drawer at most this long beyond the drawing's own pace."""
FLOW_END_WAIT_S = 30.0
"""The longest the drawer waits for its flow run to end before drawing anyway."""
MARKDOWN_SAFE = str.maketrans({c: "_" for c in "|[]<>`*\\"})
"""A custom id is hostile input: in the sample's markdown it shows as text, never as a link, tag or table cell break."""


class PrefectAway(Exception):
    """The Prefect API does not answer: the drawer stops, leaving the orders it has not taken in the store."""


class SampleOrder(BaseModel):
    """What a batch's flow run leaves for the drawer: everything it shows, so it reads nothing else."""

    batch_id: str
    flow_run_id: str
    job_id: str
    mlflow_traces: bool = Field(default=True, description="The job's `observability.mlflow_traces`.")
    traces: list[SampledTrace]
    rows: list[dict[str, Any]] = Field(description="The per-trace table: its first rows, then every sampled line.")
    placed_at: float = Field(default_factory=time.time, description="When the flow run had written the results.")


def order_uri(settings: Settings, batch_id: str) -> str:
    return storage.join(settings.store_uri, "trace_samples", f"{batch_id}.json")


def place_order(order: SampleOrder, settings: Settings) -> None:
    """Leave the order in the store and start a drawer for it, detached (it outlives this process), unless a drawer
    is running: that one draws every order placed before it ends."""
    uri = order_uri(settings, order.batch_id)
    storage.write_bytes(uri, order.model_dump_json().encode(), settings)
    try:
        start_drawer(settings, order.batch_id)
    except BaseException:
        storage.delete(uri, settings)  # no drawer: no order left behind
        raise


def start_drawer(settings: Settings, batch_id: str) -> bool:
    """Start the drawer, holding the drawers' lock for it, with `batch_id`'s order first; False when one is running."""
    lock = take_lock(settings)
    if lock is None:
        return False
    try:
        env = {k: v for k, v in os.environ.items() if k != "PREFECT__FLOW_RUN_ID"}  # the drawer is not the flow run
        with open(settings.logs_dir / "trace_samples.log", "ab") as log:
            drawer = subprocess.Popen(
                [sys.executable, "-m", DRAWER_MODULE, "--lock-fd", str(lock), "--", batch_id],
                cwd=PROJECT_ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                pass_fds=(lock,),
            )
        record_holder(lock, drawer.pid)  # for `pronk stack down`, which stops it
        return True
    finally:
        os.close(lock)  # the drawer's copy of the descriptor holds the lock from here


async def publish_traces(run: BatchRun, settings: Settings, sample_size: int) -> None:
    """After the batch's results are written: drop the tools' scratch folder, leave the trace sample's order.

    The drawer draws the sample in this flow run's graph, logs it to MLflow and publishes the per-trace table with
    each sampled line's MLflow link once this flow run has ended; without a sample (or when the order cannot be
    left) the table is published here, without links. All of it is best effort.
    """
    batch = run.batch
    await asyncio.to_thread(shutil.rmtree, scratch_dir(settings, batch.id), True)
    sample = sample_of(run.finished, sample_size)
    rows = table_rows(run.finished, sample)
    if sample and batch.flow_run_id:
        order = SampleOrder(
            batch_id=batch.id,
            flow_run_id=batch.flow_run_id,
            job_id=run.job.job_id,
            mlflow_traces=run.job.observability.mlflow_traces,
            traces=sample,
            rows=rows,
        )
        try:
            await asyncio.to_thread(place_order, order, settings)
        except Exception as exc:  # noqa: BLE001 - the batch's results are written: its sample is for show
            logger.warning("batch %s: cannot start drawing its trace sample: %r", batch.id, exc)
        else:
            logger.info("batch %s: %d sampled traces will be drawn once this run has ended", batch.id, len(sample))
            return
    await best_effort(
        "trace table",
        acreate_table_artifact(
            table=trace_table(rows, {}), key=None, description=f"batch {batch.id}: traces (first {TABLE_ROWS} lines)"
        ),
    )


def take_order(batch_id: str, settings: Settings) -> SampleOrder | None:
    """The batch's order, deleted from the store before it is drawn (so never drawn twice); None if there is none."""
    uri = order_uri(settings, batch_id)
    try:
        data = storage.read_bytes(uri, settings)
    except FileNotFoundError:
        return None
    storage.delete(uri, settings)
    try:
        return SampleOrder.model_validate_json(data)
    except ValidationError as exc:
        logger.warning("batch %s: its trace sample order does not parse: %s", batch_id, exc.errors()[:1])
        return None


def deadline_s(order: SampleOrder) -> float:
    """The most the drawer may take: MLflow's budget, the drawing's pace and its wait for the server to write the
    nodes, and a grace for a slow server."""
    nodes = sum(len(t.steps) for t in order.traces) * 2  # a step and its tool call, at most
    drawing = min(nodes, MAX_TASK_RUNS) / TASK_RUNS_PER_S + RECORD_WAIT_S
    return FLOW_END_WAIT_S + MLFLOW_BUDGET_S + drawing + GRACE_S


async def wait_for_the_flow_run_to_end(client: PrefectClient, order: SampleOrder) -> None:
    """Wait (at most `FLOW_END_WAIT_S`) until the batch's flow run is final: the drawing starts with the run's last
    steps otherwise, and would compete with the very run whose end it must not delay."""
    deadline = time.monotonic() + FLOW_END_WAIT_S
    while time.monotonic() < deadline:
        flow_run = await best_effort("the flow run's state", client.read_flow_run(uuid.UUID(order.flow_run_id)))
        if flow_run is not None and flow_run.state is not None and flow_run.state.is_final():
            return
        await asyncio.sleep(0.5)
    logger.warning("batch %s: its flow run had not ended after %.0f s; drawing anyway", order.batch_id, FLOW_END_WAIT_S)


def mlflow_trace_url(settings: Settings, experiment_id: str, trace_id: str) -> str:
    """The MLflow UI's page of one trace."""
    return f"{settings.mlflow_ui_url}/#/experiments/{experiment_id}/traces?selectedEvaluationId={trace_id}"


async def log_sample_to_mlflow(order: SampleOrder, settings: Settings) -> dict[str, str]:
    """The sampled traces as MLflow traces; each sampled line's custom_id → its URL in the MLflow UI.

    MLflow trouble is logged, never a reason to skip the rest of the drawing.
    """
    if not order.traces or not order.mlflow_traces:
        return {}
    records = [StepRecord(**row) for t in order.traces for row in t.steps]
    try:
        experiment_id, logged = await asyncio.wait_for(
            asyncio.to_thread(
                log_mlflow_traces,
                records,
                settings.tracking_uri,
                experiment_name(order.job_id),
                settings.artifact_root,
                {"pronk.batch_id": order.batch_id, "pronk.job_id": order.job_id},
            ),
            MLFLOW_BUDGET_S,
        )
    except Exception as exc:  # noqa: BLE001 - the batch's own results are written: this is for show
        logger.warning("batch %s: logging MLflow traces failed: %r", order.batch_id, exc)
        return {}
    logger.info("batch %s: logged %d sampled traces to MLflow", order.batch_id, len(logged))
    roots = {r.custom_id or "": r.root_trace_id for r in records}
    return {
        cid: mlflow_trace_url(settings, experiment_id, logged[root]) for cid, root in roots.items() if root in logged
    }


async def draw(client: PrefectClient, order: SampleOrder, dags: list[list[DagNode]]) -> int:
    """The sampled traces as task runs in the batch's flow run graph; how many were created (best effort)."""
    started = time.monotonic()
    try:
        drawn = await draw_trace_dags(client, order.flow_run_id, dags)
    except Exception as exc:  # noqa: BLE001 - the drawing is for show: the batch has ended already
        logger.warning("batch %s: drawing the sampled traces failed: %r", order.batch_id, exc)
        return 0
    logger.info("batch %s: %d task runs drawn in %.2f s", order.batch_id, drawn, time.monotonic() - started)
    return drawn


def sample_markdown(
    batch_id: str, sample: list[SampledTrace], links: dict[str, str], dags: list[list[DagNode]] | None = None
) -> str:
    """The sampled traces, each with its state and a link to its MLflow trace (when logged), then each one's task
    runs with their figures (as their state messages say)."""
    lines = [
        f"# Sampled traces of batch {batch_id}",
        "",
        "Each is drawn in this run's graph as task runs named `<trace> step <n>: <tool>`.",
        "",
        "| line | custom_id | state | steps | MLflow trace |",
        "| --- | --- | --- | --- | --- |",
    ]
    for t in sample:
        link = f"[open]({links[t.custom_id]})" if t.custom_id in links else "—"
        state = "completed" if t.ok else "error"
        lines.append(f"| {t.line} | {_cell(t.custom_id)} | {state} | {len(t.steps)} | {link} |")
    for t, dag in zip(sample, dags or [], strict=False):
        lines += ["", f"## {_cell(t.custom_id)}", "", "| task run | figures |", "| --- | --- |"]
        lines += [f"| {_cell(n.name)}{' (failed)' if n.failed else ''} | {_cell(n.summary)} |" for n in dag]
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    return readable(text, 400).translate(MARKDOWN_SAFE)


async def fulfil(order: SampleOrder, settings: Settings) -> None:
    """Log the sample to MLflow and draw it in Prefect at once, then publish the table and the markdown."""
    flow_run_id = uuid.UUID(order.flow_run_id)
    dags = [trace_dag([StepRecord(**row) for row in t.steps]) for t in order.traces]
    async with get_client() as client:
        await wait_for_the_flow_run_to_end(client, order)
        started = time.monotonic()
        links, drawn = await asyncio.gather(log_sample_to_mlflow(order, settings), draw(client, order, dags))
        summary = (
            f"batch {order.batch_id}: {len(order.traces)} sampled traces drawn as {drawn} task runs and logged to "
            f"MLflow in {time.monotonic() - started:.2f} s, done {time.time() - order.placed_at:.2f} s after the "
            "run's results were written"
        )
        logger.info("%s", summary)
        await best_effort(
            "trace table",
            client.create_artifact(
                ArtifactCreate(
                    type="table",
                    data=json.dumps(trace_table(order.rows, links)),
                    description=f"batch {order.batch_id}: traces (first {TABLE_ROWS}, then the sampled ones)",
                    flow_run_id=flow_run_id,
                )
            ),
        )
        await best_effort(
            "sampled traces",
            client.create_artifact(
                ArtifactCreate(
                    type="markdown",
                    data=sample_markdown(order.batch_id, order.traces, links, dags),
                    description=f"batch {order.batch_id}: sampled traces",
                    flow_run_id=flow_run_id,
                )
            ),
        )
        await best_effort("sample's log line", client.create_logs([log_line(order.flow_run_id, summary)]))


def placed_orders(settings: Settings) -> list[str]:
    """The batch ids of the orders waiting for a drawer."""
    names = storage.list_names(storage.join(settings.store_uri, "trace_samples"), settings)
    return [name.removesuffix(".json") for name in names if name.endswith(".json")]


async def prefect_health() -> Exception | None:
    """Why the Prefect API fails its health check (it refuses connections, errs or does not answer in time), or None
    when it answers. A fresh client each time: Prefect's client retries a refused connection only once it has
    connected, so a server that is gone fails at once."""
    try:
        async with get_client() as client:
            return await asyncio.wait_for(client.api_healthcheck(), PREFECT_CALL_TIMEOUT_S)
    except Exception as exc:  # noqa: BLE001 - a timeout, or a client that cannot start: the server is as good as gone
        return exc


def draw_order(batch_id: str, settings: Settings) -> bool:
    """Take the batch's order and fulfil it within its deadline; False when that failed.

    Raises `PrefectAway`, the order left in the store, when the Prefect API does not answer: each order would wait
    `FLOW_END_WAIT_S` for the end of a flow run that a server which is gone never reports.
    """
    error = asyncio.run(prefect_health())
    if error is not None:
        raise PrefectAway(f"{type(error).__name__}: {error}")
    order = take_order(batch_id, settings)
    if order is None:
        logger.info("batch %s: no trace sample to draw", batch_id)
        return True
    limit = deadline_s(order)
    signal.alarm(math.ceil(limit) + 5)  # a call that ignores cancellation (MLflow's, in a thread) ends with the process
    try:
        asyncio.run(asyncio.wait_for(fulfil(order, settings), limit))
    except Exception:
        logger.exception("batch %s: drawing its trace sample failed", order.batch_id)
        return False
    finally:
        signal.alarm(0)
    return True


def draw_while_placed(lock: int, settings: Settings) -> bool:
    """Draw every order placed, holding the drawers' lock; let it go only when none is left after it was let go
    (an order placed while the lock was held started no drawer of its own)."""
    ok = True
    while True:
        for batch_id in placed_orders(settings):
            ok = draw_order(batch_id, settings) and ok
        fcntl.flock(lock, fcntl.LOCK_UN)
        if not placed_orders(settings):
            return ok
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return ok  # a drawer started meanwhile: the orders are its


def stop_on_sigterm(signum: int, frame: object) -> None:
    """End the drawer at once (`pronk stack down` stops it with the server it draws for). The orders not taken yet stay
    in the store; the one being drawn is given up half drawn, as drawing is only for show. `os._exit`, not `SystemExit`:
    the interpreter's exit would wait on a thread still in an MLflow call."""
    logger.warning("stopped by SIGTERM; the orders not drawn yet stay in the store")
    os._exit(0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Draw finished batches' trace samples (started by their flow runs).")
    parser.add_argument("batch_ids", nargs="*", help="Batches whose orders are drawn first.")
    parser.add_argument(
        "--lock-fd", type=int, help="The drawers' lock, held for this drawer: then every placed order is drawn."
    )
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(process)d %(name)s %(levelname)s %(message)s", force=True
    )  # Prefect and MLflow configured logging on import
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request otherwise
    signal.signal(signal.SIGTERM, stop_on_sigterm)
    settings = get_settings()
    try:
        ok = all([draw_order(batch_id, settings) for batch_id in args.batch_ids])
        if args.lock_fd is not None:
            ok = draw_while_placed(args.lock_fd, settings) and ok
    except PrefectAway as exc:
        logger.warning(
            "the Prefect API does not answer (%s): stopped drawing; %d orders stay in the store for the next drawer",
            exc,
            len(placed_orders(settings)),
        )
        return 1
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
