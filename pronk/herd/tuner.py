"""The Herd tuner: profile the job, replay a sample of its own traces against candidate configurations chosen by
Optuna, judge the winner against the current configuration, and (when asked) apply it.

Knobs searched (`KNOBS`): the engine's `max_num_seqs`, `max_num_batched_tokens` (the chunked-prefill token
budget) and n-gram speculative decoding (`speculative_ngram_tokens`); vLLM's priority queue (`priority`); the
admission scheduler (`admission`, `kv_budget_headroom`, `kv_budget_growth_steps`); KV pins (`kv_pin_ttl_s`,
`kv_pin_ttl`); the KV host tier's size (`kv_host_tier_bytes`, priced by the job's `price_per_host_gb_hour`, which
tasks per dollar counts); the routing policy; batch concurrency (`concurrency`, fixed or adaptive, and
`max_concurrency`, its number or adaptive's start); the number of workers and the cores of each (a candidate never
has more workers than the machine has cores for; a worker's price grows with its cores). The current configuration
is replayed `repeats` times first (the guard's noise), then Optuna's TPE sampler proposes candidates until the next
trial would not fit in the budget; the best one is replayed once more when there is time. Every trial is a child
MLflow run of the tuning run (params; tasks per dollar, p50/p90 trace time, cached ratio, the traces in flight it
chose).

`--knobs concurrency` searches the lines in flight and the host tier's size together (`CONCURRENCY_KNOBS`): an
adaptive target is capped by the KV room, device cache and tier, so the two set the fleet's load jointly, and the
guard judges their winner like any other.

When the job has a labelled set (`quality.labelled_set`), the first replay of the current configuration and the
winner's second replay also run the set on their fleet, and the guard refuses a winner that answers worse. Only
those two trials run it: the search ranks on tasks per dollar alone, and the set costs a few lines' time twice per
tuning rather than once per candidate. A winner refused on quality ends the tuning with no change, as one refused
on tasks per dollar does.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

from pydantic import BaseModel

from pronk.batches.labelled import labelled_lines
from pronk.batches.schemas import CheckCounts
from pronk.herd.guard import Verdict, judge
from pronk.herd.profile import job_step_uris, profile_steps, scan_steps
from pronk.herd.shapes import relabel, sample_shapes, shapes_from_steps
from pronk.herd.trial import Measurement, TrialFleet, replay_sample, restart_key, run_labelled_set
from pronk.jobs.schema import JobConfig
from pronk.jobs.versions import with_changes
from pronk.protocol.lines import ValidRequest
from pronk.protocol.shapes import TraceShape
from pronk.settings import Settings

logger = logging.getLogger(__name__)
T = TypeVar("T")

KNOBS: dict[str, tuple[str, list[Any]]] = {
    "max_num_seqs": ("engine", [8, 16, 32, 64, 128]),
    "max_num_batched_tokens": ("engine", [512, 1024, 2048, 4096, 8192]),
    "speculative_ngram_tokens": ("engine", [0, 2, 4]),
    "priority": ("scheduling", [False, True]),
    "admission": ("scheduling", ["none", "kv_budget"]),
    "kv_budget_headroom": ("scheduling", [0.05, 0.1, 0.2]),
    "kv_budget_growth_steps": ("scheduling", [0.0, 1.0, 3.0]),
    "kv_pin_ttl_s": ("scheduling", [0.0, 5.0, 30.0, 120.0]),
    "kv_pin_ttl": ("scheduling", ["fixed", "auto"]),
    "kv_host_tier_bytes": ("scheduling", [0, 1 << 28, 1 << 30, 1 << 32]),
    "routing": ("scheduling", ["trace_affinity", "least_loaded"]),
    "concurrency": ("scheduling", ["fixed", "adaptive"]),
    "max_concurrency": ("scheduling", [4, 8, 16, 32, 64]),
    "workers": ("", []),  # 1 … max_workers
    "cpu_cores_per_worker": ("", [1, 2, 4, 8]),  # those the machine has
}
"""Each knob: the job-file section it lives in ("" = top level) and its candidate values."""
LIVE_KNOBS = ("admission", "kv_pin_ttl_s", "kv_pin_ttl", "routing", "concurrency", "max_concurrency")
"""Knobs that need no new workers: a search over only these runs every trial on one fleet."""
CONCURRENCY_KNOBS = ("concurrency", "max_concurrency", "kv_host_tier_bytes")
"""The lines in flight and the KV room that holds them: searched together, since an adaptive target is capped by the
device cache and host tier (`pronk.batches.in_flight`) and more lines in flight pay only where the tier holds them."""
KNOB_GROUPS = {"live": LIVE_KNOBS, "concurrency": CONCURRENCY_KNOBS}


def chosen_knobs(names: list[str] | None) -> tuple[str, ...]:
    """The knobs a tuning searches: every one when none are named, a group's for its one name (`live`,
    `concurrency`), else those named."""
    if not names:
        return tuple(KNOBS)
    if len(names) == 1 and names[0] in KNOB_GROUPS:
        return KNOB_GROUPS[names[0]]
    return tuple(names)


def fit_to_cores(params: dict[str, Any], job: JobConfig, cores: int) -> dict[str, Any]:
    """`params` with fewer workers where the workers times their cores exceed the machine's `cores` (a CPU job's
    workers are pinned to cores of their own; sharing them would measure contention, not the configuration)."""
    per_worker = params.get("cpu_cores_per_worker", job.cpu_cores_per_worker)
    workers = params.get("workers", job.workers)
    if job.device != "cpu" or workers * per_worker <= cores:
        return params
    return {**params, "workers": max(1, cores // per_worker)}


def changes_of(params: dict[str, Any]) -> dict[str, Any]:
    """Knob values as job-file changes (`{"engine": {...}, "scheduling": {...}, "workers": n}`)."""
    changes: dict[str, Any] = {}
    for knob, value in params.items():
        section = KNOBS[knob][0]
        if section:
            changes.setdefault(section, {})[knob] = value
        else:
            changes[knob] = value
    return changes


@dataclass(slots=True)
class TuneConfig:
    budget_minutes: float
    sample: int = 8
    """Root traces replayed per trial (the same ones for every trial)."""
    repeats: int = 2
    """Replays of the current configuration, for the guard's noise."""
    knobs: tuple[str, ...] = tuple(KNOBS)
    max_workers: int | None = None
    """Most workers any trial's fleet has, the current configuration's replay included (default: the job's)."""
    time_scale: float = 1.0
    """Multiplies the replayed tool gaps."""
    runs: int | None = None
    """Profile only the job's last N batches."""
    seed: int = 0
    min_noise: float = 0.05


