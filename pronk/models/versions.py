"""Model versions: which version a reference names, the version an upload must fit, whether one can replace another,
and what an upload registered (`UploadResult`, also the answer of `POST /v1/weights/upload`)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from pronk.jobs.schema import JobConfig
from pronk.models.checkpoints import check_compatible, checkpoint_tags, read_spec
from pronk.models.registry import (
    alias_version,
    is_models_uri,
    latest_version,
    models_uri,
    parse_models_uri,
    register_model_dir,
    resolve_model,
)
from pronk.pronk_error import PronkError
from pronk.settings import Settings


class ModelMismatch(PronkError, ValueError):
    """A `models:/` URI names another registered model than the one it was given for."""


class NotLeapable(PronkError, ValueError):
    """The job serves a directory or `s3://` path, not an MLflow model, so it has no versions to Leap between."""


class UploadResult(BaseModel):
    """A checkpoint registered as a model version."""

    name: str = Field(description="Registered model name.")
    version: int = Field(ge=1, description="The new version number.")
    uri: str = Field(description="`models:/NAME/VERSION` of the new version.")
    parent_version: int | None = Field(default=None, description="The version it was validated against.")
    tags: dict[str, str] = Field(default_factory=dict)


def resolve_version(name: str, reference: str | int, settings: Settings) -> int:
    """The version number of model `name` that `reference` names.

    `reference` is `models:/NAME@ALIAS`, `models:/NAME/N`, a version number, or an alias of `name`.
    Raises `ModelMismatch` when a URI names another model; MLflow's error when an alias is unknown.
    """
    if isinstance(reference, int):
        return reference
    if not is_models_uri(reference):
        return int(reference) if reference.isdigit() else alias_version(name, reference, settings)
    uri_name, alias, number = parse_models_uri(reference)
    if uri_name != name:
        raise ModelMismatch(f"{reference} is a version of {uri_name!r}, not of {name!r}")
    return alias_version(name, alias, settings) if alias else int(str(number))


def reference_version(name: str, job_model: str | None, settings: Settings) -> int | None:
    """The version a new checkpoint of `name` must fit: the one the job's model URI names, else the newest."""
    if job_model and is_models_uri(job_model) and parse_models_uri(job_model)[0] == name:
        return resolve_version(name, job_model, settings)
    return latest_version(name, settings)


def check_version_fits(target_uri: str, current_version: str, settings: Settings) -> None:
    """Raise `CheckpointMismatch` if `target_uri` cannot replace the weights a worker labels `current_version`.

    `current_version` is a version label (`NAME/N`); a local or `s3://` label has nothing to check against.
    """
    target = resolve_model(target_uri, settings)
    if current_version.startswith("local:") or "://" in current_version:
        return
    current = resolve_model(models_uri(current_version), settings)
    check_compatible(read_spec(target.path), read_spec(current.path), target_uri, current_version)


def upload_checkpoint(
    src: str, name: str, settings: Settings, job_model: str | None = None, source_tag: str | None = None
) -> UploadResult:
    """Validate a checkpoint (local dir or s3://) against the model's current version, then register it as the next one.

    Nothing is registered when it does not fit: `CheckpointMismatch` names the first difference.
    """
    local = resolve_model(src, settings).path
    spec = read_spec(local)
    parent = reference_version(name, job_model, settings)
    if parent is not None:
        reference = resolve_model(models_uri(f"{name}/{parent}"), settings)
        check_compatible(spec, read_spec(reference.path), src, reference.version)
    tags = checkpoint_tags(spec, parent, source_tag or src)
    version = register_model_dir(local, name, tags=tags, settings=settings)
    return UploadResult(
        name=name, version=version, uri=models_uri(f"{name}/{version}"), parent_version=parent, tags=tags
    )


def leap_model(job: JobConfig) -> str:
    """The registered model name a job serves; `NotLeapable` when it serves no MLflow model."""
    if not is_models_uri(job.model):
        raise NotLeapable(f"Job {job.job_id} serves {job.model!r}, not an MLflow model.")
    return parse_models_uri(job.model)[0]


def leap_target(job: JobConfig, uri: str, serving: set[str], settings: Settings) -> int:
    """The version of the job's model that `uri` names, checked to fit every version its workers serve (`serving`).

    A `models:/` URI must name the job's model; a checkpoint directory or `s3://` path is validated and registered
    first. Raises `NotLeapable`, `ModelMismatch` or `CheckpointMismatch`.
    """
    name = leap_model(job)
    if is_models_uri(uri):
        if parse_models_uri(uri)[0] != name:
            raise ModelMismatch(f"Job {job.job_id} serves model {name!r}; {uri} is another model.")
        version = resolve_version(name, uri, settings)
    else:
        version = upload_checkpoint(uri, name, settings, job.model).version
    for current in sorted(serving):
        check_version_fits(models_uri(f"{name}/{version}"), current, settings)
    return version
