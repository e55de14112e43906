"""The history of an enrichment's runs: one JSON line per run under its results folder, newest last."""

from __future__ import annotations

import json

from pydantic import BaseModel, Field

from pronk import storage
from pronk.settings import Settings

HISTORY = "history.jsonl"


class EnrichRun(BaseModel):
    """What one run of an enrichment did and cost."""

    @property
    def success_rate(self) -> float | None:
        """Passed over checked rows of the labelled sample; None when this run asked none of them."""
        return self.passed / self.checked if self.checked else None

    run_id: str
    spec: str
    started_at: str
    finished_at: str
    rows: int = Field(description="Rows of the table after the filter.")
    new: int = Field(description="Rows never enriched before, asked now.")
    changed: int = Field(description="Rows whose prompt inputs, template or outputs changed, asked again.")
    retried: int = Field(description="Rows whose previous answer failed, asked again.")
    skipped: int = Field(description="Rows already enriched with the same fingerprint.")
    failed: int = Field(description="Rows asked now whose answer could not be parsed or validated (`_error`).")
    pending: int = Field(default=0, description="Rows left for a later run (`limit`).")
    steps: int = Field(description="Engine steps this run ran (0 when nothing changed).")
    cost_usd: float = Field(description="Processing cost of the run's batch (worker-seconds x price).")
    tasks_per_dollar: float | None = Field(description="Rows enriched without error per dollar.")
    checked: int = Field(default=0, description="Rows of the labelled sample asked now: each answer was checked.")
    passed: int = Field(default=0, description="Checked rows whose answer had every expected value.")
    model_version: str | None = None
    batch_id: str | None = None
    version_uri: str
    duration_s: float


class History:
    """Runs of one enrichment, kept as a JSON-lines file rewritten whole (atomic on local disk and S3)."""

    def __init__(self, results: str, settings: Settings):
        self.uri = storage.join(results, HISTORY)
        self.settings = settings

    def runs(self) -> list[EnrichRun]:
        if not storage.exists(self.uri, self.settings):
            return []
        lines = storage.read_bytes(self.uri, self.settings).decode().splitlines()
        return [EnrichRun.model_validate_json(line) for line in lines if line.strip()]

    def append(self, run: EnrichRun) -> None:
        lines = [r.model_dump_json() for r in self.runs()] + [run.model_dump_json()]
        storage.write_bytes(self.uri, ("\n".join(lines) + "\n").encode(), self.settings)

    def table(self) -> list[dict[str, object]]:
        return [json.loads(r.model_dump_json(exclude={"spec", "version_uri"})) for r in self.runs()]


def summary_markdown(run: EnrichRun) -> str:
    """A run's figures, as its Prefect run page shows them."""
    tpd = f"{run.tasks_per_dollar:,.0f}" if run.tasks_per_dollar is not None else "n/a"
    checks = f"{run.passed}/{run.checked} ({run.success_rate:.0%})" if run.success_rate is not None else "-"
    return "\n".join(
        [
            f"# Enrichment `{run.spec}`, run `{run.run_id}`",
            "",
            "| rows | new | changed | retried | skipped | failed | pending | labelled passed | engine steps "
            "| cost (USD) | tasks/$ |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
            f"| {run.rows} | {run.new} | {run.changed} | {run.retried} | {run.skipped} | {run.failed} | {run.pending} "
            f"| {checks} | {run.steps} | {run.cost_usd:.6f} | {tpd} |",
            "",
            f"Model version `{run.model_version or 'n/a'}`, batch `{run.batch_id or 'none'}`, "
            f"version `{run.version_uri}`.",
        ]
    )
