"""The supervisor: a small process `pronk stack up` leaves running that restarts dead engine workers.

Run as `python -m pronk.stack.supervisor` (its pid is `supervisor` in `stack.json`, its log
`logs/supervisor.log`). Every half second it checks each worker in `stack.json` by its pid and its
registry heartbeat. A worker silent for longer than the router's `heartbeat_timeout_s` shows as `unresponsive`
(the router already sends it nothing); one that exited, never heartbeat within `start_timeout_s`, or stopped
heartbeating for `hang_timeout_s` is a failure: its whole process group is killed (vLLM's EngineCore
outlives a SIGKILLed worker otherwise), and the same worker id is started again after the restart
policy's backoff, or given up on after too many failures. What it sees goes to `supervisor.json`,
which `pronk stack status` shows.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from pydantic import BaseModel

from pronk.settings import Settings, get_settings
from pronk.stack.fleet import start_worker
from pronk.stack.processes import alive, kill_group, reap, spawn
from pronk.stack.processes import stop as stop_process_group
from pronk.stack.restart_policy import RestartHistory, RestartPolicy
from pronk.stack.state import SUPERVISOR, read_state, worker_of, write_json, write_state
from pronk.worker_registry import worker_registry

log = logging.getLogger(__name__)


class WorkerState(StrEnum):
    STARTING = "starting"
    SERVING = "serving"
    UNRESPONSIVE = "unresponsive"
    """Alive but silent for longer than the router waits (it sends the worker nothing); not yet a hang."""
    RESTARTING = "restarting"
    GIVEN_UP = "given up"


class SupervisedWorker(BaseModel):
    """One worker as the supervisor last saw it (a row of `supervisor.json`)."""

    worker_id: str
    state: WorkerState
    pid: int
    restarts: int
    failures_in_window: int
    since: float
    """When the worker entered `state` (Unix time)."""
    restart_at: float | None = None
    last_failure: str | None = None


class SupervisorReport(BaseModel):
    pid: int
    updated_at: float
    workers: list[SupervisedWorker]


def report_path(settings: Settings) -> Path:
    return settings.data_dir / "supervisor.json"


def read_report(settings: Settings) -> SupervisorReport | None:
    path = report_path(settings)
    try:
        return SupervisorReport.model_validate_json(path.read_text())
    except (OSError, ValueError):
        return None


def policy_from_settings(settings: Settings) -> RestartPolicy:
    return RestartPolicy(
        base_delay_s=settings.worker_restart_base_delay_s,
        max_delay_s=settings.worker_restart_max_delay_s,
        healthy_reset_s=settings.worker_restart_reset_s,
        max_failures=settings.worker_restart_max_failures,
        failure_window_s=settings.worker_restart_window_s,
    )


@dataclass(slots=True)
class Beat:
    pid: int
    at: float


@dataclass(slots=True)
class Watch:
    worker_id: str
    pid: int
    history: RestartHistory
    since: float
    state: WorkerState = WorkerState.STARTING
    last_beat: float | None = None
    restart_at: float | None = None
    last_failure: str | None = None


@dataclass(slots=True)
class Supervisor:
    """Per-tick decisions over a set of workers; the processes and the registry are reached through the callables."""

    policy: RestartPolicy
    spawn: Callable[[str], int]
    """Start the worker with this id; returns its pid."""
    poll: Callable[[int], tuple[bool, int | None]]
    """(alive, exit code when known) of a pid."""
    heartbeat: Callable[[str], Beat | None]
    """The worker id's latest registry entry (its pid and heartbeat time), if any."""
    kill_group: Callable[[int], object]
    start_timeout_s: float = 300.0
    hang_timeout_s: float = 60.0
    unresponsive_after_s: float = 5.0
    watches: dict[str, Watch] = field(default_factory=dict)

    def tick(self, workers: dict[str, int], now: float) -> dict[str, int]:
        """Check every worker of `workers` (id -> pid); returns id -> pid after the restarts this tick made."""
        for gone in set(self.watches) - set(workers):
            del self.watches[gone]
        for worker_id, pid in workers.items():
            watch = self.watches.get(worker_id)
            if watch is None or (watch.pid != pid and watch.state != WorkerState.RESTARTING):
                # new to us, or restarted by someone else (`stack up`): watch that process from here
                history = watch.history if watch else RestartHistory(self.policy)
                watch = self.watches[worker_id] = Watch(worker_id, pid, history, since=now)
            self._check(watch, now)
        return {worker_id: watch.pid for worker_id, watch in self.watches.items()}

    def _check(self, watch: Watch, now: float) -> None:
        if watch.state == WorkerState.GIVEN_UP:
            return
        if watch.state == WorkerState.RESTARTING:
            if watch.restart_at is not None and now >= watch.restart_at:
                try:
                    pid = self.spawn(watch.worker_id)
                except OSError as exc:
                    self._fail(watch, now, f"could not be started: {exc}")
                    return
                watch.pid = pid
                watch.history.restarts += 1
                watch.state, watch.since, watch.last_beat, watch.restart_at = WorkerState.STARTING, now, None, None
                log.warning("restarted %s as pid %d (restart %d)", watch.worker_id, watch.pid, watch.history.restarts)
            return
        running, code = self.poll(watch.pid)
        beat = self.heartbeat(watch.worker_id)
        if beat is not None and beat.pid == watch.pid:
            watch.last_beat = max(watch.last_beat or 0.0, beat.at)
        if not running:
            self._fail(watch, now, "exited" + (f" with code {code}" if code is not None else ""))
        elif watch.state == WorkerState.STARTING:
            if watch.last_beat is not None and now - watch.last_beat <= self.hang_timeout_s:
                watch.state, watch.since = WorkerState.SERVING, now
                log.info("%s (pid %d) is serving", watch.worker_id, watch.pid)
            elif now - watch.since > self.start_timeout_s:
                self._fail(watch, now, f"no heartbeat within {self.start_timeout_s:.0f}s of its start")
        elif now - (watch.last_beat if watch.last_beat is not None else watch.since) > self.hang_timeout_s:
            self._fail(watch, now, f"no heartbeat for {self.hang_timeout_s:.0f}s")
        elif watch.last_beat is not None and now - watch.last_beat > self.unresponsive_after_s:
            if watch.state != WorkerState.UNRESPONSIVE:
                watch.state, watch.since = WorkerState.UNRESPONSIVE, now
                log.warning(
                    "%s (pid %d) is unresponsive: no heartbeat for %.1fs",
                    watch.worker_id,
                    watch.pid,
                    now - watch.last_beat,
                )
        else:
            if watch.state == WorkerState.UNRESPONSIVE:
                watch.state, watch.since = WorkerState.SERVING, now
                log.info("%s (pid %d) is serving again", watch.worker_id, watch.pid)
            watch.history.record_healthy(watch.since, now)

    def _fail(self, watch: Watch, now: float, reason: str) -> None:
        self.kill_group(watch.pid)  # the worker, and the engine processes it leaves behind
        watch.last_failure = reason
        delay = watch.history.record_failure(now)
        if delay is None:
            watch.state, watch.since = WorkerState.GIVEN_UP, now
            log.error(
                "GIVING UP on %s (pid %d, %s): %d failures within %.0fs; `pronk stack up` starts it again",
                watch.worker_id,
                watch.pid,
                reason,
                len(watch.history.failures),
                self.policy.failure_window_s,
            )
            return
        watch.state, watch.since, watch.restart_at = WorkerState.RESTARTING, now, now + delay
        log.warning("%s (pid %d) %s; restarting in %.1fs", watch.worker_id, watch.pid, reason, delay)

    def report(self, pid: int, now: float) -> SupervisorReport:
        return SupervisorReport(
            pid=pid,
            updated_at=now,
            workers=[
                SupervisedWorker(
                    worker_id=w.worker_id,
                    state=w.state,
                    pid=w.pid,
                    restarts=w.history.restarts,
                    failures_in_window=len(w.history.failures),
                    since=w.since,
                    restart_at=w.restart_at,
                    last_failure=w.last_failure,
                )
                for w in self.watches.values()
            ],
        )


