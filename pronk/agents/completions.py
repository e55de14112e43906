"""One chat completion request through the router, turned into an OpenAI output or error line.

Prefect-free, so the batch flow and the benchmarks' bare asyncio loop run exactly the same code.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from engine.client import ContextTooLong, StepRejected
from engine.protocol import SamplingSpec, StepRequest, StepResult
from engine.router import NoWorkerAvailable, Router
from pronk.batches.input import ValidRequest, error_line
from pronk.batches.schemas import ErrorCode, OutputLine, ResponseEnvelope, new_id
from pronk.jobs import JobConfig


@dataclass(slots=True)
class RequestOutcome:
    line: int
    output: OutputLine
    result: StepResult | None


def to_step_request(request: ValidRequest, job: JobConfig, request_id: str) -> StepRequest:
    body = request.body
    return StepRequest(
        request_id=request_id,
        messages=body.messages,
        sampling=SamplingSpec(
            max_tokens=body.output_limit(job.default_max_tokens),
            temperature=body.temperature,
            top_p=body.top_p,
            seed=body.seed,
            stop=body.stop,
        ),
        trace_id=request.custom_id,
    )


def chat_completion_body(result: StepResult, model: str, request_id: str) -> dict:
    return {
        "id": request_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": result.model_version,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": result.text},
                "finish_reason": result.finish_reason,
                "logprobs": None,
            }
        ],
        "usage": {
            "prompt_tokens": result.prompt_tokens,
            "completion_tokens": result.completion_tokens,
            "total_tokens": result.prompt_tokens + result.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": result.cached_tokens},
        },
        "pronk": {
            "model_version": result.model_version,
            "worker_id": result.worker_id,
            "queue_time_s": round(result.queue_time_s, 6),
            "engine_time_s": round(result.engine_time_s, 6),
        },
    }


def failed_outcome(request: ValidRequest, code: str, reason: object) -> RequestOutcome:
    return RequestOutcome(request.line, error_line(request.line, request.custom_id, code, str(reason)), None)


def engine_error_code(exc: StepRejected | NoWorkerAvailable) -> str:
    """A step the engine refused is the request's fault (one too big for any worker's KV budget is
    `context_length`); no worker to run it is the fleet's."""
    if isinstance(exc, ContextTooLong):
        return ErrorCode.CONTEXT_LENGTH
    return ErrorCode.REQUEST_REJECTED if isinstance(exc, StepRejected) else ErrorCode.ENGINE_UNAVAILABLE


async def run_request(router: Router, request: ValidRequest, job: JobConfig) -> RequestOutcome:
    """Run one request; engine trouble becomes an error line for this request, never an exception."""
    request_id = new_id("chatcmpl")
    try:
        result = await router.generate(to_step_request(request, job, request_id))
    except (StepRejected, NoWorkerAvailable) as exc:
        return failed_outcome(request, engine_error_code(exc), exc)
    response = ResponseEnvelope(
        status_code=200, request_id=request_id, body=chat_completion_body(result, job.served_model_name, request_id)
    )
    return RequestOutcome(request.line, OutputLine(custom_id=request.custom_id, response=response), result)
