"""The root of the data plane's own exceptions (engine/ imports nothing of pronk, so it has its own root)."""

from __future__ import annotations


class EngineError(Exception):
    """A step, worker or weight swap the engine refused or could not serve."""
