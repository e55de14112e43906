"""See a trace, on the real stack: a batch started like `prefect deployment run` (no batch id) is named by its batch,
its sampled traces are task runs whose `task_inputs` draw each trace's DAG, at the times its steps ran, each opens
in MLflow, and the run's page shows them in headless Chromium."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
from pathlib import Path
from uuid import UUID

import pytest

from pronk.agents.step_records import StepRecord
from pronk.batches.store import BatchStore
from pronk.control.trace_sample.dag import trace_dag
from pronk.flows.batch import batch_id_of_flow_run
from pronk.settings import get_settings
from tests.conftest import DATA
from tests.flows.deployment_runs import run_batch_deployment

pytestmark = pytest.mark.e2e
JOB = "job-c0ffee01"
LINES = ["agent-fanout", "agent-sql", "chat-plain", "replay-fanout"]
SAMPLED = ["agent-fanout", "chat-plain", "replay-fanout"]
"""Three of the four, spread evenly: lines 1, 3 and 4 (none fails, so none goes first)."""
SCREENSHOT = os.environ.get("PRONK_TRACE_DAG_SCREENSHOT")
"""Where to keep the browser's screenshot of the run page (docs/trace_dag.png is one), if set."""


def read_jsonl(uri: str) -> list[dict]:
    return [json.loads(line) for line in Path(uri).read_text().splitlines() if line.strip()]


def replay_fan_out() -> dict:
    """A replayed trace whose step 1 fans out to two children (the model may spawn only one in `agent-fanout`)."""
    child = {"trace_id": "c", "system_prompt_tokens": 20, "steps": [{"new_prompt_tokens": 10, "output_tokens": 8}]}
    steps = [
        {"new_prompt_tokens": 40, "output_tokens": 16, "tool_gap_s": 0.1},
        {"new_prompt_tokens": 30, "output_tokens": 8, "tool_gap_s": 0.1, "fan_out": [child, child]},
        {"new_prompt_tokens": 30, "output_tokens": 8},
    ]
    body = {"model": "pronk-tiny", "shape": {"trace_id": "fan", "system_prompt_tokens": 200, "steps": steps}}
    return {"custom_id": "replay-fanout", "method": "POST", "url": "/v1/pronk/replay", "body": body}


@pytest.fixture(scope="module")
def dag_run(stack, tmp_path_factory):
    """Four lines (two fan out) through the run-batch deployment with `trace_sample=3` and no batch id."""
    work = tmp_path_factory.mktemp("dags")
    by_id = {line["custom_id"]: line for line in read_jsonl(str(DATA / "agent_batch.jsonl"))}
    by_id["replay-fanout"] = replay_fan_out()
    (work / "input.jsonl").write_text("".join(json.dumps(by_id[cid]) + "\n" for cid in LINES))
    started = run_batch_deployment(input_uri=work / "input.jsonl", job_id=JOB, output_dir=work / "out", trace_sample=3)
    assert started.returncode == 0, started.stdout + started.stderr
    flow_run_id = re.search(r"UUID: ([0-9a-f-]{36})", started.stdout).group(1)  # type: ignore[union-attr]
    return flow_run_id, asyncio.run(server_view(flow_run_id))


async def server_view(flow_run_id: str, deadline_s: float = 180.0) -> dict:
    """The finished flow run, once its sample's drawer has published the sample's markdown (its last act), with its
    task runs, its artifacts and its graph, as the Prefect server has them."""
    from prefect import get_client
    from prefect.client.schemas.filters import (
        ArtifactFilter,
        ArtifactFilterFlowRunId,
        FlowRunFilter,
        FlowRunFilterId,
        LogFilter,
        LogFilterFlowRunId,
    )

    run_filter = FlowRunFilter(id=FlowRunFilterId(any_=[UUID(flow_run_id)]))
    artifact_filter = ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[UUID(flow_run_id)]))
    async with get_client() as client:
        loop = asyncio.get_running_loop()
        until = loop.time() + deadline_s
        while not [
            a
            for a in await client.read_artifacts(artifact_filter=artifact_filter)
            if a.type == "markdown" and "sampled traces" in (a.description or "")  # the run's report is markdown too
        ]:
            assert loop.time() < until, f"the trace sample was not drawn within {deadline_s} s of the flow run's end"
            await asyncio.sleep(1.0)
        graph = await client.request("GET", "/flow_runs/{id}/graph-v2", path_params={"id": flow_run_id})
        flow_logs = LogFilter(flow_run_id=LogFilterFlowRunId(any_=[UUID(flow_run_id)]))  # SQLite: no text search
        logs = await client.read_logs(flow_logs, limit=200)
        return {
            "flow_run": await client.read_flow_run(UUID(flow_run_id)),
            "task_runs": await client.read_task_runs(flow_run_filter=run_filter, limit=200),
            "artifacts": await client.read_artifacts(artifact_filter=artifact_filter),
            "graph": graph.json(),
            "logs": [log.message for log in logs],
        }


