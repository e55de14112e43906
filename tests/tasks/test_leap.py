"""The stage task's retry condition, asked as Prefect's task engine asks it (a `Failed` state holding the error):
a checkpoint the worker refused is not retried, any other failure is."""

import pytest
from prefect.states import Failed

from pronk.engine.client import WeightsRefused, WorkerUnavailable
from pronk.engine.engine_error import EngineError
from pronk.tasks.leap import stage_weights


@pytest.mark.parametrize(
    ("error", "retried"),
    [
        (WeightsRefused("http://w0: checkpoint m/3 does not fit m/1"), False),
        (WorkerUnavailable("http://w0: ConnectError on /weights/stage"), True),
        (EngineError("http://w0: HTTP 500 on /weights/stage"), True),
    ],
    ids=["refused", "unreachable", "worker-error"],
)
def test_staging_is_retried_unless_the_worker_refused_the_checkpoint(error, retried):
    assert stage_weights.retry_condition_fn is not None
    assert stage_weights.retry_condition_fn(stage_weights, None, Failed(data=error)) is retried
