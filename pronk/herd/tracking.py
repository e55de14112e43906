"""MLflow side of Herd: the profile run with its histograms, in the job's experiment."""

from __future__ import annotations

import tempfile
from pathlib import Path

from pronk.herd.profile import TrafficProfile
from pronk.settings import Settings
from pronk.tracking import job_experiment


def histograms(profile: TrafficProfile, folder: Path) -> list[Path]:
    """One PNG histogram per distribution that has values."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for name, dist in profile.distributions().items():
        if not dist.values:
            continue
        fig, ax = plt.subplots(figsize=(5, 3.2))
        ax.hist(dist.values, bins=min(30, max(5, len(set(dist.values)))), color="#3b6ea8")
        ax.set_title(f"{name}: p50 {dist.p50:g}, p90 {dist.p90:g} (n={dist.count})", fontsize=9)
        ax.set_ylabel("count")
        fig.tight_layout()
        path = folder / f"{name.replace('[', '_').replace(']', '')}.png"
        fig.savefig(path, dpi=90)
        plt.close(fig)
        paths.append(path)
    return paths


def flat_metrics(summary: dict, prefix: str = "") -> dict[str, float]:
    """A nested summary as MLflow metric names (`output_tokens.p50`); names keep only MLflow's allowed characters."""
    metrics: dict[str, float] = {}
    for key, value in summary.items():
        name = f"{prefix}{key}".replace("[", ".").replace("]", "")
        if isinstance(value, dict):
            metrics.update(flat_metrics(value, f"{name}."))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            metrics[name] = float(value)
    return metrics


def log_profile(profile: TrafficProfile, job_id: str, settings: Settings, run_name: str = "herd-profile") -> str:
    """The profile as an MLflow run of the job's experiment: its figures as metrics, histograms as PNG artifacts,
    the summary as JSON; returns the run id."""
    import mlflow

    job_experiment(job_id, settings)
    with mlflow.start_run(run_name=run_name, nested=mlflow.active_run() is not None) as run:
        mlflow.set_tags({"pronk.herd": "profile", "pronk.job_id": job_id})
        mlflow.log_metrics(flat_metrics(profile.summary()))
        mlflow.log_dict(profile.summary(), "profile.json")
        with tempfile.TemporaryDirectory() as tmp:
            for path in histograms(profile, Path(tmp)):
                mlflow.log_artifact(str(path), "histograms")
        return run.info.run_id
