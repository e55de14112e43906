"""Experiments: one question each, answered by a script that records its section of bench/RESULTS.md."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def scratch_stack(name: str, **env: str) -> Path:
    """A fresh folder for an experiment's own embedded stack, with the environment pointing the stack there on free
    ports (Prefect, MLflow's UI, the API), so it never meets a stack already running; `env` adds settings. The stack's
    data dir is `<folder>/data`. The folder lets others pass (0711), as a data dir a user picks does: run as root,
    the stack's PostgreSQL runs as another user, who must reach its cluster, else the stack keeps Prefect on SQLite."""
    from engine.worker import free_port

    work = Path(tempfile.mkdtemp(prefix=f"pronk-bench-{name}-"))
    work.chmod(0o711)
    ports = {f"PRONK_{part}_PORT": str(free_port()) for part in ("PREFECT", "MLFLOW", "API")}
    os.environ.update({"PRONK_DATA_DIR": str(work / "data"), **ports, **env})
    return work
