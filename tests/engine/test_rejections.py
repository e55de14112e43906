"""A bad step is the request's fault, not the worker's: 400 from the worker, StepRejected in the client,
no retry and no failure mark in the router."""

import asyncio
import time
from types import SimpleNamespace

import httpx
import pytest
from fastapi.testclient import TestClient

from pronk.engine import vllm_backend
from pronk.engine.auth import auth_headers
from pronk.engine.client import StepRejected, WorkerClient, WorkerUnavailable
from pronk.engine.registry import FileRegistry
from pronk.engine.router import Router
from pronk.engine.vllm_backend import StepInvalid, VllmBackend
from pronk.engine.worker import create_app
from pronk.engine.worker_protocol import StepRequest
from tests.engine.test_router import JOB, StandInClient, announce, step


class ValidationErrorLikeVllms(Exception):
    """Stands in for vllm.exceptions.VLLMValidationError, which is not a ValueError."""


class RefusingEngine:
    model_config = SimpleNamespace(max_model_len=8)

    def generate(self, prompt, params, request_id):
        raise ValidationErrorLikeVllms("The decoder prompt (length 9) is longer than the maximum model length of 8.")


@pytest.fixture
def backend(monkeypatch):
    monkeypatch.setattr(vllm_backend, "_client_errors", lambda: (ValueError, TypeError, ValidationErrorLikeVllms))
    monkeypatch.setattr(VllmBackend, "_sampling_params", lambda self, spec: SimpleNamespace(extra_args=None))
    return VllmBackend("m", "m/1", "w0", JOB, {}, _engine=RefusingEngine())


def test_a_prompt_over_max_model_len_is_refused_before_the_engine(backend):
    with pytest.raises(StepInvalid, match="9 tokens; max_model_len is 8"):
        asyncio.run(backend.generate(StepRequest(request_id="r", prompt_token_ids=list(range(9)))))
    assert backend.in_flight == 0


def test_vllms_own_validation_errors_become_step_invalid(backend):
    with pytest.raises(StepInvalid, match="ValidationErrorLikeVllms"):
        asyncio.run(backend.generate(StepRequest(request_id="r", prompt_token_ids=[1, 2])))
    assert backend.in_flight == 0


def test_the_worker_answers_a_bad_step_with_400(backend, tmp_path):
    app = create_app(backend, FileRegistry(tmp_path), "http://w0", 1.0, lambda *a: None, token="t")
    response = TestClient(app, headers=auth_headers("t")).post(
        "/generate", json={"request_id": "r", "prompt_token_ids": list(range(9))}
    )
    assert response.status_code == 400 and "max_model_len is 8" in response.json()["detail"]


@pytest.mark.parametrize(
    ("status", "error"),
    [(400, StepRejected), (413, StepRejected), (422, StepRejected), (500, WorkerUnavailable), (503, WorkerUnavailable)],
)
def test_the_client_tells_a_rejected_step_from_an_unavailable_worker(status, error):
    client = WorkerClient("t")
    client._http = httpx.AsyncClient(transport=httpx.MockTransport(lambda request: httpx.Response(status, text="no")))
    with pytest.raises(error):
        asyncio.run(client.generate("http://w0", step()))


class RejectingClient(StandInClient):
    async def generate(self, url, request):
        self.calls.append(url)
        raise StepRejected("HTTP 400: prompt too long")


def test_the_router_neither_retries_a_rejected_step_nor_marks_the_worker_failed(tmp_path):
    registry = FileRegistry(tmp_path, heartbeat_timeout_s=5.0)
    announce(registry, "w0")
    announce(registry, "w1", waiting=3)
    client = RejectingClient()
    router = Router(JOB, registry, client=client)
    started = time.monotonic()
    with pytest.raises(StepRejected):
        asyncio.run(router.generate(step()))
    assert client.calls == ["http://w0"] and router.failed == {} and time.monotonic() - started < 1
    assert [w.worker_id for w in router.workers()] == ["w0", "w1"]


@pytest.mark.parametrize(
    ("seeded_sampling", "temperature", "sent"), [(True, 0.7, 5), (False, 0.7, None), (True, 0.0, None)]
)
def test_a_seed_reaches_vllm_only_where_its_sampler_can_use_it(seeded_sampling, temperature, sent):
    """On CPU vLLM's sampler dies rewinding a seeded generator after a chunked prefill: the seed is dropped there."""
    from pronk.engine.worker_protocol import SamplingSpec

    backend = VllmBackend("m", "m/1", "w0", JOB, {}, seeded_sampling=seeded_sampling)
    params = backend._sampling_params(SamplingSpec(max_tokens=4, temperature=temperature, seed=5))
    assert params.seed == sent


def test_a_step_asks_vllm_for_its_final_output_only():
    """The worker answers a step once, at its end: vLLM need not make an output for every token on the way."""
    from vllm.sampling_params import RequestOutputKind

    from pronk.engine.worker_protocol import SamplingSpec

    backend = VllmBackend("m", "m/1", "w0", JOB, {})
    assert backend._sampling_params(SamplingSpec(max_tokens=4)).output_kind == RequestOutputKind.FINAL_ONLY


class RecordingEngine:
    model_config = SimpleNamespace(max_model_len=64)

    def __init__(self):
        self.prompts: list = []

    async def generate(self, prompt, params, request_id):
        self.prompts.append(prompt)
        completion = SimpleNamespace(text="ok", token_ids=[7], finish_reason="stop")
        yield SimpleNamespace(
            outputs=[completion], metrics=None, prompt_token_ids=[1, 2], num_cached_tokens=0, kv_transfer_params=None
        )


def test_a_step_reaches_vllm_as_rendered_token_input(monkeypatch):
    """Token ids go in as vLLM's own server sends them (`tokens_input`), not as a raw prompt vLLM would hand to its
    tokenizer threads first."""
    monkeypatch.setattr(VllmBackend, "_generation_version", lambda self, completion: "m/1")
    engine = RecordingEngine()
    backend = VllmBackend("m", "m/1", "w0", JOB, {}, _engine=engine)
    result = asyncio.run(backend.generate(StepRequest(request_id="r", prompt_token_ids=[1, 2])))
    assert engine.prompts == [{"type": "token", "prompt_token_ids": [1, 2]}] and result.token_ids == [7]


def test_a_workers_engine_keeps_the_stats_its_stats_read_and_no_prometheus_metrics():
    """vLLM adds a Prometheus logger to every engine unless given one: the worker's stand-in records nothing, while
    the snapshot behind /stats gets every scheduler report."""
    from vllm.v1.metrics.loggers import PrometheusStatLogger, StatLoggerManager
    from vllm.v1.metrics.stats import PrefixCacheStats, SchedulerStats

    snapshot = vllm_backend.SchedulerSnapshot()
    factories = [vllm_backend._stat_logger_factory(snapshot), vllm_backend._no_prometheus_logger()]
    manager = StatLoggerManager(SimpleNamespace(), custom_stat_loggers=factories, enable_default_loggers=False)
    prometheus = [logger for logger in manager.stat_loggers if isinstance(logger, PrometheusStatLogger)]
    assert [type(logger).__name__ for logger in prometheus] == ["NoPrometheus"]
    stats = SchedulerStats(
        num_running_reqs=3, kv_cache_usage=0.5, prefix_cache_stats=PrefixCacheStats(queries=8, hits=6)
    )
    manager.record(stats, None)
    assert (snapshot.running, snapshot.kv_cache_usage, snapshot.prefix_cache_hits) == (3, 0.5, 6)
