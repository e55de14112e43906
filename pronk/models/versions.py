"""Model versions a checkpoint is checked against: the version a new upload must fit, and whether a version can replace another."""

from __future__ import annotations

from pydantic import BaseModel, Field

from pronk.models.checkpoints import check_compatible, checkpoint_tags, read_spec
from pronk.models.registry import (
    alias_version,
    latest_version,
    parse_models_uri,
    register_model_dir,
    resolve_model,
)
from pronk.settings import Settings, get_settings


class UploadResult(BaseModel):
    """A checkpoint registered as a model version."""

    name: str = Field(description="Registered model name.")
    version: int = Field(ge=1, description="The new version number.")
    uri: str = Field(description="`models:/NAME/VERSION` of the new version.")
    parent_version: int | None = Field(default=None, description="The version it was validated against.")
    tags: dict[str, str] = Field(default_factory=dict)


def reference_version(name: str, job_model: str | None, settings: Settings) -> int | None:
    """The version a new checkpoint of `name` must fit: the one the job's model URI names, else the newest."""
    if job_model and job_model.startswith("models:/"):
        job_name, alias, number = parse_models_uri(job_model)
        if job_name == name:
            return alias_version(name, alias, settings) if alias else int(number)
    return latest_version(name, settings)


def check_version_fits(target_uri: str, current_version: str, settings: Settings | None = None) -> None:
    """Raise `CheckpointMismatch` if `target_uri` cannot replace the weights a worker labels `current_version` (`NAME/N`)."""
    settings = settings or get_settings()
    target = resolve_model(target_uri, settings)
    if current_version.startswith("local:") or "://" in current_version:
        return
    current = resolve_model(f"models:/{current_version}", settings)
    check_compatible(read_spec(target.path), read_spec(current.path), target_uri, current_version)


def upload_checkpoint(
    src: str, name: str, job_model: str | None = None, settings: Settings | None = None, source_tag: str | None = None
) -> UploadResult:
    """Validate a checkpoint (local dir or s3://) against the model's current version, then register it as the next one.

    Nothing is registered when it does not fit: `CheckpointMismatch` names the first difference.
    """
    settings = settings or get_settings()
    local = resolve_model(src, settings).path
    spec = read_spec(local)
    parent = reference_version(name, job_model, settings)
    if parent is not None:
        reference = resolve_model(f"models:/{name}/{parent}", settings)
        check_compatible(spec, read_spec(reference.path), src, reference.version)
    tags = checkpoint_tags(spec, parent, source_tag or src)
    version = register_model_dir(local, name, tags=tags, settings=settings)
    return UploadResult(name=name, version=version, uri=f"models:/{name}/{version}", parent_version=parent, tags=tags)
