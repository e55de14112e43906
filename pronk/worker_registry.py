"""The worker registry pronk's settings name: `registry_url` (PostgreSQL, across hosts) when set, else the folder
`registry_dir`, with the settings' heartbeat timeout. The engine opens a registry from a location alone
(`pronk.engine.registry.Registry.open`); this is the one place pronk turns its settings into one."""

from __future__ import annotations

from pronk.engine.registry import Registry
from pronk.settings import Settings


def worker_registry(settings: Settings) -> Registry:
    return Registry.open(settings.registry_url or settings.registry_dir, settings.heartbeat_timeout_s)
