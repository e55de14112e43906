"""Prefect settings for pronk's processes: which server, where its state lives, and a server tuned to keep up.

Call `configure_prefect()` before the first `import prefect` in a process; values already in the
environment win, so `PREFECT_API_URL` pointing at a remote server is respected.
"""

from __future__ import annotations

import logging
import os

from pronk.pronk_error import PronkError
from pronk.settings import Settings

# Measured on 2 cores (Prefect's server on SQLite): batching the recorders lets it record ~100 task runs/s in bursts,
# ~55/s sustained, instead of ~30, and a burst no longer overflows its event queue.
TUNED_SERVER = {
    "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_BATCH_SIZE": "500",
    "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_FLUSH_INTERVAL": "1",
    "PREFECT_SERVER_SERVICES_EVENT_PERSISTER_BATCH_SIZE": "500",
    "PREFECT_SERVER_SERVICES_EVENT_PERSISTER_FLUSH_INTERVAL": "1",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    # A scheduled deployment (an enrichment spec's cron) gets its runs within 10 s of being deployed, not 60.
    "PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS": "10",
    # A run waiting on its deployment's concurrency limit (the batch queue's next drainer) is offered again 5 s
    # later, not 30: it starts soon after the drainer before it ends.
    "PREFECT_SERVER_DEPLOYMENTS_CONCURRENCY_SLOT_WAIT_SECONDS": "5",
    # A deployment's concurrency slot is a lease its flow run renews. Kept in memory (Prefect's default), a server
    # restart forgets every lease: a run still alive is killed at its next renewal (410), and the slot of a run that
    # died is never given back, so the next drainer waits for good (issue 65). On disk they outlive a restart.
    "PREFECT_SERVER_CONCURRENCY_LEASE_STORAGE": "prefect.server.concurrency.lease_storage.filesystem",
}


PRONK_LOGGERS = ("pronk",)
"""pronk's own loggers (its flows' and tasks' too, `pronk.flows.*` and `pronk.tasks.*`): Prefect attaches its API
handler to them, so their lines show on the run page."""

# Run pages show INFO: the flow's `get_run_logger()` and pronk's loggers (inside flow runs). Task runs and
# Prefect's own loggers stay at WARNING: their per-task-run lines are what cost throughput (sent to the API, they
# cut a client's task runs from ~260/s to ~175/s on these cores).
RUN_PAGE_LOGGING = {
    "PREFECT_LOGGING_LOGGERS_PREFECT_FLOW_RUNS_LEVEL": "INFO",
    "PREFECT_LOGGING_EXTRA_LOGGERS": ",".join(PRONK_LOGGERS),
    "PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW": "ignore",
}


RUN_LOGGERS = ("prefect.flow_runs", "prefect.task_runs")
"""The loggers Prefect's engine reports a flow or task run's exception on, with its traceback."""


class RefusalsWithoutTraceback(logging.Filter):
    """Drop the traceback from a run's log line when its exception is a `PronkError`: pronk raised it on purpose and
    its message says what is wrong (a refused Leap, a missing job), so the line keeps the message and the command
    that ran the flow prints it once more as its error, without a Python traceback before it."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], PronkError):
            record.exc_info, record.exc_text = None, None
        return True


def hide_tracebacks_of_refusals() -> None:
    """Install `RefusalsWithoutTraceback` on Prefect's run loggers in this process (once)."""
    for name in RUN_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, RefusalsWithoutTraceback) for f in logger.filters):
            logger.addFilter(RefusalsWithoutTraceback())


def prefect_api_url(settings: Settings) -> str:
    return f"http://127.0.0.1:{settings.prefect_port}/api"


def prefect_environment(settings: Settings) -> dict[str, str]:
    env = {
        "PREFECT_HOME": str(settings.data_dir / "prefect"),
        "PREFECT_API_URL": prefect_api_url(settings),
        "PREFECT_SERVER_API_HOST": "127.0.0.1",
        "PREFECT_SERVER_API_PORT": str(settings.prefect_port),
        "PREFECT_LOGGING_LEVEL": "WARNING",
        "PREFECT_UI_ENABLED": "true",
        # A flow run's `prefect.flow-run.heartbeat` every 30 s (Prefect's least; its default is 180):
        # `pronk.control.dead_runs` judges a run on another host dead after three missed.
        "PREFECT_FLOWS_HEARTBEAT_FREQUENCY": "30",
        **RUN_PAGE_LOGGING,
        **TUNED_SERVER,
    }
    return {key: os.environ.get(key, value) for key, value in env.items()}


def configure_prefect(settings: Settings) -> None:
    os.environ.update(prefect_environment(settings))


def show_pronk_logs(level: int = logging.INFO) -> None:
    """Let pronk's loggers pass INFO lines in this process (a flow run): with `PREFECT_LOGGING_EXTRA_LOGGERS`
    they reach the run page in the Prefect UI, which otherwise says "This run didn't generate logs"."""
    for name in PRONK_LOGGERS:
        logger = logging.getLogger(name)
        if logger.getEffectiveLevel() > level:
            logger.setLevel(level)
