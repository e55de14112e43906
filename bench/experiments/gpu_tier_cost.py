"""On a GPU: what does a KV host tier save? Loading an evicted prefix back from host memory against recomputing it.

The host tier (issue 27, `engine/kv_tier.py`) pays when copying a prefix's KV from host memory costs less than
the prefill that would otherwise recompute it. On this project's CPU engines that holds by a wide margin; this
script measures both sides on a GPU for a 3B-shaped Llama (`bench.experiments.llama3b`), with nothing but torch
and CuPy, so it runs on a device machine where vLLM's GPU build is not installed.

- Recompute: one prefill of a prefix of L tokens through the model's 28 decoder layers (bf16, random weights,
  PyTorch's fused attention with grouped KV heads; the rotary embedding, embeddings and LM head left out, so the
  figure is a little low).
- Store and load: the prefix's KV blocks (16 tokens each, vLLM's paged layout per layer) between the engine's
  cache on the GPU, at scattered block ids, and a pinned host buffer. `bulk`: per layer and key or value, one
  gather on the GPU and one DMA, the best a tier can do. `per block`: one cudaMemcpyAsync per layer, key or value,
  and block (32 KiB), issued through CuPy from Python: what copies cost when nothing batches them (vLLM's own GPU
  worker batches them, `swap_blocks_batch`). `batched`: every block's copy in one launch of a Triton kernel that
  reads the host blocks over the bus, as vLLM's copy worker does for blocks of 28 KiB or less.

    python -m bench.experiments.gpu_tier_cost [--out bench/results/gpu_tier_cost.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from bench.experiments.llama3b import KV_BYTES_PER_TOKEN, SHAPE

BLOCK_TOKENS = 16
DEVICE_BLOCKS = 4096  # the engine's cache: 65k tokens, 7.5 GB
HOST_BLOCKS = 2048  # the host tier's buffer: 32k tokens, 3.8 GB pinned
PREFIXES = (512, 2048, 8192)
HOST_TO_DEVICE = 1  # cudaMemcpyKind
BATCHED_PROGRAMS = 12  # vLLM's tuning of its copy kernel on an H100: within 5% of peak at 8-32 KiB blocks
REPEATS = 7


def timed(fn, repeats: int = REPEATS, warmup: int = 2) -> list[float]:
    """Milliseconds of each of `repeats` calls, by CUDA events, after `warmup` untimed ones."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return times


