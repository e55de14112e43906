"""Replay on a stand-in router: exact prompt lengths, generated tokens carried into the prefix, fan-out, pins."""

from __future__ import annotations

import asyncio
import json

from pronk.agents.replay import filler_tokens, run_shape
from pronk.agents.tool_gaps import ToolGaps
from pronk.engine.worker_protocol import StepRequest, StepResult
from pronk.protocol.shapes import TraceShape
from pronk.settings import get_settings

BWRAP = get_settings().sandbox_bwrap
"""The bubblewrap binary a harness's python tool isolates code with."""


class EchoRouter:
    """Generates `max_tokens` tokens (ids 9), and remembers every request."""

    def __init__(self):
        self.requests: list[StepRequest] = []
        self.finished: list[str] = []

    async def finish(self, trace_id: str) -> None:
        self.finished.append(trace_id)

    async def aclose(self) -> None:
        """Nothing to close; the bench's replay loop closes its backend at the end."""

    async def generate(self, request: StepRequest) -> StepResult:
        self.requests.append(request)
        n = request.sampling.max_tokens
        return StepResult(
            request_id=request.request_id,
            text="",
            token_ids=[9] * n,
            prompt_tokens=len(request.prompt_token_ids),
            cached_tokens=0,
            completion_tokens=n,
            finish_reason="length",
            model_version="m/1",
            worker_id="w0",
            queue_time_s=0.0,
            engine_time_s=0.001,
        )


SHAPE = TraceShape.model_validate(
    {
        "trace_id": "s",
        "system_prompt_tokens": 10,
        "steps": [
            {
                "new_prompt_tokens": 3,
                "output_tokens": 2,
                "tool_gap_s": 0.01,
                "fan_out": [
                    {
                        "trace_id": "c",
                        "system_prompt_tokens": 4,
                        "steps": [{"new_prompt_tokens": 1, "output_tokens": 5}],
                    }
                ],
            },
            {"new_prompt_tokens": 6, "output_tokens": 7},
        ],
    }
)


def test_replay_sends_exact_lengths_and_grows_the_prefix():
    router = EchoRouter()
    trace = asyncio.run(run_shape(router, SHAPE, kv_pin_ttl_s=3.0, custom_id="line-1"))
    first, last = router.requests[0], router.requests[-1]
    (child,) = [r for r in router.requests if r.trace_id == "s.0.0"]
    assert child.affinity_key == first.affinity_key == "s"
    assert len(first.prompt_token_ids) == 13 and first.sampling.ignore_eos and first.sampling.max_tokens == 2
    assert child.prompt_token_ids[:15] == first.prompt_token_ids + [9, 9] and len(child.prompt_token_ids) == 20
    assert last.trace_id == "s" and len(last.prompt_token_ids) == 13 + 2 + 6
    assert first.kv_pin_ttl_s == 3.0 and last.kv_pin_ttl_s == 0.0 and child.kv_pin_ttl_s == 0.0
    assert [
        (r.trace_id, r.step, r.prompt_tokens, r.output_tokens)
        for r in sorted(trace.records, key=lambda r: (r.trace_id, r.step))
    ] == [("s", 0, 13, 2), ("s", 1, 21, 7), ("s.0.0", 0, 20, 5)]
    assert trace.summary().output_tokens == SHAPE.total_output_tokens() == 14
    assert all(r.custom_id == "line-1" and r.kind == "replay" for r in trace.records)
    assert router.finished == ["s.0.0", "s"]  # each trace tells the router it ended, children first


def test_auto_pin_ttl_comes_from_measured_gaps():
    router = EchoRouter()
    gaps = ToolGaps(default_s=30.0, min_samples=1, floor_s=0.0)
    gaps.observe("fan_out", 2.0)
    asyncio.run(run_shape(router, SHAPE, kv_pin_ttl_s=30.0, gaps=gaps))
    assert router.requests[0].kv_pin_ttl_s == 2.5
    assert len(gaps.gaps["fan_out"]) == 2  # the replay's own gap was measured in


def test_filler_tokens_are_deterministic_and_ordinary():
    assert filler_tokens("a", 50) == filler_tokens("a", 50) != filler_tokens("b", 50)
    assert all(16 <= t < 4000 for t in filler_tokens("a", 500))


def test_a_replay_that_ran_across_a_leap_reports_the_version_of_its_last_step(tmp_path):
    """Its output line says which weights made its last step, as an agent's does, so a batch running through a
    Leap shows both versions in its output."""
    from pronk.agents.harness import Harness
    from pronk.agents.step_records import StepRecorder
    from pronk.batches.input import validate_input
    from pronk.jobs.catalog import resolve_job
    from pronk.settings import get_settings

    router = EchoRouter()
    generate = router.generate

    async def leaping(request: StepRequest) -> StepResult:
        result = await generate(request)
        return result.model_copy(update={"model_version": f"m/{len(router.requests)}", "worker_id": "w1"})

    router.generate = leaping  # type: ignore[method-assign]
    job = resolve_job("tiny-cpu", get_settings())
    shape = {"trace_id": "t", "system_prompt_tokens": 4, "steps": [{"new_prompt_tokens": 2, "output_tokens": 2}] * 2}
    line = {
        "custom_id": "r",
        "method": "POST",
        "url": "/v1/pronk/replay",
        "body": {"model": "pronk-tiny", "shape": shape},
    }
    (request,) = validate_input(json.dumps(line).encode(), job).requests
    outcome = asyncio.run(Harness(router, job, StepRecorder(), tmp_path, sandbox_bwrap=BWRAP).run_line(request))  # type: ignore[arg-type]
    assert outcome.completion is not None
    assert (outcome.completion.model_version, outcome.completion.worker_id) == ("m/2", "w1")
