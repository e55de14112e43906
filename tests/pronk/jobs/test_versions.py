"""Configuration versions: the job file stays the base, the current version's changes apply on every load."""

from __future__ import annotations

import json

import pytest

from pronk.jobs.catalog import resolve_job
from pronk.jobs.schema import JobFileError
from pronk.jobs.versions import current_version, job_versions, save_version, set_current_version, versions_dir
from pronk.settings import Settings, get_settings

JOB = "job-abcdef12"
JOB_FILE = f"""
job_id: {JOB}
name: versioned
model: models:/pronk-tiny@live
served_model_name: pronk-tiny
price_per_worker_hour: 0.05
engine: {{max_model_len: 2048, max_num_seqs: 16, kv_cache_memory_bytes: 67108864}}
scheduling: {{max_concurrency: 8, kv_pin_ttl_s: 30, routing: trace_affinity}}
"""


def base(catalog):
    return resolve_job(JOB, catalog, versions=False)


@pytest.fixture
def catalog(tmp_path) -> Settings:
    """Settings whose job catalog holds the one job file, with its configuration versions under a data dir of its
    own."""
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "versioned.yaml").write_text(JOB_FILE)
    return get_settings().model_copy(update={"jobs_dir": tmp_path / "jobs", "data_dir": tmp_path / "data"})


def test_versions_apply_over_the_job_file(catalog):
    assert current_version(JOB, catalog) is None and resolve_job(JOB, catalog).engine.max_num_seqs == 16
    first = save_version(
        base(catalog), {"engine": {"max_num_seqs": 32}, "scheduling": {"max_concurrency": 24}}, "r1", catalog
    )
    job = resolve_job(JOB, catalog)
    assert (first.version, job.engine.max_num_seqs, job.scheduling.max_concurrency) == (1, 32, 24)
    assert job.scheduling.kv_pin_ttl_s == 30  # a section merges key by key
    assert job.engine.max_model_len == 2048 and job.engine.kv_cache_memory_bytes == 67108864  # merged, not replaced
    second = save_version(base(catalog), {"scheduling": {"routing": "least_loaded"}}, "r2", catalog)
    job = resolve_job("versioned", catalog)
    assert (second.version, job.scheduling.routing, job.engine.max_num_seqs) == (2, "least_loaded", 16)
    assert resolve_job(JOB, catalog, versions=False).scheduling.routing == "trace_affinity"
    assert [v.mlflow_run_id for v in job_versions(JOB, catalog)] == ["r1", "r2"]
    set_current_version(JOB, 1, catalog)
    assert resolve_job(JOB, catalog).engine.max_num_seqs == 32
    set_current_version(JOB, 0, catalog)
    assert resolve_job(JOB, catalog).engine.max_num_seqs == 16


def test_bad_versions_are_refused(catalog):
    with pytest.raises(JobFileError, match="not tunable"):
        save_version(base(catalog), {"model": "elsewhere"}, None, catalog)
    with pytest.raises(JobFileError, match="invalid"):
        save_version(base(catalog), {"engine": {"max_num_seqs": 0}}, None, catalog)
    assert job_versions(JOB, catalog) == []
    with pytest.raises(JobFileError, match="no configuration version 7"):
        set_current_version(JOB, 7, catalog)
    save_version(base(catalog), {"scheduling": {"max_concurrency": 4}}, None, catalog)
    (versions_dir(JOB, catalog) / "v1.json").write_text("{not json")  # a damaged version is refused, never half applied
    with pytest.raises(JobFileError, match="unreadable"):
        resolve_job(JOB, catalog)


def test_a_version_written_before_sections_is_read_in_sections(catalog):
    save_version(base(catalog), {"workers": 1}, None, catalog)
    flat = {"job_id": JOB, "version": 1, "changes": {"max_concurrency": 4, "harness": {"routing": "least_loaded"}}}
    (versions_dir(JOB, catalog) / "v1.json").write_text(json.dumps(flat))
    job = resolve_job(JOB, catalog)
    assert (job.scheduling.max_concurrency, job.scheduling.routing) == (4, "least_loaded")
