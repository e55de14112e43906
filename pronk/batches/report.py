"""Reports on a job's batches: the `pronk runs` table, each batch's figures and completion-time plot.

The same figures go to three places: the terminal (`pronk runs`), the batch's Prefect run page (a markdown
artifact) and the job's MLflow experiment (one run per batch), so tasks per dollar, success rate and tool-call
validity can be charted over time.
"""

from __future__ import annotations

import logging
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import polars as pl

from pronk.agents.step_records import StepRecord, steps_frame
from pronk.batches.schemas import Batch
from pronk.batches.store import BatchStore
from pronk.settings import Settings
from pronk.tracking import job_experiment

logger = logging.getLogger(__name__)

MARKDOWN_SAFE = str.maketrans({c: "_" for c in "|[]<>`*\\"})
BARS = " ▁▂▃▄▅▆▇█"


@dataclass(slots=True)
class RunFigures:
    """One batch's row of `pronk runs`."""

    batch_id: str
    job_id: str
    status: str
    lines: int
    completed: int
    failed: int
    cancelled: int
    input_tokens: int
    cached_tokens: int
    output_tokens: int
    cached_pct: float
    cost_usd: float
    tasks_per_dollar: float | None
    tasks_counted: str
    """`passed` (lines whose check passed) when the batch checked any line, else `completed`."""
    checked: int
    passed: int
    checks_failed: int
    unchecked: int
    success_rate: float | None
    tool_calls: int
    """Agent steps whose output was meant as a tool call (every attempt)."""
    tool_calls_valid: int
    tool_call_validity: float | None
    """Valid over all tool calls; None when there was none."""
    duration_s: float | None
    model_version: str
    created_at: int

    @classmethod
    def of(cls, batch: Batch, model_version: str = "") -> RunFigures:
        usage = batch.usage
        cached = usage.input_tokens_details.cached_tokens
        end = batch.completed_at or batch.failed_at or batch.cancelled_at or batch.expired_at
        start = batch.in_progress_at or batch.created_at
        return cls(
            batch_id=batch.id,
            job_id=batch.job_id,
            status=batch.status,
            lines=batch.request_counts.total,
            completed=batch.request_counts.completed,
            failed=batch.request_counts.failed,
            cancelled=batch.request_counts.cancelled,
            input_tokens=usage.input_tokens,
            cached_tokens=cached,
            output_tokens=usage.output_tokens,
            cached_pct=round(100.0 * cached / usage.input_tokens, 2) if usage.input_tokens else 0.0,
            cost_usd=round(batch.processing_cost, 8),
            tasks_per_dollar=round(batch.tasks_per_dollar, 2) if batch.tasks_per_dollar is not None else None,
            tasks_counted=batch.tasks_counted,
            checked=batch.checks.checked,
            passed=batch.checks.passed,
            checks_failed=batch.checks.failed,
            unchecked=batch.checks.unchecked,
            success_rate=batch.success_rate,
            tool_calls=batch.tool_calls.total,
            tool_calls_valid=batch.tool_calls.valid,
            tool_call_validity=batch.tool_calls.validity,
            duration_s=float(end - start) if end else None,
            model_version=model_version,
            created_at=batch.created_at,
        )

    def metrics(self) -> dict[str, float]:
        """The figures MLflow charts (numbers only)."""
        return {
            k: float(v)
            for k, v in asdict(self).items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "created_at"
        }


def model_versions(steps_uri: str | None, settings: Settings) -> str:
    """The model versions a batch's steps ran on (from its step records; empty when they are not readable)."""
    if not steps_uri:
        return ""
    try:
        frame = steps_frame(steps_uri, {"model_version": pl.String}, settings)
        versions = frame.select(pl.col("model_version").drop_nulls().unique()).collect()["model_version"]
    except (OSError, pl.exceptions.PolarsError):
        return ""
    return ",".join(sorted(versions.to_list()))


def recent_runs(settings: Settings, job_ids: list[str], limit: int = 20) -> list[RunFigures]:
    """The most recent batches of the jobs, newest first."""
    batches = BatchStore(settings).of_jobs(set(job_ids), limit)
    return [RunFigures.of(b, model_versions(b.steps_uri, settings)) for b in batches]


def runs_table(rows: list[RunFigures]) -> str:
    """`pronk runs`: one line per batch."""
    head = (
        f"{'batch':<32} {'job':<13} {'status':<10} {'lines':>7} {'failed':>6} {'passed':>9} {'calls ok':>8} "
        f"{'in tok':>9} {'out tok':>8} {'cached':>7} {'cost $':>10} {'tasks/$':>11} {'dur s':>7}  model"
    )
    lines = [head]
    for r in rows:
        tpd = f"{r.tasks_per_dollar:,.0f}" if r.tasks_per_dollar is not None else "-"
        tpd += "*" if r.tasks_counted == "passed" else " "
        passed = f"{r.passed}/{r.checked}" if r.checked else "-"
        calls = f"{r.tool_call_validity:.1%}" if r.tool_call_validity is not None else "-"
        dur = f"{r.duration_s:.0f}" if r.duration_s is not None else "-"
        lines.append(
            f"{r.batch_id:<32} {r.job_id:<13} {r.status:<10} {r.lines:>7} {r.failed:>6} {passed:>9} {calls:>8} "
            f"{r.input_tokens:>9} {r.output_tokens:>8} {r.cached_pct:>6.1f}% {r.cost_usd:>10.6f} {tpd:>11} {dur:>7}  "
            f"{r.model_version}"
        )
    lines.append(
        "passed: lines whose check passed / lines checked; calls ok: tool calls valid against the tool's schema; "
        "tasks/$* counts passed lines, else completed ones."
    )
    return "\n".join(lines)


