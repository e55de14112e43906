"""The `python` tool's bubblewrap sandbox against the escapes a hostile tester found, and its limits."""

from __future__ import annotations

import asyncio
import os
import socket
import sysconfig
import time
import uuid
from pathlib import Path

import pytest

from pronk import paths
from pronk.agents.tools import call_cgroup, run_tool
from pronk.agents.tools.base import ToolContext, ToolOutcome
from pronk.agents.tools.python_exec import PythonTool
from pronk.agents.tools.sandbox import sandbox_unavailable
from pronk.jobs.schema import PythonToolLimits
from pronk.settings import PROJECT_ROOT, get_settings

needs_sandbox = pytest.mark.skipif(
    sandbox_unavailable(get_settings().sandbox_bwrap) is not None, reason="bubblewrap cannot create namespaces here"
)
LIMITS = PythonToolLimits(cpu_s=2, wall_s=20, memory_mb=256, output_bytes=4096)


def run(code: str, scratch: Path, limits: PythonToolLimits = LIMITS, bwrap: str | None = None) -> ToolOutcome:
    tool = PythonTool(limits, bwrap or get_settings().sandbox_bwrap)
    return asyncio.run(run_tool(tool, {"code": code}, ToolContext("t", scratch), 60.0, 20_000))


@pytest.fixture
def secret(tmp_path):
    """A file outside the scratch folder the sandboxed code must never read."""
    path = tmp_path / "outside" / "secret.txt"
    path.parent.mkdir()
    path.write_text("the-planted-secret")
    return path


@pytest.fixture
def scratch(tmp_path):
    path = tmp_path / "scratch"
    path.mkdir()
    return path


def surviving(marker: str) -> list[str]:
    """Command lines of processes on this machine that carry `marker`."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
            except OSError:
                continue
            if marker in cmdline:
                found.append(cmdline)
    return found


@needs_sandbox
def test_normal_code_prints_imports_the_stdlib_and_keeps_files_in_scratch(scratch):
    code = (
        "import json, math, collections, re, sqlite3\n"
        "open('notes.txt', 'w').write(json.dumps(collections.Counter('abca')))\n"
        "print(open('notes.txt').read(), round(math.pi, 2))"
    )
    outcome = run(code, scratch)
    assert outcome.ok, outcome.text
    assert outcome.text.strip() == '{"a": 2, "b": 1, "c": 1} 3.14'
    assert (scratch / "notes.txt").read_text() == '{"a": 2, "b": 1, "c": 1}'
    assert (scratch / "notes.txt").stat().st_mode & 0o022 == 0, "the trace's folder is pronk's, not the sandbox's"
    again = run("print(open('notes.txt').read())", scratch)
    assert again.ok and "a" in again.text


@needs_sandbox
@pytest.mark.parametrize(
    "rebind",
    [
        "import sys\nsys.modules['__main__'].__dict__.clear()",
        "import sys\nsys.addaudithook = None\n__builtins__ = {}",
        # the old in-process hook's trick: rebind the globals every function (a `_hook` among them) reads
        "import gc\nfor f in [o for o in gc.get_objects() if type(o).__name__ == 'function']:\n"
        "    f.__globals__.pop('_hook', None)\n    f.__globals__.pop('open', None)",
    ],
    ids=["main-module", "builtins", "hook-globals"],
)
def test_rebinding_globals_reads_nothing_outside(scratch, secret, rebind):
    code = (
        f"{rebind}\nimport builtins\n"
        f"for path in ({str(secret)!r}, '/etc/shadow', '/etc/passwd', {str(PROJECT_ROOT / 'pyproject.toml')!r}):\n"
        "    try:\n        print(builtins.open(path).read())\n    except OSError as exc:\n        print('refused', exc)"
    )
    outcome = run(code, scratch)
    assert outcome.ok, outcome.text
    assert (
        outcome.text.count("refused") == 4 and "the-planted-secret" not in outcome.text and "root:" not in outcome.text
    )


@needs_sandbox
@pytest.mark.parametrize(
    "spawn",
    [
        "import subprocess\nprint(subprocess.run(['cat', SECRET], capture_output=True, text=True))\n"
        "subprocess.run(['touch', ESCAPE])",
        "import os\nos.system('cat ' + SECRET + '; touch ' + ESCAPE)",
        "import _posixsubprocess, subprocess\nprint(_posixsubprocess.fork_exec)\n"
        "subprocess.Popen(['/bin/sh', '-c', 'cat $0; touch $1', SECRET, ESCAPE]).wait()",
    ],
    ids=["subprocess", "os-system", "fork-exec"],
)
def test_new_processes_run_inside_the_sandbox_too(scratch, secret, tmp_path, spawn):
    escape = tmp_path / "escaped-by-subprocess"
    code = f"SECRET = {str(secret)!r}\nESCAPE = {str(escape)!r}\n{spawn}"
    outcome = run(code, scratch)
    assert "the-planted-secret" not in outcome.text
    assert not escape.exists()


@needs_sandbox
def test_os_open_with_o_creat_cannot_write_outside_scratch(scratch, tmp_path):
    site_packages = Path(sysconfig.get_paths()["purelib"])
    targets = [
        site_packages / f"pronk_sandbox_escape_{uuid.uuid4().hex[:6]}.pth",
        tmp_path / "escaped.txt",
        PROJECT_ROOT / f"escaped_{uuid.uuid4().hex[:6]}.txt",
        Path("/usr/lib/escaped.txt"),
    ]
    code = (
        "import os, sys\n"
        f"paths = {[str(t) for t in targets] + [os.path.realpath(os.__file__) + '.escaped']!r}\n"
        "paths.append(os.path.join(os.path.dirname(os.__file__), 'escaped.py'))\n"
        "for path in paths:\n"
        "    try:\n"
        "        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)\n"
        "        os.write(fd, b'import os; os.system(\"id\")')\n"
        "        print('WROTE', path)\n"
        "    except OSError as exc:\n"
        "        print('refused', exc.strerror)"
    )
    outcome = run(code, scratch)
    assert outcome.ok, outcome.text
    assert "WROTE" not in outcome.text and outcome.text.count("refused") == 6
    assert not any(t.exists() for t in targets)


@needs_sandbox
def test_links_to_outside_neither_enter_nor_leave_the_scratch(scratch, secret):
    """A link planted in the trace's folder never reaches the sandbox, and one the code makes is not kept."""
    (scratch / "planted").symlink_to(secret)
    code = (
        "import os\n"
        f"os.symlink({str(PROJECT_ROOT / 'pyproject.toml')!r}, 'made')\n"
        "os.symlink('/etc/passwd', 'absolute')\n"
        "open('kept.txt', 'w').write('kept')\n"
        "folder = os.open('.', os.O_RDONLY | os.O_DIRECTORY)\n"
        "for name in ('planted', 'made'):\n"
        "    try:\n"
        "        print(os.read(os.open(name, os.O_RDONLY, dir_fd=folder), 200))\n"
        "    except OSError as exc:\n"
        "        print('refused', exc.strerror)"
    )
    outcome = run(code, scratch)
    assert outcome.ok, outcome.text
    assert outcome.text.count("refused") == 2 and "the-planted-secret" not in outcome.text
    assert "left out 'absolute'" in outcome.text and "'made'" in outcome.text
    assert secret.read_text() == "the-planted-secret"
    assert (scratch / "kept.txt").read_text() == "kept"
    assert not any(path.is_symlink() for path in scratch.iterdir())