def test_a_deployment_run_without_a_batch_id_is_named_by_its_batch(dag_run):
    flow_run_id, view = dag_run
    batch_id = batch_id_of_flow_run(flow_run_id)
    assert view["flow_run"].name == batch_id
    batch = BatchStore(get_settings()).load(batch_id)
    assert batch.status == "completed" and batch.request_counts.completed == len(LINES)
    assert batch.flow_run_id == flow_run_id


def test_sampled_traces_are_task_runs_whose_inputs_draw_their_dags(dag_run):
    flow_run_id, view = dag_run
    batch = BatchStore(get_settings()).load(batch_id_of_flow_run(flow_run_id))
    assert batch.steps_uri is not None
    steps = [StepRecord(**row) for row in read_jsonl(batch.steps_uri)]
    task_runs = view["task_runs"]
    names = {t.id: t.name for t in task_runs}
    drawn = {t.name: t for t in task_runs if " step " in t.name}
    expected = [n for cid in SAMPLED for n in trace_dag([r for r in steps if r.custom_id == cid])]
    assert sorted(drawn) == sorted(n.name for n in expected) and len(drawn) == len(expected)
    assert not [name for name in drawn if name.startswith("agent-sql")]
    key_to_name = {n.key: n.name for n in expected}
    for node in expected:
        task_run = drawn[node.name]
        upstream = {names.get(ref.id) for ref in task_run.task_inputs.get("upstream", [])}
        assert upstream == {key_to_name[k] for k in node.upstream}, node.name
        assert task_run.state.message == node.summary and task_run.state.is_failed() == node.failed
        assert abs(task_run.start_time.timestamp() - node.started_at) < 1e-3  # at the time its step ran
        assert task_run.expected_start_time == task_run.start_time <= task_run.end_time == task_run.state.timestamp
    fan_outs = {n.trace_id: n for n in expected if n.kind == "tool" and n.figures["children"]}
    assert set(fan_outs) == {"agent-fanout", "replay-fanout"} and fan_outs["replay-fanout"].figures["children"] == 2
    for tool in fan_outs.values():
        branches = [n for n in expected if n.upstream == [tool.key] and n.kind == "step"]
        assert len(branches) == tool.figures["children"]  # the children's first steps, side by side
    flow_run = view["flow_run"]
    assert flow_run.state.is_completed() and all(t.state.is_final() for t in task_runs)
    assert all(t.created >= flow_run.end_time for t in drawn.values())  # drawn once the flow run had ended, yet shown
    assert all(flow_run.start_time <= t.start_time <= t.end_time <= flow_run.end_time for t in drawn.values())  # in it
    parents = {id_: {e["id"] for e in node["parents"]} for id_, node in view["graph"]["nodes"]}
    for node in expected:  # the graph the UI draws: each node under its upstream nodes
        ids = {t.name: str(t.id) for t in drawn.values()}
        assert parents[ids[node.name]] == {ids[key_to_name[k]] for k in node.upstream}, node.name
    summary = f"{len(SAMPLED)} sampled traces drawn as {len(expected)} task runs"
    assert [m for m in view["logs"] if summary in m]  # the drawer's summary line, in the flow run's logs
    replayed = fan_outs["replay-fanout"]
    (joined,) = [n for n in expected if replayed.key in n.upstream and n.trace_id == "replay-fanout"]
    assert joined.name == "replay-fanout step 2: length" and len(joined.upstream) == 3  # the tool and both children


