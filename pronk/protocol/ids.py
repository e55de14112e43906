"""Ids of pronk's objects: a kind prefix and 24 random hex digits, as OpenAI's (`batch_…`, `file_…`)."""

from __future__ import annotations

import secrets

HEX_DIGITS = 24


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(HEX_DIGITS // 2)}"


def id_pattern(prefix: str) -> str:
    """The pattern every id `new_id(prefix)` makes matches: the API checks an id against it before any lookup, so a
    malformed id is a 400 and only a well-formed one that names nothing a 404."""
    return rf"^{prefix}_[0-9a-f]{{{HEX_DIGITS}}}$"
