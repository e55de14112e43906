"""OS isolation for model-written code: a bubblewrap (`bwrap`) sandbox around the venv's base Python.

Each call gets new user, PID, network, IPC, UTS and cgroup namespaces; uid/gid 65534 inside with no
capabilities, no new privileges and no further user namespaces; a read-only view of `/usr` and the
base interpreter's prefix (its stdlib, never the venv's site-packages nor the project tree, the data
dir, `/root` or `/etc`); a fresh tmpfs `/tmp`; and the trace's scratch folder bound at `/scratch`,
the only writable place. The code arrives as a read-only copy at `/cell.py`, so nothing outside the
sandbox ever opens a path inside the scratch folder. Resource limits are set inside the sandbox by
`prlimit`, after the user namespace exists, so RLIMIT_NPROC counts this sandbox's processes only.

Where bubblewrap is missing or cannot create namespaces, `sandbox_unavailable` says why and the
`python` tool refuses: code never runs unisolated.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from pronk.jobs import PythonToolLimits

logger = logging.getLogger(__name__)

SANDBOX_UID = 65534
SCRATCH = "/scratch"
CELL = "/cell.py"
PROBE_TIMEOUT_S = 30.0
BWRAP_ENV = {"PATH": "/usr/bin:/bin"}  # bwrap's own environment: its PID 1 inside shows it in /proc/1/environ


def _interpreter() -> tuple[str, str]:
    """The venv's base interpreter (same version as pronk, none of the venv's packages) and its prefix."""
    executable = os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)
    return executable, os.path.realpath(sys.base_prefix)


@dataclass(slots=True, frozen=True)
class Sandbox:
    """The `bwrap` command line that runs one code file under `limits` with `scratch` as its only writable folder."""

    bwrap: str
    limits: PythonToolLimits

    def command(self, scratch: Path, cell_fd: int) -> list[str]:
        python, prefix = _interpreter()
        limits = self.limits
        memory = limits.memory_mb << 20
        file_size = limits.output_bytes * 4
        view = ["--ro-bind", "/usr", "/usr"]
        for link in ("bin", "lib", "lib64", "sbin"):
            target = os.path.realpath(f"/{link}")
            if target.startswith("/usr/"):
                view += ["--symlink", target.lstrip("/"), f"/{link}"]
            elif os.path.isdir(target):
                view += ["--ro-bind", target, f"/{link}"]
        if not (prefix + "/").startswith("/usr/"):
            view += ["--ro-bind", prefix, prefix]
        return [
            shutil.which(self.bwrap) or self.bwrap,
            "--unshare-user",
            "--unshare-pid",
            "--unshare-net",
            "--unshare-ipc",
            "--unshare-uts",
            "--unshare-cgroup-try",
            "--disable-userns",
            "--uid",
            str(SANDBOX_UID),
            "--gid",
            str(SANDBOX_UID),
            "--cap-drop",
            "ALL",
            "--die-with-parent",
            "--new-session",
            "--clearenv",
            "--setenv",
            "PATH",
            "/usr/bin:/bin",
            "--setenv",
            "HOME",
            SCRATCH,
            "--hostname",
            "sandbox",
            *view,
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "--tmpfs",
            "/tmp",
            "--bind",
            str(scratch),
            SCRATCH,
            "--ro-bind-data",
            str(cell_fd),
            CELL,
            "--chdir",
            SCRATCH,
            "prlimit",
            f"--cpu={limits.cpu_s}",
            f"--as={memory}",
            f"--fsize={file_size}",
            f"--nproc={limits.processes}",
            f"--nofile={limits.open_files}",
            "--core=0",
            "--",
            python,
            "-I",
            CELL,
        ]


def code_fd(code: str) -> int:
    """An anonymous file holding `code`, for `--ro-bind-data` (the caller closes it once bwrap has started)."""
    fd = os.memfd_create("cell", 0)
    os.write(fd, code.encode("utf-8", "surrogatepass"))
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


@lru_cache
def sandbox_unavailable(bwrap: str) -> str | None:
    """Why code cannot run isolated here (None when it can); probed once per bwrap path by running the real sandbox."""
    scratch = Path(tempfile.mkdtemp(prefix="pronk-sandbox-probe-"))
    fd = code_fd("import os\nassert os.getuid() == 65534\nopen('probe', 'w').write('ok')\n")
    try:
        command = Sandbox(bwrap, PythonToolLimits()).command(scratch, fd)
        result = subprocess.run(
            command,
            pass_fds=(fd,),
            capture_output=True,
            timeout=PROBE_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
            env=BWRAP_ENV,
        )
        if result.returncode != 0 or (scratch / "probe").read_text() != "ok":
            why = result.stderr.decode("utf-8", "replace").strip()[-300:]
            return f"bubblewrap sandbox failed (exit status {result.returncode}): {why}"
        return None
    except (OSError, subprocess.SubprocessError) as exc:
        return f"bubblewrap sandbox cannot start: {exc}"
    finally:
        os.close(fd)
        shutil.rmtree(scratch, ignore_errors=True)


def sandbox_available(bwrap: str) -> bool:
    """True when the `python` tool can run code under bubblewrap here (cached)."""
    why = sandbox_unavailable(bwrap)
    if why:
        logger.warning("python tool disabled: %s", why)
    return why is None
