"""The improve flow end to end on the real stack and the tiny model: rollouts on the job's two vLLM workers, selection,
a bounded fine-tune, a new MLflow version with its lineage, a Leap through the canary.

The tiny model's answers are random, so nothing here asserts what it writes: the training lines force one final
answer (`max_steps: 1`) whose check passes on any text, and the canary may hold or refuse the new version; either
way the round's bookkeeping must be whole and the fleet must serve exactly one of the two versions.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from mlflow import MlflowClient

import pronk.flows.improve
import pronk.flows.leap
from pronk import storage
from pronk.improve.rounds import RoundStore
from pronk.jobs.catalog import resolve_job
from pronk.jobs.schema import ImproveConfig
from pronk.models.registry import alias_version
from tests.flows.test_leap import JOB, MODEL, answers_anything, fleet, restore_v1

pytestmark = pytest.mark.e2e


def training_set(path, lines: int = 4):
    """Agent lines whose one step must answer (a tool is offered, no step is left to call it) and whose check passes
    on any answer, the empty one included."""
    rows = [
        {
            "custom_id": f"train-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": MODEL,
                "max_tokens": 16,
                "messages": [{"role": "user", "content": f"task {i}: answer in one word"}],
                "tools": [{"type": "function", "function": {"name": "python"}}],
                "harness": {"max_steps": 1},
            },
            "check": {"type": "regex", "pattern": "^"},
        }
        for i in range(lines)
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return path


def test_a_round_trains_registers_and_leaps_through_the_canary(stack, tmp_path, monkeypatch):
    v1 = alias_version(MODEL, "live", stack)
    restore_v1(stack, v1)
    base = resolve_job(JOB, stack)
    job = base.model_copy(
        update={
            "quality": base.quality.model_copy(
                update={"labelled_set": str(answers_anything(tmp_path / "held-out.jsonl", lines=4))}
            ),
            "improve": ImproveConfig(
                training_set=str(training_set(tmp_path / "train.jsonl")),
                tasks_per_round=None,
                samples_per_task=2,
                max_steps=2,
                max_seconds=120,
                batch_size=2,
            ),
        }
    )
    monkeypatch.setattr(pronk.flows.improve, "resolve_job", lambda job_id, settings: job)
    monkeypatch.setattr(pronk.flows.leap, "resolve_job", lambda job_id, settings: job)
    try:
        [record] = asyncio.run(pronk.flows.improve.improve(job_id=JOB, rounds=1))
        assert record["parent_version"] == f"{MODEL}/{v1}"
        assert record["selection"]["samples"] == 8 and record["selection"]["tasks"] == 4
        rollouts = storage.read_bytes(RoundStore(stack).rollouts_uri(record["id"]), stack)
        assert len(rollouts.decode().splitlines()) == 8
        if record["status"] == "nothing_to_learn":
            assert record["selection"]["kept"] == 0
            return
        assert {"rollouts", "training", "leap"} <= set(record["seconds"])
        training = record["training"]
        assert 1 <= training["steps"] <= 2 and len(training["losses"]) == training["steps"]
        assert not Path(training["checkpoint_dir"]).exists()  # registered in MLflow, not kept twice
        assert record["status"] in ("leapt", "refused"), record["message"]
        name, version = record["version"].split("/")
        client = MlflowClient(tracking_uri=stack.tracking_uri)
        tags = client.get_model_version(name, version).tags
        assert tags["pronk.improve_run"] == record["mlflow_run_id"]
        run = client.get_run(record["mlflow_run_id"])
        assert run.data.params["parent_version"] == f"{MODEL}/{v1}"
        assert {"train_loss", "held_out_before", "held_out_after"} <= set(run.data.metrics)
        for side in ("held_out_before", "held_out_after"):
            assert record[side]["passed"] + record[side]["failed"] == 4
        served = {w.stats.model_version for w in fleet(stack)}
        assert served == ({record["version"]} if record["status"] == "leapt" else {f"{MODEL}/{v1}"})
    finally:
        restore_v1(stack, v1)
