"""Run a code file confined to its folder: `python -I sandbox.py CELL.py` (started by the `python` tool).

An audit hook, installed before the cell runs, refuses file access outside the cell's folder (reads
of the interpreter's own library stay allowed, so imports work), network sockets, new processes
and native-library loading. Resource limits (CPU, memory, file size) are set by the parent.
Stdlib only: this file runs in a bare `python -I`.
"""

import os
import sys

SCRATCH = os.path.realpath(os.path.dirname(os.path.abspath(sys.argv[1])))
READABLE = tuple(
    os.path.realpath(p) for p in {sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.__file__)}
) + ("/dev/null", "/dev/urandom", "/proc/self")
DENIED_EVENTS = (
    "socket.",
    "subprocess.",
    "os.system",
    "os.exec",
    "os.fork",
    "os.posix_spawn",
    "os.spawn",
    "os.kill",
    "os.killpg",
    "ctypes.",
    "os.chdir",
    "os.chroot",
    "pty.",
    "sys.setprofile",
    "sys.settrace",
)
PATH_EVENTS = {
    "os.remove",
    "os.rename",
    "os.mkdir",
    "os.rmdir",
    "os.chmod",
    "os.chown",
    "os.symlink",
    "os.link",
    "os.truncate",
    "os.utime",
    "shutil.rmtree",
    "shutil.copyfile",
    "shutil.move",
}
LIST_EVENTS = {"os.listdir", "os.scandir"}


def _inside(path, roots):
    real = os.path.realpath(os.fsdecode(path)) if isinstance(path, (str, bytes, os.PathLike)) else ""
    return any(real == r or real.startswith(r.rstrip("/") + "/") for r in roots)


def _hook(event, args):
    if event.startswith(DENIED_EVENTS):
        raise PermissionError(f"sandbox: {event} is not allowed")
    if event == "open":
        path, mode = args[0], args[1] or "r"
        if isinstance(path, int):
            return
        writing = any(c in str(mode) for c in "wax+")
        if not _inside(path, (SCRATCH,)) and (writing or not _inside(path, READABLE)):
            raise PermissionError(f"sandbox: no access to {os.fsdecode(path)!r} outside the scratch folder")
    elif event in LIST_EVENTS:
        if args and not _inside(args[0], (SCRATCH,) + READABLE):
            raise PermissionError(f"sandbox: cannot list {os.fsdecode(args[0])!r} outside the scratch folder")
    elif event in PATH_EVENTS:
        for path in args[:2]:
            if isinstance(path, (str, bytes, os.PathLike)) and not _inside(path, (SCRATCH,)):
                raise PermissionError(f"sandbox: {event} on {os.fsdecode(path)!r} outside the scratch folder")


def main():
    cell = sys.argv[1]
    with open(cell) as f:
        code = compile(f.read(), "cell", "exec")
    os.chdir(SCRATCH)
    sys.path[:] = [p for p in sys.path if _inside(p, READABLE)]
    sys.addaudithook(_hook)
    exec(code, {"__name__": "__main__", "__builtins__": __builtins__})


main()
