"""The run's progress artifact, without a Prefect server: what it sends for the batch's reports."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from pronk.control import artifacts
from pronk.control.artifacts import ProgressArtifact


@pytest.fixture
def sent(monkeypatch) -> list[tuple[str, float]]:
    """The calls the artifact makes to Prefect; an update at 50% fails the first time, as a busy server's would."""
    calls: list[tuple[str, float]] = []
    artifact_id = uuid.uuid4()

    async def create(progress: float, key: str | None, description: str) -> uuid.UUID:
        calls.append(("create", progress))
        return artifact_id

    async def update(artifact: uuid.UUID, progress: float) -> uuid.UUID:
        assert artifact == artifact_id
        calls.append(("update", progress))
        if progress == 50.0 and calls.count(("update", 50.0)) == 1:
            raise ConnectionError("the Prefect API is busy")
        return artifact

    monkeypatch.setattr(artifacts, "acreate_progress_artifact", create)
    monkeypatch.setattr(artifacts, "aupdate_progress_artifact", update)
    return calls


def test_a_report_that_changes_nothing_sends_nothing_and_a_failed_update_is_sent_again(sent):
    progress = ProgressArtifact("batch b")

    async def report(*percents: float) -> None:
        for percent in percents:
            await progress(percent)

    asyncio.run(report(0.0, 0.0, 10.0, 10.0, 10.0, 50.0, 50.0, 50.0, 100.0))
    assert sent == [
        ("create", 0.0),
        ("update", 10.0),
        ("update", 50.0),
        ("update", 50.0),
        ("update", 100.0),
    ]