@needs_sandbox
def test_no_network_not_even_loopback(scratch):
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        listener.settimeout(0.5)
        port = listener.getsockname()[1]
        outcome = run(
            f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2).sendall(b'hi')", scratch
        )
        assert not outcome.ok
        assert "Connection refused" in outcome.text or "unreachable" in outcome.text
        with pytest.raises(TimeoutError):
            listener.accept()


@needs_sandbox
def test_no_process_survives_the_wall_time_kill(scratch):
    marker = f"pronk-sandbox-marker-{uuid.uuid4().hex[:8]}"
    code = (
        "import os, subprocess, sys, time\n"
        f"argv = [sys.executable, '-c', 'import time; time.sleep(120)', {marker!r}]\n"
        "for _ in range(5):\n"
        "    subprocess.Popen(argv, start_new_session=True)\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        os.execv(sys.executable, argv)\n"
        "    os._exit(0)\n"
        "n = 0\n"
        "while n < 40:\n"
        "    if os.fork() == 0:\n"
        "        os.execv(sys.executable, argv)\n"
        "    n += 1\n"
        "print('spawned', n, flush=True)\n"
        "time.sleep(120)"
    )
    limits = LIMITS.model_copy(update={"wall_s": 3.0, "processes": 64, "memory_mb": 2048})
    started = time.monotonic()
    outcome = run(code, scratch, limits)
    assert not outcome.ok and "wall time limit of 3s exceeded" in outcome.text, outcome.text
    assert time.monotonic() - started < 20
    deadline = time.monotonic() + 5
    while surviving(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert surviving(marker) == []


@needs_sandbox
def test_no_nested_user_namespace_and_no_capabilities(scratch):
    code = (
        "import subprocess\n"
        "print(subprocess.run(['unshare', '--user', '--map-root-user', 'id'], capture_output=True).returncode)\n"
        "print([l for l in open('/proc/self/status') if l.startswith(('CapEff', 'CapBnd', 'NoNewPrivs'))])"
    )
    outcome = run(code, scratch)
    assert outcome.ok, outcome.text
    refused, status = outcome.text.splitlines()
    assert refused != "0"
    assert status.count("0000000000000000") == 2 and "NoNewPrivs:\\t1" in status


@needs_sandbox
def test_the_environment_is_cleared(scratch, monkeypatch):
    monkeypatch.setenv("PRONK_TEST_API_KEY", "sk-do-not-leak")
    code = (
        "import os\nprint(dict(os.environ))\n"
        "for pid in os.listdir('/proc'):\n"
        "    if pid.isdigit():\n"
        "        try:\n            print(open(f'/proc/{pid}/environ').read())\n"
        "        except OSError as exc:\n            print('refused', exc.strerror)"
    )
    outcome = run(code, scratch)
    assert outcome.ok, outcome.text
    assert "sk-do-not-leak" not in outcome.text and "PRONK" not in outcome.text


@needs_sandbox
def test_the_project_and_the_data_dir_are_not_visible(scratch):
    paths = [str(PROJECT_ROOT), str(get_settings().data_dir), "/root/.ssh", "/etc", "/work", str(scratch)]
    outcome = run(f"import os\nprint([os.path.exists(p) for p in {paths!r}], os.getuid(), os.getgid())", scratch)
    assert outcome.ok and outcome.text.strip() == "[False, False, False, False, False, False] 65534 65534"


@needs_sandbox
@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ("while True:\n    pass", "killed: CPU time limit of 1s exceeded"),
        ("x = bytearray(1 << 30)", "MemoryError"),
        ("import time\ntime.sleep(60)", "killed: wall time limit of 2s exceeded"),
        ("while True:\n    print('x' * 1000)", "killed: output limit of 4096 bytes exceeded"),
        ("import os\nfds = [os.open('/dev/null', os.O_RDONLY) for _ in range(100)]", "Too many open files"),
    ],
    ids=["cpu", "memory", "wall", "output", "open-files"],
)
def test_limits_fire(scratch, code, expected):
    wall_s = 2 if "sleep" in code else 20  # the CPU limit must fire first even on a loaded machine
    limits = PythonToolLimits(cpu_s=1, wall_s=wall_s, memory_mb=256, output_bytes=1024, open_files=32)
    outcome = run(code, scratch, limits)
    assert not outcome.ok and expected in outcome.text, outcome.text
    assert outcome.text.startswith("python: ")


