"""A chat line is a one-step trace: on a kv_budget job its worker must drop its admission when the step ends."""

from __future__ import annotations

from pronk.agents.completions import run_request
from pronk.agents.step_records import StepRecorder
from pronk.engine.admission import KvBudget
from pronk.engine.registry import FileRegistry
from pronk.engine.router import Router
from pronk.jobs.catalog import resolve_job
from pronk.protocol.bodies import ChatCompletionBody
from pronk.protocol.lines import ValidRequest
from pronk.settings import get_settings
from tests.engine.test_admission import JOB, BudgetClient, entry, run_async


@run_async
async def test_a_chat_line_leaves_its_workers_admission_budget_when_it_ends(tmp_path):
    registry = FileRegistry(tmp_path)
    registry.announce(entry("w0", 9000))
    budget = KvBudget(10_000)
    router = Router(JOB, registry, client=BudgetClient({"w0": budget}), admission="kv_budget")
    body = ChatCompletionBody(model="pronk-tiny", messages=[{"role": "user", "content": "hello"}], max_tokens=8)

    for line in range(3):
        request = ValidRequest(line, f"line-{line}", body)
        outcome = await run_request(router, request, body, resolve_job("tiny-cpu", get_settings()), StepRecorder())
        assert outcome.custom_id == f"line-{line}"

    # before, each line stayed resident (and in the growth reserve) until the 30-minute idle expiry
    assert budget.resident == {} and budget.used == 0
    assert budget.counts["admitted"] == 3
