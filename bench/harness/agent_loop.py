"""A plain asyncio agent loop that replays trace shapes against stock vLLM servers or pronk's router.

Every setup runs the very same replay code, `pronk.agents.replay.run_shape` (append the tool result, call
the model with exact lengths, append its output, wait out the tool gap, fan out), with at most
`concurrency` root traces in flight; only what answers `generate(StepRequest)` changes:

- `OpenAIServers`: what a user has today — N stock vLLM OpenAI servers behind a plain
  round-robin balancer, sent prompt token ids on `/v1/completions` (`ignore_eos`, `max_tokens`), or a step's
  chat messages on `/v1/chat/completions` with its JSON schema as `response_format` (the agent harness's steps).
- `RouterClient`: the same requests to a vllm-router in front of those servers (`bench.harness.peer`), which picks
  the server.
- `pronk.engine.router.Router`: pronk's workers with the job's routing policy and gap-KV pin, no Prefect.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass, field

from pronk.agents.replay import TraceRecord, run_shape
from pronk.agents.tool_gaps import ToolGaps
from pronk.engine.http_transport import many_requests_client
from pronk.engine.tls import verify_context
from pronk.engine.worker_protocol import StepRequest, StepResult
from pronk.protocol.shapes import TraceShape


class OpenAIServers:
    """Stock vLLM OpenAI servers, round-robin per request, speaking pronk's step protocol to the replay loop or the
    agent harness."""

    def __init__(self, urls: list[str], model: str):
        self.urls = urls
        self.model = model
        self._next = itertools.cycle(range(len(urls)))
        # The client pronk's workers are called by (`pronk.engine.client`): the two loops pay the same CPU a request.
        self._http = many_requests_client(600.0, verify_context(None))

    async def finish(self, trace_id: str) -> None:
        """A trace ended; stock servers keep no per-trace state."""

    def request_body(self, request: StepRequest) -> tuple[str, dict]:
        """The endpoint and body that carry `request`: prompt token ids as a completion, chat messages as a chat
        completion whose JSON schema goes as OpenAI's `response_format` (vLLM's structured outputs), with the same
        sampling either way."""
        spec = request.sampling
        given = {"seed": spec.seed, "stop": spec.stop}
        sampling = {
            "model": self.model,
            "temperature": spec.temperature,
            "top_p": spec.top_p,
            "ignore_eos": spec.ignore_eos,
            "return_token_ids": True,
            **{key: value for key, value in given.items() if value is not None},
        }
        if request.messages is None:
            return "/v1/completions", {**sampling, "prompt": request.prompt_token_ids, "max_tokens": spec.max_tokens}
        body = {
            **sampling,
            "messages": [{"role": m.role, "content": m.text()} for m in request.messages],
            "max_completion_tokens": spec.max_tokens,
        }
        if spec.json_schema is not None:
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "step", "schema": spec.json_schema},
            }
        return "/v1/chat/completions", body

    def destination(self, request: StepRequest) -> tuple[str, dict[str, str], str]:
        """Where a step goes: (the URL, the headers it carries, the name of the server that will answer it): here the
        next server in turn, named by its index."""
        index = next(self._next)
        return self.urls[index], {}, f"vllm-server-{index}"

    def answered_by(self, data: dict, server: str) -> str:
        """The server that answered a step, from the response `data` and its `destination`'s name."""
        return server

    async def generate(self, request: StepRequest) -> StepResult:
        url, headers, server = self.destination(request)
        path, body = self.request_body(request)
        started = time.monotonic()
        response = await self._http.post(f"{url}{path}", json=body, headers=headers)
        response.raise_for_status()
        data = response.json()
        usage, choice = data["usage"], data["choices"][0]
        text = choice["text"] if request.messages is None else choice["message"]["content"] or ""
        return StepResult(
            request_id=request.request_id,
            text=text,
            token_ids=choice["token_ids"],
            prompt_tokens=usage["prompt_tokens"],
            cached_tokens=(usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0,
            completion_tokens=usage["completion_tokens"],
            finish_reason=choice.get("finish_reason") or "stop",
            model_version=self.model,
            worker_id=self.answered_by(data, server),
            queue_time_s=0.0,
            engine_time_s=time.monotonic() - started,
        )

    async def aclose(self) -> None:
        await self._http.aclose()


SESSION_HEADER = "X-Session-ID"
"""The header vllm-router's sticky policies pin a session by."""


class RouterClient(OpenAIServers):
    """A vllm-router in front of stock vLLM servers: every step goes to its one URL, which picks the server. With
    `session_header`, a step carries its trace's id as `X-Session-ID` (a fan-out child its root trace's, whose prefix
    it shares: the family pronk's router keeps together too). The server that answered is its response's
    `system_fingerprint`, which each server behind a router is started to set to its own name
    (`bench.harness.baseline.VllmServers`)."""

    def __init__(self, url: str, model: str, session_header: bool):
        super().__init__([url], model)
        self.session_header = session_header

    def destination(self, request: StepRequest) -> tuple[str, dict[str, str], str]:
        session = request.affinity_key or request.trace_id
        headers = {SESSION_HEADER: session} if self.session_header and session else {}
        return self.urls[0], headers, "vllm-router"

    def answered_by(self, data: dict, server: str) -> str:
        return data.get("system_fingerprint") or server


@dataclass(slots=True)
class ReplayResult:
    """What one replay of a workload produced; `bench.harness.figures` turns it into figures."""

    wall_s: float
    started: float
    """`time.monotonic()` at the start: what `finished_s` counts from."""
    traces: list[TraceRecord] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    finished_s: list[float] = field(default_factory=list)  # each finished trace's end, in s from the start


async def replay(
    shapes: list[TraceShape],
    backend,
    concurrency: int,
    kv_pin_ttl_s: float = 0.0,
    gaps: ToolGaps | None = None,
    gap_scale: float = 1.0,
) -> ReplayResult:
    """Run every shape on `backend` (anything with `generate` and `aclose`), `concurrency` root traces at a time.

    A trace that fails is recorded in `errors`, not raised; the backend is closed at the end. With `gaps`, pins
    last what the measured tool gaps suggest (`kv_pin_ttl: auto`). `gap_scale` multiplies every tool gap (0: none).
    """
    started = time.monotonic()
    result = ReplayResult(wall_s=0.0, started=started)
    slots = asyncio.Semaphore(concurrency)

    async def one(shape: TraceShape) -> None:
        async with slots:
            try:
                result.traces.append(
                    await run_shape(backend, shape, kv_pin_ttl_s=kv_pin_ttl_s, gaps=gaps, time_scale=gap_scale)
                )
                result.finished_s.append(time.monotonic() - started)
            except Exception as exc:  # noqa: BLE001 - one trace's failure is counted, never stops the round
                result.errors.append(f"{shape.trace_id}: {type(exc).__name__}: {exc}"[:300])

    try:
        await asyncio.gather(*(one(shape) for shape in shapes))
    finally:
        await backend.aclose()
    result.wall_s = time.monotonic() - started
    return result
