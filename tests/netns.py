"""Hosts as network namespaces, for tests that need more than one machine on one machine.

`Hosts` makes a hub namespace holding a bridge and one namespace per host, each joined to the bridge by a veth
pair with one address on a private /24. Nothing is added to the namespace the tests run in: its processes
reach a host only through `Hosts.call` (a thread moved into the host's namespace) or processes started there
(`Hosts.spawn`, through `ip netns exec`). `close` stops every process it started and deletes every namespace,
whatever happened before.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from pronk.stack.processes import spawn, stop_groups

T = TypeVar("T")
CLONE_NEWNET = 0x40000000


def unavailable() -> str | None:
    """Why namespaces cannot be made here, or None when they can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2)"
    probe = f"pk-probe-{uuid.uuid4().hex[:6]}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


class Hosts:
    def __init__(self, names: list[str], subnet: str = "10.231.0"):
        self.tag = uuid.uuid4().hex[:6]
        self.hub = f"pk-{self.tag}-hub"
        self.address = {name: f"{subnet}.{i + 1}" for i, name in enumerate(names)}
        self.pids: list[int] = []
        self.made: list[str] = []
        try:
            self._make(names)
        except BaseException:
            self.close()
            raise

    def ns(self, host: str) -> str:
        return f"pk-{self.tag}-{host}"

    def _make(self, names: list[str]) -> None:
        _ip("netns", "add", self.hub)
        self.made.append(self.hub)
        _ip("-n", self.hub, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.hub, "link", "set", "br0", "up")
        for name in names:
            ns = self.ns(name)
            _ip("netns", "add", ns)
            self.made.append(ns)
            _ip("-n", self.hub, "link", "add", f"to-{name}", "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("-n", self.hub, "link", "set", f"to-{name}", "master", "br0")
            _ip("-n", self.hub, "link", "set", f"to-{name}", "up")
            _ip("-n", ns, "addr", "add", f"{self.address[name]}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")

    def cut(self, host: str) -> None:
        """Take the host's link down (its cable pulled): its processes run on, unreachable."""
        _ip("-n", self.hub, "link", "set", f"to-{host}", "down")

    def spawn(self, host: str, argv: list[str], log: Path, env: dict[str, str], cwd: Path | None = None) -> int:
        pid = spawn(["ip", "netns", "exec", self.ns(host), *argv], log, env=env, cwd=cwd)
        self.pids.append(pid)
        return pid

    def run(self, host: str, argv: list[str], env: dict[str, str], cwd: Path | None = None, timeout_s: float = 300):
        return subprocess.run(
            ["ip", "netns", "exec", self.ns(host), *argv],
            env={**os.environ, **env},
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )

    def call(self, host: str, fn: Callable[[], T]) -> T:
        """`fn()` in a thread inside the host's namespace (its sockets are the host's)."""

        def inside() -> T:
            libc = ctypes.CDLL(None, use_errno=True)
            fd = os.open(f"/run/netns/{self.ns(host)}", os.O_RDONLY)
            try:
                if libc.setns(fd, CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), f"setns into {self.ns(host)}")
            finally:
                os.close(fd)
            return fn()

        with ThreadPoolExecutor(max_workers=1) as pool:  # a fresh thread each time: it never leaves the namespace
            return pool.submit(inside).result()

    def close(self) -> None:
        # All at once: a process on a host whose link was cut can use its whole grace period, and one after
        # another those periods add up to a minute.
        stop_groups(self.pids, timeout_s=5.0)
        for ns in reversed(self.made):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self.pids.clear()
        self.made.clear()
