"""Model versions in MLflow (SQLite tracking store, local or S3 artifacts) and model URIs resolved to local dirs."""

from __future__ import annotations

import hashlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from pronk import paths
from pronk.models.checkpoints import checkpoint_tags, read_spec
from pronk.settings import Settings

MODELS_EXPERIMENT = "pronk-models"
TINY_MODEL_NAME = "pronk-tiny"
MODELS_SCHEME = "models:/"
"""The prefix of MLflow model URIs: `models:/NAME@ALIAS`, `models:/NAME/N`."""


@dataclass(frozen=True, slots=True)
class ResolvedModel:
    """A model URI made local: the directory vLLM loads, and the version label every step carries."""

    path: Path
    version: str


def _client(settings: Settings):
    import mlflow
    from mlflow import MlflowClient

    mlflow.set_tracking_uri(settings.tracking_uri)
    mlflow.set_registry_uri(settings.tracking_uri)
    return MlflowClient(tracking_uri=settings.tracking_uri, registry_uri=settings.tracking_uri)


def _experiment_id(client, settings: Settings) -> str:
    experiment = client.get_experiment_by_name(MODELS_EXPERIMENT)
    if experiment is not None:
        return experiment.experiment_id
    settings.artifact_root.mkdir(parents=True, exist_ok=True)
    return client.create_experiment(MODELS_EXPERIMENT, artifact_location=settings.artifact_root.as_uri())


def register_model_dir(
    src: Path, name: str, settings: Settings, tags: dict[str, str] | None = None, alias: str | None = None
) -> int:
    """Log a Hugging Face model directory as run artifacts and register it as the next version of `name`."""
    client = _client(settings)
    run = client.create_run(_experiment_id(client, settings), run_name=f"register-{name}")
    client.log_artifacts(run.info.run_id, str(src), artifact_path="model")
    client.set_terminated(run.info.run_id)
    from mlflow.exceptions import MlflowException

    try:
        client.get_registered_model(name)
    except MlflowException:
        client.create_registered_model(name)
    version = client.create_model_version(
        name, source=f"{run.info.artifact_uri}/model", run_id=run.info.run_id, tags=tags or {}
    )
    if alias:
        client.set_registered_model_alias(name, alias, version.version)
    return int(version.version)


def alias_version(name: str, alias: str, settings: Settings) -> int:
    """The version number `models:/name@alias` points at."""
    return int(_client(settings).get_model_version_by_alias(name, alias).version)


def alias_tags(name: str, alias: str, settings: Settings) -> tuple[int, dict[str, str]] | None:
    """The version `models:/name@alias` points at and its tags; None when the alias does not exist."""
    from mlflow.exceptions import MlflowException

    try:
        version = _client(settings).get_model_version_by_alias(name, alias)
    except MlflowException:
        return None
    return int(version.version), dict(version.tags)


def set_alias(name: str, alias: str, version: int, settings: Settings) -> None:
    """Point `models:/name@alias` at `version`."""
    _client(settings).set_registered_model_alias(name, alias, str(version))


def tag_version(name: str, version: int, key: str, value: str, settings: Settings) -> None:
    """Set one tag on version `version` of `name`."""
    _client(settings).set_model_version_tag(name, str(version), key, value)


def latest_version(name: str, settings: Settings) -> int | None:
    """The newest version number of `name`, or None when it has none."""
    versions = _client(settings).search_model_versions(f"name='{name}'")
    return max((int(v.version) for v in versions), default=None)


def is_models_uri(uri: str) -> bool:
    """Whether `uri` names an MLflow model version (`models:/…`) rather than a directory or `s3://` path."""
    return uri.startswith(MODELS_SCHEME)


def models_uri(label: str) -> str:
    """`models:/` + `NAME/N` (a version label, as `resolve_model` and the workers report it) or `NAME@ALIAS`."""
    return f"{MODELS_SCHEME}{label}"


def parse_models_uri(uri: str) -> tuple[str, str | None, str | None]:
    """`models:/name@alias` or `models:/name/3` into (name, alias, version)."""
    rest = uri.removeprefix(MODELS_SCHEME)
    if "@" in rest:
        name, alias = rest.split("@", 1)
        return name, alias, None
    name, _, version = rest.rpartition("/")
    if not name or not version.isdigit():
        raise ValueError(f"model URI {uri!r}: expected models:/NAME@ALIAS or models:/NAME/VERSION")
    return name, None, version


def _publish(downloaded: Path, target: Path) -> None:
    """Move a finished download into place atomically; if another process (a worker of the job) won, keep theirs."""
    try:
        downloaded.rename(target)
    except OSError:
        if not (target / "config.json").exists():
            raise


def resolve_model(uri: str, settings: Settings) -> ResolvedModel:
    """Make any supported model URI a local directory, downloading into the data dir's cache once."""
    if is_models_uri(uri):
        client = _client(settings)
        name, alias, number = parse_models_uri(uri)
        version = client.get_model_version_by_alias(name, alias) if alias else client.get_model_version(name, number)
        target = paths.under(settings.models_dir, paths.component(name), f"v{version.version}")
        if not (target / "config.json").exists():
            import mlflow.artifacts

            staging = target.with_name(f"{target.name}.partial-{os.getpid()}")
            shutil.rmtree(staging, ignore_errors=True)
            staging.mkdir(parents=True)
            mlflow.artifacts.download_artifacts(artifact_uri=version.source, dst_path=str(staging))
            downloaded = staging / "model" if (staging / "model" / "config.json").exists() else staging
            _publish(downloaded, target)
            shutil.rmtree(staging, ignore_errors=True)
        return ResolvedModel(target, f"{name}/{version.version}")
    if uri.startswith("s3://"):
        from pronk.storage import filesystem

        fs = filesystem(uri, settings)
        digest = hashlib.sha256(uri.encode()).hexdigest()[:12]
        target = settings.models_dir / "s3" / digest
        if not (target / "config.json").exists():
            staging = target.with_name(f"{target.name}.partial-{os.getpid()}")
            shutil.rmtree(staging, ignore_errors=True)
            staging.parent.mkdir(parents=True, exist_ok=True)
            fs.get(uri.rstrip("/") + "/", str(staging), recursive=True)
            _publish(staging, target)
            shutil.rmtree(staging, ignore_errors=True)
        return ResolvedModel(target, uri)
    path = Path(uri.removeprefix("file://")).expanduser().resolve()
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"model {uri!r}: no config.json in {path}")
    return ResolvedModel(path, f"local:{path.name}")


def ensure_tiny_model(settings: Settings) -> int:
    """Make and register the tiny model as `pronk-tiny@live` unless that alias already exists."""
    served = alias_tags(TINY_MODEL_NAME, "live", settings)
    if served is not None:
        return served[0]
    from pronk.models.tiny_model import make_tiny_model

    build_dir = settings.data_dir / "build" / TINY_MODEL_NAME
    shutil.rmtree(build_dir, ignore_errors=True)
    make_tiny_model(build_dir)
    version = register_model_dir(
        build_dir, TINY_MODEL_NAME, tags=checkpoint_tags(read_spec(build_dir)), alias="live", settings=settings
    )
    shutil.rmtree(build_dir, ignore_errors=True)
    return version
