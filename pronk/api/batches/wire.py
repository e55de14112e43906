"""The Batches resource on the wire: the batch id, the create body (OpenAI's plus `job_id`) and the list.

A batch itself is OpenAI's `BatchObject` (`pronk.batches.schemas`): the stored record (`Batch`) is that object plus
its owner and the server paths of its files, and the batch flow, the command line and the enrich flow write and read
the same fields, so they are declared once, in the domain; the API answers the public part (`Batch.public`).
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import Path
from pydantic import BaseModel, ConfigDict, Field, field_validator

from pronk.api.files.wire import FILE_ID_PATTERN
from pronk.batches.schemas import BatchObject
from pronk.protocol.ids import id_pattern

BatchId = Annotated[str, Path(pattern=id_pattern("batch"), description="The batch's id (`batch_` and 24 hex digits).")]

JOB_ID_PATTERN = r"^job-[0-9a-f]{8}$"
MAX_METADATA_PAIRS, MAX_METADATA_KEY, MAX_METADATA_VALUE = 16, 64, 512


class BatchCreate(BaseModel):
    """OpenAI's create-batch body plus `job_id` (the openai client sends it through `extra_body`)."""

    model_config = ConfigDict(extra="forbid")

    input_file_id: str = Field(pattern=FILE_ID_PATTERN, description="An uploaded file with purpose `batch`.")
    endpoint: str = Field(description="The url every line of the file must name; pronk serves /v1/chat/completions.")
    completion_window: Literal["24h", "unlimited"] = Field(
        description="`24h`: lines not started within a day end as `batch_expired` and the batch `expired`."
    )
    metadata: dict[str, str] | None = Field(
        default=None, description="Up to 16 pairs; keys <= 64, values <= 512 chars."
    )
    job_id: str | None = Field(
        default=None,
        pattern=JOB_ID_PATTERN,
        description="The job to run on; default: the one job serving the lines' model.",
    )

    @field_validator("metadata")
    @classmethod
    def _metadata_limits(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        if value is None:
            return None
        if len(value) > MAX_METADATA_PAIRS:
            raise ValueError(f"at most {MAX_METADATA_PAIRS} pairs, got {len(value)}")
        for key, item in value.items():
            if len(key) > MAX_METADATA_KEY:
                raise ValueError(f"key {key[:80]!r} has {len(key)} characters; the limit is {MAX_METADATA_KEY}")
            if len(item) > MAX_METADATA_VALUE:
                raise ValueError(f"value of {key!r} has {len(item)} characters; the limit is {MAX_METADATA_VALUE}")
        return value


class BatchList(BaseModel):
    object: Literal["list"] = "list"
    data: list[BatchObject]
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool = False
