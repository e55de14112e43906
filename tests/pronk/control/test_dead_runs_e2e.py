"""Runs on another host are judged by their heartbeats on the real Prefect server: one whose heartbeats stopped is
dead, one still beating is not (the stack's server; the runs are made here, labelled as another host's)."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from pronk.control import dead_runs
from pronk.control.dead_runs import HOST, PID, PID_STARTED, find_dead

pytestmark = pytest.mark.e2e


async def a_run_on_another_host(client, name: str) -> uuid.UUID:
    from prefect import flow
    from prefect.states import Running

    @flow(name="run-batch")
    def run_batch() -> None: ...

    run = await client.create_flow_run(run_batch, name=name, state=Running())
    await client.update_flow_run_labels(run.id, {HOST: "another-host", PID: "4242", PID_STARTED: "7"})
    return run.id


def test_a_run_on_another_host_is_dead_once_its_heartbeats_stop_and_a_beating_one_is_not(stack, monkeypatch):
    from prefect import get_client
    from prefect.events import emit_event
    from prefect.states import Cancelled

    monkeypatch.setattr(dead_runs, "dead_after_s", lambda: 4.0)

    async def scenario() -> tuple[str, str, set[str]]:
        async with get_client() as client:
            quiet = await a_run_on_another_host(client, "quiet-on-another-host")
            beating = await a_run_on_another_host(client, "beating-on-another-host")
            try:
                await asyncio.sleep(5)  # both are older than the window; only one beats in it
                emit_event(event=dead_runs.HEARTBEAT, resource={"prefect.resource.id": f"prefect.flow-run.{beating}"})
                deadline = time.monotonic() + 30
                while True:  # until the server has stored the heartbeat
                    found = {run.flow_run_id for run in await find_dead(judge_remote=True)}
                    if str(beating) not in found or time.monotonic() > deadline:
                        return str(quiet), str(beating), found
                    await asyncio.sleep(0.5)
            finally:
                for run_id in (quiet, beating):
                    await client.set_flow_run_state(run_id, Cancelled(), force=True)

    quiet, beating, found = asyncio.run(scenario())
    assert quiet in found and beating not in found
