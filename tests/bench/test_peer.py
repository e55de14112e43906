"""Unit tests of the peers' set-up that need no server: vllm-router's command line for each policy, its balance
threshold for the benchmark's fleets, the servers behind it, and the client that sends each step through it."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import httpx
import pytest

from bench.harness import peer
from bench.harness.agent_loop import SESSION_HEADER, RouterClient
from bench.harness.baseline import router_flags
from bench.harness.figures import CACHE_AWARE, PEERS, STICKY
from bench.harness.peer import POLICIES, VllmRouter, balance_abs_threshold, router_argv
from pronk.engine.worker_protocol import SamplingSpec, StepRequest
from pronk.jobs.catalog import resolve_job
from pronk.settings import get_settings

URLS = ["http://127.0.0.1:8001", "http://127.0.0.1:8002"]


@pytest.fixture
def installed(tmp_path, monkeypatch) -> str:
    """A `vllm-router` command beside the interpreter, as the `bench` extra installs it."""
    command = tmp_path / "bin" / "vllm-router"
    command.parent.mkdir()
    command.write_text("#!/bin/sh\n")
    command.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(command.parent / "python"))
    return str(command)


def test_every_peer_setup_has_a_policy():
    assert set(POLICIES) == set(PEERS)
    assert POLICIES[CACHE_AWARE].policy == "cache_aware" and not POLICIES[CACHE_AWARE].session_header
    assert POLICIES[STICKY].policy == "sticky_least_loaded" and POLICIES[STICKY].session_header


def test_cache_aware_balances_at_half_an_engines_share_of_the_traces_in_flight():
    settings = get_settings()
    thresholds = {
        name: balance_abs_threshold(job.scheduling.max_concurrency, job.workers)
        for name in ("agent-long", "agent-long-tiered", "tiny-cpu-herd", "agent-real")
        if (job := resolve_job(name, settings))
    }
    assert thresholds == {"agent-long": 2, "agent-long-tiered": 2, "tiny-cpu-herd": 8, "agent-real": 2}
    assert balance_abs_threshold(1, 2) == 1  # never 0: an engine one request busier is no pile-up


def test_the_cache_aware_command_line(installed):
    argv = router_argv(POLICIES[CACHE_AWARE], URLS, 9000, 9001, concurrency=10)
    assert argv == [
        installed,
        "--host",
        "127.0.0.1",
        "--port",
        "9000",
        "--worker-urls",
        *URLS,
        "--policy",
        "cache_aware",
        "--prometheus-port",
        "9001",
        "--balance-abs-threshold",
        "2",
        "--balance-rel-threshold",
        "1.5",
        "--retry-max-retries",
        "3",
        "--log-level",
        "warning",
    ]


def test_the_sticky_command_line_has_no_balance_thresholds(installed):
    argv = router_argv(POLICIES[STICKY], URLS, 9000, 9001, concurrency=32)
    assert argv[argv.index("--policy") + 1] == "sticky_least_loaded"
    assert not any(flag.startswith("--balance") for flag in argv)
    assert argv[argv.index("--retry-max-retries") + 1] == "3" and "--disable-circuit-breaker" not in argv


def test_without_the_bench_extra_the_router_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(RuntimeError, match=r"bench. extra"):
        router_argv(POLICIES[STICKY], URLS, 9000, 9001, concurrency=8)


def test_a_router_is_started_in_front_of_the_servers_and_stopped(installed, tmp_path, monkeypatch):
    started, stopped = [], []
    monkeypatch.setattr(peer, "spawn", lambda argv, log: started.append((argv, log)) or 4242)
    monkeypatch.setattr(peer, "wait_healthy", lambda url, *_: started.append(url))
    monkeypatch.setattr(peer, "stop", stopped.append)
    with VllmRouter(STICKY, URLS, 8, tmp_path) as router:
        (argv, log), health = started
        assert argv[0] == installed and argv[argv.index("--worker-urls") + 1 :][:2] == URLS
        assert health == f"{router.url}/health" and router.url.endswith(argv[argv.index("--port") + 1])
        assert log == tmp_path / "vllm-router-sticky_least_loaded.log"
        assert router.command_line.startswith(f"{installed} --host 127.0.0.1")
        client = router.client("smol")
        assert isinstance(client, RouterClient) and client.urls == [router.url] and client.session_header
    assert stopped == [4242]


def test_servers_behind_a_router_expose_the_render_endpoints_and_name_themselves():
    flags = router_flags(1)
    assert "--enable-scale-out" in flags
    assert flags[flags.index("--fingerprint-mode") + 1] == "custom"
    assert flags[flags.index("--fingerprint-value") + 1] == "vllm-server-1"


def _through(client: RouterClient, requests: list[StepRequest], fingerprint: str | None) -> list[tuple[dict, str]]:
    """Each request through `client` against a server double: the headers it sent, and the worker the result names."""
    sent = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(dict(request.headers))
        body = {
            "choices": [{"text": "x", "token_ids": [7], "finish_reason": "length"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1, "prompt_tokens_details": {"cached_tokens": 2}},
        }
        return httpx.Response(200, json=body | ({"system_fingerprint": fingerprint} if fingerprint else {}))

    client._http = httpx.AsyncClient(transport=httpx.MockTransport(answer))

    async def run():
        try:
            return [await client.generate(r) for r in requests]
        finally:
            await client.aclose()

    results = asyncio.run(run())
    return [(headers, result.worker_id) for headers, result in zip(sent, results, strict=True)]


def _step(trace_id: str, affinity_key: str | None = None) -> StepRequest:
    return StepRequest(
        request_id=f"{trace_id}/0",
        prompt_token_ids=[1, 2, 3],
        sampling=SamplingSpec(max_tokens=1),
        trace_id=trace_id,
        affinity_key=affinity_key,
    )


def test_a_sticky_peer_sends_the_trace_id_as_the_session_and_a_child_its_roots():
    client = RouterClient("http://router", "smol", session_header=True)
    (root, server), (child, _) = _through(client, [_step("t1"), _step("t1.c0", affinity_key="t1")], "vllm-server-1")
    assert root[SESSION_HEADER.lower()] == "t1" and child[SESSION_HEADER.lower()] == "t1"
    assert server == "vllm-server-1"  # the server's own name, from its responses' system_fingerprint


def test_cache_aware_sends_no_session_and_a_nameless_answer_is_the_routers():
    client = RouterClient("http://router", "smol", session_header=False)
    ((headers, server),) = _through(client, [_step("t1")], None)
    assert SESSION_HEADER.lower() not in headers and server == "vllm-router"


def test_the_router_flags_reach_a_server_as_vllm_reads_them():
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    args = make_arg_parser(FlexibleArgumentParser()).parse_args(["--model", str(Path("m")), *router_flags(0)])
    assert args.enable_scale_out and args.fingerprint_mode == "custom" and args.fingerprint_value == "vllm-server-0"
