"""Prefect tasks that read and validate batch input files."""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from pronk import storage
from pronk.batches.input import BatchInputError, ValidatedInput, validate_input
from pronk.batches.prompt_length import input_limits
from pronk.jobs.schema import JobConfig
from pronk.settings import Settings


@task(cache_policy=NO_CACHE, retries=2, retry_delay_seconds=1)
def read_input_file(uri: str, settings: Settings) -> bytes:
    """Read the batch input file from a local path or s3://."""
    try:
        return storage.read_bytes(uri, settings)
    except (OSError, ValueError) as exc:
        raise BatchInputError(f"cannot read input file {uri}: {exc}") from exc


@task(cache_policy=NO_CACHE)
def validate_lines(data: bytes, job: JobConfig, settings: Settings) -> ValidatedInput:
    """Split the input into valid requests and error lines; prompts too long for the job are rejected here."""
    return validate_input(data, job, input_limits(job, settings))