@dataclass(slots=True)
class Trial:
    number: int
    label: str
    params: dict[str, Any]
    changes: dict[str, Any]
    measurement: Measurement | None
    error: str | None = None
    seconds: float = 0.0
    mlflow_run_id: str | None = None
    quality: CheckCounts | None = None
    """The labelled set's tally on this trial's fleet, for the trials that run it."""

    @property
    def value(self) -> float:
        m = self.measurement
        return m.tasks_per_dollar if m is not None and m.failed == 0 else 0.0


@dataclass(slots=True)
class TuneResult:
    job_id: str
    mlflow_run_id: str
    profile: dict[str, Any]
    trials: list[Trial] = field(default_factory=list)
    winner: Trial | None = None
    verdict: Verdict | None = None
    seconds: float = 0.0

    def summary(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "mlflow_run_id": self.mlflow_run_id,
            "trials": len(self.trials),
            "seconds": round(self.seconds, 1),
            "winner": {"label": self.winner.label, "changes": self.winner.changes} if self.winner else None,
            "verdict": asdict(self.verdict, dict_factory=_plain) if self.verdict else None,
            "table": [
                {
                    "trial": t.label,
                    "tasks_per_dollar": t.value,
                    "p50_s": t.measurement.p50_s if t.measurement else None,
                    "p90_s": t.measurement.p90_s if t.measurement else None,
                    "cached_ratio": t.measurement.cached_ratio if t.measurement else None,
                    "in_flight": t.measurement.in_flight if t.measurement else None,
                    "labelled": (
                        {**t.quality.model_dump(), "success_rate": t.quality.success_rate}
                        if t.quality is not None
                        else None
                    ),
                    "error": t.error,
                    "params": t.params,
                }
                for t in self.trials
            ],
        }

    def markdown(self) -> str:
        """The tuning run's trials and verdict, as its Prefect run page shows them."""
        lines = [f"# Herd tuning of {self.job_id}", "", f"MLflow run `{self.mlflow_run_id}`, {self.seconds:.0f} s."]
        if self.verdict is not None:
            lines += ["", f"**Guard: {'accepted' if self.verdict.accept else 'refused'}**: {self.verdict.reason}."]
        labelled = any(t.quality is not None for t in self.trials)
        columns = ["trial", "tasks per dollar", "p50 s", "p90 s", "cached", *(["labelled set"] if labelled else [])]
        lines += ["", "| " + " | ".join([*columns, "settings"]) + " |", "|" + " --- |" * (len(columns) + 1)]
        for t in self.trials:
            m = t.measurement
            figures = f"{t.value:,.1f} | {m.p50_s} | {m.p90_s} | {m.cached_ratio}" if m else f"— | — | — | {t.error}"
            if labelled:
                figures += f" | {t.quality.describe() if t.quality is not None else '—'}"
            settings = ", ".join(f"{k}={v}" for k, v in t.params.items()) or "current"
            lines.append(f"| {t.label} | {figures} | {settings} |")
        return "\n".join(lines) + "\n"