def test_the_tool_refuses_without_bubblewrap(scratch):
    outcome = run("open('ran', 'w').write('1')", scratch, bwrap=str(scratch / "no-such-bwrap"))
    assert not outcome.ok and outcome.text.startswith("python: refused: no OS sandbox")
    assert sandbox_unavailable(str(scratch / "no-such-bwrap")) is not None
    assert not (scratch / "ran").exists()


@needs_sandbox
def test_the_process_limit_binds_each_sandbox_on_its_own(tmp_path):
    code = (
        "import os, time\nn = 0\ntry:\n    while n < 300:\n        if os.fork() == 0:\n"
        "            time.sleep(2)\n            os._exit(0)\n        n += 1\n"
        "except OSError as exc:\n    print('refused after', n, exc.strerror)"
    )
    tool = PythonTool(LIMITS.model_copy(update={"processes": 12}), get_settings().sandbox_bwrap)

    async def three_at_once():
        contexts = [ToolContext("t", tmp_path / f"scratch{i}") for i in range(3)]
        return await asyncio.gather(*(run_tool(tool, {"code": code}, c, 60.0, 2000) for c in contexts))

    outcomes = asyncio.run(three_at_once())
    assert all(o.ok for o in outcomes), outcomes
    counts = {int(o.text.split()[2]) for o in outcomes}
    assert len(counts) == 1 and 5 <= counts.pop() < 12, outcomes


@needs_sandbox
@pytest.mark.skipif(call_cgroup.layout() is None, reason="no cgroup for a call can be made here")
def test_the_memory_limit_holds_for_the_whole_call_not_each_process(scratch):
    """Six children of 200 MB each fit a 512 MiB RLIMIT_AS one by one; the call's cgroup holds them to 512 MiB, and
    the call fails saying so even though the parent, which only counts its children, exits 0."""
    code = (
        "import os, time\n"
        "children = []\n"
        "for _ in range(6):\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        block = b'x' * (200 << 20)\n"
        "        time.sleep(3)\n"
        "        os._exit(0)\n"
        "    children.append(pid)\n"
        "held = sum(os.waitpid(pid, 0)[1] == 0 for pid in children)\n"
        "print(f'held {held} of 6')"
    )
    limits = LIMITS.model_copy(update={"memory_mb": 512, "processes": 16})
    outcome = run(code, scratch, limits)
    held = [line for line in outcome.text.splitlines() if line.startswith("held ")]
    assert held != ["held 6 of 6"], outcome.text
    assert not outcome.ok and "memory limit of 512 MiB for the whole call exceeded" in outcome.text, outcome.text
    assert "the kernel killed a process of the call" in outcome.text


