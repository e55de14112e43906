"""The wire format between the router and an engine worker: one step in, one step result out; and a Leap's two
calls to a worker, stage new weights and reload them (`pronk.engine.weight_swap` serves them)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[dict[str, Any]] | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.get("text", "") for part in self.content if isinstance(part, dict))
        return self.content or ""


class SamplingSpec(BaseModel):
    """The sampling parameters pronk passes to vLLM's `SamplingParams`."""

    model_config = ConfigDict(extra="forbid")

    max_tokens: int = Field(default=256, ge=1, description="Most tokens to generate.")
    temperature: float = Field(default=1.0, ge=0, le=2, description="0 is greedy.")
    top_p: float = Field(default=1.0, gt=0, le=1)
    seed: int | None = None
    stop: list[str] | None = None
    ignore_eos: bool = Field(default=False, description="Generate exactly max_tokens (replay traffic).")
    json_schema: dict[str, Any] | None = Field(default=None, description="Constrain output to this JSON schema.")


class AdmissionHints(BaseModel):
    """How a step asks to be admitted (`pronk.engine.admission.KvBudget`)."""

    model_config = ConfigDict(extra="forbid")

    started: bool = Field(default=False, description="The trace already ran a step: it goes before new traces.")
    wait_s: float = Field(default=5.0, ge=0, le=60, description="Longest wait for room before 'not admitted'.")
    since: float | None = Field(
        default=None,
        description="Wall time the trace's family first asked for a step: its place in the worker's admission "
        "queue and its age when room runs short (older traces are never paused for younger ones); "
        "`trace_started_at` when omitted.",
    )


class StepRequest(BaseModel):
    """One generation: chat messages or prompt token ids, never both."""

    model_config = ConfigDict(extra="forbid")

    request_id: str = Field(min_length=1)
    messages: list[ChatMessage] | None = None
    prompt_token_ids: list[int] | None = None
    sampling: SamplingSpec = Field(default_factory=SamplingSpec)
    trace_id: str | None = Field(default=None, description="The trace this step belongs to, for affinity.")
    affinity_key: str | None = Field(
        default=None,
        description="Steps sharing this key share a prefix (a trace and its fan-out children); defaults to trace_id.",
    )
    kv_pin_ttl_s: float = Field(
        default=0.0,
        ge=0,
        description="Keep this trace's prefix pinned in the KV cache this long after the step (a tool-call gap "
        "follows).",
    )

    trace_started_at: float | None = Field(
        default=None,
        description="Wall time the trace's family first asked for a step: its place in the admission queue and, "
        "under the engine's priority scheduling, its priority (earlier runs first).",
    )
    admission: AdmissionHints | None = Field(
        default=None, description="Ask the worker to admit this step by its KV budget before running it."
    )

    @model_validator(mode="after")
    def _one_prompt(self) -> StepRequest:
        if (self.messages is None) == (self.prompt_token_ids is None):
            raise ValueError("give exactly one of messages or prompt_token_ids")
        return self


class ReleaseRequest(BaseModel):
    """Traces that ended: let go of their KV pins now rather than at the TTL."""

    model_config = ConfigDict(extra="forbid")

    trace_ids: list[str] = Field(min_length=1, max_length=1024)


class StepResult(BaseModel):
    request_id: str
    text: str
    token_ids: list[int]
    prompt_tokens: int
    cached_tokens: int = Field(description="Prompt tokens not computed: found in the engine's cache or loaded.")
    host_tier_tokens: int = Field(default=0, description="Of the cached tokens, those loaded from the KV host tier.")
    completion_tokens: int
    finish_reason: str
    model_version: str
    worker_id: str
    queue_time_s: float = Field(description="From arrival in the engine to first scheduling.")
    engine_time_s: float = Field(description="From arrival in the worker to the last token.")


class HostTierStats(BaseModel):
    """A worker's KV host tier since it started (`scheduling.kv_host_tier_bytes`); all counts cumulative."""

    capacity_bytes: int = Field(description="Host memory the tier was given.")
    lookup_tokens: int = Field(default=0, description="Prompt tokens the engine missed and looked up in the tier.")
    hit_tokens: int = Field(default=0, description="Of those, tokens the tier held.")
    loaded_tokens: int = Field(default=0, description="Prompt tokens loaded from the tier instead of recomputed.")
    stores: int = Field(default=0, description="Copies from the engine's cache to the tier.")
    stored_bytes: int = 0
    store_seconds: float = 0.0
    loads: int = Field(default=0, description="Copies from the tier back into the engine's cache.")
    loaded_bytes: int = 0
    load_seconds: float = 0.0


class WorkerStats(BaseModel):
    """What a worker advertises to the router: load, cache, version."""

    worker_id: str
    job_id: str
    model_version: str
    running: int = 0
    waiting: int = 0
    in_flight: int = 0
    kv_cache_usage: float = 0.0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    preemptions: int = Field(
        default=0, description="Requests the engine preempted (KV freed, recomputed when resumed); cumulative."
    )
    requests_served: int = 0
    leap_state: str = Field(
        default="ready", description="Leap: ready, uploading (staging new weights), reloading or failed."
    )
    staged_version: str | None = Field(
        default=None, description="Leap: the weight version staged on disk, ready to reload."
    )
    kv_capacity_tokens: int = Field(default=0, description="Tokens the engine's KV cache holds.")
    admission_limit_tokens: int = Field(default=0, description="Admission budget: capacity minus headroom.")
    admission_free_tokens: int = Field(default=0, description="Budget not reserved by admitted traces.")
    admission_new_trace_room_tokens: int = Field(
        default=0, description="Budget a new trace can be admitted into: free tokens less the growth reserve."
    )
    admission_resident_tokens: int = Field(default=0, description="Tokens reserved by admitted traces.")
    admission_peak_tokens: int = Field(default=0, description="Most tokens ever reserved at once.")
    admission_resident: int = Field(default=0, description="Admitted traces (running or in a tool gap).")
    admission_waiting: int = Field(default=0, description="Steps waiting for room.")
    admission_paused: int = Field(default=0, description="Traces paused to make room (their next step re-admits).")
    admission_host_limit_tokens: int = Field(default=0, description="With a KV host tier: paused traces' budget.")
    admission_host_tokens: int = Field(default=0, description="With a KV host tier: paused traces' context.")
    admission_counts: dict[str, int] = Field(
        default_factory=dict, description="Cumulative: admitted, waited, timed_out, refused, paused."
    )
    host_tier: HostTierStats | None = Field(default=None, description="The KV host tier, where the job has one.")


class StageRequest(BaseModel):
    model_uri: str = Field(min_length=1, description="What to stage: `models:/NAME/N`, a local dir or s3://.")


class StageResult(BaseModel):
    worker_id: str
    version: str = Field(description="Version label of the staged weights.")
    path: str
    seconds: float = Field(description="Download and validation time.")


class ReloadRequest(BaseModel):
    version: str = Field(
        min_length=1, description="A version staged on this worker (or the one it serves, to re-load it)."
    )


class ReloadResult(BaseModel):
    worker_id: str
    from_version: str
    to_version: str
    pause_requested_at: float = Field(description="Unix time the pause was asked for.")
    paused_at: float = Field(description="Unix time in-flight generations had drained.")
    resumed_at: float = Field(description="Unix time generation resumed on the new weights.")
