"""Prefect tasks that read and validate batch input files."""

from __future__ import annotations

from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from pronk import storage
from pronk.batches.input import BatchInputError, InputLimits, ValidatedInput, validate_input
from pronk.batches.prompt_length import PromptLength
from pronk.jobs import JobConfig
from pronk.settings import get_settings


@task(cache_policy=NO_CACHE, retries=2, retry_delay_seconds=1)
def read_input_file(uri: str) -> bytes:
    """Read the batch input file from a local path or s3://."""
    try:
        return storage.read_bytes(uri)
    except (OSError, ValueError) as exc:
        raise BatchInputError(f"cannot read input file {uri}: {exc}") from exc


def job_tokenizer(job: JobConfig) -> Any:
    """The tokenizer of the job's model, as its workers load it (the model's directory, resolved once)."""
    from transformers import AutoTokenizer

    from pronk.models.registry import resolve_model

    return AutoTokenizer.from_pretrained(str(resolve_model(job.model).path))


@task(cache_policy=NO_CACHE)
def validate_lines(data: bytes, job: JobConfig) -> ValidatedInput:
    """Split the input into valid requests and error lines; prompts too long for the job are rejected here."""
    return validate_input(data, job, input_limits(job))


def input_limits(job: JobConfig) -> InputLimits:
    """The limits every line of a batch for `job` is validated against (the job's tokenizer loads on first need)."""
    return InputLimits(
        max_line_bytes=get_settings().max_line_bytes, prompt_tokens=PromptLength(job, lambda: job_tokenizer(job))
    )
