"""OS isolation for model-written code: a bubblewrap (`bwrap`) sandbox around the venv's base Python.

Each call gets new user, PID, network, IPC, UTS and cgroup namespaces; uid/gid 65534 inside with no
capabilities and no new privileges; a read-only view of `/usr` and the base interpreter's prefix (its
stdlib, never the venv's site-packages nor the project tree, the data dir, `/root` or `/etc`); a fresh
writable tmpfs `/tmp`, gone when the call ends; and a size-limited tmpfs at `/scratch`, which the launcher fills
from the trace's files and hands back as a tar when the code ends (`scratch.py`): no host folder is ever mounted
writable or handed to the sandbox's uid. Both tmpfs hold `scratch_mb` at most, and count against the call's
memory cgroup; every file the code writes, stdout included, is capped at `4 × output_bytes` (RLIMIT_FSIZE), and
the call names each file the code left at that cap (`LAUNCHER`).
The code arrives as a read-only copy at `/cell.py`. Resource limits
are set inside by `prlimit`, after the user namespace exists, so RLIMIT_NPROC counts this sandbox's processes
only; memory and processes are bounded for the whole call by its cgroup (`call_cgroup.py`).

Run as root, plain `bwrap --unshare-user` would map the sandbox's uid to host uid 0, which the kernel
exempts from RLIMIT_NPROC and which owns most files. So as root the sandbox enters a user namespace
made here that maps uid 65534 to the unprivileged host uid 65534 (and 0 to 0, so bwrap can still set
up its mounts); bwrap keeps only CAP_SETUID/SETGID/SETPCAP, and `setpriv` drops to 65534 and clears
every capability before the code runs. Run as any other user, bwrap maps 65534 to that user. Either
way a seccomp filter (`seccomp.py`) refuses new user namespaces inside.

Where bubblewrap is missing or cannot create namespaces, `sandbox_unavailable` says why and the
`python` tool refuses: code never runs unisolated.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from pronk.agents.tools import scratch as scratch_files
from pronk.agents.tools.seccomp import no_user_namespaces_fd
from pronk.jobs.schema import PythonToolLimits

SANDBOX_UID = 65534
SCRATCH = "/scratch"
CELL = "/cell.py"
SEED = "/seed.tar"
CELL_RUNNER = f"""
def run_cell():
    import ast, sys
    del globals()["run_cell"]
    with open({CELL!r}) as cell:
        tree = ast.parse(cell.read(), {CELL!r})
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    scope = sys.modules["__main__"].__dict__
    scope["__file__"] = {CELL!r}
    exec(compile(tree, {CELL!r}, "exec"), scope)
    if last is not None:
        value = eval(compile(ast.Expression(last.value), {CELL!r}, "eval"), scope)
        if value is not None:
            print(repr(value))
run_cell()
"""
"""Runs the cell as a notebook does: a last line that is an expression shows its value (`12 * 34` answers 408);
models write calculator-style cells far more often than ones that print. The cell runs in `__main__`, as a script
would; the runner keeps its own state in a function's locals, so a cell that clears its globals cannot break it."""
LAUNCHER = f"""
import os, resource, signal, stat, subprocess, sys, tarfile
with tarfile.open({SEED!r}) as seed:
    seed.extractall({SCRATCH!r}, filter="data")
def first_to_go():
    with open("/proc/self/oom_score_adj", "w") as adj:
        adj.write("1000")
def at_the_size_cap():
    found = {{}}
    for top in ({SCRATCH!r}, "/tmp"):
        for folder, _, names in os.walk(top):
            for name in names:
                path = os.path.join(folder, name)
                try:
                    info = os.lstat(path)
                except OSError:
                    continue
                if stat.S_ISREG(info.st_mode) and info.st_size >= cap:
                    found[path] = (info.st_ino, info.st_mtime_ns)
    return found
cap = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
seeded = at_the_size_cap()
status = subprocess.run([sys.executable, "-I", "-c", {CELL_RUNNER!r}], preexec_fn=first_to_go).returncode
try:
    capped = sorted(path for path, seen in at_the_size_cap().items() if seeded.get(path) != seen)
    if capped:
        names = ", ".join(capped[:5]) + (" and more" if len(capped) > 5 else "")
        note = f"{{names}} reached {{cap}} bytes, the most one file may hold: what was written past it is lost"
        os.write(2, f"\\n[file size cap: {{note}}]\\n".encode())
except Exception:
    pass
try:
    with os.fdopen(int(sys.argv[1]), "wb") as pipe, tarfile.open(fileobj=pipe, mode="w|") as dump:
        for name in sorted(os.listdir({SCRATCH!r})):
            dump.add(os.path.join({SCRATCH!r}, name), arcname=name)
except Exception:
    pass
if status < 0:
    if -status != signal.SIGKILL:
        signal.signal(-status, signal.SIG_DFL)
    os.kill(os.getpid(), -status)
sys.exit(status)
"""
"""Runs inside the sandbox: unpack the trace's files into the tmpfs scratch, run the code (without the dump
pipe, and first in line for the out-of-memory killer), name the files it left at the size cap (RLIMIT_FSIZE: a
write that crosses it is cut short without an error, and Python drops the error of a flush when a file it never
closed is collected, so the code may never hear of it; a file the trace brought in at the cap is not named again),
then write the scratch to the pipe as a tar and end as the
code ended. The note goes to stderr unbuffered: a failed flush of a buffered stream at exit would change the status."""
PROBE_TIMEOUT_S = 30.0
PROBE_DUMP_BYTES = 1 << 20
BWRAP_ENV = {"PATH": "/usr/bin:/bin"}  # bwrap's own environment: its PID 1 inside shows it in /proc/1/environ