class Layers:
    """The decoder layers of the 3B shape with random bf16 weights: enough to time a prefill."""

    def __init__(self, device: torch.device) -> None:
        hidden, inter = SHAPE["hidden_size"], SHAPE["intermediate_size"]
        self.heads, self.kv_heads, self.head_dim = (
            SHAPE["num_attention_heads"],
            SHAPE["num_key_value_heads"],
            SHAPE["head_dim"],
        )
        qkv = (self.heads + 2 * self.kv_heads) * self.head_dim

        def weight(rows: int, cols: int) -> torch.Tensor:
            return torch.randn(rows, cols, device=device, dtype=torch.bfloat16) * rows**-0.5

        self.weights = [
            (
                weight(hidden, qkv),
                weight(self.heads * self.head_dim, hidden),
                weight(hidden, 2 * inter),
                weight(inter, hidden),
            )
            for _ in range(SHAPE["num_hidden_layers"])
        ]
        self.hidden = hidden

    def prefill_flops(self, tokens: int) -> float:
        """The prefill's multiply-adds, twice: the weights' for every token, and causal attention's (half of L x L)."""
        weights = sum(w.numel() for w in self.weights[0]) * SHAPE["num_hidden_layers"]
        attention = 2 * tokens * tokens / 2 * self.heads * self.head_dim * SHAPE["num_hidden_layers"]
        return 2 * (weights * tokens + attention)

    @torch.inference_mode()
    def prefill(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.shape[0]
        q_size, kv_size = self.heads * self.head_dim, self.kv_heads * self.head_dim
        for w_qkv, w_o, w_gate_up, w_down in self.weights:
            h = F.rms_norm(x, (self.hidden,))
            q, k, v = (h @ w_qkv).split((q_size, kv_size, kv_size), dim=-1)
            # [batch 1, heads, tokens, head_dim]: the fused kernels take 4-dimensional inputs only, and grouped
            # attention (`enable_gqa`) falls back to the quadratic math kernel in some releases, so the KV heads are
            # repeated for the query heads
            q = q.view(1, tokens, self.heads, self.head_dim).transpose(1, 2)
            group = self.heads // self.kv_heads
            k, v = (
                t.view(1, tokens, self.kv_heads, self.head_dim).transpose(1, 2).repeat_interleave(group, dim=1)
                for t in (k, v)
            )
            attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + attn.transpose(1, 2).reshape(tokens, q_size) @ w_o
            gate, up = (F.rms_norm(x, (self.hidden,)) @ w_gate_up).chunk(2, dim=-1)
            x = x + (F.silu(gate) * up) @ w_down
        return x


@triton.jit
def _copy_blocks(src_addrs, dst_addrs, n_jobs, WORDS: tl.constexpr):
    """Copy `n_jobs` blocks of WORDS 8-byte words, each from its own source address to its own destination; the
    programs take jobs in turn. A GPU reads pinned host memory at its own address, so one launch loads them all."""
    job = tl.program_id(0)
    offsets = tl.arange(0, WORDS)
    while job < n_jobs:
        src = tl.load(src_addrs + job).to(tl.pointer_type(tl.int64))
        dst = tl.load(dst_addrs + job).to(tl.pointer_type(tl.int64))
        tl.store(dst + offsets, tl.load(src + offsets))
        job += tl.num_programs(0)


def kv_caches(blocks: int, device: torch.device, pin: bool) -> list[torch.Tensor]:
    """One paged KV tensor per layer: [key and value, blocks, tokens a block, KV heads, head_dim]."""
    shape = (2, blocks, BLOCK_TOKENS, SHAPE["num_key_value_heads"], SHAPE["head_dim"])
    return [
        torch.zeros(shape, dtype=torch.bfloat16, device=device, pin_memory=pin)
        for _ in range(SHAPE["num_hidden_layers"])
    ]


def tier_copies(device_cache: list[torch.Tensor], host_cache: list[torch.Tensor], tokens: int) -> dict[str, list]:
    """Milliseconds to store a prefix of `tokens` to the host tier and to load it back, both ways of copying."""
    blocks = tokens // BLOCK_TOKENS
    generator = torch.Generator().manual_seed(tokens)
    ids = torch.randperm(DEVICE_BLOCKS, generator=generator)[:blocks].to(device_cache[0].device)
    host = slice(0, blocks)  # a fresh store takes free host blocks, which a tier hands out in order

    def store() -> None:
        for dev, cpu in zip(device_cache, host_cache, strict=True):
            for kv in (0, 1):  # key, then value: each a contiguous run of host blocks, so one DMA
                cpu[kv, host].copy_(dev[kv].index_select(0, ids), non_blocking=True)

    def load() -> None:
        for dev, cpu in zip(device_cache, host_cache, strict=True):
            for kv in (0, 1):
                dev[kv].index_copy_(0, ids, cpu[kv, host].to(dev.device, non_blocking=True))

    def load_per_block() -> None:
        import cupy  # the device machine's image has it; nothing else here needs it

        stream = torch.cuda.current_stream().cuda_stream
        for dst, src in copies:
            cupy.cuda.runtime.memcpyAsync(dst, src, chunk, HOST_TO_DEVICE, stream)

    chunk = device_cache[0][0, 0].nbytes  # one block's keys (or values) of one layer: 32 KiB
    copies = [
        (dev[kv, device_id].data_ptr(), cpu[kv, host_id].data_ptr())
        for dev, cpu in zip(device_cache, host_cache, strict=True)
        for kv in (0, 1)
        for host_id, device_id in enumerate(ids.tolist())
    ]
    src_addrs = torch.tensor([src for _, src in copies], dtype=torch.int64, device=ids.device)
    dst_addrs = torch.tensor([dst for dst, _ in copies], dtype=torch.int64, device=ids.device)

    def load_batched() -> None:
        _copy_blocks[(min(BATCHED_PROGRAMS, len(copies)),)](src_addrs, dst_addrs, len(copies), WORDS=chunk // 8)

    store()  # the batched load must bring the stored blocks back where they were
    device_cache[0][:, ids] = 0
    load_batched()
    if not torch.equal(device_cache[0][:, ids].cpu(), host_cache[0][:, host]):
        raise AssertionError("the batched load copied the wrong bytes")
    figures = {"store_bulk_ms": timed(store), "load_bulk_ms": timed(load), "load_batched_ms": timed(load_batched)}
    figures["load_per_block_ms"] = timed(load_per_block, repeats=3, warmup=1)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench/results/gpu_tier_cost.json"))
    args = parser.parse_args()
    device = torch.device("cuda")
    started = time.monotonic()
    layers = Layers(device)
    device_cache, host_cache = (
        kv_caches(DEVICE_BLOCKS, device, pin=False),
        kv_caches(HOST_BLOCKS, torch.device("cpu"), pin=True),
    )
    for layer in device_cache:
        layer.normal_()  # values, so that a copy can be checked
    rows = []
    for tokens in PREFIXES:
        x = torch.randn(tokens, SHAPE["hidden_size"], device=device, dtype=torch.bfloat16)
        row: dict = {"prefix_tokens": tokens, "kv_bytes": tokens * KV_BYTES_PER_TOKEN}
        row["recompute_ms"] = timed(lambda x=x: layers.prefill(x))
        row |= tier_copies(device_cache, host_cache, tokens)
        recompute, load = statistics.median(row["recompute_ms"]), statistics.median(row["load_bulk_ms"])
        row["load_gb_s"] = round(row["kv_bytes"] / load / 1e6, 1)
        row["store_gb_s"] = round(row["kv_bytes"] / statistics.median(row["store_bulk_ms"]) / 1e6, 1)
        row["recompute_over_load"] = round(recompute / load, 2)
        row["recompute_tflop_s"] = round(layers.prefill_flops(tokens) / recompute / 1e9, 1)
        row["recompute_over_load_per_block"] = round(recompute / statistics.median(row["load_per_block_ms"]), 2)
        row["recompute_over_load_batched"] = round(recompute / statistics.median(row["load_batched_ms"]), 2)
        rows.append(row)
        print(
            json.dumps(
                {k: v for k, v in row.items() if not k.endswith("_ms")}
                | {k: round(statistics.median(v), 3) for k, v in row.items() if k.endswith("_ms")}
            ),
            flush=True,
        )
    result = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "shape": SHAPE,
        "kv_bytes_per_token": KV_BYTES_PER_TOKEN,
        "block_tokens": BLOCK_TOKENS,
        "repeats": REPEATS,
        "rows": rows,
        "seconds": round(time.monotonic() - started, 1),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