@needs_sandbox
def test_tmp_is_writable_for_the_call_alone_and_files_are_capped_at_four_times_the_output(scratch):
    code = (
        "import os, tempfile\n"
        "with tempfile.NamedTemporaryFile('w', delete=False) as f:\n"
        "    f.write('kept for this call')\n"
        "print(open(f.name).read(), os.path.dirname(f.name))\n"
        "try:\n"
        "    with open('big', 'wb') as big:\n"
        "        big.write(b'x' * (4 * 4096 + 1))\n"
        "except OSError as exc:\n"
        "    print('refused:', exc.strerror)"
    )
    outcome = run(code, scratch)
    assert outcome.ok, outcome.text
    assert "kept for this call /tmp" in outcome.text and "refused: File too large" in outcome.text
    again = run("import os; print(sorted(os.listdir('/tmp')))", scratch)
    assert again.ok and again.text.strip() == "[]", again.text


@needs_sandbox
def test_a_file_cut_at_the_size_cap_is_named_even_when_the_code_never_hears_of_it(scratch):
    """A write that crosses RLIMIT_FSIZE is cut short without an error, and Python drops the error of the flush of a
    file it never closed: the call names each file left at the cap, and the cap, whether the code heard of it or not.
    A file the trace brought in at the cap is not named again."""
    cap = 4 * LIMITS.output_bytes
    cut = run(
        "open('cut.txt', 'w').write('x' * 20000)\nopen('/tmp/cut.txt', 'w').write('x' * 20000)\n"
        "len(open('cut.txt').read())",
        scratch,
    )
    assert cut.ok, cut.text
    assert cut.text.startswith(f"{cap}\n"), cut.text
    assert f"/scratch/cut.txt, /tmp/cut.txt reached {cap} bytes, the most one file may hold" in cut.text
    assert (scratch / "cut.txt").stat().st_size == cap

    refused = run("with open('/tmp/big', 'wb') as big:\n    big.write(b'x' * 20000)", scratch)
    assert not refused.ok and "OSError: [Errno 27] File too large" in refused.text, refused.text
    assert f"[file size cap: /tmp/big reached {cap} bytes" in refused.text
    assert "cut.txt" not in refused.text


@needs_sandbox
def test_the_scratch_fills_up_at_its_size_and_keeps_what_fit(scratch):
    code = (
        "n = 0\n"
        "try:\n"
        "    while True:\n"
        "        with open(f'f{n}', 'wb') as f:\n"
        "            f.write(b'x' * 16384)\n"
        "        n += 1\n"
        "except OSError as exc:\n"
        "    print('full:', exc.strerror)"
    )
    outcome = run(code, scratch, LIMITS.model_copy(update={"scratch_mb": 2}))
    assert outcome.ok and "full: No space left on device" in outcome.text, outcome.text
    kept = list(scratch.iterdir())
    assert kept and sum(path.stat().st_size for path in kept) <= 2 << 20


@needs_sandbox
def test_a_custom_id_of_dotdot_keeps_to_its_own_folder_and_changes_no_owner(tmp_path):
    """The probe's escape: `..` as a custom id made the data dir the scratch, mounted writable and chowned."""
    data = tmp_path / "data"
    (data / "store").mkdir(parents=True)
    (data / "worker-token").write_text("token")
    before = {path: (path.stat().st_uid, path.stat().st_mode) for path in [data, *data.iterdir()]}
    root = data / "scratch" / "batch_x"
    scratch = paths.under(root, paths.component(".."), paths.component(".."))
    code = "import os\nopen('note', 'w').write('x')\nprint(sorted(os.listdir('.')), sorted(os.listdir('..')))"
    outcome = run(code, scratch)
    assert outcome.ok and "worker-token" not in outcome.text, outcome.text
    assert scratch.resolve().is_relative_to(root.resolve()) and (scratch / "note").read_text() == "x"
    assert {path: (path.stat().st_uid, path.stat().st_mode) for path in before} == before
    assert sorted(p.name for p in data.iterdir()) == ["scratch", "store", "worker-token"]
