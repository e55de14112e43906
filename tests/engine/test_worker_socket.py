"""A worker holds its port from before vLLM loads: nothing can take it during the load, and a taken port (or an
unreadable TLS certificate) fails fast."""

import os
import socket
import subprocess
import sys

import pytest

from pronk.engine.worker import bind_socket


def test_the_bound_port_is_held_until_the_worker_serves_on_it():
    sock = bind_socket("127.0.0.1")
    try:
        port = sock.getsockname()[1]
        with socket.socket() as other, pytest.raises(OSError):
            other.bind(("127.0.0.1", port))
    finally:
        sock.close()


def test_a_worker_told_a_taken_port_exits_before_loading_the_model(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        completed = subprocess.run(
            [sys.executable, "-m", "pronk.stack.worker", "--job", "tiny-cpu", "--port", str(port)],
            env={**os.environ, "PRONK_DATA_DIR": str(tmp_path)},
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert completed.returncode != 0
    assert "Address already in use" in completed.stderr
    assert "vllm" not in completed.stderr.lower()


def test_a_worker_given_an_unreadable_certificate_exits_naming_it_before_loading_the_model(tmp_path):
    missing = tmp_path / "worker.crt"
    completed = subprocess.run(
        [sys.executable, "-m", "pronk.stack.worker", "--job", "tiny-cpu"],
        env={
            **os.environ,
            "PRONK_DATA_DIR": str(tmp_path),
            "PRONK_WORKER_TLS_CERT": str(missing),
            "PRONK_WORKER_TLS_KEY": str(tmp_path / "worker.key"),
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode != 0
    assert completed.stderr.strip().splitlines()[-1] == (
        f"engine worker not started: worker TLS certificate {missing}: No such file or directory"
    )
    assert "vllm" not in completed.stderr.lower()
