"""Test settings: every test session gets its own data dir and ports, set before Prefect is imported.

The `stack` fixture starts the real embedded stack once per session (Prefect server, the run-batch
deployment with a process worker, the tiny model in MLflow on SQLite, two vLLM workers).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from engine.worker import free_port

_DATA_DIR = Path(tempfile.mkdtemp(prefix="pronk-test-"))
os.environ.update(
    {
        "PRONK_DATA_DIR": str(_DATA_DIR),
        "PRONK_PREFECT_PORT": str(free_port()),
        "PRONK_MLFLOW_PORT": str(free_port()),
    }
)
for key in [k for k in os.environ if k.startswith("PREFECT_")]:
    del os.environ[key]

from pronk.prefect_env import configure_prefect  # noqa: E402
from pronk.settings import Settings, get_settings  # noqa: E402

get_settings.cache_clear()
configure_prefect(get_settings())

DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="session")
def settings() -> Settings:
    return get_settings()


@pytest.fixture(scope="session")
def stack(settings: Settings):
    """The real embedded stack with the default job's two workers; stopped at the end of the session."""
    from pronk import stack as embedded

    try:
        embedded.up(settings, mlflow_ui=False)
        yield settings
    finally:
        embedded.down(settings)