def completion_times(records: list[StepRecord]) -> list[float]:
    """Seconds from the batch's first step to the end of each root trace (its last step or tool), sorted."""
    if not records:
        return []
    start = min(r.started_at for r in records)
    ends: dict[str, float] = {}
    for r in records:
        end = r.started_at + r.engine_time_s + r.tool_time_s
        ends[r.root_trace_id] = max(ends.get(r.root_trace_id, 0.0), end - start)
    return sorted(round(e, 3) for e in ends.values())


def text_histogram(values: list[float], bins: int = 24) -> str:
    """A one-line bar chart of `values` over [0, max] (for markdown, which shows no images from a local file)."""
    if not values:
        return ""
    top = max(values) or 1.0
    counts = [0] * bins
    for v in values:
        counts[min(bins - 1, int(v / top * bins))] += 1
    peak = max(counts)
    return "".join(BARS[round(c / peak * (len(BARS) - 1))] for c in counts)


def completion_plot(times: list[float], path: Path, title: str) -> Path:
    """Traces finished over time, as a step curve PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.step([0.0, *times], list(range(len(times) + 1)), where="post", color="#3b6ea8")
    ax.set_xlabel("seconds since the batch's first step")
    ax.set_ylabel("traces finished")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def batch_markdown(figures: RunFigures, times: list[float], mlflow_url: str | None) -> str:
    """A batch's run-page report: its figures, a completion-time chart and where MLflow charts it over time."""
    rows = [
        ("status", figures.status),
        (
            "lines (completed / failed / cancelled)",
            f"{figures.lines} ({figures.completed} / {figures.failed} / {figures.cancelled})",
        ),
        ("tokens in / cached / out", f"{figures.input_tokens} / {figures.cached_tokens} / {figures.output_tokens}"),
        ("cached", f"{figures.cached_pct:.1f}%"),
        ("cost (USD)", f"{figures.cost_usd:.6f}"),
        (
            f"tasks per dollar (counts {figures.tasks_counted} lines)",
            f"{figures.tasks_per_dollar:,.2f}" if figures.tasks_per_dollar is not None else "—",
        ),
        (
            "checks passed / checked",
            f"{figures.passed} / {figures.checked} ({figures.success_rate:.0%})"
            if figures.success_rate is not None
            else "no line checked",
        ),
        ("checks failed / lines unchecked", f"{figures.checks_failed} / {figures.unchecked}"),
        (
            "tool calls valid / made",
            f"{figures.tool_calls_valid} / {figures.tool_calls} ({figures.tool_call_validity:.0%})"
            if figures.tool_call_validity is not None
            else "no tool call",
        ),
        ("duration (s)", f"{figures.duration_s:.0f}" if figures.duration_s is not None else "—"),
        ("model version", figures.model_version or "—"),
    ]
    lines = [f"# Batch {figures.batch_id}", "", "| figure | value |", "| --- | --- |"]
    lines += [f"| {name} | {str(value).translate(MARKDOWN_SAFE)} |" for name, value in rows]
    if times:
        p = lambda q: times[min(len(times) - 1, int(q * (len(times) - 1) + 0.5))]  # noqa: E731
        lines += [
            "",
            "## Completion times",
            "",
            f"{len(times)} traces: p50 {p(0.5):.1f} s, p90 {p(0.9):.1f} s, last {times[-1]:.1f} s.",
            "",
            f"`0 s {text_histogram(times)} {times[-1]:.0f} s` (traces finished per interval)",
        ]
    if mlflow_url:
        lines += ["", f"The plot and these figures per run: [MLflow]({mlflow_url})."]
    return "\n".join(lines) + "\n"


def log_batch_run(
    figures: RunFigures, times: list[float], rows: list[dict[str, object]], settings: Settings
) -> tuple[str, str]:
    """The batch's figures as a run of the job's MLflow experiment (named by the batch), with its completion-time
    plot and its lines' rows of the per-trace table (each with its `check`) as the table `lines.json`; returns
    (run id, the run's URL in the MLflow UI)."""
    import mlflow

    experiment_id = job_experiment(figures.job_id, settings)
    with mlflow.start_run(run_name=figures.batch_id) as run:
        mlflow.set_tags(
            {"pronk.batch_id": figures.batch_id, "pronk.job_id": figures.job_id, "pronk.status": figures.status}
        )
        if figures.model_version:
            mlflow.set_tag("pronk.model_version", figures.model_version)
        mlflow.log_metrics(figures.metrics())
        if times:
            with tempfile.TemporaryDirectory() as tmp:
                plot = completion_plot(times, Path(tmp) / "completion_times.png", f"batch {figures.batch_id}")
                mlflow.log_artifact(str(plot))
        if rows:
            columns = dict.fromkeys(k for row in rows for k in row)
            mlflow.log_table({k: [row.get(k) for row in rows] for k in columns}, artifact_file="lines.json")
        run_id = run.info.run_id
    return run_id, f"{settings.mlflow_ui_url}/#/experiments/{experiment_id}/runs/{run_id}"
