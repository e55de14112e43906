"""A worker of an `engine.backend: sim` job: the engine arguments that make its vLLM engine a simulated one."""

import pytest

from pronk.engine.kv_retention import pin_settings
from pronk.engine.sim_executor import SIM_KEY
from pronk.jobs.catalog import resolve_job
from pronk.settings import PROJECT_ROOT, get_settings
from pronk.stack.worker import simulated


def sim_job(**sim):
    job = resolve_job("sim-h100-qwen3-8b", get_settings(), versions=False)
    return job.model_copy(update={"sim": job.sim.model_copy(update=sim)})


def test_a_sim_job_runs_its_architecture_under_the_simulated_executor_with_the_models_tokenizer():
    kwargs = simulated(sim_job(), {"additional_config": pin_settings(0.5), "max_num_seqs": 256}, "/models/tiny/v1")
    assert kwargs["model"] == str(PROJECT_ROOT / "data" / "sim" / "models" / "qwen3-8b")
    assert kwargs["tokenizer"] == "/models/tiny/v1"
    assert kwargs["distributed_executor_backend"] == "pronk.engine.sim_executor.SimExecutor"
    assert kwargs["max_num_seqs"] == 256
    assert kwargs["additional_config"]["pronk_kv_pin_max_fraction"] == 0.5  # the pinning scheduler's, kept
    sim = kwargs["additional_config"][SIM_KEY]
    assert (sim["speed_factor"], sim["gpu_memory_bytes"]) == (1.0, int(79.6 * (1 << 30)))
    assert sim["timing"] == str(PROJECT_ROOT / "data" / "sim" / "timing" / "h100-vllm-qwen3-8b.json")
    assert "num_gpu_blocks_override" not in kwargs


def test_a_block_count_fixes_the_kv_cache():
    kwargs = simulated(sim_job(num_gpu_blocks=4096), {}, "/models/tiny/v1")
    assert kwargs["num_gpu_blocks_override"] == 4096


def test_a_timing_file_of_another_gpu_is_refused():
    with pytest.raises(SystemExit, match="timed on h200_sxm, not h100_sxm"):
        simulated(sim_job(timing="data/sim/timing/h200-vllm-qwen3-8b.json"), {}, "/models/tiny/v1")
