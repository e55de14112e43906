"""The supervisor's decisions on fake processes and heartbeats (no servers, no clock)."""

from __future__ import annotations

from dataclasses import dataclass, field

from pronk.stack.restart_policy import RestartPolicy
from pronk.stack.supervisor import Beat, Supervisor, WorkerState

W0 = "job-c0ffee01-w0"


@dataclass
class FakeHost:
    running: set[int] = field(default_factory=set)
    beats: dict[str, Beat] = field(default_factory=dict)
    killed: list[int] = field(default_factory=list)
    spawned: list[str] = field(default_factory=list)
    next_pid: int = 100

    def spawn(self, worker_id: str) -> int:
        self.next_pid += 1
        self.running.add(self.next_pid)
        self.spawned.append(worker_id)
        return self.next_pid

    def poll(self, pid: int) -> tuple[bool, int | None]:
        return pid in self.running, None

    def heartbeat(self, worker_id: str) -> Beat | None:
        return self.beats.get(worker_id)

    def kill_group(self, pgid: int) -> None:
        self.killed.append(pgid)
        self.running.discard(pgid)


def supervisor(host: FakeHost, **policy) -> Supervisor:
    return Supervisor(
        RestartPolicy(**{"base_delay_s": 1.0, "max_delay_s": 8.0, "max_failures": 3, **policy}),
        host.spawn,
        host.poll,
        host.heartbeat,
        host.kill_group,
        start_timeout_s=30.0,
        hang_timeout_s=10.0,
    )


def test_a_dead_worker_has_its_group_killed_and_is_restarted_with_the_same_id_after_the_backoff():
    host = FakeHost(running={7}, beats={W0: Beat(7, 0.0)})
    sup = supervisor(host)
    assert sup.tick({W0: 7}, 0.0) == {W0: 7} and sup.watches[W0].state == WorkerState.SERVING
    host.running.discard(7)
    assert sup.tick({W0: 7}, 1.0) == {W0: 7}
    assert host.killed == [7] and sup.watches[W0].state == WorkerState.RESTARTING
    assert sup.tick({W0: 7}, 1.5) == {W0: 7} and not host.spawned  # still backing off
    pids = sup.tick({W0: 7}, 2.0)
    assert host.spawned == [W0] and pids == {W0: 101} and sup.watches[W0].state == WorkerState.STARTING
    host.beats[W0] = Beat(101, 3.0)
    sup.tick(pids, 3.0)
    report = sup.report(pid=1, now=3.0).workers[0]
    assert (report.state, report.restarts, report.pid, report.last_failure) == (WorkerState.SERVING, 1, 101, "exited")


def test_a_stale_heartbeat_of_the_old_process_does_not_count_for_the_new_one():
    host = FakeHost(running={7}, beats={W0: Beat(7, 0.0)})
    sup = supervisor(host)
    sup.tick({W0: 7}, 0.0)
    host.running.discard(7)
    sup.tick({W0: 7}, 1.0)
    pids = sup.tick({W0: 7}, 2.0)
    sup.tick(pids, 3.0)
    assert sup.watches[W0].state == WorkerState.STARTING


def test_a_worker_that_keeps_dying_is_given_up_on_loudly(caplog):
    host = FakeHost(running={7})
    sup = supervisor(host)
    pids, now = {W0: 7}, 0.0
    for _ in range(20):
        host.running.clear()  # every start dies at once
        pids = sup.tick(pids, now)
        now += 1.0
    watch = sup.watches[W0]
    assert watch.state == WorkerState.GIVEN_UP and watch.history.restarts == 2 and len(host.spawned) == 2
    assert any(r.levelname == "ERROR" and "GIVING UP" in r.getMessage() for r in caplog.records)
    spawned = len(host.spawned)
    sup.tick(pids, now + 1000.0)
    assert len(host.spawned) == spawned  # given up means no more starts


def test_a_worker_that_never_heartbeats_or_stops_heartbeating_is_killed_and_restarted():
    host = FakeHost(running={7})
    sup = supervisor(host)
    sup.tick({W0: 7}, 0.0)
    sup.tick({W0: 7}, 31.0)
    assert host.killed == [7] and "no heartbeat within 30s" in (sup.watches[W0].last_failure or "")

    host = FakeHost(running={7}, beats={W0: Beat(7, 0.0)})
    sup = supervisor(host)
    sup.tick({W0: 7}, 0.0)
    sup.tick({W0: 7}, 9.0)
    assert not host.killed
    sup.tick({W0: 7}, 11.0)
    assert host.killed == [7] and sup.watches[W0].state == WorkerState.RESTARTING


def test_a_silent_worker_shows_unresponsive_within_seconds_and_serving_when_it_beats_again():
    """A SIGSTOPped worker showed `serving` for the whole hang timeout; it is `unresponsive` once the router
    would drop it, and `serving` again when its heartbeat returns."""
    host = FakeHost(running={7}, beats={W0: Beat(7, 0.0)})
    sup = supervisor(host)
    sup.tick({W0: 7}, 0.5)
    assert sup.watches[W0].state == WorkerState.SERVING
    sup.tick({W0: 7}, 4.0)
    assert sup.watches[W0].state == WorkerState.SERVING
    sup.tick({W0: 7}, 6.0)
    assert sup.watches[W0].state == WorkerState.UNRESPONSIVE and not host.killed
    assert sup.report(1, 6.0).workers[0].state == "unresponsive"
    host.beats[W0] = Beat(7, 8.0)
    sup.tick({W0: 7}, 8.5)
    assert sup.watches[W0].state == WorkerState.SERVING
    sup.tick({W0: 7}, 19.0)
    assert sup.watches[W0].state == WorkerState.RESTARTING and host.killed == [7]


def test_workers_leaving_the_state_file_are_forgotten_and_new_pids_from_elsewhere_are_adopted():
    host = FakeHost(running={7, 8}, beats={W0: Beat(8, 5.0)})
    sup = supervisor(host)
    sup.tick({W0: 7}, 0.0)
    assert sup.tick({W0: 8}, 5.0) == {W0: 8} and sup.watches[W0].state == WorkerState.SERVING
    assert sup.tick({}, 6.0) == {} and not sup.watches
