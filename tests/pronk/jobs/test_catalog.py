from pathlib import Path

import pytest
import yaml

from pronk.jobs.catalog import load_job_file, load_jobs, resolve_job
from pronk.jobs.schema import JobFileError
from pronk.jobs.versions import with_current_version
from pronk.settings import PROJECT_ROOT, Settings, get_settings

GOOD = """
job_id: job-0123abcd
model: models:/pronk-tiny@live
served_model_name: pronk-tiny
price_per_worker_hour: 0.1
engine:
  kv_cache_memory_bytes: 33554432
"""


def catalog(jobs_dir: Path) -> Settings:
    """The test session's settings with `jobs_dir` as the job catalog."""
    return get_settings().model_copy(update={"jobs_dir": jobs_dir})


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


def test_a_host_tier_adds_its_memory_to_the_worker_hour_price(tmp_path):
    job = load_job_file(write(tmp_path, "small", GOOD))
    assert job.scheduling.kv_host_tier_bytes == 0 and job.worker_hour_price == pytest.approx(0.1)
    tiered = GOOD + "price_per_host_gb_hour: 0.004\nscheduling:\n  kv_host_tier_bytes: 8000000000\n"
    assert load_job_file(write(tmp_path, "tiered", tiered)).worker_hour_price == pytest.approx(0.1 + 8 * 0.004)


def test_shipped_jobs_of_the_demo_and_the_suite_are_valid():
    settings = get_settings()
    assert Settings.model_fields["default_job"].default == resolve_job("smollm2-cpu", settings).job_id
    demo = resolve_job("smollm2-cpu", settings)
    assert demo.model_source and demo.quality.labelled_set and demo.engine.dtype == "float32"
    job = resolve_job("tiny-cpu", settings)
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
        load_jobs(catalog(tmp_path))


def test_unknown_job_lists_known_ones_by_id_and_name_which_it_both_accepts(tmp_path):
    write(tmp_path, "a", GOOD)
    with pytest.raises(KeyError, match=r"no job 'nope' \(a job id or name\); known: job-0123abcd \(a\)$"):
        resolve_job("nope", catalog(tmp_path))
    assert resolve_job("a", catalog(tmp_path)).job_id == resolve_job("job-0123abcd", catalog(tmp_path)).job_id


def test_a_broken_neighbour_does_not_stop_a_job_but_the_catalog_names_it(tmp_path, caplog):
    """A typo in one job file used to fail every batch of every job (their runs look jobs up by id)."""
    write(tmp_path, "good", GOOD)
    write(tmp_path, "typo", GOOD.replace("job-0123abcd", "job-0123abce") + "wokers: 3\n")
    assert resolve_job("job-0123abcd", catalog(tmp_path)).name == "good"
    assert "typo.yaml" in caplog.text
    with pytest.raises(KeyError, match=r"unreadable: .*wokers"):
        resolve_job("job-0123abce", catalog(tmp_path))
    with pytest.raises(JobFileError, match="wokers"):
        load_jobs(catalog(tmp_path))


def test_a_derived_job_states_only_its_differences(tmp_path):
    write(tmp_path, "small", GOOD + "scheduling: {routing: least_loaded, kv_pin_ttl_s: 5}\n")
    derived = write(tmp_path, "small-herd", "base: small\njob_id: job-0123abce\nscheduling: {admission: kv_budget}\n")
    job = load_job_file(derived)
    assert (job.name, job.job_id, job.model) == ("small-herd", "job-0123abce", "models:/pronk-tiny@live")
    assert (job.scheduling.routing, job.scheduling.kv_pin_ttl_s, job.scheduling.admission) == (
        "least_loaded",
        5,
        "kv_budget",
    )
    assert job.engine.kv_cache_memory_bytes == 33554432


def test_every_shipped_derived_job_file_states_only_differences():
    for path in get_settings().jobs_dir.glob("*.yaml"):
        raw = yaml.safe_load(path.read_text())
        if "base" not in raw:
            continue
        base = yaml.safe_load((path.parent / f"{raw['base']}.yaml").read_text())
        repeated = [
            f"{section}.{key}"
            for section, values in raw.items()
            if isinstance(values, dict) and isinstance(base.get(section), dict)
            for key, value in values.items()
            if base[section].get(key) == value
        ] + [key for key, value in raw.items() if not isinstance(value, dict) and base.get(key) == value]
        assert not repeated, f"{path.name} repeats its base's {repeated}"


@pytest.mark.parametrize(
    ("base", "message"), [("nowhere", "no job file"), ("../etc", "same folder"), ("loop", "circle")]
)
def test_a_bad_base_is_refused_naming_it(tmp_path, base, message):
    write(tmp_path, "loop", f"base: derived\n{GOOD}")
    path = write(tmp_path, "derived", f"base: {base}\njob_id: job-0123abce\n")
    with pytest.raises(JobFileError, match=message):
        load_job_file(path)


