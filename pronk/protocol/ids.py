"""Ids of pronk's objects: a kind prefix and 24 random hex digits, as OpenAI's (`batch_…`, `file_…`)."""

from __future__ import annotations

import secrets


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"
