"""A chat line is a one-step trace: on a kv_budget job its worker must drop its admission when the step ends."""

from __future__ import annotations

from engine.admission import KvBudget
from engine.protocol import StepRequest, StepResult
from engine.registry import FileRegistry
from engine.router import Router
from pronk.agents.completions import run_request
from pronk.agents.step_records import StepRecorder
from pronk.batches.input import ValidRequest
from pronk.batches.schemas import ChatCompletionBody
from pronk.jobs import get_job
from tests.engine.test_admission import JOB, entry, run_async


class BudgetWorker:
    """One stand-in worker that admits every step by a real `KvBudget`, as the vLLM backend does."""

    def __init__(self) -> None:
        self.budget = KvBudget(10_000)

    async def generate(self, url: str, request: StepRequest) -> StepResult:
        assert request.admission is not None and request.trace_id is not None
        tokens = 10 + request.sampling.max_tokens
        await self.budget.admit(request.trace_id, tokens, started=request.admission.started, since=1.0, timeout_s=1.0)
        self.budget.step_done(request.trace_id, tokens)
        return StepResult(
            request_id=request.request_id,
            text="hi",
            token_ids=[1],
            prompt_tokens=10,
            cached_tokens=0,
            completion_tokens=1,
            finish_reason="stop",
            model_version="m/1",
            worker_id="w0",
            queue_time_s=0.0,
            engine_time_s=0.0,
        )

    async def release(self, url: str, trace_ids: list[str]) -> None:
        self.budget.release(trace_ids)

    async def aclose(self) -> None:
        pass


@run_async
async def test_a_chat_line_leaves_its_workers_admission_budget_when_it_ends(tmp_path):
    registry = FileRegistry(tmp_path)
    registry.announce(entry("w0", 9000))
    worker = BudgetWorker()
    router = Router(JOB, registry, client=worker, admission="kv_budget")
    body = ChatCompletionBody(model="pronk-tiny", messages=[{"role": "user", "content": "hello"}], max_tokens=8)

    for line in range(3):
        outcome = await run_request(
            router, ValidRequest(line, f"line-{line}", body), body, get_job("tiny-cpu"), StepRecorder()
        )
        assert outcome.custom_id == f"line-{line}"

    # before, each line stayed resident (and in the growth reserve) until the 30-minute idle expiry
    assert worker.budget.resident == {} and worker.budget.used == 0
    assert worker.budget.counts["admitted"] == 3
