"""The KV host tier's copy worker on plain tensors, and the engine arguments a job's tier becomes."""

from __future__ import annotations

import pytest
import torch
from vllm.v1.kv_offload.base import CanonicalKVCacheRef, CanonicalKVCaches, CanonicalKVCacheTensor, GPULoadStoreSpec
from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec

from pronk.engine.kv_tier import VLLM_CPU_VERSION, HostCopyWorker, HostTierUnavailable, host_tier_config
from pronk.settings import get_settings

BLOCKS, PAGE = 12, 8


def caches() -> CanonicalKVCaches:
    """Two KV tensors (say K and V of one layer) whose every block holds its own bytes."""
    tensors = [
        CanonicalKVCacheTensor(torch.arange(BLOCKS * PAGE, dtype=torch.int8).view(BLOCKS, PAGE) + offset, PAGE)
        for offset in (0, 50)
    ]
    return CanonicalKVCaches(tensors, [[CanonicalKVCacheRef(0, PAGE), CanonicalKVCacheRef(1, PAGE)]])


@pytest.mark.parametrize("blocks_per_chunk", [1, 2])
def test_blocks_stored_to_the_host_come_back_into_other_blocks_byte_for_byte(blocks_per_chunk):
    kv = caches()
    original = [t.tensor.clone() for t in kv.tensors]
    worker = HostCopyWorker(kv, blocks_per_chunk, num_chunks=8)
    # blocks 3, 7, 9 of a request starting at its logical block 1: with 2 blocks a chunk, the first chunk's first
    # slot belongs to the request's block 0, which is not in this transfer
    first = 1
    stored = GPULoadStoreSpec([3, 7, 9], group_sizes=[3], block_indices=[first])
    chunks = -(-(3 + first % blocks_per_chunk) // blocks_per_chunk)
    assert worker.submit_store(1, stored, CPULoadStoreSpec(list(range(5, 5 + chunks))))
    for t in kv.tensors:
        t.tensor.zero_()
    assert worker.submit_load(
        2, CPULoadStoreSpec(list(range(5, 5 + chunks))), GPULoadStoreSpec([0, 1, 2], [3], [first])
    )

    for t, before in zip(kv.tensors, original, strict=True):
        assert torch.equal(t.tensor[[0, 1, 2]], before[[3, 7, 9]])
        assert not t.tensor[3:].any()  # nothing else was written
    done = worker.get_finished()
    assert [(r.job_id, r.success, r.transfer_size) for r in done] == [(1, True, 3 * PAGE * 2), (2, True, 3 * PAGE * 2)]
    assert worker.get_finished() == []


def test_the_tier_is_vllms_own_offloading_on_an_accelerator_and_pronks_copy_spec_on_cpu():
    gpu = host_tier_config(1 << 30, "cuda", "0.33.0")
    assert gpu["kv_connector"] == "OffloadingConnector" and "spec_module_path" not in gpu["kv_connector_extra_config"]
    cpu = host_tier_config(1 << 30, "cpu", VLLM_CPU_VERSION)["kv_connector_extra_config"]
    assert cpu["spec_module_path"] == "pronk.engine.kv_tier" and cpu["spec_name"] == "HostCopyOffloadingSpec"
    for extra in (gpu["kv_connector_extra_config"], cpu):
        assert extra["cpu_bytes_to_use"] == 1 << 30 and extra["offload_prompt_only"] is False
    policy = ("TraceAwareCachePolicy", "pronk.engine.kv_tier_policy")
    assert (cpu["eviction_policy"], cpu["cache_policy_module_path"]) == policy
    assert "eviction_policy" not in gpu["kv_connector_extra_config"]  # another release than the policy's: vLLM's LRU


def test_another_vllm_cpu_release_is_refused_naming_the_one_it_needs():
    with pytest.raises(HostTierUnavailable, match=f"needs vllm-cpu {VLLM_CPU_VERSION}.*has 0.40.0"):
        host_tier_config(1 << 30, "cpu", "0.40.0")


def test_a_job_with_a_host_tier_starts_its_workers_with_the_offloading_connector():
    from pronk.jobs.catalog import resolve_job
    from pronk.stack.worker import host_tier

    assert host_tier(resolve_job("agent-long", get_settings())) == {}
    (config,) = host_tier(resolve_job("agent-long-tiered", get_settings())).values()
    assert config.kv_connector == "OffloadingConnector" and config.kv_role == "kv_both"
    assert (
        config.kv_connector_extra_config["cpu_bytes_to_use"]
        == resolve_job("agent-long-tiered", get_settings()).scheduling.kv_host_tier_bytes
    )
