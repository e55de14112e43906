"""A batch whose completion window ends mid-run: the real flow on the real stack stops starting requests and
ends `expired`, with what finished in the output file and one `batch_expired` line per request never started."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from pronk import storage
from pronk.batches.schemas import Batch
from pronk.batches.store import BatchStore
from pronk.settings import get_settings
from tests.pronk.api.test_openai_client import JOB, slow_line

pytestmark = pytest.mark.e2e


def test_a_batch_past_its_window_expires_with_its_finished_results(stack, tmp_path):
    from pronk.flows.batch import run_batch

    # 16 waves of 32 lines, >= 48 s of tool gaps on any machine, cannot finish in a 20 s window; a run starts well
    # inside it even on a loaded machine.
    total = 512
    path = tmp_path / "input.jsonl"
    path.write_text("\n".join(slow_line(f"r{i}") for i in range(total)))
    batch = Batch(input_file_id=str(path), job_id=JOB, model="pronk-tiny")
    batch.expires_at = int(time.time()) + 20
    BatchStore(get_settings()).save(batch)

    result = asyncio.run(
        run_batch(input_uri=str(path), job_id=JOB, output_dir=str(tmp_path / "out"), batch_id=batch.id)
    )

    stored = BatchStore(get_settings()).load(batch.id)
    assert result["status"] == stored.status == "expired" and stored.expired_at >= stored.expires_at
    outputs = [json.loads(x) for x in storage.read_bytes(stored.output_uri, get_settings()).decode().splitlines()]
    errors = [json.loads(x) for x in storage.read_bytes(stored.error_uri, get_settings()).decode().splitlines()]
    assert len(outputs) > 0 and len(errors) > 0
    assert sorted(line["custom_id"] for line in outputs + errors) == sorted(f"r{i}" for i in range(total))
    assert {e["error"]["code"] for e in errors} == {"batch_expired"}
    counts = stored.request_counts  # an expired batch's unstarted lines are cancelled, as OpenAI counts them
    assert (counts.completed, counts.failed, counts.cancelled) == (len(outputs), 0, len(errors))