def test_a_flat_job_file_is_refused_with_how_to_migrate_and_migrate_rewrites_it(tmp_path):
    from typer.testing import CliRunner

    from pronk.cli.main import app

    flat = """
job_id: job-0123abcd
model: models:/pronk-tiny@live
served_model_name: pronk-tiny
price_per_worker_hour: 0.1
max_concurrency: 8
engine: {kv_cache_memory_bytes: 33554432, scheduling_policy: priority}
harness: {max_steps: 4, routing: least_loaded, tables_dir: data/tables, trace_sample: 3}
"""
    path = write(tmp_path, "flat", flat)
    with pytest.raises(JobFileError, match=r"harness.routing → scheduling.routing.*pronk job migrate"):
        load_job_file(path)
    result = CliRunner().invoke(app, ["job", "migrate", str(path)])
    assert result.exit_code == 0, result.output
    job = load_job_file(path)
    assert (job.scheduling.max_concurrency, job.scheduling.routing, job.scheduling.priority) == (
        8,
        "least_loaded",
        True,
    )
    assert (job.harness.max_steps, job.tools.sql.tables_dir, job.observability.trace_sample) == (4, "data/tables", 3)


def test_a_model_goes_to_its_one_job_else_the_live_one_else_the_default_else_a_clear_error():
    from pronk.jobs.catalog import AmbiguousModel, job_for_model

    jobs = load_jobs(get_settings())
    model = "smollm2-135m-instruct"  # agent-real (job-10d91d95) and smollm2-cpu (job-5a011201)
    nobody = frozenset[str]()
    assert job_for_model("pronk-tiny", jobs, nobody.__contains__, "tiny-cpu").job_id == "job-c0ffee01"
    assert job_for_model(model, jobs, {"job-5a011201"}.__contains__, "tiny-cpu").job_id == "job-5a011201"
    assert job_for_model(model, jobs, nobody.__contains__, "agent-real").job_id == "job-10d91d95"
    with pytest.raises(AmbiguousModel, match=r"job-10d91d95 \(agent-real\), job-5a011201 \(smollm2-cpu\) all serve"):
        job_for_model(model, jobs, nobody.__contains__, "tiny-cpu")
    both = {"job-10d91d95", "job-5a011201"}.__contains__
    assert job_for_model(model, jobs, both, "smollm2-cpu").job_id == "job-5a011201"
    with pytest.raises(AmbiguousModel, match=r"agent-real, live.*smollm2-cpu, live"):
        job_for_model(model, jobs, both, "tiny-cpu")
    with pytest.raises(AmbiguousModel, match="no job serves model 'gpt-x'"):
        job_for_model("gpt-x", jobs, nobody.__contains__, "tiny-cpu")


def test_the_simulated_h100_job_asks_for_a_sim_engine_sized_by_the_gpu():
    job = resolve_job("sim-h100-qwen3-8b", get_settings(), versions=False)
    assert (job.engine.backend, job.sim.gpu, job.engine.kv_cache_memory_bytes) == ("sim", "h100_sxm", None)
    assert job.sim.memory_bytes == int(79.6 * (1 << 30))
    assert "backend" not in job.vllm_kwargs()
    assert (PROJECT_ROOT / job.sim.architecture / "config.json").exists()
    assert (PROJECT_ROOT / job.sim.timing).exists()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("engine: {backend: sim}\nsim: {gpu: cpu, timing: data/sim/timing/cpu-tiny.json}\n", "num_gpu_blocks"),
        ("engine: {backend: sim}\nscheduling: {kv_host_tier_bytes: 1048576}\n", "host tier"),
    ],
)
def test_a_simulated_engine_it_cannot_be_is_refused(tmp_path, text, message):
    path = write(tmp_path, "sim", GOOD.replace("engine:\n  kv_cache_memory_bytes: 33554432\n", "") + text)
    with pytest.raises(JobFileError, match=message):
        load_job_file(path)


def test_an_unknown_routing_policy_is_refused_when_the_job_is_read_not_when_its_router_is_built(tmp_path):
    path = write(tmp_path, "bad", GOOD + "scheduling: {routing: random}\n")
    with pytest.raises(JobFileError, match=r"scheduling\.routing' value 'random'"):
        load_job_file(path)


def test_a_job_without_a_configuration_version_resolves_to_its_file_as_it_is(tmp_path):
    write(tmp_path, "a", GOOD)
    settings = catalog(tmp_path).model_copy(update={"data_dir": tmp_path / "data"})
    job_file = resolve_job("a", settings, versions=False)
    assert with_current_version(job_file, settings) is job_file  # nothing to apply: no second validation