def _poll(pid: int) -> tuple[bool, int | None]:
    code = reap(pid)  # known only for workers this supervisor started itself
    return (False, code) if code is not None else (alive(pid), None)


def stack_supervisor(settings: Settings) -> Supervisor:
    """A supervisor over the real processes and registry of the stack `settings` describe."""
    registry = worker_registry(settings)

    def spawn(worker_id: str) -> int:
        job_id, index = worker_of(worker_id) or ("", 0)
        return start_worker(job_id, index, settings)

    def heartbeat(worker_id: str) -> Beat | None:
        job = worker_of(worker_id)
        entries = registry.entries(job[0]) if job else []
        entry = next((e for e in entries if e.worker_id == worker_id), None)
        return Beat(entry.pid, entry.heartbeat_at) if entry else None

    return Supervisor(
        policy_from_settings(settings),
        spawn,
        _poll,
        heartbeat,
        kill_group,
        unresponsive_after_s=settings.heartbeat_timeout_s,
    )


def run(settings: Settings, stop: threading.Event, interval_s: float = 0.5) -> None:
    """Supervise the workers of `stack.json` until `stop` is set."""
    supervisor = stack_supervisor(settings)
    log.info("supervising the workers of %s (%s)", settings.data_dir, supervisor.policy)
    while not stop.is_set():
        now = time.time()
        state = read_state(settings)
        workers = {name: pid for name, pid in state.items() if worker_of(name)}
        try:
            pids = supervisor.tick(workers, now)
        except Exception:  # one bad tick (a full disk, a registry file mid-write) must not end supervision
            log.exception("supervisor tick failed")
            pids = workers
        if pids != workers:
            write_state(settings, {**read_state(settings), **pids})
        write_json(report_path(settings), supervisor.report(os.getpid(), now).model_dump(mode="json"))
        stop.wait(interval_s)
    log.info("supervisor stopped")


def start_supervisor(settings: Settings, state: dict[str, int]) -> None:
    """Start the supervisor over the workers recorded in `stack.json` (written before, so it sees them)."""
    argv = [sys.executable, "-m", "pronk.stack.supervisor"]
    pid = spawn(argv, settings.logs_dir / "supervisor.log", env={"PRONK_DATA_DIR": str(settings.data_dir)})
    state.update({**read_state(settings), SUPERVISOR: pid})
    write_state(settings, state)


def stop_supervisor(settings: Settings, state: dict[str, int]) -> None:
    """Stop the supervisor, so nothing restarts what is being started or stopped, and take in its last pids."""
    if SUPERVISOR in state:
        stop_process_group(state[SUPERVISOR])
        state.update(read_state(settings))
        del state[SUPERVISOR]
        write_state(settings, state)


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    run(get_settings(), stop)


if __name__ == "__main__":
    main()
