"""Folders named after what a user or a model wrote: a custom id, a trace id, a model name.

Such a string is never a path. `component` turns it into one folder name that cannot climb (`..`, `/`, NUL
and over-long names all become plain characters), stays readable in a listing, and stays distinct for distinct
inputs (a hash of the whole string ends it, so `a/b` and `a_b` do not share a folder). `under` joins components
to a root and refuses a result outside it, the check that holds even if a caller forgets the encoding.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

READABLE_CHARS = 40
"""How much of the original string the folder name keeps, for a person reading a listing."""

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def component(name: str) -> str:
    """One folder name for `name`: its safe characters (at most READABLE_CHARS), a dash and 16 hex of its hash."""
    readable = _UNSAFE.sub("_", name[:READABLE_CHARS])
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return f"{readable}-{digest}"


class PathEscape(ValueError):
    """A path built for a root would lie outside it."""


def under(root: Path, *components: str) -> Path:
    """`root` joined with `components` (each already made by `component` or a trusted constant), checked to stay
    under `root` once symlinks and `..` are resolved."""
    path = root.joinpath(*components)
    resolved, resolved_root = path.resolve(), root.resolve()
    if resolved == resolved_root or not resolved.is_relative_to(resolved_root):
        raise PathEscape(f"{path} is not inside {root}")
    return path
