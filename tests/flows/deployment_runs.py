"""`prefect deployment run run-batch/run-batch` as a user types it, for the e2e tests that start batches that way."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from pronk.settings import get_settings
from pronk.stack.prefect_env import prefect_environment


def run_batch_deployment(env: dict[str, str] | None = None, **parameters: object) -> subprocess.CompletedProcess[str]:
    """Start the run-batch deployment with `-p key=value` for each parameter and watch it to its end (240 s).

    `env` replaces the environment (a stack of its own); by default it is this session's, with its stack's Prefect.
    """
    command = [sys.executable, "-m", "prefect", "deployment", "run", "run-batch/run-batch"]
    for key, value in parameters.items():
        command += ["-p", f"{key}={value}"]
    command += ["--watch", "--watch-timeout", "240"]
    return subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=300,
        env=env or {**os.environ, **prefect_environment(get_settings())},
    )


def start_batch_deployment(**parameters: object) -> str:
    """Start the run-batch deployment as `run_batch_deployment` does, without watching it; returns the flow run id."""
    command = [sys.executable, "-m", "prefect", "deployment", "run", "run-batch/run-batch"]
    for key, value in parameters.items():
        command += ["-p", f"{key}={value}"]
    started = subprocess.run(
        command, capture_output=True, text=True, timeout=120, env={**os.environ, **prefect_environment(get_settings())}
    )
    assert started.returncode == 0, started.stdout + started.stderr
    found = re.search(r"UUID: ([0-9a-f-]{36})", started.stdout)
    assert found, started.stdout
    return found.group(1)
