"""A seccomp filter for the `python` tool's sandbox: no new user namespaces, nothing else refused.

Run as root, the sandbox enters a user namespace made outside bubblewrap, which rules out bwrap's
`--disable-userns`; this filter puts the same wall back. `unshare` and `clone` with CLONE_NEWUSER fail
with EPERM; `clone3` (whose flags live in memory a filter cannot read) fails with ENOSYS, so libc falls
back to `clone`; on x86-64 the x32 syscall numbers are refused; another architecture kills the process.
The program is classic BPF, as bubblewrap's `--seccomp FD` reads it.
"""

from __future__ import annotations

import os
import platform
import struct

CLONE_NEWUSER = 0x10000000
AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
SYSCALLS = {
    "x86_64": {"unshare": 272, "clone": 56, "clone3": 435},
    "aarch64": {"unshare": 97, "clone": 220, "clone3": 435},
}
X32_BIT = 0x40000000

LOAD_WORD, JEQ, JGE, JSET, RETURN = 0x20, 0x15, 0x35, 0x45, 0x06
ALLOW, KILL_PROCESS, ERRNO = 0x7FFF0000, 0x80000000, 0x00050000
EPERM, ENOSYS = 1, 38
NR_OFFSET, ARCH_OFFSET, ARG0_OFFSET = 0, 4, 16


def _program(machine: str) -> list[tuple[int, int, int, int]]:
    numbers = SYSCALLS[machine]
    x32 = X32_BIT if machine == "x86_64" else 0xFFFFFFFF  # no syscall number reaches 0xFFFFFFFF elsewhere
    return [
        (LOAD_WORD, 0, 0, ARCH_OFFSET),
        (JEQ, 1, 0, AUDIT_ARCH[machine]),
        (RETURN, 0, 0, KILL_PROCESS),
        (LOAD_WORD, 0, 0, NR_OFFSET),
        (JGE, 6, 0, x32),  # -> refuse
        (JEQ, 6, 0, numbers["clone3"]),  # -> ENOSYS
        (JEQ, 1, 0, numbers["unshare"]),  # -> flags
        (JEQ, 0, 2, numbers["clone"]),  # -> flags, else allow
        (LOAD_WORD, 0, 0, ARG0_OFFSET),  # flags: the low word of the first argument
        (JSET, 1, 0, CLONE_NEWUSER),  # -> refuse
        (RETURN, 0, 0, ALLOW),
        (RETURN, 0, 0, ERRNO | EPERM),
        (RETURN, 0, 0, ERRNO | ENOSYS),
    ]


def no_user_namespaces_fd() -> int | None:
    """An anonymous file holding the filter for this machine (None on an architecture it does not know)."""
    machine = platform.machine()
    if machine not in SYSCALLS:
        return None
    fd = os.memfd_create("seccomp", os.MFD_CLOEXEC)
    os.write(fd, b"".join(struct.pack("=HBBI", *instruction) for instruction in _program(machine)))
    os.lseek(fd, 0, os.SEEK_SET)
    return fd
