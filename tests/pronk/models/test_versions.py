"""The one version resolver and the `models:/` predicate, on MLflow/SQLite in a temp dir."""

from __future__ import annotations

import pytest

from pronk.jobs.schema import JobConfig
from pronk.models.checkpoints import CheckpointMismatch
from pronk.models.registry import is_models_uri, models_uri, parse_models_uri, register_model_dir, set_alias
from pronk.models.versions import (
    ModelMismatch,
    NotLeapable,
    leap_target,
    reference_version,
    resolve_version,
)
from pronk.settings import Settings
from tests.pronk.api.test_weights_routes import checkpoint


def job(model: str) -> JobConfig:
    return JobConfig.model_validate(
        {"job_id": "job-0000beef", "name": "m", "model": model, "served_model_name": "m", "price_per_worker_hour": 0.1}
    )


@pytest.fixture(scope="module")
def settings(tmp_path_factory) -> Settings:
    """Model `m` with versions 1 and 2, `m@live` → 1."""
    tmp = tmp_path_factory.mktemp("versions")
    settings = Settings(data_dir=tmp / "data", storage_uri=str(tmp / "store"), s3_endpoint_url=None)
    set_alias("m", "live", register_model_dir(checkpoint(tmp / "v1"), "m", settings=settings), settings)
    register_model_dir(checkpoint(tmp / "v2"), "m", settings=settings)
    return settings


def test_models_uris_are_recognised_built_and_parsed():
    assert is_models_uri("models:/m@live") and is_models_uri("models:/m/3")
    assert not any(is_models_uri(uri) for uri in ("/srv/ckpt", "s3://bucket/m", "file:///m", "m/3", "models/m"))
    assert models_uri("m/3") == "models:/m/3" and models_uri("m@live") == "models:/m@live"
    assert parse_models_uri(models_uri("m/3")) == ("m", None, "3")
    assert parse_models_uri("models:/m@live") == ("m", "live", None)


def test_every_form_of_reference_resolves_to_a_version_number(settings):
    cases = {2: 2, "2": 2, "live": 1, "models:/m/2": 2, "models:/m@live": 1, "models:/m/7": 7}
    assert {ref: resolve_version("m", ref, settings) for ref in cases} == cases
    with pytest.raises(ModelMismatch, match="not of 'm'"):
        resolve_version("m", "models:/other/1", settings)
    with pytest.raises(Exception, match="nope"):
        resolve_version("m", "nope", settings)


def test_reference_version_follows_the_jobs_model_else_the_newest(settings):
    assert reference_version("m", "models:/m@live", settings) == 1
    assert reference_version("m", "models:/m/2", settings) == 2
    assert reference_version("m", "models:/other@live", settings) == 2
    assert reference_version("m", "/srv/some/dir", settings) == 2
    assert reference_version("m", None, settings) == 2
    assert reference_version("unregistered", None, settings) is None


def test_leap_target_checks_the_job_the_uri_and_the_fit(settings, tmp_path):
    with pytest.raises(NotLeapable, match="not an MLflow model"):
        leap_target(job(str(tmp_path)), "models:/m/2", {"m/1"}, settings)
    with pytest.raises(ModelMismatch, match="serves model 'm'; models:/other/1 is another model"):
        leap_target(job("models:/m@live"), "models:/other/1", {"m/1"}, settings)
    assert leap_target(job("models:/m@live"), "models:/m/2", {"m/1", "local:x"}, settings) == 2
    wrong = checkpoint(tmp_path / "wrong", {"lm_head.weight": (16, 8)})
    with pytest.raises(CheckpointMismatch):
        leap_target(job("models:/m@live"), str(wrong), {"m/1"}, settings)
