"""The root of pronk's own exceptions: `except PronkError` catches every failure pronk raises on purpose."""

from __future__ import annotations


class PronkError(Exception):
    """Something pronk refused or could not do; the message says what and names the offending value."""
