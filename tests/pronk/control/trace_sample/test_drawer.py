"""The sample's drawer without a server: its order is taken once, it starts detached, and its task runs are sent
final at the times their steps ran, linked by their ids, and the same ones when drawn again; it gives up its
backlog when the server is gone and ends at once on SIGTERM."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from datetime import datetime
from types import SimpleNamespace

import httpx
import pytest
from prefect.settings import PREFECT_API_URL, temporary_settings

from pronk import storage
from pronk.agents.step_records import StepRecord
from pronk.control.trace_sample import drawer, drawing
from pronk.control.trace_sample.choice import SampledTrace, trace_table
from pronk.control.trace_sample.dag import trace_dag
from pronk.control.trace_sample.drawer import PrefectAway, SampleOrder, order_uri, take_order
from pronk.control.trace_sample.drawing import draw_trace_dags, node_events
from pronk.control.trace_sample.lock import lock_path, take_lock
from pronk.settings import PROJECT_ROOT, Settings

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

    monkeypatch.setattr(drawer.subprocess, "Popen", refuse)
    with pytest.raises(OSError):
        drawer.place_order(order(), settings)
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

    def popen(args, **kw):
        started.append((args, kw))
        return SimpleNamespace(pid=4242)

    monkeypatch.setattr(drawer.subprocess, "Popen", popen)
    monkeypatch.setenv("PREFECT__FLOW_RUN_ID", FLOW_RUN)
    drawer.place_order(order("-batch"), settings)
    ((args, kw),) = started
    assert args[-2:] == ["--", "-batch"]  # a hostile batch id is never an option
    assert args[args.index("--lock-fd") + 1] == str(kw["pass_fds"][0])
    assert kw["start_new_session"] is True and "PREFECT__FLOW_RUN_ID" not in kw["env"]
    assert lock_path(settings).read_text() == "4242\n"  # the drawer's pid, for `pronk stack down`
    taken = take_order("-batch", settings)
    assert taken is not None and taken.traces == order().traces


def test_an_order_placed_while_a_drawer_holds_the_lock_starts_no_second_drawer(settings, monkeypatch):
    """A burst of batches ending starts one drawer; it draws every order placed until it lets the lock go."""
    import fcntl

    started = []

    def popen(args, **kw):
        started.append(args)
        return SimpleNamespace(pid=4242)

    monkeypatch.setattr(drawer.subprocess, "Popen", popen)
    settings.logs_dir.mkdir(parents=True, exist_ok=True)
    held = os.open(lock_path(settings), os.O_RDWR | os.O_CREAT)
    fcntl.flock(held, fcntl.LOCK_EX)
    try:
        drawer.place_order(order("batch_1"), settings)
        drawer.place_order(order("batch_2"), settings)
        assert started == [] and drawer.placed_orders(settings) == ["batch_1", "batch_2"]
    finally:
        os.close(held)
    drawer.place_order(order("batch_3"), settings)
    assert len(started) == 1


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_prefect_server_that_is_gone_fails_the_health_check_at_once():
    with temporary_settings({PREFECT_API_URL: f"http://127.0.0.1:{closed_port()}/api"}):
        started = time.monotonic()
        error = asyncio.run(drawer.prefect_health())
    assert isinstance(error, httpx.ConnectError) and time.monotonic() - started < 5


def quiet_main(monkeypatch, settings: Settings) -> None:
    """Let `main` run inside pytest: leave its logging and its SIGTERM handler alone, and give it `settings`."""
    monkeypatch.setattr(drawer.logging, "basicConfig", lambda **kw: None)
    monkeypatch.setattr(drawer.signal, "signal", lambda *args: None)
    monkeypatch.setattr(drawer, "get_settings", lambda: settings)


def place_orders(settings, *batch_ids: str) -> None:
    for batch_id in batch_ids:
        storage.write_bytes(order_uri(settings, batch_id), order(batch_id).model_dump_json().encode(), settings)


def run_drawer(settings, *batch_ids: str) -> int:
    """`main` as `start_drawer` runs it: holding the drawers' lock, `batch_ids`' orders first."""
    lock = take_lock(settings)
    assert lock is not None
    try:
        return drawer.main(["--lock-fd", str(lock), "--", *batch_ids])
    finally:
        os.close(lock)


def test_the_drawer_gives_up_its_backlog_when_the_prefect_server_is_gone(settings, monkeypatch, caplog):
    async def refused():
        return httpx.ConnectError("[Errno 111] Connection refused")

    async def never(order, settings):
        raise AssertionError("drawn without a server")

    place_orders(settings, "batch_1", "batch_2")
    monkeypatch.setattr(drawer, "prefect_health", refused)
    monkeypatch.setattr(drawer, "fulfil", never)
    quiet_main(monkeypatch, settings)
    started = time.monotonic()
    assert run_drawer(settings, "batch_1") == 1
    assert time.monotonic() - started < 5
    assert drawer.placed_orders(settings) == ["batch_1", "batch_2"]  # left for the next drawer
    assert "2 orders stay in the store" in caplog.text
    with pytest.raises(PrefectAway):
        drawer.draw_order("batch_2", settings)


def test_a_live_server_gets_every_order_drawn(settings, monkeypatch):
    drawn = []

    async def healthy():
        return None

    async def fulfil(order, settings):
        drawn.append(order.batch_id)

    place_orders(settings, "batch_1", "batch_2")
    monkeypatch.setattr(drawer, "prefect_health", healthy)
    monkeypatch.setattr(drawer, "fulfil", fulfil)
    quiet_main(monkeypatch, settings)
    assert run_drawer(settings) == 0
    assert drawn == ["batch_1", "batch_2"] and drawer.placed_orders(settings) == []


def test_the_drawer_ends_at_once_on_sigterm():
    code = (
        "import signal, time; from pronk.control.trace_sample.drawer import stop_on_sigterm; "
        "signal.signal(signal.SIGTERM, stop_on_sigterm); print('ready', flush=True); time.sleep(300)"
    )
    drawer = subprocess.Popen(
        [sys.executable, "-c", code], cwd=PROJECT_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert drawer.stdout is not None and drawer.stdout.readline() == "ready\n"
    drawer.send_signal(signal.SIGTERM)
    assert drawer.wait(timeout=10) == 0
    assert "stopped by SIGTERM" in drawer.stdout.read()


class FakeClient:
    """Takes nodes' events and logs like the server (its recorder keeps a task run's latest state, one state per
    event id); refuses the events of the nodes named in `refuse`."""

    def __init__(self, refuse: set[str] = frozenset()):  # type: ignore[assignment]
        self.events: dict[str, dict] = {}
        self.logs: list = []
        self.refuse = refuse

    async def request(self, method, path, json):
        assert method == "POST"
        if path == "/events":
            if json[0]["resource"]["prefect.resource.name"] in self.refuse:
                raise RuntimeError("503")
            self.events |= {e["id"]: e for e in json}
            return SimpleNamespace(json=lambda: None)
        assert path == "/task_runs/count"
        wanted = set(json["task_runs"]["id"]["any_"])
        final = {e["resource"]["prefect.resource.id"].removeprefix("prefect.task-run.") for e in self.final_events()}
        return SimpleNamespace(json=lambda: len(wanted & final))

    def final_events(self) -> list[dict]:
        return [e for e in self.events.values() if e["payload"]["validated_state"]["type"] in ("COMPLETED", "FAILED")]

    async def create_logs(self, logs):
        self.logs += logs


def at(stamp: str) -> float:
    return datetime.fromisoformat(stamp).timestamp()


def task_run_id(event: dict) -> str:
    return event["resource"]["prefect.resource.id"].removeprefix("prefect.task-run.")


def test_nodes_are_final_at_the_time_they_ran_and_linked_by_their_ids_the_same_when_drawn_again():
    records = [StepRecord(**row) for row in steps("t-1", 3, fail_at=1)]
    for r in records:
        r.started_at, r.engine_time_s, r.tool_time_s = 1_700_000_000.0 + 10 * r.step, 2.0, 3.0
    dag = trace_dag(records)
    client = FakeClient()
    assert asyncio.run(draw_trace_dags(client, FLOW_RUN, [dag, dag], rate=1000.0)) == 2 * len(dag)  # type: ignore[arg-type]
    assert len(client.events) == 2 * 2 * len(dag)  # Running, then final
    finals = client.final_events()
    ids = {e["payload"]["task_run"]["dynamic_key"]: task_run_id(e) for e in finals}
    assert len(set(ids.values())) == 2 * len(dag)  # the same trace twice is two DAGs, not one
    for event in finals:
        task_run, state = event["payload"]["task_run"], event["payload"]["validated_state"]
        index, key = task_run["dynamic_key"].split("/", 1)
        node = next(n for n in dag if n.key == key)
        assert task_run["name"] == node.name and state["message"] == node.summary
        assert state["type"] == ("FAILED" if node.failed else "COMPLETED")
        assert [u["id"] for u in task_run["task_inputs"]["upstream"]] == [ids[f"{index}/{k}"] for k in node.upstream]
        assert event["related"] == [
            {"prefect.resource.id": f"prefect.flow-run.{FLOW_RUN}", "prefect.resource.role": "flow-run"}
        ]
        assert event["resource"]["prefect.orchestration"] == "client"  # what the server's task-run recorder writes
        assert at(task_run["start_time"]) == at(task_run["expected_start_time"]) == node.started_at
        assert at(task_run["end_time"]) == at(event["occurred"]) == node.ended_at
    running = [e for e in client.events.values() if e not in finals]
    assert sorted(task_run_id(e) for e in running) == sorted(ids.values())
    for event in running:
        node = next(n for n in dag if n.key == event["payload"]["task_run"]["dynamic_key"].split("/", 1)[1])
        assert event["payload"]["validated_state"]["type"] == "RUNNING" and at(event["occurred"]) == node.started_at
        assert "end_time" not in event["payload"]["task_run"]
    logged = {log.task_run_id: log.timestamp.timestamp() for log in client.logs}
    assert logged == {uuid.UUID(ids[f"{i}/{n.key}"]): n.ended_at for i in (0, 1) for n in dag}
    again = FakeClient()
    asyncio.run(draw_trace_dags(again, FLOW_RUN, [dag, dag], rate=1000.0))  # type: ignore[arg-type]
    assert again.events == client.events  # the same task runs, states and events: the server keeps one of each


def test_a_node_of_no_measured_time_still_ends_after_it_starts():
    (step,) = trace_dag([StepRecord(trace_id="t", step=0, root_trace_id="t", started_at=1_700_000_000.0)])
    running, final = node_events(FLOW_RUN, 0, step)
    assert running.occurred < final.occurred  # the recorder keeps a task run's later state only


def test_a_refused_node_is_left_out_and_the_rest_drawn():
    dag = trace_dag([StepRecord(**row) for row in steps("t-1", 3)])
    client = FakeClient(refuse={dag[1].name})
    assert asyncio.run(draw_trace_dags(client, FLOW_RUN, [dag], rate=1000.0)) == len(dag) - 1  # type: ignore[arg-type]
    assert len(client.logs) == len(dag) - 1


def test_nodes_the_server_has_not_written_in_time_are_not_counted(monkeypatch):
    dag = trace_dag([StepRecord(**row) for row in steps("t-1", 2)])
    client = FakeClient()
    client.final_events = lambda: []  # type: ignore[method-assign]
    monkeypatch.setattr(drawing, "RECORD_WAIT_S", 0.0)
    assert asyncio.run(draw_trace_dags(client, FLOW_RUN, [dag], rate=1000.0)) == 0  # type: ignore[arg-type]


def test_the_table_links_each_sampled_row_to_its_mlflow_trace():
    rows = [{"custom_id": "a", "steps": 2}, {"custom_id": "b", "steps": 1}, {}]
    links = {"b": "http://127.0.0.1:5000/#/experiments/1/traces?selectedEvaluationId=tr-1"}
    table = trace_table(rows, links)
    assert [r["mlflow_trace"] for r in table] == ["", links["b"], ""] and table[0]["steps"] == 2


def test_the_drawer_lives_a_bounded_time():
    small, big = order(), order()
    big.traces = [SampledTrace(line=i + 1, custom_id=f"t-{i}", ok=True, steps=steps(f"t-{i}", 200)) for i in range(9)]
    assert drawer.deadline_s(small) < drawer.deadline_s(big) <= 30 + 60 + 600 / 40 + 15 + 30
