"""The strongest peer a user can deploy today: the vLLM project's router (`vllm-router`, the `bench` extra, pinned) in
front of the very stock vLLM servers the round-robin baseline uses, so only the placement of each step differs.

Two policies (`POLICIES`), each its own setup:

- `cache_aware`, vllm-router's default: it tokenizes each chat prompt on a server (`/v1/chat/completions/render`,
  which the servers expose with `--enable-scale-out`; a token-id prompt it reads as is), sends it to the server whose
  approximate radix tree of past prompts matches most of it, or, below a 30% match, to the least loaded server, and
  balances by load instead whenever the servers' requests in flight differ by more than `--balance-abs-threshold`
  and by a factor of more than `--balance-rel-threshold`. Its default absolute threshold, 64, is sized for GPU
  engines running hundreds of requests; this fleet never has more in flight than the job's `max_concurrency` (8 to
  32 traces over 2 engines), so with it the router never balances and can pile every trace that shares a system
  prompt onto one engine (issue 63: 36 requests of 6 traces, all on one server). A careful user sets it to the fleet
  (`balance_abs_threshold`) and keeps the relative one, 1.5.
- `sticky_least_loaded` with `X-Session-ID` set to the trace's id: a session's first request goes to the least
  loaded server and every later one follows it: the best a client can do with session affinity.

Both retry a step the server answered 408, 429 or 5xx up to `RETRY_ATTEMPTS` tries in all, with vllm-router's
backoff (50 ms, x1.5, at most 30 s, 20% jitter): a step is a seeded generation, so sending it again is safe, and on
a 2-engine fleet a failure that lasts past two re-sends is no blip, so it should show as the trace's error rather
than queue more load. The circuit breaker keeps its defaults (a server's circuit opens after 10 failures within
120 s, for 60 s): a healthy run never trips it, and one tighter would take half this fleet out over a few bad
requests, where the health checker already drops a dead server. Every other setting is vllm-router's default.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from bench.harness.agent_loop import RouterClient
from bench.harness.figures import CACHE_AWARE, STICKY
from pronk.engine.worker import free_port
from pronk.stack.processes import spawn, stop, wait_healthy


@dataclass(frozen=True, slots=True)
class RouterPolicy:
    """A vllm-router policy as a peer setup runs it: its name on the command line, and whether each step carries its
    trace's id as `X-Session-ID`."""

    policy: str
    session_header: bool


POLICIES = {
    CACHE_AWARE: RouterPolicy("cache_aware", session_header=False),
    STICKY: RouterPolicy("sticky_least_loaded", session_header=True),
}
"""Each peer setup (`figures.PEERS`) by name."""

RETRY_ATTEMPTS = 3
"""Tries of a step in all, the first included (vllm-router's `--retry-max-retries`)."""
BALANCE_REL_THRESHOLD = 1.5
"""vllm-router's default: balance only when the busiest server has 1.5x the requests in flight of the idlest."""


def balance_abs_threshold(concurrency: int, workers: int) -> int:
    """`cache_aware`'s absolute balance threshold for a fleet of `workers` servers with `concurrency` traces in
    flight: half of one server's fair share of them (at least 1). The router balances once the busiest server holds
    more than that many requests over the idlest (and 1.5x as many), so a pile-up on one engine is undone within a
    few steps, while the small differences every fleet has keep each trace on the server that holds its prefix."""
    return max(1, concurrency // (2 * workers))


def router_command() -> str:
    """The `vllm-router` command: the one installed beside the interpreter running the bench (the `bench` extra
    puts it in the venv's bin), else on PATH."""
    search = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    found = shutil.which("vllm-router", path=search)
    if found is None:
        raise RuntimeError(
            "vllm-router is not installed; the benchmark's peers need the `bench` extra: `make install`, or "
            "`pip install -e '.[bench]'`"
        )
    return found


def router_argv(
    policy: RouterPolicy, worker_urls: list[str], port: int, metrics_port: int, concurrency: int
) -> list[str]:
    """The command line of a vllm-router with `policy` in front of `worker_urls`, on `port` (its Prometheus metrics
    on `metrics_port`), for a fleet with `concurrency` traces in flight."""
    argv = [router_command(), "--host", "127.0.0.1", "--port", str(port), "--worker-urls", *worker_urls]
    argv += ["--policy", policy.policy, "--prometheus-port", str(metrics_port)]
    if policy.policy == "cache_aware":
        argv += ["--balance-abs-threshold", str(balance_abs_threshold(concurrency, len(worker_urls)))]
        argv += ["--balance-rel-threshold", str(BALANCE_REL_THRESHOLD)]
    return [*argv, "--retry-max-retries", str(RETRY_ATTEMPTS), "--log-level", "warning"]


@dataclass
class VllmRouter:
    """One vllm-router process in front of stock servers, for the peer setup `name`; use as a context manager so it
    always stops. It runs unpinned, as pronk's router (in the replay loop's process) and the round-robin client do."""

    name: str
    worker_urls: list[str]
    concurrency: int
    logs_dir: Path
    url: str = ""
    pid: int | None = None
    argv: tuple[str, ...] = ()

    @property
    def policy(self) -> RouterPolicy:
        return POLICIES[self.name]

    @property
    def command_line(self) -> str:
        """How it was started, as a shell would take it."""
        return shlex.join(self.argv)

    @property
    def log_path(self) -> Path:
        return self.logs_dir / f"vllm-router-{self.policy.policy}.log"

    def start(self, timeout_s: float = 60.0) -> VllmRouter:
        port = free_port()
        self.argv = tuple(router_argv(self.policy, self.worker_urls, port, free_port(), self.concurrency))
        self.pid = spawn(list(self.argv), self.log_path)
        self.url = f"http://127.0.0.1:{port}"
        # it serves only once every server has answered its /health
        wait_healthy(f"{self.url}/health", self.name, self.pid, self.log_path, timeout_s)
        return self

    def client(self, model: str) -> RouterClient:
        """A client that sends each step through this router, as the replay loop and the agent harness call it."""
        return RouterClient(self.url, model, self.policy.session_header)

    def stop(self) -> None:
        if self.pid is not None:
            stop(self.pid)
            self.pid = None

    def __enter__(self) -> VllmRouter:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
