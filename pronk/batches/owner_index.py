"""Per-owner listings of files and batches, newest first, with OpenAI's cursor pagination.

Each object an owner makes gets an empty marker `<root>/<owner>/<stamp>_<id>` whose stamp counts
down with the creation time, so one sorted LIST gives the owner's objects newest first and a page
costs that LIST plus reads of just the page's records, however many objects the store holds.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Literal

from pronk import storage
from pronk.settings import Settings

OWNER_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")  # never `.` or `..`: it names a folder
_LAST_MS = 10**13 - 1


def check_owner(owner: str) -> str:
    if not OWNER_PATTERN.fullmatch(owner):
        raise ValueError(
            f"owner {owner[:80]!r} must be 1-64 letters, digits, '_', '.' or '-', starting with a letter or digit"
        )
    return owner


@dataclass(slots=True)
class Page:
    ids: list[str]
    has_more: bool


class OwnerIndex:
    def __init__(self, root: str, settings: Settings):
        self.settings = settings
        self.root = root

    def _folder(self, owner: str) -> str:
        return storage.join(self.root, check_owner(owner))

    def add(self, owner: str, object_id: str, created_ms: int | None = None) -> None:
        stamp = _LAST_MS - (created_ms if created_ms is not None else time.time_ns() // 1_000_000)
        storage.write_bytes(storage.join(self._folder(owner), f"{stamp:013d}_{object_id}"), b"", self.settings)

    def ids(self, owner: str) -> list[str]:
        """The owner's object ids, newest first."""
        return [name.split("_", 1)[1] for name in storage.list_names(self._folder(owner), self.settings) if "_" in name]

    def remove(self, owner: str, object_id: str) -> None:
        folder = self._folder(owner)
        for name in storage.list_names(folder, self.settings):
            if name.endswith(f"_{object_id}"):
                storage.delete(storage.join(folder, name), self.settings)

    def page(self, owner: str, after: str | None, limit: int, order: Literal["asc", "desc"] = "desc") -> Page:
        """Up to `limit` ids after the cursor id `after` (exclusive); an unknown cursor gives an empty page."""
        ids = self.ids(owner)
        if order == "asc":
            ids.reverse()
        start = 0
        if after is not None:
            if after not in ids:
                return Page(ids=[], has_more=False)
            start = ids.index(after) + 1
        return Page(ids=ids[start : start + limit], has_more=start + limit < len(ids))