def _plain(items: list[tuple[str, Any]]) -> dict[str, Any]:
    """`asdict`'s dict factory for dataclasses holding pydantic models (the verdict's check counts): JSON-ready."""
    return {key: value.model_dump() if isinstance(value, BaseModel) else value for key, value in items}


def run_coroutine(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run `coroutine` to its end from sync code, in a thread of its own when this one already runs an event loop
    (a Prefect task may)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


TrialRunner = Callable[[str, Callable[[], Trial]], Trial]
"""How a trial runs: the command line calls it; the `herd` flow makes it a Prefect task run named by its label."""


def _direct(label: str, run: Callable[[], Trial]) -> Trial:
    return run()


class Tuner:
    def __init__(
        self, job: JobConfig, settings: Settings, config: TuneConfig, run_trial: TrialRunner | None = None
    ) -> None:
        unknown = set(config.knobs) - set(KNOBS)
        if unknown:
            raise ValueError(f"unknown knobs {sorted(unknown)}; known: {sorted(KNOBS)}")
        if config.max_workers is not None and job.workers > config.max_workers:
            job = with_changes(job, {"workers": config.max_workers})  # every trial's fleet, the current one's too
        self.job = job
        self.settings = settings
        self.config = config
        self.run_trial = run_trial or _direct
        self.deadline = time.monotonic() + config.budget_minutes * 60.0
        self.fleet = TrialFleet(settings)
        self.replay_seconds: list[float] = []
        self.labelled: list[ValidRequest] | None = None
        """The job's labelled set, read when the tuning starts (None: the job has none)."""
        self.labelled_seconds: list[float] = []
        self.parent_run_id: str | None = None

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def tune(self, traffic: list[TraceShape] | None = None) -> TuneResult:
        """Tune on a sample of the job's own traces (from its step records), or of `traffic` when given (the
        benchmark's drawn workload)."""
        import mlflow
        import optuna

        from pronk.herd.tracking import flat_metrics
        from pronk.tracking import job_experiment

        started = time.monotonic()
        cfg, job = self.config, self.job
        if job.quality.labelled_set is not None:  # an unreadable or invalid set fails here, before any trial
            self.labelled = labelled_lines(job, self.settings)
        if traffic is None:
            frame = scan_steps(job_step_uris(job.job_id, self.settings, cfg.runs), self.settings)
            profile: dict[str, Any] = profile_steps(frame).summary()
            traffic = shapes_from_steps(frame)
        else:
            profile = {"traces": len(traffic)}
        shapes = sample_shapes(traffic, cfg.sample, cfg.seed)
        logger.info(
            "herd tune %s: %d traces replayed per trial, %.1f min budget", job.job_id, len(shapes), cfg.budget_minutes
        )
        job_experiment(job.job_id, self.settings)
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=cfg.seed))
        with mlflow.start_run(run_name=f"herd-tune {job.job_id}") as parent, self.fleet:
            mlflow.set_tags({"pronk.herd": "tune", "pronk.job_id": job.job_id})
            mlflow.log_params(
                {
                    "budget_minutes": cfg.budget_minutes,
                    "sample": len(shapes),
                    "repeats": cfg.repeats,
                    "knobs": ",".join(cfg.knobs),
                    "time_scale": cfg.time_scale,
                    "seed": cfg.seed,
                    "labelled_set": job.quality.labelled_set or "none",
                }
            )
            mlflow.log_metrics(flat_metrics(profile, "profile."))
            self.parent_run_id = parent.info.run_id
            result = TuneResult(job.job_id, parent.info.run_id, profile)
            current: list[Trial] = []
            for r in range(cfg.repeats):
                if r and not self._fits(job):
                    break
                current.append(self._trial(len(result.trials), f"current #{r + 1}", {}, shapes, labelled=r == 0))
                result.trials.append(current[-1])
            while self._fits(None, trials=2):  # room for the candidate and, should it win, its repeat
                optuna_trial = study.ask()
                params = self._suggest(optuna_trial)
                trial = self._trial(len(result.trials), f"candidate {optuna_trial.number}", params, shapes)
                result.trials.append(trial)
                if trial.measurement is None:
                    study.tell(optuna_trial, state=optuna.trial.TrialState.FAIL)
                else:
                    study.tell(optuna_trial, trial.value)
            candidates = [t for t in result.trials if t.params and t.measurement is not None]
            if candidates and current:
                best = max(candidates, key=lambda t: t.value)
                repeats = [best]
                if self._fits(with_changes(job, best.changes)):
                    repeats.append(
                        self._trial(len(result.trials), f"{best.label} again", best.params, shapes, labelled=True)
                    )
                    result.trials.append(repeats[-1])
                result.winner = best
                result.verdict = judge(
                    [t.value for t in current],
                    [t.value for t in repeats],
                    sum(t.measurement.failed for t in repeats if t.measurement),
                    cfg.min_noise,
                    (current[0].quality, repeats[-1].quality) if self.labelled is not None else None,
                )
                mlflow.log_dict(best.changes, "winner_changes.json")
                mlflow.set_tags(
                    {"pronk.herd.accept": str(result.verdict.accept), "pronk.herd.reason": result.verdict.reason}
                )
                mlflow.log_metrics(
                    {
                        "current_tasks_per_dollar": result.verdict.current,
                        "winner_tasks_per_dollar": result.verdict.winner,
                        "gain": result.verdict.gain,
                        "noise": result.verdict.noise,
                    }
                )
                if result.verdict.quality is not None:
                    rates = {
                        "current_success_rate": result.verdict.quality.current.success_rate,
                        "winner_success_rate": result.verdict.quality.candidate.success_rate,
                    }
                    mlflow.log_metrics({name: rate for name, rate in rates.items() if rate is not None})
            result.seconds = time.monotonic() - started
            mlflow.log_metric("trials", len(result.trials))
            mlflow.log_dict(result.summary(), "tune.json")
        return result

    def _suggest(self, trial) -> dict[str, Any]:
        cores = len(os.sched_getaffinity(0))
        params: dict[str, Any] = {}
        for knob in self.config.knobs:
            if knob == "workers":
                params[knob] = trial.suggest_int(knob, 1, self.config.max_workers or self.job.workers)
            elif knob == "cpu_cores_per_worker":
                params[knob] = trial.suggest_categorical(knob, [c for c in KNOBS[knob][1] if c <= cores])
            else:
                params[knob] = trial.suggest_categorical(knob, KNOBS[knob][1])
        return fit_to_cores(params, self.job, cores)

    def _fits(self, candidate: JobConfig | None, trials: int = 1) -> bool:
        """Whether `trials` more trials (of `candidate`; None: not yet known) fit the budget, with room kept for
        the winner's run of the labelled set."""
        replay = max(self.replay_seconds, default=0.0) * 1.2 * trials + max(self.labelled_seconds, default=0.0) * 1.2
        live_only = set(self.config.knobs) <= set(LIVE_KNOBS)  # then every candidate runs on the current fleet
        needs_start = self.fleet.key is None or (
            self.fleet.key != restart_key(candidate) if candidate is not None else not live_only
        )
        start = max(self.fleet.starts, default=0.0) * 1.2 if needs_start else 0.0
        return self.remaining() > replay + start

    def _trial(self, number: int, label: str, params: dict[str, Any], shapes, labelled: bool = False) -> Trial:
        """Replay `shapes` on the configuration `params` make; with `labelled` (and a labelled set), then run the
        set on the same fleet."""
        changes = changes_of(params)

        def run() -> Trial:
            import mlflow

            began = time.monotonic()
            trial = Trial(number, label, params, changes, None)
            with mlflow.start_run(
                run_name=f"trial {number}: {label}", nested=True, parent_run_id=self.parent_run_id
            ) as child:
                trial.mlflow_run_id = child.info.run_id
                mlflow.set_tags({"pronk.herd": "trial", "pronk.herd.trial": label})
                mlflow.log_params({k: str(v) for k, v in params.items()} or {"configuration": "current"})
                try:
                    candidate = with_changes(self.job, changes)
                    self.fleet.start_timeout_s = max(30.0, self.remaining())
                    fleets = len(self.fleet.starts)
                    trial_job = self.fleet.serve(candidate)
                    if len(self.fleet.starts) > fleets:  # a cold engine's first steps would be charged to this trial
                        run_coroutine(
                            replay_sample(trial_job, relabel(shapes[:1], f"warmup{number}"), self.settings, 0.0, 60.0)
                        )
                    shapes_here = relabel(shapes, f"herd{number}-{int(time.time())}")
                    trial.measurement = run_coroutine(
                        replay_sample(
                            trial_job, shapes_here, self.settings, self.config.time_scale, max(10.0, self.remaining())
                        )
                    )
                    self.replay_seconds.append(trial.measurement.wall_s)
                    mlflow.log_metrics(trial.measurement.metrics())
                    if trial.measurement.errors:
                        mlflow.log_dict({"errors": trial.measurement.errors}, "errors.json")
                    if labelled and self.labelled is not None:
                        set_began = time.monotonic()
                        trial.quality = run_coroutine(run_labelled_set(trial_job, self.labelled, self.settings))
                        self.labelled_seconds.append(time.monotonic() - set_began)
                        mlflow.log_metrics({f"labelled_{k}": float(v) for k, v in trial.quality.model_dump().items()})
                        if trial.quality.success_rate is not None:
                            mlflow.log_metric("success_rate", trial.quality.success_rate)
                except Exception as exc:  # noqa: BLE001 - a configuration that cannot run is a failed trial
                    logger.warning("herd trial %s failed: %s", label, exc)
                    trial.error = f"{type(exc).__name__}: {exc}"[:500]
                    mlflow.set_tag("pronk.herd.error", trial.error)
                    self.fleet.stop()
            trial.seconds = time.monotonic() - began
            logger.info(
                "herd trial %s: %.1f tasks/$ in %.1f s %s", label, trial.value, trial.seconds, json.dumps(params)
            )
            return trial

        return self.run_trial(label, run)