def _interpreter() -> tuple[str, str]:
    """The venv's base interpreter (same version as pronk, none of the venv's packages) and its prefix."""
    executable = os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)
    return executable, os.path.realpath(sys.base_prefix)


def _host_user_namespace() -> int:
    """A user namespace (as an fd) mapping 0 to 0 and SANDBOX_UID to the unprivileged host uid SANDBOX_UID."""
    helper = subprocess.Popen(
        ["unshare", "--user", "--", "sleep", "60"], env=BWRAP_ENV, stdin=subprocess.DEVNULL, start_new_session=True
    )
    try:
        ours = os.readlink("/proc/self/ns/user")
        deadline = time.monotonic() + PROBE_TIMEOUT_S
        while os.readlink(f"/proc/{helper.pid}/ns/user") == ours:
            if helper.poll() is not None or time.monotonic() > deadline:
                raise OSError(f"unshare --user did not make a user namespace (exit status {helper.poll()})")
            time.sleep(0.001)
        mapping = f"0 0 1\n{SANDBOX_UID} {SANDBOX_UID} 1\n".encode()
        for name in ("uid_map", "gid_map"):
            fd = os.open(f"/proc/{helper.pid}/{name}", os.O_WRONLY)
            try:
                os.write(fd, mapping)
            finally:
                os.close(fd)
        return os.open(f"/proc/{helper.pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        helper.kill()
        helper.wait()


@dataclass(slots=True)
class Launch:
    """One prepared sandbox run: its command line, the fds it needs (`close` them once bwrap has started) and
    the read end of the pipe its scratch comes back through (`scratch.read_dump` consumes it)."""

    command: list[str]
    fds: tuple[int, ...]
    dump: int

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)


