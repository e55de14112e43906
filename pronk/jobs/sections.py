"""How job mappings combine (`merge_sections`), and the flat job-file format of before sections, with its migration.

A job file's `base:`, a Herd configuration version and `pronk job migrate` all go through here.
"""

from __future__ import annotations

from typing import Any


def merge_sections(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """`changes` over `base`: mappings merge key by key, at every depth; anything else (lists too) replaces."""
    merged = dict(base)
    for key, value in changes.items():
        old = merged.get(key)
        merged[key] = merge_sections(old, value) if isinstance(old, dict) and isinstance(value, dict) else value
    return merged


FLAT_KEYS = {
    "max_concurrency": "scheduling.max_concurrency",
    "engine.scheduling_policy": "scheduling.priority",
    "harness.routing": "scheduling.routing",
    "harness.admission": "scheduling.admission",
    "harness.kv_budget_headroom": "scheduling.kv_budget_headroom",
    "harness.kv_budget_growth_steps": "scheduling.kv_budget_growth_steps",
    "harness.kv_pin_ttl_s": "scheduling.kv_pin_ttl_s",
    "harness.kv_pin_ttl": "scheduling.kv_pin_ttl",
    "harness.tools": "tools.enabled",
    "harness.python": "tools.python",
    "harness.tables_dir": "tools.sql.tables_dir",
    "harness.corpus_dir": "tools.search.corpus_dir",
    "harness.trace_sample": "observability.trace_sample",
    "harness.mlflow_traces": "observability.mlflow_traces",
}
"""Keys of the flat job-file format (before sections) and where each lives now; `pronk job migrate` moves them
(`scheduling_policy: priority` becomes `priority: true`)."""


def flat_keys(raw: dict[str, Any]) -> list[str]:
    """The keys of `raw` that only the flat (pre-section) format has."""
    found = []
    for dotted in FLAT_KEYS:
        section, _, key = dotted.rpartition(".")
        holder = raw.get(section) if section else raw
        if isinstance(holder, dict) and key in holder:
            found.append(dotted)
    return found


def migrate_flat(raw: dict[str, Any]) -> dict[str, Any]:
    """A flat-format job file's mapping rewritten in sections (values unchanged; `scheduling_policy` becomes
    `scheduling.priority`)."""
    migrated = {k: (dict(v) if isinstance(v, dict) else v) for k, v in raw.items()}
    moved: dict[str, Any] = {}
    for dotted, target in FLAT_KEYS.items():
        section, _, key = dotted.rpartition(".")
        holder = migrated.get(section) if section else migrated
        if not isinstance(holder, dict) or key not in holder:
            continue
        value = holder.pop(key)
        if value is None:  # the flat format's "the default"
            continue
        if dotted == "engine.scheduling_policy":
            value = value == "priority"
        *path, last = target.split(".")
        node = moved
        for part in path:
            node = node.setdefault(part, {})
        node[last] = value
    for section in ("engine", "harness"):
        if migrated.get(section) == {}:
            del migrated[section]
    return merge_sections(migrated, moved)
