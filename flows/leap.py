"""The Leap flow: swap a job's running fleet to an MLflow model version in place, in seconds, with no redeploy.

Every worker first stages the new weights (downloads and validates them while still serving the old
ones); then all of them swap at a step boundary (drain in-flight generations, reload in place,
reset the prefix cache, resume). A worker that fails is retried; if the fleet cannot all switch,
the workers that did switch go back, and the job's alias moves only when the whole fleet serves the
new version.
"""

from __future__ import annotations

import asyncio

from prefect import flow, get_run_logger, runtime
from prefect.artifacts import acreate_table_artifact

from engine.registry import Registry
from pronk.errors import PronkError
from pronk.jobs import get_job
from pronk.models.checkpoints import CheckpointMismatch
from pronk.models.leap_records import LeapRecord, LeapStore, WorkerLeap
from pronk.models.registry import is_models_uri, models_uri, parse_models_uri, set_alias
from pronk.models.versions import check_version_fits, resolve_version
from pronk.settings import Settings, get_settings
from pronk.stack.prefect_env import show_pronk_logs
from pronk.worker_token import worker_token
from tasks.leap import LeapRun, reload_weights, stage_weights


class LeapRefused(PronkError, ValueError):
    """The Leap did not start: no such version, no live worker, or a checkpoint that does not fit. Nothing changed."""


class LeapFailed(PronkError, RuntimeError):
    """The fleet could not all switch; the record says which workers went back."""


def _target_version(name: str, version: int | None, alias: str | None, settings: Settings) -> int:
    if version is not None and alias is None:
        return version
    if version is not None or alias is None:
        raise LeapRefused("give exactly one of version or alias")
    try:
        return resolve_version(name, models_uri(f"{name}@{alias}"), settings)
    except Exception as exc:
        raise LeapRefused(f"model {name} has no alias {alias!r}: {exc}") from exc


def _check_fits(target_uri: str, current_version: str, settings: Settings) -> None:
    """Refuse a target that does not fit the weights the fleet serves (each worker checks again when staging)."""
    try:
        check_version_fits(target_uri, current_version, settings)
    except CheckpointMismatch as exc:
        raise LeapRefused(str(exc)) from exc
    except Exception as exc:
        raise LeapRefused(f"cannot resolve {target_uri}: {exc}") from exc


async def _publish(record: LeapRecord) -> None:
    await acreate_table_artifact(
        table=record.table(),
        key=f"leap-{record.job_id}",
        description=f"Leap {record.id} of {record.job_id} to {record.to_version}: {record.status}. {record.message}",
    )


async def _switch(run: LeapRun, original: dict[str, str]) -> list[str]:
    """Stage on every worker, then swap every worker; return the workers that could not switch.

    None switched when staging failed somewhere.
    """
    record = run.record
    record.status = "staging"
    await run.save()
    uri = models_uri(record.to_version)
    staged = await asyncio.gather(*(stage_weights(run, w, uri) for w in original), return_exceptions=True)
    not_staged = [w for w, result in zip(original, staged) if isinstance(result, BaseException)]
    if not_staged:
        return not_staged
    record.status = "reloading"
    await run.save()
    swapped = await asyncio.gather(
        *(reload_weights(run, w, record.to_version) for w in original), return_exceptions=True
    )
    return [w for w, result in zip(original, swapped) if isinstance(result, BaseException)]


async def _roll_back(run: LeapRun, original: dict[str, str]) -> list[str]:
    """Swap the workers that reached the new version back to what each served; return those that could not."""
    switched = [w for w, entry in run.record.workers.items() if entry.version != original[w]]
    back = await asyncio.gather(*(reload_weights(run, w, original[w]) for w in switched), return_exceptions=True)
    stuck = []
    for worker_id, result in zip(switched, back):
        if isinstance(result, BaseException):
            stuck.append(worker_id)
        else:
            run.record.workers[worker_id].state = "rolled_back"
    await run.save()
    return stuck


@flow(name="leap", log_prints=False)
async def leap(job_id: str, version: int | None = None, alias: str | None = None, leap_id: str | None = None) -> dict:
    """Swap a job's running workers to version N (or the version alias A names) of its model; its alias follows."""
    show_pronk_logs()
    logger = get_run_logger()
    settings = get_settings()
    store = LeapStore(settings)
    job = get_job(job_id)
    if not is_models_uri(job.model):
        raise LeapRefused(f"job {job.job_id} serves {job.model!r}; Leap needs an MLflow model (models:/NAME@ALIAS)")
    name, job_alias, _ = parse_models_uri(job.model)
    target = _target_version(name, version, alias, settings)
    workers = Registry.from_settings(settings).live(job.job_id)
    original = {w.worker_id: w.stats.model_version for w in workers}
    record = LeapRecord(
        job_id=job.job_id,
        model=name,
        to_version=f"{name}/{target}",
        alias=job_alias,
        from_version=", ".join(sorted(set(original.values()))) or None,
        flow_run_id=str(runtime.flow_run.id) if runtime.flow_run.id else None,
        workers={
            w.worker_id: WorkerLeap(worker_id=w.worker_id, url=w.url, version=w.stats.model_version) for w in workers
        },
    )
    if leap_id:
        record.id = leap_id
    try:
        if not workers:
            raise LeapRefused(f"no live workers for {job.job_id}")
        for current in sorted(set(original.values())):
            await asyncio.to_thread(_check_fits, models_uri(record.to_version), current, settings)
    except LeapRefused as exc:
        record.finish("refused", str(exc))
        await asyncio.to_thread(store.save, record)
        await _publish(record)
        raise
    run = LeapRun(record, store, worker_token(settings))
    try:
        failed = await _switch(run, original)
        if failed:
            errors = "; ".join(f"{w}: {record.workers[w].error}" for w in failed)
            message = f"{len(failed)} of {len(original)} workers could not switch to {record.to_version} ({errors}); "
            if record.status == "staging":
                message += f"no worker switched, the fleet still serves {record.from_version}"
                record.finish("failed", message)
            else:
                stuck = await _roll_back(run, original)
                message += (
                    f"the others went back to {record.from_version}"
                    if not stuck
                    else f"{stuck} could not go back either"
                )
                record.finish("rolled_back" if not stuck else "failed", message)
            logger.error("leap %s: %s", record.id, message)
            raise LeapFailed(message)
        if job_alias:
            await asyncio.to_thread(set_alias, name, job_alias, target, settings)
            record.alias_moved = True
        record.finish(
            "completed",
            f"{len(original)} workers serve {record.to_version}"
            + (f"; {name}@{job_alias} → {target}" if job_alias else ""),
        )
        logger.info("leap %s: %s in %.3fs", record.id, record.message, record.switch_seconds or 0.0)
        return record.model_dump(mode="json")
    finally:
        await run.save()
        await run.aclose()
        await _publish(record)
