"""A bad step is the request's fault, not the worker's: 400 from the worker, StepRejected in the client,
no retry and no failure mark in the router."""

import asyncio
import time
from types import SimpleNamespace

import httpx
import pytest
from fastapi.testclient import TestClient

from engine import vllm_backend
from engine.auth import auth_headers
from engine.client import StepRejected, WorkerClient, WorkerUnavailable
from engine.protocol import StepRequest
from engine.registry import FileRegistry
from engine.router import Router
from engine.vllm_backend import StepInvalid, VllmBackend
from engine.worker import create_app
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
    from engine.protocol import SamplingSpec

    backend = VllmBackend("m", "m/1", "w0", JOB, {}, seeded_sampling=seeded_sampling)
    params = backend._sampling_params(SamplingSpec(max_tokens=4, temperature=temperature, seed=5))
    assert params.seed == sent


def test_a_step_asks_vllm_for_its_final_output_only():
    """The worker answers a step once, at its end: vLLM need not make an output for every token on the way."""
    from vllm.sampling_params import RequestOutputKind

    from engine.protocol import SamplingSpec

    backend = VllmBackend("m", "m/1", "w0", JOB, {})
    assert backend._sampling_params(SamplingSpec(max_tokens=4)).output_kind == RequestOutputKind.FINAL_ONLY
