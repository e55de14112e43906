"""A row's fingerprint: what its answer depends on, so a row is asked again only when that changed.

The fingerprint hashes the row's prompt inputs (the columns its template names) together with the
spec's template and output schema: editing a row's inputs, the prompt or an output column re-enriches
the rows it touches; editing other columns, the schedule or the job does not.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pronk.enrich.spec import EnrichSpec

VERSION = 1
"""Bumped when the fingerprint's recipe changes, so every row is enriched again once."""


def spec_fingerprint(spec: EnrichSpec) -> str:
    """The part every row shares: template and output schema."""
    return _digest({"v": VERSION, "prompt": spec.prompt, "outputs": spec.output_schema()})


def row_fingerprint(spec_part: str, inputs: dict[str, Any]) -> str:
    """One row's fingerprint from the spec's part and its prompt inputs (in the template's column order)."""
    return _digest({"spec": spec_part, "inputs": inputs})


def _digest(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]
