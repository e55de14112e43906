"""The Prefect deployments the stack creates: `deployments/prefect.yaml`, plus one `enrich-table` deployment per
enrichment spec in `deployments/enrichments/`, scheduled by the spec's cron."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from pronk.enrich.spec import EnrichSpec, load_specs
from pronk.settings import PROJECT_ROOT

BASE = PROJECT_ROOT / "deployments" / "prefect.yaml"
ENRICH_ENTRYPOINT = "flows/enrich.py:enrich_table"


def enrich_deployment(path: Path, spec: EnrichSpec) -> dict[str, Any]:
    """The deployment `enrich-table/<spec name>`: runs the spec, on its schedule when it has one."""
    entry: dict[str, Any] = {
        "name": spec.name,
        "description": f"Enrich {spec.table} ({', '.join(spec.outputs)}) for new or changed rows.",
        "entrypoint": ENRICH_ENTRYPOINT,
        "parameters": {"spec": str(path.relative_to(PROJECT_ROOT) if path.is_relative_to(PROJECT_ROOT) else path)},
        "tags": ["enrich"],
        "work_pool": {"name": "pronk", "work_queue_name": "default", "job_variables": {}},
    }
    if spec.schedule is not None:
        entry["schedules"] = [
            {"cron": spec.schedule.cron, "timezone": spec.schedule.timezone, "active": spec.schedule.active}
        ]
    return entry


def prefect_yaml(enrichments: Path | None = None) -> dict[str, Any]:
    """The whole project file to deploy: the base deployments and every spec's."""
    project = yaml.safe_load(BASE.read_text())
    project["deployments"] = list(project["deployments"]) + [
        enrich_deployment(path, spec) for path, spec in load_specs(enrichments)
    ]
    return project


def write_prefect_yaml(target: Path, enrichments: Path | None = None) -> Path:
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(yaml.safe_dump(prefect_yaml(enrichments), sort_keys=False))
    return target
