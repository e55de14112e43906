from pathlib import Path

import pytest

from pronk.jobs import JobFileError, get_job, load_job_file, load_jobs

GOOD = """
job_id: job-0123abcd
model: models:/pronk-tiny@live
served_model_name: pronk-tiny
price_per_worker_hour: 0.1
engine:
  kv_cache_memory_bytes: 33554432
"""


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    return path


def test_good_job_file_loads_with_defaults(tmp_path):
    job = load_job_file(write(tmp_path, "small", GOOD))
    assert job.job_id == "job-0123abcd"
    assert job.name == "small"
    assert job.engine.enable_prefix_caching is True
    assert job.engine.as_vllm_kwargs()["kv_cache_memory_bytes"] == 33554432


def test_shipped_default_job_is_valid():
    job = get_job("tiny-cpu")
    assert job.job_id == "job-c0ffee01"
    assert job.workers == 2
    assert job.engine.kv_cache_memory_bytes


def test_unknown_key_names_file_key_and_value(tmp_path):
    path = write(tmp_path, "typo", GOOD + "wokers: 3\n")
    with pytest.raises(JobFileError) as err:
        load_job_file(path)
    assert str(path) in str(err.value) and "'wokers'" in str(err.value) and "3" in str(err.value)


def test_bad_value_names_nested_key_and_value(tmp_path):
    path = write(tmp_path, "bad", GOOD.replace("33554432", "-5"))
    with pytest.raises(JobFileError, match=r"engine\.kv_cache_memory_bytes' value -5"):
        load_job_file(path)


@pytest.mark.parametrize("job_id", ["job-123", "JOB-0123abcd", "job-0123abcz"])
def test_job_id_format_is_enforced(tmp_path, job_id):
    with pytest.raises(JobFileError, match="job_id"):
        load_job_file(write(tmp_path, "x", GOOD.replace("job-0123abcd", job_id)))


def test_duplicate_job_ids_are_rejected(tmp_path):
    write(tmp_path, "a", GOOD)
    write(tmp_path, "b", GOOD)
    with pytest.raises(JobFileError, match="already used"):
        load_jobs(tmp_path)


def test_unknown_job_lists_known_ones(tmp_path):
    write(tmp_path, "a", GOOD)
    with pytest.raises(KeyError, match="job-0123abcd"):
        get_job("nope", tmp_path)
