"""The sample's drawer without a server: its order is taken once, it starts detached, and its task runs are created
final, linked by their ids, and the same ones when drawn again."""

from __future__ import annotations

import asyncio
import uuid
from types import SimpleNamespace

import pytest

from pronk import storage
from pronk.agents.step_records import StepRecord
from pronk.agents.trace_dag import trace_dag
from pronk.batches.traces import SampledTrace, trace_table
from pronk.control import trace_sample
from pronk.control.trace_dags import draw_trace_dags
from pronk.control.trace_sample import SampleOrder, order_uri, take_order
from pronk.settings import Settings

FLOW_RUN = str(uuid.uuid4())


def steps(trace: str, n: int, fail_at: int | None = None) -> list[dict]:
    rows = []
    for i in range(n):
        tool = "sql" if i < n - 1 else None
        rows.append(
            {
                "trace_id": trace,
                "step": i,
                "root_trace_id": trace,
                "custom_id": trace,
                "tool_name": tool,
                "tool_ok": None if tool is None else i != fail_at,
                "finish_reason": "stop",
            }
        )
    return rows


def order(batch_id: str = "batch_1") -> SampleOrder:
    traces = [SampledTrace(line=1, custom_id="t-1", ok=True, steps=steps("t-1", 3, fail_at=1))]
    return SampleOrder(batch_id=batch_id, flow_run_id=FLOW_RUN, job_id="job-c0ffee01", traces=traces, rows=[])


@pytest.fixture
def settings(tmp_path) -> Settings:
    return Settings(data_dir=tmp_path, storage_uri=str(tmp_path / "store"))


def test_an_order_whose_drawer_cannot_start_is_not_left_behind(settings, monkeypatch):
    def refuse(*args, **kwargs):
        raise OSError("no more processes")

    monkeypatch.setattr(trace_sample.subprocess, "Popen", refuse)
    with pytest.raises(OSError):
        trace_sample.place_order(order(), settings)
    assert not storage.exists(order_uri(settings, "batch_1"), settings)


def test_an_order_is_taken_once_and_a_malformed_one_is_dropped(settings):
    placed = order()
    storage.write_bytes(order_uri(settings, "batch_1"), placed.model_dump_json().encode(), settings)
    assert take_order("batch_1", settings) == placed
    assert take_order("batch_1", settings) is None  # a second drawer finds nothing to draw
    storage.write_bytes(order_uri(settings, "batch_2"), b'{"batch_id": 3', settings)
    assert take_order("batch_2", settings) is None
    assert not storage.exists(order_uri(settings, "batch_2"), settings)


def test_placing_an_order_starts_a_drawer_in_its_own_session(settings, monkeypatch):
    started = []
    monkeypatch.setattr(trace_sample.subprocess, "Popen", lambda args, **kw: started.append((args, kw)))
    monkeypatch.setenv("PREFECT__FLOW_RUN_ID", FLOW_RUN)
    trace_sample.place_order(order("-batch"), settings)
    ((args, kw),) = started
    assert args[-3:] == ["pronk.control.trace_sample", "--", "-batch"]  # a hostile batch id is never an option
    assert kw["start_new_session"] is True and "PREFECT__FLOW_RUN_ID" not in kw["env"]
    taken = take_order("-batch", settings)
    assert taken is not None and taken.traces == order().traces


class FakeClient:
    """Records task-run creations and logs; refuses the nodes named in `refuse`."""

    def __init__(self, refuse: set[str] = frozenset()):  # type: ignore[assignment]
        self.task_runs: list[dict] = []
        self.logs: list = []
        self.refuse = refuse

    async def create_task_run(self, task, **kw):
        if kw["name"] in self.refuse:
            raise RuntimeError("503")
        self.task_runs.append(kw)
        return SimpleNamespace(id=kw["id"])

    async def create_logs(self, logs):
        self.logs += logs


def test_nodes_are_created_final_and_linked_by_their_ids_the_same_when_drawn_again():
    dag = trace_dag([StepRecord(**row) for row in steps("t-1", 3, fail_at=1)])
    client = FakeClient()
    assert asyncio.run(draw_trace_dags(client, FLOW_RUN, [dag, dag], rate=1000.0)) == 2 * len(dag)  # type: ignore[arg-type]
    ids = {(tr["dynamic_key"]): tr["id"] for tr in client.task_runs}
    assert len(set(ids.values())) == 2 * len(dag)  # the same trace twice is two DAGs, not one
    for tr in client.task_runs:
        index, key = tr["dynamic_key"].split("/", 1)
        node = next(n for n in dag if n.key == key)
        assert tr["name"] == node.name and tr["state"].message == node.summary
        assert tr["state"].is_failed() == node.failed and (tr["state"].is_failed() or tr["state"].is_completed())
        assert [u.id for u in tr["task_inputs"]["upstream"]] == [ids[f"{index}/{k}"] for k in node.upstream]
        assert tr["flow_run_id"] == uuid.UUID(FLOW_RUN)
    assert {log.task_run_id for log in client.logs} == set(ids.values())
    again = FakeClient()
    asyncio.run(draw_trace_dags(again, FLOW_RUN, [dag, dag], rate=1000.0))  # type: ignore[arg-type]
    assert {tr["dynamic_key"]: tr["id"] for tr in again.task_runs} == ids  # the server keeps the first of each


def test_a_refused_node_is_left_out_and_the_rest_drawn():
    dag = trace_dag([StepRecord(**row) for row in steps("t-1", 3)])
    client = FakeClient(refuse={dag[1].name})
    assert asyncio.run(draw_trace_dags(client, FLOW_RUN, [dag], rate=1000.0)) == len(dag) - 1  # type: ignore[arg-type]
    assert len(client.logs) == len(dag) - 1


def test_the_table_links_each_sampled_row_to_its_mlflow_trace():
    rows = [{"custom_id": "a", "steps": 2}, {"custom_id": "b", "steps": 1}, {}]
    links = {"b": "http://127.0.0.1:5000/#/experiments/1/traces?selectedEvaluationId=tr-1"}
    table = trace_table(rows, links)
    assert [r["mlflow_trace"] for r in table] == ["", links["b"], ""] and table[0]["steps"] == 2


def test_the_drawer_lives_a_bounded_time():
    small, big = order(), order()
    big.traces = [SampledTrace(line=i + 1, custom_id=f"t-{i}", ok=True, steps=steps(f"t-{i}", 200)) for i in range(9)]
    assert trace_sample.deadline_s(small) < trace_sample.deadline_s(big) <= 30 + 60 + 600 / 40 + 30
