"""The Prefect side of sampled traces, without a server: the task-run budget, the sample's markdown, run names."""

from __future__ import annotations

import uuid

from pronk.control.trace_sample.choice import SampledTrace
from pronk.control.trace_sample.dag import DagNode
from pronk.control.trace_sample.drawer import sample_markdown
from pronk.control.trace_sample.drawing import within_budget
from pronk.flows.batch import batch_id_of_flow_run


def dag(size: int) -> list[DagNode]:
    return [DagNode(f"k{i}", f"n{i}", "step", "t", i) for i in range(size)]


def test_whole_dags_are_drawn_while_they_fit_the_budget():
    dags = [dag(300), dag(400), dag(250), dag(60)]
    assert [len(d) for d in within_budget(dags, 600)] == [300, 250]
    assert within_budget([dag(700)], 600) == []


def test_the_sample_markdown_links_mlflow_and_shows_hostile_ids_as_text():
    lines = [
        SampledTrace(line=3, custom_id="[x](javascript:alert(1))|<b>", ok=True, steps=[{}, {}]),
        SampledTrace(line=9, custom_id="t-9", ok=False, steps=[{}]),
    ]
    failed_step = DagNode("t-9/0", "t-9 step 0: error", "step", "t-9", 0, failed=True)
    failed_step.figures = {"prompt_tokens": 5, "cached_tokens": 0, "output_tokens": 0, "worker": None}
    failed_step.figures |= {"model_version": None, "queue_time_s": 0.0, "engine_time_s": 0.0, "attempts": 3}
    links = {"t-9": "http://127.0.0.1:5000/#/experiments/1/traces?x=y"}
    text = sample_markdown("batch_1", lines, links, [[], [failed_step]])
    rows = [row for row in text.splitlines() if row.startswith("| 3") or row.startswith("| 9")]
    assert rows[0] == "| 3 | _x_(javascript:alert(1))__b_ | completed | 2 | — |"
    assert rows[1] == "| 9 | t-9 | error | 1 | [open](http://127.0.0.1:5000/#/experiments/1/traces?x=y) |"
    assert "| t-9 step 0: error (failed) | prompt 5 tokens (0 cached), 0 out; worker -, model -;" in text


def test_a_run_without_a_batch_id_takes_one_from_its_flow_run():
    flow_run_id = str(uuid.uuid4())
    batch_id = batch_id_of_flow_run(flow_run_id)
    assert batch_id == batch_id_of_flow_run(flow_run_id) and batch_id.startswith("batch_") and len(batch_id) == 30
