"""The server-side agent harness: generate → parse the tool call → run the tool → append → next step.

Every step's output is constrained (vLLM structured outputs) to `{"tool": NAME, "arguments": {...}}`
or `{"final": TEXT}`, built from the line's tools' JSON schemas with every string and array bounded
so that even a random-weight model's call parses within the step's token budget. `spawn_subagents`
starts child traces from the parent's messages, concurrently; the parent resumes with their answers.
A step that fails (engine trouble, an unparsable call, a timeout) is retried up to the harness's
`max_step_retries`, each attempt recorded, with whether its tool call parsed and was valid against the tool's
schema (`tool_call_validity`). Prefect-free, like `pronk.agents.completions`.
"""

from __future__ import annotations

import asyncio
import json
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pronk import paths
from pronk.agents.client_tools import is_client_line
from pronk.agents.completions import engine_error_code, failed_outcome, run_request
from pronk.agents.outcomes import Completion, RequestOutcome, Usage
from pronk.agents.replay import run_shape
from pronk.agents.step_records import StepRecord, StepRecorder, summarise
from pronk.agents.tool_calls import parse_call, step_schema, system_prompt, tool_call_validity
from pronk.agents.tool_gaps import ToolGaps
from pronk.agents.tools import SPAWN_SUBAGENTS, job_tools, run_tool
from pronk.agents.tools.base import Tool, ToolContext
from pronk.agents.transcripts import Transcript, TranscriptRecorder
from pronk.engine.client import ContextTooLong, StepRejected
from pronk.engine.router import NoWorkerAvailable, Router
from pronk.engine.worker_protocol import ChatMessage, SamplingSpec, StepRequest, StepResult
from pronk.jobs.schema import HarnessConfig, JobConfig
from pronk.pronk_error import PronkError
from pronk.protocol.bodies import ChatCompletionBody, NamedToolChoice, ReplayBody
from pronk.protocol.error_codes import ErrorCode
from pronk.protocol.ids import new_id
from pronk.protocol.lines import ValidRequest
from pronk.settings import Settings
from pronk.worker_registry import worker_registry
from pronk.worker_token import worker_client

TOOL_RESULT_CHARS = 1200


def job_router(job: JobConfig, settings: Settings, only: list[str] | None = None, **options: Any) -> Router:
    """A router to the live workers of `job` (or only those of `only`) with the job's routing and admission;
    `options` are the Router's own (an admission timeout, say)."""
    return Router(
        job.job_id,
        worker_registry(settings),
        policy=job.scheduling.routing,
        admission=job.scheduling.admission,
        client=worker_client(settings),
        only=only,
        **options,
    )


class TraceFailed(PronkError):
    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


@dataclass(slots=True)
class ToolView:
    """A tool as one line sees it: its schema may be narrowed by the line."""

    name: str
    description: str
    parameters: dict[str, Any]
    tool: Tool


@dataclass(slots=True)
class Family:
    """What a root trace and its children share."""

    root_id: str
    custom_id: str
    limits: HarnessConfig
    tools: dict[str, ToolView]
    system_prompt: str
    max_tokens: int
    temperature: float
    seed: int | None
    scratch: Path
    answer_schema: dict[str, Any] | None = None
    """The line's `response_format` schema: the final answer is constrained to it, and the last step must answer."""
    records: list[StepRecord] = field(default_factory=list)


@dataclass(slots=True)
class TraceState:
    trace_id: str
    parent_id: str | None
    depth: int
    messages: list[dict[str, str]]
    finish_reason: str = "running"
    answer: str = ""
    steps: int = 0
    last_result: StepResult | None = None


def tool_views(body: ChatCompletionBody, tools: dict[str, Tool]) -> dict[str, ToolView]:
    views = {}
    for spec in body.tools or []:
        tool = tools[spec.function.name]
        views[tool.name] = ToolView(
            tool.name, spec.function.description or tool.description, spec.function.parameters or tool.parameters, tool
        )
    return views


def tool_turn(tool: str, ok: bool, text: str) -> str:
    """The tool turn the model reads after a call: `[NAME ok] RESULT`, or `[NAME error] WHY`."""
    return f"[{tool} {'ok' if ok else 'error'}] {text}"


