"""Agent traces end to end on the real stack: harness, tools, fan-out, step records, affinity, replay, containment."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from pronk.batches.store import BatchStore
from pronk.settings import PROJECT_ROOT, get_settings
from pronk.worker_token import worker_token
from tests.conftest import DATA
from tests.flows.deployment_runs import run_batch_deployment

BWRAP = get_settings().sandbox_bwrap
"""The bubblewrap binary a harness's python tool isolates code with."""

pytestmark = pytest.mark.e2e
JOB = "job-c0ffee01"
AGENT_BATCH = DATA / "agent_batch.jsonl"


def read_jsonl(uri: str) -> list[dict]:
    return [json.loads(line) for line in Path(uri).read_text().splitlines()]


@pytest.fixture(scope="module")
def agent_run(stack, tmp_path_factory):
    from pronk.flows.batch import run_batch

    out = tmp_path_factory.mktemp("agent")
    return asyncio.run(run_batch(input_uri=str(AGENT_BATCH), job_id=JOB, output_dir=str(out)))


def test_agent_batch_completes_with_all_tools_and_a_fan_out(agent_run):
    batch = agent_run
    assert batch["status"] == "completed" and batch["request_counts"] == {
        "total": 8,
        "completed": 8,
        "failed": 0,
        "cancelled": 0,
    }
    outputs = {o["custom_id"]: o["response"]["body"] for o in read_jsonl(batch["output_uri"])}
    traces = {cid: body["pronk"]["trace"] for cid, body in outputs.items() if "trace" in body["pronk"]}
    used = set().union(*(t["tool_calls"] for t in traces.values()))
    assert {"python", "sql", "search", "spawn_subagents"} <= used
    assert traces["agent-fanout"]["traces"] >= 2
    for cid in ("agent-python", "agent-sql", "agent-search", "agent-fanout", "agent-narrow-sql"):
        assert outputs[cid]["choices"][0]["finish_reason"] in {"stop", "max_steps"}
        assert traces[cid]["steps"] >= 2
    assert outputs["agent-narrow-sql"]["choices"][0]["finish_reason"] == "max_steps"
    transcript = outputs["agent-sql"]["pronk"]["transcript"]
    assert [m["role"] for m in transcript[:4]] == ["system", "user", "assistant", "tool"]
    # The harness reads a step the way parse_call does: a raw control character inside a generated string is kept.
    assert json.loads(transcript[2]["content"], strict=False)["tool"] == "sql"
    assert sum(body["usage"]["prompt_tokens"] for body in outputs.values()) == batch["usage"]["input_tokens"]
    # Four lines carry a check; whether the random model passes one is its choice, that each was checked is not.
    checked = {"agent-python", "agent-sql", "agent-fanout", "chat-plain"}
    statuses = {cid: body["pronk"]["check"]["status"] for cid, body in outputs.items()}
    assert all(statuses[cid] in {"passed", "failed"} for cid in checked), statuses
    assert all(status == "unchecked" for cid, status in statuses.items() if cid not in checked), statuses
    checks = batch["checks"]
    assert checks["passed"] + checks["failed"] == 4 and checks["unchecked"] == 4
    assert batch["tasks_counted"] == "passed" and batch["success_rate"] == checks["passed"] / 4


def test_step_records_show_one_worker_per_trace_and_cached_prefixes(agent_run):
    steps = pl.read_ndjson(agent_run["steps_uri"])
    assert Path(agent_run["steps_uri"]).parent == Path(agent_run["output_uri"]).parent
    assert {
        "trace_id",
        "step",
        "parent_trace_id",
        "worker_id",
        "model_version",
        "prompt_tokens",
        "cached_tokens",
        "output_tokens",
        "queue_time_s",
        "engine_time_s",
        "tool_name",
        "tool_time_s",
        "error",
    } <= set(steps.columns)
    served = steps.filter(pl.col("worker_id").is_not_null())
    per_family = served.group_by("root_trace_id").agg(pl.col("worker_id").n_unique().alias("workers"))
    assert per_family["workers"].max() == 1
    agent = served.filter(pl.col("kind") == "agent")
    assert agent.filter(pl.col("step") >= 1)["cached_tokens"].min() > 0
    children = agent.filter(pl.col("parent_trace_id").is_not_null())
    # The model picks how many sub-agents to spawn (the tool's schema allows 1 to max_fan_out): at least one ran.
    assert children.height >= 1 and children["cached_tokens"].min() > 0
    assert set(steps["kind"]) == {"agent", "chat", "replay"}
    assert served["model_version"].unique().to_list() == ["pronk-tiny/1"]


