"""`pronk herd tune` prints every trial and the guard's verdict, and ends with the summary as its last stdout line.

The tuning itself runs on real temporary workers in `tests/pronk/herd/test_herd_e2e.py` (through the `herd`
flow, the same `Tuner`); here a stand-in `Tuner` returns a fixed result so the command's own work is checked.
"""

from __future__ import annotations

import json

from typer.testing import CliRunner

from pronk.cli.main import app
from pronk.herd import tuner
from pronk.herd.guard import Verdict
from tests.bench.test_herd_bench import measurement


class FixedTuner:
    seen: list[tuner.TuneConfig] = []

    def __init__(self, job, settings, config: tuner.TuneConfig):
        self.job = job
        FixedTuner.seen.append(config)

    def tune(self) -> tuner.TuneResult:
        current = tuner.Trial(0, "current #1", {}, {}, measurement(3000.0))
        candidate = tuner.Trial(1, "trial 1", {"routing": "least_loaded"}, {}, None, error="worker exited")
        return tuner.TuneResult(
            job_id=self.job.job_id,
            mlflow_run_id="run-1",
            profile={},
            trials=[current, candidate],
            verdict=Verdict(
                accept=False, reason="no candidate was measured", current=3000.0, winner=0.0, gain=0.0, noise=0.1
            ),
            seconds=12.0,
        )


def test_tune_prints_each_trial_and_ends_with_the_summary(monkeypatch):
    monkeypatch.setattr(tuner, "Tuner", FixedTuner)
    result = CliRunner().invoke(
        app, ["herd", "tune", "--job", "tiny-cpu", "--budget-minutes", "2", "--knobs", "routing,max_concurrency"]
    )
    assert result.exit_code == 0, result.output
    config = FixedTuner.seen[-1]
    assert config.budget_minutes == 2 and config.knobs == ("routing", "max_concurrency")
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert [row["trial"] for row in summary["table"]] == ["current #1", "trial 1"]
    assert summary["mlflow_run_id"] == "run-1" and "applied" not in summary
    assert "current #1" in result.stderr and "worker exited" in result.stderr
    assert "guard: refused: no candidate was measured" in result.stderr
