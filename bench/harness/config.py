"""What a benchmark run is asked: `python -m bench`'s options, as both drivers (`suite`, `agent_real`) read them."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field

from bench.harness.workload import LABELLED_PROFILES, PROFILES


class BenchConfig(BaseModel):
    """What `python -m bench` runs."""

    job: str = Field(
        default="job-c0ffee01", description="Job whose model, engine args, workers and price both sides use."
    )
    profile: str = Field(
        default="cpu", description=f"Workload profile: one of {sorted(PROFILES) + sorted(LABELLED_PROFILES)}."
    )
    traces: int | None = Field(default=None, ge=1, description="Root traces per round (default: the profile's).")
    seed: int = Field(default=0, description="Workload seed; round r uses seed + r.")
    rounds: int = Field(default=3, ge=1, description="Rounds; every round is kept, with min/median/max.")
    single_step_requests: int = Field(
        default=64, ge=0, description="Lines in the single-step batch file (0: no single-step comparison)."
    )
    limit: bool = Field(
        default=True, description="Also run the two offline limits (capacity-matched and compute-only)."
    )
    work_dir: Path = Field(description="Scratch folder: workload files, outputs, logs.")
    record: bool = Field(default=False, description="Write bench/RESULTS.md, bench/results/results.json and the plot.")
    command: str = Field(default="python -m bench", description="The command line, for the record.")
