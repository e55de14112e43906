"""`python -m bench.experiments.herd`: the Herd goal measured side by side: a job's default configuration (its
file) against the configuration `herd tune` picks for the same traffic, in one run.

Per workload profile (`agent-long` and `cpu` by default, `bench.harness.workload.PROFILES`), with a job whose file is
the default configuration (`PROFILE_JOBS`: jobs at pronk's defaults, as a user first writes them: `agent-long-untuned`
for agent-long, the embedded default `tiny-cpu` for cpu; `--job` names another, e.g. `agent-long`, the configuration
issue 11 tuned by hand): the tuner replays a tuning workload (seed `seed`) against Optuna's candidates on temporary
workers within `budget_minutes`; then, for each round, a held-out workload (seed `seed + 1 + round`) is replayed on
the default configuration and on the tuned one (the default again when the guard refused every candidate), in an
order rotated each round, each on temporary workers of its own (start-up not charged). Tasks per dollar are charged
as a batch is: the fleet's worker-seconds for the replay's wall time. The goal: tuned ≥ 1.5x default on every
profile, and never below it. `--record` keeps the latest run of each (profile, job) in
`bench/results/herd_results.json`.

    python -m bench.experiments.herd --profiles agent-long,cpu --budget-minutes 20 --rounds 3 --record
    python -m bench.experiments.herd --profiles agent-long --job agent-long --budget-minutes 18 --rounds 3 --record
    python -m bench.experiments.herd --smoke          # a few traces and a 1-minute budget, to keep the script alive

Do not run the full bench on a shared machine: it holds every core for the whole budget and the rounds.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from bench.harness.workload import PROFILES, generate
from pronk.herd.shapes import relabel
from pronk.herd.trial import Measurement, TrialFleet, replay_sample
from pronk.herd.tuner import KNOBS, LIVE_KNOBS, TuneConfig, Tuner, run_coroutine
from pronk.jobs.catalog import resolve_job
from pronk.jobs.schema import JobConfig
from pronk.jobs.versions import with_changes
from pronk.settings import PROJECT_ROOT, Settings, get_settings

log = logging.getLogger(__name__)

GOAL = 1.5
RESULTS = PROJECT_ROOT / "bench" / "results" / "herd_results.json"
PROFILE_JOBS = {"agent-long": "agent-long-untuned", "cpu": "tiny-cpu", "smoke": "tiny-cpu"}
"""The job whose file is the default configuration of each profile: the profile's fleet (model, positions, KV
bytes, workers, price) with every scheduling choice at pronk's defaults (any other profile: `tiny-cpu`)."""


class HerdBenchConfig(BaseModel):
    job: str | None = Field(
        default=None, description="Job whose file is the default configuration (default: `PROFILE_JOBS`)."
    )
    profiles: list[str] = Field(default_factory=lambda: ["agent-long", "cpu"])
    traces: int | None = Field(default=None, ge=1, description="Root traces per held-out round (default: profile's).")
    tune_traces: int = Field(default=12, ge=1, description="Root traces replayed per tuning trial.")
    budget_minutes: float = Field(default=30.0, gt=0, description="Tuning budget per profile.")
    rounds: int = Field(default=3, ge=1)
    seed: int = 0
    knobs: list[str] = Field(default_factory=lambda: list(KNOBS))
    max_workers: int | None = None
    time_scale: float = Field(default=1.0, gt=0)
    replay_timeout_s: float = Field(default=3600.0, gt=0)


SMOKE = HerdBenchConfig(
    profiles=["smoke"],
    traces=3,
    tune_traces=3,
    budget_minutes=1.0,
    rounds=1,
    knobs=list(LIVE_KNOBS),
    max_workers=1,
    time_scale=0.2,
    replay_timeout_s=120.0,
)


def side_by_side(default: list[Measurement], tuned: list[Measurement]) -> dict[str, Any]:
    """Per-round ratios of tasks per dollar (tuned / default), their median, and the goal's verdict."""
    ratios = [
        t.tasks_per_dollar / d.tasks_per_dollar if d.tasks_per_dollar > 0 else float("nan")
        for d, t in zip(default, tuned)
    ]
    median = statistics.median(ratios) if ratios else float("nan")
    return {
        "ratios": [round(r, 3) for r in ratios],
        "median_ratio": round(median, 3),
        "goal": GOAL,
        "goal_met": median >= GOAL,
        "never_worse": all(r >= 1.0 for r in ratios),
        "default_failed": sum(m.failed for m in default),
        "tuned_failed": sum(m.failed for m in tuned),
    }


