"""One chat completion request through the router, turned into a typed outcome (a one-step trace).

Prefect-free, so the batch flow and the benchmarks' bare asyncio loop run exactly the same code.
"""

from __future__ import annotations

from pronk.agents.client_tools import NotACall, client_tool_step, read_step
from pronk.agents.outcomes import Completion, LineFailure, RequestOutcome, Usage
from pronk.agents.step_records import StepRecord, StepRecorder
from pronk.engine.client import ContextTooLong, StepRejected
from pronk.engine.router import NoWorkerAvailable, Router
from pronk.engine.worker_protocol import SamplingSpec, StepRequest, StepResult
from pronk.jobs.schema import JobConfig
from pronk.protocol.bodies import ChatCompletionBody
from pronk.protocol.error_codes import ErrorCode
from pronk.protocol.ids import new_id
from pronk.protocol.lines import ValidRequest


def to_step_request(body: ChatCompletionBody, trace_id: str, job: JobConfig, request_id: str) -> StepRequest:
    return StepRequest(
        request_id=request_id,
        messages=body.messages,
        sampling=SamplingSpec(
            max_tokens=body.output_limit(job.default_max_tokens),
            temperature=body.temperature,
            top_p=body.top_p,
            seed=body.seed,
            stop=[body.stop] if isinstance(body.stop, str) else body.stop,
            json_schema=body.answer_schema,
        ),
        trace_id=trace_id,
    )


def chat_completion(result: StepResult, model: str, request_id: str) -> Completion:
    return Completion(
        kind="chat",
        request_id=request_id,
        model=model,
        model_version=result.model_version,
        worker_id=result.worker_id,
        usage=Usage(result.prompt_tokens, result.cached_tokens, result.completion_tokens),
        text=result.text,
        finish_reason=result.finish_reason,
        queue_time_s=result.queue_time_s,
        engine_time_s=result.engine_time_s,
    )


def failed_outcome(request: ValidRequest, code: str, reason: object) -> RequestOutcome:
    return RequestOutcome(request.line, request.custom_id, LineFailure(code, str(reason)))


def engine_error_code(exc: StepRejected | NoWorkerAvailable) -> str:
    """A step the engine refused is the request's fault (one too big for any worker's KV budget is
    `context_length`); no worker to run it is the fleet's."""
    if isinstance(exc, ContextTooLong):
        return ErrorCode.CONTEXT_LENGTH
    return ErrorCode.REQUEST_REJECTED if isinstance(exc, StepRejected) else ErrorCode.ENGINE_UNAVAILABLE


def _chat_record(request: ValidRequest, error: str | None = None) -> StepRecord:
    """The step record of a plain chat line: a one-step trace named by its custom_id."""
    cid = request.custom_id
    return StepRecord(trace_id=cid, step=0, root_trace_id=cid, custom_id=cid, kind="chat", error=error)


async def run_request(
    router: Router,
    request: ValidRequest,
    body: ChatCompletionBody,
    job: JobConfig,
    recorder: StepRecorder,
    client_tools: bool = False,
) -> RequestOutcome:
    """Run one request and record its step; engine trouble becomes this request's failed outcome, never an exception.

    With `client_tools` the line's tools are the client's own (`pronk.agents.client_tools`): the step may answer with
    a call of one, returned as OpenAI's `tool_calls` for the client to run."""
    request_id = new_id("chatcmpl")
    step = to_step_request(body, request.custom_id, job, request_id)
    if client_tools:
        step = client_tool_step(body, step)
    try:
        result = await router.generate(step)
    except (StepRejected, NoWorkerAvailable) as exc:
        code = engine_error_code(exc)
        recorder.add(_chat_record(request, error=code))
        return failed_outcome(request, code, exc)
    finally:
        # A one-step trace ends with its step: its worker drops its admission now, not at the idle expiry
        # (30 min), which left every chat line of a kv_budget job holding budget and growth reserve.
        await router.finish(request.custom_id)
    recorder.add(_chat_record(request)).take(result)
    completion = chat_completion(result, job.served_model_name, request_id)
    if client_tools:
        try:
            answer, completion.tool_calls = read_step(body, result)
        except NotACall as exc:
            return failed_outcome(request, ErrorCode.INVALID_TOOL_CALL, exc)
        completion.text = answer or ""
        if completion.tool_calls:
            completion.finish_reason = "tool_calls"
    return RequestOutcome(request.line, request.custom_id, completion)
