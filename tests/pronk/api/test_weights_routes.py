"""The weights routes in-process (TestClient) on MLflow/SQLite in a temp dir.

Workers are registry entries, the Leap starter a recording double.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from fastapi.testclient import TestClient
from safetensors.torch import save_file

from pronk.api.app import create_app
from pronk.api.keys import ApiKeyStore
from pronk.api.weights.serving import LEAP
from pronk.models.registry import latest_version, register_model_dir, set_alias
from pronk.settings import Settings
from tests.fakes import announce_worker

JOB = "job-0000beef"
SHAPES = {"model.embed_tokens.weight": (16, 8), "lm_head.weight": (16, 8)}


def checkpoint(path: Path, shapes=SHAPES) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    save_file({name: torch.randn(shape) for name, shape in shapes.items()}, path / "model.safetensors")
    return path


class RecordingLeaps:
    """A `DeploymentStarter` that records (job id, version, Leap id) of each leap run it is asked to start."""

    def __init__(self):
        self.started: list[tuple[str, int, str]] = []

    async def start(self, deployment: str, parameters: dict[str, Any], run_name: str, tags: list[str]) -> str:
        assert deployment == LEAP and run_name == parameters["leap_id"] and parameters["job_id"] in tags
        self.started.append((parameters["job_id"], parameters["version"], parameters["leap_id"]))
        return "flow-run-1"


@pytest.fixture
def api(tmp_path: Path):
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    (jobs / "m.yaml").write_text(
        f"job_id: {JOB}\nmodel: models:/m@live\nserved_model_name: m\nprice_per_worker_hour: 0.1\n"
    )
    settings = Settings(
        data_dir=tmp_path / "data",
        jobs_dir=jobs,
        storage_uri=str(tmp_path / "store"),
        s3_endpoint_url=None,
        api_auth=True,
        weights_root=tmp_path,
        reconcile_interval_s=0,
    )
    set_alias("m", "live", register_model_dir(checkpoint(tmp_path / "v1"), "m", settings=settings), settings)
    app = create_app(settings, runs=RecordingLeaps())
    key, _ = ApiKeyStore(settings).create(admin=True)
    with TestClient(app) as client:
        yield client, {"Authorization": f"Bearer {key}"}, settings, app.state.runs, tmp_path


def announce(settings: Settings, version: str = "m/1") -> None:
    announce_worker(settings, JOB, version)


def test_upload_registers_a_fitting_checkpoint_and_refuses_a_wrong_shape(api):
    client, auth, settings, _, tmp = api
    ok = client.post(
        "/v1/weights/upload", headers=auth, json={"source": str(checkpoint(tmp / "v2")), "model": "m", "job_id": JOB}
    )
    assert ok.status_code == 200, ok.text
    assert ok.json()["version"] == 2 and ok.json()["tags"]["parent_version"] == "1"
    wrong = checkpoint(tmp / "wrong", {**SHAPES, "lm_head.weight": (17, 8)})
    refused = client.post("/v1/weights/upload", headers=auth, json={"source": str(wrong), "model": "m"})
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "checkpoint_mismatch"
    assert "'lm_head.weight' shape is [17, 8], expected [16, 8]" in refused.json()["error"]["message"]
    assert latest_version("m", settings) == 2
    assert client.post("/v1/weights/upload", json={"source": str(wrong), "model": "m"}).status_code == 401


def test_reload_validates_then_starts_a_leap_per_job_and_status_shows_it(api):
    client, auth, settings, leaps, tmp = api
    assert (
        client.post("/v1/weights/reload", headers=auth, json={"other": "models:/m/1"}).json()["error"]["code"]
        == "unknown_model"
    )
    assert (
        client.post("/v1/weights/reload", headers=auth, json={"m": "models:/m/1"}).json()["error"]["code"]
        == "no_live_workers"
    )
    announce(settings)
    wrong = client.post(
        "/v1/weights/reload", headers=auth, json={"m": str(checkpoint(tmp / "wrong", {"lm_head.weight": (16, 8)}))}
    )
    assert wrong.status_code == 409 and "'model.embed_tokens.weight' is missing" in wrong.json()["error"]["message"]
    assert leaps.started == []

    started = client.post("/v1/weights/reload", headers=auth, json={"m": str(checkpoint(tmp / "v2"))})
    assert started.status_code == 202, started.text
    (leap,) = started.json()["data"]
    assert (leap["job_id"], leap["to_version"], leap["flow_run_id"]) == (JOB, "m/2", "flow-run-1")
    assert leaps.started == [(JOB, 2, leap["leap_id"])]

    (job,) = client.get("/v1/weights/status", headers=auth).json()["data"]
    assert job["workers"] == [
        {"worker_id": f"{JOB}-w0", "model_version": "m/1", "leap_state": "ready", "staged_version": None}
    ]
    assert job["latest_leap"]["id"] == leap["leap_id"] and job["latest_leap"]["status"] == "queued"
    assert client.get("/v1/weights/status", headers=auth, params={"job_id": "job-ffffffff"}).status_code == 404