def replay_on(job: JobConfig, shapes, label: str, settings: Settings, config: HerdBenchConfig) -> Measurement:
    """`shapes` on a fresh temporary fleet of `job`'s configuration (start-up and one warm-up trace not charged)."""
    with TrialFleet(settings) as fleet:
        trial_job = fleet.serve(job)
        run_coroutine(replay_sample(trial_job, relabel(shapes[:1], f"warmup-{label}"), settings, 0.0, 120.0))
        return run_coroutine(
            replay_sample(trial_job, relabel(shapes, label), settings, config.time_scale, config.replay_timeout_s)
        )


def bench_profile(profile: str, config: HerdBenchConfig, settings: Settings, echo=print) -> dict[str, Any]:
    default = resolve_job(config.job or PROFILE_JOBS.get(profile, "tiny-cpu"), get_settings(), versions=False)
    tuner = Tuner(
        default,
        settings,
        TuneConfig(
            budget_minutes=config.budget_minutes,
            sample=config.tune_traces,
            knobs=tuple(config.knobs),
            max_workers=config.max_workers,
            time_scale=config.time_scale,
            seed=config.seed,
        ),
    )
    default = tuner.job  # with the workers cap, as every trial ran
    result = tuner.tune(generate(profile, config.seed, config.tune_traces).shapes)
    accepted = result.verdict is not None and result.verdict.accept and result.winner is not None
    tuned = with_changes(default, result.winner.changes) if accepted and result.winner else default
    echo(f"{profile}: {len(result.trials)} trials; guard: {result.verdict.reason if result.verdict else 'no winner'}")
    runs: dict[str, list[Measurement]] = {"default": [], "tuned": []}
    for r in range(config.rounds):
        shapes = generate(profile, config.seed + 1 + r, config.traces).shapes
        order = [("default", default), ("tuned", tuned)]
        for name, job in order[r % 2 :] + order[: r % 2]:
            runs[name].append(replay_on(job, shapes, f"{name}{r}-{int(time.time())}", settings, config))
            echo(f"{profile} round {r}: {name} {runs[name][-1].tasks_per_dollar:,.1f} tasks/$")
    return {
        "profile": profile,
        "job": default.name,
        "tuning_run": result.mlflow_run_id,
        "tuning": result.summary(),
        "tuned_changes": result.winner.changes if accepted and result.winner else {},
        "rounds": {name: [asdict(m) for m in ms] for name, ms in runs.items()},
        **side_by_side(runs["default"], runs["tuned"]),
    }


def run_herd_bench(config: HerdBenchConfig, settings: Settings, echo=print) -> dict[str, Any]:
    unknown = set(config.profiles) - set(PROFILES)
    if unknown:
        raise ValueError(f"unknown profiles {sorted(unknown)}; known: {sorted(PROFILES)}")
    started = time.monotonic()
    outcome = {
        "config": config.model_dump(),
        "profiles": [bench_profile(p, config, settings, echo) for p in config.profiles],
    }
    outcome["wall_s"] = round(time.monotonic() - started, 1)
    for p in outcome["profiles"]:
        echo(f"{p['profile']}: tuned / default tasks per dollar, median {p['median_ratio']}x (rounds {p['ratios']}); "
             f"goal {GOAL}x {'met' if p['goal_met'] else 'NOT met'}; never worse: {p['never_worse']}")  # fmt: skip
    return outcome


def recorded(previous: dict[str, Any], outcome: dict[str, Any]) -> dict[str, Any]:
    """The record with `outcome` in it: each (profile, default job) keeps its latest run, with the config and wall
    time of the run that measured it, so running one profile or job does not erase the others."""
    runs = previous["runs"]
    new = [{**p, "config": outcome["config"], "wall_s": outcome["wall_s"]} for p in outcome["profiles"]]
    replaced = {(p["profile"], p["job"]) for p in new}
    return {"runs": [p for p in runs if (p["profile"], p["job"]) not in replaced] + new}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="a tiny run that keeps the script alive")
    parser.add_argument("--job")
    parser.add_argument("--profiles", help="comma-separated workload profiles")
    parser.add_argument("--budget-minutes", type=float)
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--traces", type=int)
    parser.add_argument("--record", action="store_true", help=f"write {RESULTS.relative_to(PROJECT_ROOT)}")
    parser.add_argument("--out", type=Path, help="write the outcome JSON here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    base = SMOKE if args.smoke else HerdBenchConfig()
    updates = {
        "job": args.job,
        "profiles": args.profiles.split(",") if args.profiles else None,
        "budget_minutes": args.budget_minutes,
        "rounds": args.rounds,
        "traces": args.traces,
    }
    config = base.model_copy(update={k: v for k, v in updates.items() if v is not None})
    outcome = run_herd_bench(config, get_settings())
    if args.out:
        args.out.write_text(json.dumps(outcome, indent=2, default=str))
        print(f"wrote {args.out}")
    if args.record:
        previous = json.loads(RESULTS.read_text()) if RESULTS.exists() else {"runs": []}
        RESULTS.write_text(json.dumps(recorded(previous, outcome), indent=2, default=str))
        print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