def test_each_sampled_trace_links_to_its_mlflow_trace_which_opens(dag_run, stack):
    import mlflow
    from mlflow import MlflowClient

    flow_run_id, view = dag_run
    (table,) = [a for a in view["artifacts"] if a.type == "table" and "traces" in (a.description or "")]
    rows = json.loads(table.data) if isinstance(table.data, str) else table.data
    links = {row["custom_id"]: row["mlflow_trace"] for row in rows if row["mlflow_trace"]}
    assert sorted(links) == sorted(SAMPLED)
    (markdown,) = [a for a in view["artifacts"] if a.type == "markdown" and "sampled traces" in (a.description or "")]
    assert all(f"[open]({url})" in markdown.data for url in links.values())
    (report,) = [a for a in view["artifacts"] if a.type == "markdown" and "report" in (a.description or "")]
    assert "| tasks per dollar (counts " in report.data and "## Completion times" in report.data
    assert "## agent-fanout" in markdown.data and "| agent-fanout step 0: " in markdown.data
    mlflow.set_tracking_uri(stack.tracking_uri)
    batch = BatchStore(get_settings()).load(batch_id_of_flow_run(flow_run_id))
    steps = read_jsonl(batch.steps_uri or "")
    for custom_id, url in links.items():
        assert url.startswith(f"http://127.0.0.1:{stack.mlflow_port}/#/experiments/")
        trace = MlflowClient().get_trace(url.rsplit("selectedEvaluationId=", 1)[1])
        spans = trace.data.spans
        assert [s.span_type for s in spans].count("LLM") == sum(1 for r in steps if r["custom_id"] == custom_id)
        root = next(s for s in spans if s.span_type == "AGENT")
        assert root.attributes["pronk.batch_id"] == batch.id and root.attributes["pronk.root_trace_id"] == custom_id
    experiment = mlflow.get_experiment_by_name(f"pronk-{JOB}")
    assert experiment is not None
    found = mlflow.search_traces(
        locations=[experiment.experiment_id], filter_string=f"trace.name = 'trace {SAMPLED[0]}'", return_type="list"
    )
    assert found


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def test_the_run_page_shows_the_sampled_step_tasks_in_headless_chromium(dag_run, stack, tmp_path):
    browser_path = chromium()
    if browser_path is None:
        pytest.skip("the system Chromium is not installed (scripts/install.sh apt-installs it)")
    playwright = pytest.importorskip("playwright.sync_api", reason="playwright is in the dev extra")
    flow_run_id, view = dag_run
    expected = sorted(t.name for t in view["task_runs"] if " step " in t.name)
    page_url = f"http://127.0.0.1:{stack.prefect_port}/runs/flow-run/{flow_run_id}"
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=browser_path, args=["--no-sandbox", "--use-gl=swiftshader"])
        try:
            page = browser.new_page(viewport={"width": 1600, "height": 1000})
            page.set_default_timeout(60_000)  # the UI polls the server forever: wait for elements, not for quiet
            page.goto(page_url, wait_until="domcontentloaded")
            page.get_by_text(batch_id_of_flow_run(flow_run_id)).first.wait_for()
            page.wait_for_timeout(3_000)  # the graph draws on a canvas after the page's data arrives
            page.screenshot(path=SCREENSHOT or str(tmp_path / "run_page.png"))
            page.get_by_text("Task Runs", exact=True).first.click()
            page.get_by_text(re.compile(r" step \d+(: | tool: )")).first.wait_for()
            shown = page.inner_text("body")
            assert [name for name in expected if name in shown], shown[:3000]
            step = next(t for t in view["task_runs"] if " step " in t.name)
            page.goto(f"http://127.0.0.1:{stack.prefect_port}/runs/task-run/{step.id}", wait_until="domcontentloaded")
            page.get_by_text(step.name).first.wait_for()
            page.get_by_text(step.state.message, exact=True).first.wait_for()  # its figures, logged
        finally:
            browser.close()
