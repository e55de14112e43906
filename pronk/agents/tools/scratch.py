"""A trace's scratch folder, kept between its `python` calls without ever being writable by the sandbox.

The sandbox writes only to a size-limited tmpfs of its own (`/scratch`). Its files come in as a tar that pronk
makes from the trace's folder (`seed`), and go out as a tar the sandbox writes to a pipe after the code has
ended; pronk reads at most a bounded number of bytes of it (`read_dump`) and unpacks it into a fresh folder
that replaces the old one (`keep`). Both directions pass tarfile's `data` filter, so an absolute path, a
`..`, a link that leaves the folder, a device or a setuid bit never reaches the host's disk, and nothing on the
host ever changes owner or mode for the sandbox. An entry that breaks a rule is left out; a dump that is cut
short, too big or has too many entries leaves the folder as the previous call left it. The call says which.
"""

from __future__ import annotations

import io
import os
import shutil
import tarfile
from collections.abc import Callable
from pathlib import Path

from pronk.settings import Settings

MAX_FILES = 4096
"""Most entries a trace's scratch keeps (a tmpfs bounds bytes, not how many empty files fit in them)."""

DUMP_READ_BYTES = 1 << 16


def _within(folder: Path) -> Callable[[tarfile.TarInfo], tarfile.TarInfo | None]:
    """tarfile's `data` rules as an `add` filter: an entry that breaks one is left out."""

    def check(member: tarfile.TarInfo) -> tarfile.TarInfo | None:
        try:
            checked = tarfile.data_filter(member, str(folder))
        except tarfile.FilterError:
            return None
        return checked.replace(uid=0, gid=0, uname="", gname="", deep=False)  # the filter clears them for extraction

    return check


def seed(folder: Path) -> int:
    """An anonymous file holding a tar of `folder` (empty when there is none), for `--ro-bind-data`."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        if folder.is_dir():
            for entry in sorted(os.listdir(folder)):
                tar.add(folder / entry, arcname=entry, filter=_within(folder))
    fd = os.memfd_create("scratch-seed", os.MFD_CLOEXEC)
    os.write(fd, buffer.getvalue())
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def read_dump(fd: int, limit: int) -> bytes | None:
    """Everything written to the dump pipe until it closes; None past `limit` bytes (the rest is drained)."""
    chunks: list[bytes] = []
    size = 0
    with os.fdopen(fd, "rb", buffering=0) as pipe:
        while chunk := pipe.read(DUMP_READ_BYTES):
            size += len(chunk)
            if size <= limit:
                chunks.append(chunk)
    return b"".join(chunks) if size <= limit else None


def keep(folder: Path, dump: bytes | None, limit: int) -> str | None:
    """Make `dump` the trace's scratch folder, leaving out entries that break the `data` rules; None when all was
    kept, else what was not (the whole dump, when it is cut short, too big, or has too many entries)."""
    if dump is None:
        return f"not kept: more than {limit} bytes"
    if not dump:
        return "not kept: the sandbox ended before handing them back"
    staging = folder.with_name(f"{folder.name}.new")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(mode=0o700, parents=True)
    left_out: list[str] = []

    def data_only(member: tarfile.TarInfo, path: str) -> tarfile.TarInfo | None:
        try:
            return tarfile.data_filter(member, path)
        except tarfile.FilterError as exc:
            left_out.append(f"{member.name!r} ({type(exc).__name__})")
            return None

    try:
        with tarfile.open(fileobj=io.BytesIO(dump), mode="r:") as tar:
            members = tar.getmembers()
            if len(members) > MAX_FILES:
                raise ValueError(f"{len(members)} entries, more than {MAX_FILES}")
            tar.extractall(staging, filter=data_only)
    except (tarfile.TarError, OSError, ValueError) as exc:
        shutil.rmtree(staging, ignore_errors=True)
        return f"not kept: {exc or type(exc).__name__}"
    old = folder.with_name(f"{folder.name}.old")
    if folder.exists():
        folder.rename(old)
    staging.rename(folder)
    shutil.rmtree(old, ignore_errors=True)
    return f"left out {', '.join(left_out[:5])}{' and more' if len(left_out) > 5 else ''}" if left_out else None


def scratch_dir(settings: Settings, run_id: str) -> Path:
    """Where a run's tools may write (each trace's scratch folder, and the `python` tool's sandbox folders, live
    under it): a batch's by its batch id, an improve round's or a Leap's canary's by theirs."""
    return settings.data_dir / "scratch" / run_id