def test_a_raising_tool_a_runaway_python_call_and_a_stuck_tool_are_contained(stack, tmp_path):
    from pronk.agents.harness import Harness
    from pronk.agents.step_records import StepRecorder
    from pronk.batches.input import validate_input
    from pronk.batches.outputs import output_line
    from pronk.engine.registry import FileRegistry
    from pronk.engine.router import Router
    from pronk.jobs.catalog import resolve_job
    from pronk.jobs.versions import with_changes

    job = with_changes(
        resolve_job(JOB, get_settings()),
        {
            "tools": {
                "enabled": [
                    "python",
                    "tests.pronk.agents.tool_fixtures:ExplodingTool",
                    "tests.pronk.agents.tool_fixtures:StuckTool",
                ],
                "python": {"cpu_s": 1, "wall_s": 25.0},
            },
            "harness": {"tool_timeout_s": 30.0},
        },
    )
    runaway = {
        "type": "object",
        "properties": {"code": {"type": "string", "enum": ["while True:\n    pass"]}},
        "required": ["code"],
        "additionalProperties": False,
    }

    def agent(cid: str, name: str, parameters=None, **limits) -> str:
        function = {"name": name, **({"parameters": parameters} if parameters else {})}
        body = {
            "model": "pronk-tiny",
            "messages": [{"role": "user", "content": "go"}],
            "tools": [{"type": "function", "function": function}],
            "tool_choice": "required",
            "max_tokens": 48,
            "seed": 3,
            "harness": {"max_steps": 2, **limits},
        }
        return json.dumps({"custom_id": cid, "method": "POST", "url": "/v1/chat/completions", "body": body})

    lines = "\n".join(
        [agent("runaway", "python", runaway), agent("raises", "explode"), agent("stuck", "stuck", tool_timeout_s=2.0)]
    )
    validated = validate_input(lines.encode(), job)
    assert validated.errors == []
    router = Router(
        job.job_id,
        FileRegistry(stack.registry_dir, stack.heartbeat_timeout_s),
        policy="trace_affinity",
        token=worker_token(stack),
    )
    recorder = StepRecorder()

    async def run_all():
        try:
            return await asyncio.gather(
                *(Harness(router, job, recorder, tmp_path, sandbox_bwrap=BWRAP).run_line(r) for r in validated.requests)
            )
        finally:
            await router.aclose()

    outcomes = {o.custom_id: o for o in asyncio.run(run_all())}
    expected = {
        "runaway": "CPU time limit of 1s exceeded",
        "raises": "RuntimeError: kaboom",
        "stuck": "timed out after 2s",
    }
    for cid, text in expected.items():
        body = output_line(outcomes[cid]).response.body
        assert body["choices"][0]["finish_reason"] == "max_steps"
        tool_message = body["pronk"]["transcript"][2]
        assert (
            tool_message["role"] == "tool" and "error]" in tool_message["content"] and text in tool_message["content"]
        )
        first = next(r for r in recorder.take_line(cid) if r.trace_id == cid and r.step == 0)
        assert first.tool_ok is False and first.tool_name in {"python", "explode", "stuck"}


def test_replay_shapes_produce_exact_token_counts(stack):
    from pronk.agents.replay import load_shapes, run_shape
    from pronk.engine.registry import FileRegistry
    from pronk.engine.router import Router

    shapes = load_shapes(PROJECT_ROOT / "data" / "shapes" / "sample_shapes.jsonl")

    async def replay_all():
        router = Router(
            JOB,
            FileRegistry(stack.registry_dir, stack.heartbeat_timeout_s),
            policy="trace_affinity",
            token=worker_token(stack),
        )
        try:
            return await asyncio.gather(*(run_shape(router, s, kv_pin_ttl_s=5.0, time_scale=0.2) for s in shapes))
        finally:
            await router.aclose()

    for shape, trace in zip(shapes, asyncio.run(replay_all())):
        assert len(trace.records) == shape.total_steps()
        assert sum(r.output_tokens for r in trace.records) == shape.total_output_tokens()
        root = sorted((r for r in trace.records if r.trace_id == shape.trace_id), key=lambda r: r.step)
        expected_prompt = shape.system_prompt_tokens
        for step, record in zip(shape.steps, root):
            expected_prompt += step.new_prompt_tokens
            assert (record.prompt_tokens, record.output_tokens) == (expected_prompt, step.output_tokens)
            expected_prompt += step.output_tokens
        assert len({r.worker_id for r in trace.records}) == 1
        if len(root) > 1:
            assert min(r.cached_tokens for r in root[1:]) > 0


def test_sample_agent_batch_runs_from_the_cli_and_from_a_prefect_deployment(stack, tmp_path):
    cli = subprocess.run(
        [
            str(Path(sys.executable).parent / "pronk"),
            "batch",
            "run",
            str(AGENT_BATCH),
            "--job",
            "tiny-cpu",
            "--out",
            str(tmp_path / "cli"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ},
    )
    assert cli.returncode == 0, cli.stderr
    batch = json.loads(cli.stdout.strip().splitlines()[-1])
    assert batch["status"] == "completed" and batch["request_counts"]["completed"] == 8
    assert pl.read_ndjson(batch["steps_uri"]).height >= 8

    deployed = run_batch_deployment(
        input_uri=AGENT_BATCH, job_id=JOB, output_dir=tmp_path / "deployed", batch_id="batch_agentdeployment"
    )
    assert deployed.returncode == 0, deployed.stdout + deployed.stderr
    stored = BatchStore(get_settings()).load("batch_agentdeployment")
    assert stored.status == "completed" and stored.request_counts.completed == 8
    assert pl.read_ndjson(stored.steps_uri).height >= 8
