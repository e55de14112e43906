"""MLflow on the stack: each job's experiment (`pronk-<job id>`), where its batches, profiles and traces are logged."""

from __future__ import annotations

from pronk.settings import Settings


def experiment_name(job_id: str) -> str:
    return f"pronk-{job_id}"


def job_experiment(job_id: str, settings: Settings) -> str:
    """Point MLflow at the stack and make the job's experiment current (created under the stack's artifact root);
    returns its id."""
    import mlflow

    mlflow.set_tracking_uri(settings.tracking_uri)
    name = experiment_name(job_id)
    if mlflow.get_experiment_by_name(name) is None:
        settings.artifact_root.mkdir(parents=True, exist_ok=True)
        mlflow.create_experiment(name, artifact_location=settings.artifact_root.as_uri())
    return mlflow.set_experiment(name).experiment_id