def tool_turn_ok(content: str) -> bool:
    """Whether a tool turn (`tool_turn`) holds a result rather than an error."""
    head = content.split("]", 1)[0]
    return head.startswith("[") and head.endswith(" ok")


class Harness:
    """Runs one batch's lines: agent traces, plain one-step chats and replays, recording every step (and, given a
    `TranscriptRecorder`, every agent trace's conversation)."""

    def __init__(
        self,
        router: Router,
        job: JobConfig,
        recorder: StepRecorder,
        scratch_root: Path,
        transcripts: TranscriptRecorder | None = None,
        *,
        sandbox_bwrap: str,
    ):
        self.router = router
        self.job = job
        self.recorder = recorder
        self.scratch_root = scratch_root
        self.transcripts = transcripts
        self.sandbox_bwrap = sandbox_bwrap
        """The bubblewrap binary the python tool (and a line's Python check) isolates code with (the settings'
        `sandbox_bwrap`, handed down by whoever builds the harness)."""
        self.tools = job_tools(job, sandbox_bwrap)
        self.gaps = ToolGaps(job.scheduling.kv_pin_ttl_s) if job.scheduling.kv_pin_ttl == "auto" else None

    async def run_line(self, request: ValidRequest) -> RequestOutcome:
        """Any valid line: a replay, an agent task, or a plain chat completion (a one-step trace).

        Whatever goes wrong inside becomes this line's error line, never an exception into the flow.
        """
        try:
            return await self._run_line(request)
        except Exception as exc:  # noqa: BLE001 - one line's failure must not fail the batch
            return failed_outcome(request, ErrorCode.STEP_FAILED, f"{type(exc).__name__}: {exc}")

    async def _run_line(self, request: ValidRequest) -> RequestOutcome:
        body = request.body
        if isinstance(body, ReplayBody):
            return await self.run_replay(request, body)
        if body.tools is not None and body.tool_choice != "none":
            if is_client_line(body, set(self.tools)):
                return await run_request(self.router, request, body, self.job, self.recorder, client_tools=True)
            return await self.run_agent(request, body)
        return await run_request(self.router, request, body, self.job, self.recorder)

    async def run_replay(self, request: ValidRequest, body: ReplayBody) -> RequestOutcome:
        kv_pin_ttl_s = self.job.scheduling.kv_pin_ttl_s if body.kv_pin_ttl_s is None else body.kv_pin_ttl_s
        try:
            trace = await run_shape(
                self.router,
                body.shape,
                kv_pin_ttl_s=kv_pin_ttl_s,
                recorder=self.recorder,
                custom_id=request.custom_id,
                trace_id=request.custom_id,
                gaps=self.gaps,
            )
        except (StepRejected, NoWorkerAvailable) as exc:
            return failed_outcome(request, engine_error_code(exc), exc)
        summary = trace.summary()
        last = trace.records[-1]
        completion = Completion(
            kind="replay",
            request_id=new_id("replay"),
            model=self.job.served_model_name,
            model_version=last.model_version or "",
            worker_id=last.worker_id or "",
            usage=Usage.of(summary),
            engine_time_s=summary.engine_time_s,
            trace_id=trace.trace_id,
            duration_s=trace.duration_s,
            summary=summary,
        )
        return RequestOutcome(request.line, request.custom_id, completion)

    async def run_agent(self, request: ValidRequest, body: ChatCompletionBody) -> RequestOutcome:
        limits = body.harness.applied_to(self.job.harness) if body.harness else self.job.harness
        views = tool_views(body, self.tools)
        family = Family(
            root_id=request.custom_id,
            custom_id=request.custom_id,
            limits=limits,
            tools=views,
            system_prompt=system_prompt(list(views.values())),
            max_tokens=min(body.output_limit(limits.step_max_tokens), limits.step_max_tokens),
            temperature=body.temperature,
            seed=body.seed,
            scratch=paths.under(self.scratch_root, paths.component(request.custom_id)),
            answer_schema=body.answer_schema,
        )
        messages = [{"role": "system", "content": family.system_prompt}] + [
            {"role": m.role, "content": m.text()} for m in body.messages
        ]
        root = TraceState(request.custom_id, None, 0, messages)
        started = time.monotonic()
        try:
            await asyncio.wait_for(self._trace(family, root, body.tool_choice), limits.trace_timeout_s)
        except TimeoutError:
            root.finish_reason = "timeout"
        except _ContextFull:
            pass
        except TraceFailed as exc:
            root.finish_reason = "error"
            return failed_outcome(request, exc.code, f"trace {root.trace_id}: {exc}")
        finally:
            await self.router.finish(root.trace_id)  # its worker drops its pin and admission now
            self._keep_transcript(family, root)
        return self._outcome(request, family, root, time.monotonic() - started)

    def _pin_ttl(self, family: Family, tools: list[ToolView]) -> float:
        """How long the step's prefix stays pinned through the tool gap that may follow it."""
        fixed = self.job.scheduling.kv_pin_ttl_s
        return self.gaps.ttl(t.name for t in tools) if self.gaps is not None and fixed > 0 else fixed

    async def _trace(self, family: Family, state: TraceState, first_choice: Any) -> None:
        limits = family.limits
        while state.steps < limits.max_steps:
            choice = first_choice if state.steps == 0 else ("required" if first_choice == "required" else "auto")
            last_step = state.steps == limits.max_steps - 1
            if last_step and first_choice != "required":
                choice = "answer"  # the last step answers: a call it made could never run
            record, call = await self._step(family, state, choice, pin=not last_step)
            state.steps += 1
            if "final" in call:
                state.answer, state.finish_reason = call["final"], "stop"
                return
            if last_step:
                record.tool_name, record.tool_ok, record.error = call["tool"], False, "max_steps reached: tool not run"
                break
            text, ok, seconds = await self._call_tool(family, state, call)
            if self.gaps is not None:
                self.gaps.observe(call["tool"], seconds)
            record.tool_name, record.tool_ok, record.tool_time_s = call["tool"], ok, round(seconds, 6)
            state.messages.append({"role": "tool", "content": tool_turn(call["tool"], ok, text)})
        state.finish_reason = "max_steps"
        state.answer = next((m["content"] for m in reversed(state.messages) if m["role"] == "assistant"), "")

    def _tools_for(self, family: Family, state: TraceState, choice: Any) -> tuple[list[ToolView], bool]:
        tools = [t for t in family.tools.values() if t.name != SPAWN_SUBAGENTS or state.depth < family.limits.max_depth]
        if isinstance(choice, NamedToolChoice):
            return [family.tools[choice.function.name]], False
        if choice == "answer":
            return [], True
        return tools, choice != "required" or not tools

    async def _step(
        self, family: Family, state: TraceState, choice: Any, pin: bool
    ) -> tuple[StepRecord, dict[str, Any]]:
        tools, allow_final = self._tools_for(family, state, choice)
        schema = step_schema(tools, allow_final, family.max_tokens, family.answer_schema)
        structured = family.answer_schema is not None
        for attempt in range(family.limits.max_step_retries + 1):
            record = self.recorder.add(
                StepRecord(
                    trace_id=state.trace_id,
                    step=state.steps,
                    root_trace_id=family.root_id,
                    parent_trace_id=state.parent_id,
                    custom_id=family.custom_id,
                    attempt=attempt,
                )
            )
            family.records.append(record)
            seed = (
                None
                if family.seed is None
                else zlib.crc32(f"{family.seed}/{state.trace_id}/{state.steps}/{attempt}".encode())
            )
            step = StepRequest(
                request_id=new_id("step"),
                messages=[ChatMessage.model_validate(m) for m in state.messages],
                sampling=SamplingSpec(
                    max_tokens=family.max_tokens, temperature=family.temperature, seed=seed, json_schema=schema
                ),
                trace_id=state.trace_id,
                affinity_key=family.root_id,
                kv_pin_ttl_s=self._pin_ttl(family, tools) if pin else 0.0,
            )
            try:
                result = await asyncio.wait_for(self.router.generate(step), family.limits.step_timeout_s)
            except StepRejected as exc:
                record.error = f"rejected: {exc}"
                if state.steps == 0:
                    code = ErrorCode.CONTEXT_LENGTH if isinstance(exc, ContextTooLong) else ErrorCode.REQUEST_REJECTED
                    raise TraceFailed(code, str(exc)) from exc
                state.finish_reason = "context_length"
                raise _ContextFull from exc
            except (TimeoutError, NoWorkerAvailable) as exc:
                record.error = f"{type(exc).__name__}: {exc}"
                continue
            record.take(result)
            state.last_result = result
            call = parse_call(result.text, {t.name for t in tools}, allow_final, structured)
            record.tool_call_parsed, record.tool_call_valid = tool_call_validity(
                result.text, call, {t.name: t.parameters for t in tools}
            )
            if isinstance(call, str):
                record.error = call
                continue
            state.messages.append({"role": "assistant", "content": result.text})
            return record, call
        code = ErrorCode.ENGINE_UNAVAILABLE if record.worker_id is None else ErrorCode.STEP_FAILED
        raise TraceFailed(
            code, f"step {state.steps} failed {family.limits.max_step_retries + 1} times; last: {record.error}"
        )

    async def _call_tool(self, family: Family, state: TraceState, call: dict[str, Any]) -> tuple[str, bool, float]:
        if call["tool"] == SPAWN_SUBAGENTS:
            started = time.monotonic()
            text = await self._fan_out(family, state, call["arguments"].get("tasks", []))
            return text, True, time.monotonic() - started
        view = family.tools[call["tool"]]
        context = ToolContext(
            trace_id=state.trace_id, scratch_dir=paths.under(family.scratch, paths.component(state.trace_id))
        )
        outcome = await run_tool(view.tool, call["arguments"], context, family.limits.tool_timeout_s, TOOL_RESULT_CHARS)
        return outcome.text, outcome.ok, outcome.seconds

    async def _fan_out(self, family: Family, parent: TraceState, tasks: list[str]) -> str:
        tasks = tasks[: family.limits.max_fan_out]
        children = [
            TraceState(
                f"{parent.trace_id}.{parent.steps - 1}.{i}",
                parent.trace_id,
                parent.depth + 1,
                parent.messages + [{"role": "user", "content": f"Sub-task {i + 1} of {len(tasks)}: {task}"}],
            )
            for i, task in enumerate(tasks)
        ]

        async def child_run(child: TraceState) -> dict[str, str]:
            try:
                await self._trace(family, child, "auto")
            except _ContextFull:
                pass
            except TraceFailed as exc:
                child.finish_reason, child.answer = "error", str(exc)
            await self.router.finish(child.trace_id)
            self._keep_transcript(family, child)
            return {"trace_id": child.trace_id, "finish_reason": child.finish_reason, "answer": child.answer}

        return json.dumps(await asyncio.gather(*(child_run(c) for c in children)))

    def _keep_transcript(self, family: Family, state: TraceState) -> None:
        if self.transcripts is not None:
            self.transcripts.add(
                Transcript(
                    family.custom_id,
                    state.trace_id,
                    state.parent_id,
                    list(state.messages),
                    state.finish_reason,
                    state.answer,
                )
            )

    def _outcome(self, request: ValidRequest, family: Family, root: TraceState, seconds: float) -> RequestOutcome:
        summary = summarise(family.records)
        last = root.last_result
        completion = Completion(
            kind="agent",
            request_id=new_id("chatcmpl"),
            model=self.job.served_model_name,
            model_version=last.model_version if last else "",
            worker_id=summary.workers[0] if summary.workers else "",
            usage=Usage.of(summary),
            text=root.answer,
            finish_reason=root.finish_reason,
            engine_time_s=summary.engine_time_s,
            trace_id=root.trace_id,
            duration_s=seconds,
            summary=summary,
            transcript=root.messages[1:],
        )
        return RequestOutcome(request.line, request.custom_id, completion)


class _ContextFull(PronkError):
    """The trace's prompt outgrew the model's context: it ends with finish_reason `context_length`."""