@dataclass(slots=True, frozen=True)
class Sandbox:
    """Runs one code file under `limits` with a scratch folder as its only writable place."""

    bwrap: str
    limits: PythonToolLimits

    def prepare(self, scratch: Path, code: str) -> Launch:
        """The code, the trace's scratch as a tar, the dump pipe, the filter, as root the user namespace."""
        dump, dump_end = os.pipe2(os.O_CLOEXEC)
        fds = [dump_end, code_fd(code)]
        try:
            fds.append(scratch_files.seed(scratch))
            seccomp = no_user_namespaces_fd()
            if seccomp is not None:
                fds.append(seccomp)
            userns = _host_user_namespace() if os.geteuid() == 0 else None
            if userns is not None:
                fds.append(userns)
        except BaseException:
            for fd in (dump, *fds):
                os.close(fd)
            raise
        return Launch(self._command(fds[1], fds[2], dump_end, seccomp, userns), tuple(fds), dump)

    def _command(
        self, cell_fd: int, seed_fd: int, dump_fd: int, seccomp_fd: int | None, userns_fd: int | None
    ) -> list[str]:
        python, prefix = _interpreter()
        limits = self.limits
        view = ["--ro-bind", "/usr", "/usr"]
        for link in ("bin", "lib", "lib64", "sbin"):
            target = os.path.realpath(f"/{link}")
            if target.startswith("/usr/"):
                view += ["--symlink", target.lstrip("/"), f"/{link}"]
            elif os.path.isdir(target):
                view += ["--ro-bind", target, f"/{link}"]
        if not (prefix + "/").startswith("/usr/"):
            for parent in reversed(Path(prefix).parents[:-1]):  # traversable, whatever the host's modes
                view += ["--perms", "0755", "--dir", str(parent)]
            view += ["--ro-bind", prefix, prefix]
        if userns_fd is None:
            user = ["--unshare-user", "--disable-userns", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID)]
            user += ["--cap-drop", "ALL"]
            drop: list[str] = []
        else:
            user = ["--userns", str(userns_fd), "--cap-drop", "ALL"]
            user += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--cap-add", "CAP_SETPCAP"]
            drop = [
                "setpriv",
                f"--reuid={SANDBOX_UID}",
                f"--regid={SANDBOX_UID}",
                "--clear-groups",
                "--inh-caps=-all",
                "--bounding-set=-all",
                "--",
            ]
        return [
            shutil.which(self.bwrap) or self.bwrap,
            *user,
            "--unshare-pid",
            "--unshare-net",
            "--unshare-ipc",
            "--unshare-uts",
            "--unshare-cgroup-try",
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
            # --size and --perms apply to the next --tmpfs: each of the two gets its own.
            "--size",
            str(limits.scratch_mb << 20),
            "--perms",
            "1777",
            "--tmpfs",
            "/tmp",
            "--size",
            str(limits.scratch_mb << 20),
            "--perms",
            "1777",
            "--tmpfs",
            SCRATCH,
            "--perms",
            "0444",
            "--ro-bind-data",
            str(cell_fd),
            CELL,
            "--perms",
            "0444",
            "--ro-bind-data",
            str(seed_fd),
            SEED,
            "--chdir",
            SCRATCH,
            *(["--seccomp", str(seccomp_fd)] if seccomp_fd is not None else []),
            *drop,
            "prlimit",
            f"--cpu={limits.cpu_s}",
            f"--as={limits.memory_mb << 20}",
            f"--fsize={limits.output_bytes * 4}",
            f"--nproc={limits.processes}",
            f"--nofile={limits.open_files}",
            "--core=0",
            "--",
            python,
            "-I",
            "-c",
            LAUNCHER,
            str(dump_fd),
        ]


def code_fd(code: str) -> int:
    """An anonymous file holding `code`, for `--ro-bind-data`."""
    fd = os.memfd_create("cell", os.MFD_CLOEXEC)
    os.write(fd, code.encode("utf-8", "surrogatepass"))
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


@lru_cache
def sandbox_unavailable(bwrap: str) -> str | None:
    """Why code cannot run isolated here (None when it can); probed once per bwrap path by running the real sandbox."""
    scratch = Path(tempfile.mkdtemp(prefix="pronk-sandbox-probe-")) / "trace"
    try:
        code = f"import os\nassert os.getuid() == {SANDBOX_UID}\nopen('probe', 'w').write('ok')\n"
        launch = Sandbox(bwrap, PythonToolLimits()).prepare(scratch, code)
        try:
            # The probe's dump (one small file) fits the pipe's buffer: it is read once the sandbox has ended.
            result = subprocess.run(
                launch.command,
                pass_fds=launch.fds,
                capture_output=True,
                timeout=PROBE_TIMEOUT_S,
                stdin=subprocess.DEVNULL,
                env=BWRAP_ENV,
            )
        finally:
            launch.close()
            dump = scratch_files.read_dump(launch.dump, PROBE_DUMP_BYTES)
        if (
            result.returncode != 0
            or scratch_files.keep(scratch, dump, PROBE_DUMP_BYTES)
            or not (scratch / "probe").is_file()
        ):
            why = result.stderr.decode("utf-8", "replace").strip()[-300:]
            return f"bubblewrap sandbox failed (exit status {result.returncode}): {why}"
        return None
    except (OSError, subprocess.SubprocessError) as exc:
        return f"bubblewrap sandbox cannot start: {exc}"
    finally:
        shutil.rmtree(scratch.parent, ignore_errors=True)
