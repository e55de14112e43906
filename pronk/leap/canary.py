"""Leap's canary: switch one worker to the new version first, run the job's labelled set on it and, at the same time,
on the workers still serving the current version, and let the rest of the fleet follow only if the success rate holds.

A job without `quality.labelled_set`, with `quality.canary: false`, or a Leap started with `--no-canary` switches the
fleet at once. Both sides are judged by `pronk.batches.labelled.compare_success`, the rule the Herd's tuner uses too.
A canary that answers worse goes back to the version it served, the job's alias stays, and the Leap ends `refused`
with both success rates in its message. The canary serves the job's other traffic while it is measured, as a canary
does: the labelled set's own lines go only to the workers measured (`Router(only=…)`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import NoReturn

from pronk.agents.harness import Harness, job_router
from pronk.agents.step_records import StepRecorder
from pronk.batches.labelled import LabelledSetError, compare_success, labelled_lines, run_labelled
from pronk.batches.progress import saved_every
from pronk.batches.schemas import CheckCounts, LinesChecked
from pronk.jobs.schema import JobConfig
from pronk.leap.records import CanaryRecord, LeapRecord, LeapStore
from pronk.leap.sequence import LeapFailed, LeapRefused, LeapRun, ReloadStep, StageStep, roll_back
from pronk.models.registry import models_uri
from pronk.protocol.lines import ValidRequest
from pronk.settings import Settings

Measure = Callable[[list[ValidRequest], list[str], LinesChecked], Awaitable[CheckCounts]]
"""Run labelled lines on these workers only, counting them in the `LinesChecked` as they are checked, and tally
their checks (`measure`, or the flow's task around it)."""


def labelled_set(job: JobConfig, record: LeapRecord, requested: bool, settings: Settings) -> list[ValidRequest] | None:
    """The lines the Leap's canary runs, or None when it runs no canary (no labelled set, the job's `quality.canary`
    off, the caller skipped it, or the fleet already serves the target: nothing would switch). A set that cannot be
    read refuses the Leap (saved) before any worker is touched."""
    if record.fleet_on_target() or not (requested and job.quality.canary and job.quality.labelled_set):
        return None
    try:
        return labelled_lines(job, settings)
    except LabelledSetError as exc:
        message = f"{exc}; the fleet stays on {record.from_version}; `pronk leap --no-canary` skips the canary"
        record.finish("refused", message)
        LeapStore(settings).save(record)
        raise LeapRefused(message, record) from exc


async def measure(
    job: JobConfig,
    lines: list[ValidRequest],
    worker_ids: list[str],
    settings: Settings,
    scratch: Path,
    progress: LinesChecked | None = None,
) -> CheckCounts:
    """Run `lines` through the harness on `worker_ids` alone and tally their checks (`progress` counts them)."""
    router = job_router(job, settings, only=worker_ids)
    try:
        harness = Harness(router, job, StepRecorder(), scratch, sandbox_bwrap=settings.sandbox_bwrap)
        return await run_labelled(lines, harness, progress)
    finally:
        await router.aclose()


async def trial(
    run: LeapRun,
    job: JobConfig,
    lines: list[ValidRequest],
    stage: StageStep,
    reload: ReloadStep,
    measure: Measure,
    timeout_s: float,
) -> list[str]:
    """Switch the canary (the first worker by id) and measure it beside the others; return the workers that could
    not switch (the canary, or none), for `pronk.leap.sequence.conclude`.

    The baseline runs on the other workers, still on the current version, while the canary runs; a job with one
    worker measures the baseline on it before it switches. A worse canary, or one whose measuring takes longer than
    `timeout_s` (`leap_canary_timeout_s`: a fleet too loaded to judge the version in time), goes back, and the Leap
    ends `refused` (`LeapRefused`), or `failed` (`LeapFailed`) if the canary cannot go back. The record is saved
    about once a second while the lines run, with how many have been checked (`CanaryRecord.checked`).
    """
    record = run.record
    canary, *others = sorted(run.original)
    record.status = "canary"
    record.canary = CanaryRecord(
        worker_id=canary,
        labelled_set=str(job.quality.labelled_set),
        lines=len(lines),
        baseline_workers=others or [canary],
    )
    await run.save()
    started = time.monotonic()
    checked = record.canary.checked
    try:
        async with asyncio.timeout(timeout_s), saved_every(run.save):
            before = None if others else await measure(lines, [canary], checked)
            try:
                await stage(run, canary, models_uri(record.to_version))
                await reload(run, canary, record.to_version)
            except Exception:  # noqa: BLE001 - the worker's entry holds the error; conclude rolls back and says so
                return [canary]
            if before is None:
                baseline, candidate = await asyncio.gather(
                    measure(lines, others, checked), measure(lines, [canary], checked)
                )
            else:
                baseline, candidate = before, await measure(lines, [canary], checked)
    except TimeoutError:
        record.canary.seconds = round(time.monotonic() - started, 3)
        record.canary.reason = f"the labelled set did not finish within leap_canary_timeout_s ({timeout_s:g}s)"
        await _refuse(run, reload, f"canary refused: {record.canary.reason} on {canary}; ")
    record.canary.seconds = round(time.monotonic() - started, 3)
    verdict = compare_success(baseline, candidate)
    record.canary.baseline, record.canary.candidate = baseline, candidate
    record.canary.worse, record.canary.reason = verdict.worse, verdict.reason
    await run.save()
    if not verdict.worse:
        return []
    await _refuse(
        run,
        reload,
        f"canary refused: {record.to_version} on {canary}: {candidate.describe()}, against {record.from_version}: "
        f"{baseline.describe()} (beyond noise); ",
    )


async def _refuse(run: LeapRun, reload: ReloadStep, message: str) -> NoReturn:
    """Send the canary back and end the Leap `refused` (`LeapRefused`), or `failed` if it cannot go back."""
    record = run.record
    canary = record.canary.worker_id if record.canary else ""
    if await roll_back(run, reload):
        message += f"{canary} could not go back to {run.original[canary]}: {record.workers[canary].error}"
        record.finish("failed", message)
        await run.save()
        raise LeapFailed(message)
    message += f"the fleet stays on {record.from_version}; `pronk leap --no-canary` skips the check"
    record.finish("refused", message)
    await run.save()
    raise LeapRefused(message, record)
