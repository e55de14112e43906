"""An enrichment spec: which table, which rows, what to ask per row, which typed columns come back, and when.

One YAML file per spec under `deployments/enrichments/`, validated on load like job files: unknown keys
and bad values are refused with the file, the key and the value. What needs the table itself (the
template's columns exist, keys are unique) is checked when a run reads it (`pronk.enrich.table`).
"""

from __future__ import annotations

import string
from pathlib import Path
from typing import Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from pronk.config_files import load_config_file
from pronk.pronk_error import PronkError
from pronk.settings import PROJECT_ROOT

TableFormat = Literal["parquet", "csv", "ndjson"]
RESERVED_COLUMNS = ("_error", "_check", "_fingerprint", "_enriched_at", "_run")
"""Columns pronk adds to every enriched table: a row's error, how its labelled answer checked (`passed`, `failed`,
`unchecked`), its inputs' fingerprint, when and by which run."""

# Output types pronk can express as a JSON schema (structured outputs) and as a polars column.
SCALAR_TYPES: dict[str, dict[str, Any]] = {
    "string": {"type": "string"},
    "integer": {"type": "integer"},
    "number": {"type": "number"},
    "boolean": {"type": "boolean"},
}
OUTPUT_TYPES = (*SCALAR_TYPES, *(f"list[{t}]" for t in SCALAR_TYPES))


class EnrichSpecError(PronkError, ValueError):
    """A spec that cannot be used, or a table that does not fit it; the message names the file, key and value."""


class OutputColumn(BaseModel):
    """One column the agent fills: its type (a JSON schema type pronk maps to a polars dtype) and what it means."""

    model_config = ConfigDict(extra="forbid")

    type: str = Field(description=f"One of {', '.join(OUTPUT_TYPES)}.")
    description: str = Field(min_length=1, max_length=1000, description="What the column holds; the agent reads it.")
    enum: list[str] | None = Field(
        default=None, min_length=1, description="Allowed values (string columns): the answer is constrained to them."
    )
    minimum: float | None = Field(default=None, description="Smallest value (integer and number columns).")
    maximum: float | None = Field(default=None, description="Largest value (integer and number columns).")

    @field_validator("type")
    @classmethod
    def _expressible(cls, value: str) -> str:
        if value not in OUTPUT_TYPES:
            raise ValueError(f"type {value!r} cannot be expressed as a JSON schema; use one of {list(OUTPUT_TYPES)}")
        return value

    @model_validator(mode="after")
    def _constraints_fit(self) -> OutputColumn:
        if self.enum is not None and self.type != "string":
            raise ValueError(f"enum is only for string columns, not {self.type}")
        bounded = self.minimum is not None or self.maximum is not None
        if bounded and self.type not in ("integer", "number"):
            raise ValueError(f"minimum and maximum are only for integer and number columns, not {self.type}")
        if self.minimum is not None and self.maximum is not None and self.minimum > self.maximum:
            raise ValueError(f"minimum {self.minimum} is above maximum {self.maximum}")
        return self

    def json_schema(self) -> dict[str, Any]:
        if self.type.startswith("list["):
            return {"type": "array", "items": dict(SCALAR_TYPES[self.type[5:-1]]), "description": self.description}
        schema = {**SCALAR_TYPES[self.type], "description": self.description}
        if self.enum is not None:
            schema["enum"] = list(self.enum)
        for bound in ("minimum", "maximum"):
            value = getattr(self, bound)
            if value is not None:
                schema[bound] = int(value) if self.type == "integer" else value
        return schema


class Schedule(BaseModel):
    """When the `enrich` deployment runs: a cron expression in a time zone."""

    model_config = ConfigDict(extra="forbid")

    cron: str = Field(min_length=9, description="Five-field cron, e.g. `0 2 * * *` (every night at 02:00).")
    timezone: str = Field(default="UTC", description="IANA time zone of the cron, e.g. `Europe/Amsterdam`.")
    active: bool = Field(default=True, description="False: the deployment exists but its schedule is paused.")

    @field_validator("cron")
    @classmethod
    def _cron(cls, value: str) -> str:
        from datetime import datetime

        from cronsim import CronSim, CronSimError

        try:
            if len(value.split()) != 5:
                raise CronSimError("it needs five fields")
            CronSim(value, datetime(2026, 1, 1))
        except CronSimError as exc:
            raise ValueError(f"{value!r} is not a five-field cron expression: {exc}") from exc
        return value

    @field_validator("timezone")
    @classmethod
    def _zone(cls, value: str) -> str:
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise ValueError(f"{value!r} is not an IANA time zone") from exc
        return value


class EnrichSpec(BaseModel):
    """An enrichment job: keep `outputs` filled for every row of `table`, re-asking only for new or changed rows."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]{0,62}$", description="Names the deployment and the results folder.")
    table: str = Field(min_length=1, description="Input table: a local path (relative to the project root) or s3://.")
    format: TableFormat | None = Field(default=None, description="parquet, csv or ndjson; default: from the suffix.")
    key: list[str] = Field(min_length=1, description="Column(s) that identify a row; must be unique in the table.")
    filter: str | None = Field(
        default=None, max_length=4000, description="A polars SQL `WHERE` condition choosing the rows to enrich."
    )
    prompt: str = Field(min_length=1, max_length=20000, description="Template over the row's columns: `{column}`.")
    outputs: dict[str, OutputColumn] = Field(min_length=1, description="The columns the agent fills, in order.")
    job: str = Field(default="tiny-cpu", min_length=1, description="Job id or name whose workers run the rows.")
    tools: list[str] = Field(default_factory=list, description="Tools of the job's harness the agent may call.")
    max_steps: int = Field(default=4, ge=1, le=256, description="Most model steps per row (within the job's cap).")
    max_tokens: int = Field(default=128, ge=8, description="Most tokens one step may generate.")
    temperature: float = Field(default=0.7, ge=0, le=2, description="Sampling temperature of every step.")
    seed: int | None = Field(
        default=None, ge=0, le=2**31 - 1, description="Sampling seed of every row (reproducible answers)."
    )
    labels: str | None = Field(
        default=None,
        description="A labelled sample: a table (path relative to the project root, or s3://; format from the "
        "suffix) of the key column(s) and the expected values of some output columns. Each labelled row's answer "
        "is checked against them; the run reports the sample's success rate.",
    )
    results: str | None = Field(
        default=None, description="Folder (or s3:// prefix) of the enriched table's versions and run history."
    )
    schedule: Schedule | None = Field(default=None, description="When the `enrich` deployment runs by itself.")

    @field_validator("key", mode="before")
    @classmethod
    def _one_key(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @field_validator("filter")
    @classmethod
    def _where(cls, value: str | None) -> str | None:
        if value is not None and ";" in value:
            raise ValueError("a filter is one SQL condition (no ';')")
        return value

    @field_validator("prompt")
    @classmethod
    def _template(cls, value: str) -> str:
        template_fields(value)
        return value

    @field_validator("outputs")
    @classmethod
    def _names(cls, value: dict[str, OutputColumn]) -> dict[str, OutputColumn]:
        for name in value:
            if not name.isidentifier() or name.startswith("_"):
                raise ValueError(f"output column {name!r} must be an identifier not starting with '_'")
        return value

    @model_validator(mode="after")
    def _columns_apart(self) -> EnrichSpec:
        clash = sorted(set(self.key) & set(self.outputs))
        if clash:
            raise ValueError(f"output columns {clash} are also key columns")
        if len(set(self.key)) != len(self.key):
            raise ValueError(f"key {self.key} names a column twice")
        return self

    @property
    def table_format(self) -> TableFormat:
        return self.format or format_of(self.table)

    @property
    def template_columns(self) -> list[str]:
        return template_fields(self.prompt)

    def output_schema(self) -> dict[str, Any]:
        """The JSON schema every answer must match: one object with every output column, nothing else."""
        return {
            "type": "object",
            "properties": {name: column.json_schema() for name, column in self.outputs.items()},
            "required": list(self.outputs),
            "additionalProperties": False,
        }

    def table_uri(self) -> str:
        return project_uri(self.table)

    def labels_uri(self) -> str | None:
        return None if self.labels is None else project_uri(self.labels)


def project_uri(path: str) -> str:
    """A spec's table path: a URI or absolute path as given, else relative to the project root."""
    return path if "://" in path or Path(path).is_absolute() else str(PROJECT_ROOT / path)


def format_of(path: str) -> TableFormat:
    """A table's format from its suffix (`.jsonl` is ndjson)."""
    suffix = path.rsplit(".", 1)[-1].lower()
    if suffix in ("parquet", "csv", "ndjson"):
        return suffix  # type: ignore[return-value]
    if suffix == "jsonl":
        return "ndjson"
    raise EnrichSpecError(f"table {path!r}: cannot tell its format from the suffix; set `format`")


def template_fields(template: str) -> list[str]:
    """The columns a prompt template names, in order of first use; `{{` and `}}` are literal braces."""
    names: list[str] = []
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise ValueError(f"prompt template is malformed: {exc}") from exc
    for _, name, spec, conversion in parsed:
        if name is None:
            continue
        if not name or not name.isidentifier() or spec or conversion:
            raise ValueError(f"prompt template field {{{name}}} must be a bare column name, like {{name}}")
        if name not in names:
            names.append(name)
    return names


def load_spec(path: str | Path) -> EnrichSpec:
    """Read and validate one spec file; a name alone means `deployments/enrichments/<name>.yaml`."""
    return load_config_file(spec_path(path), EnrichSpec, EnrichSpecError, "enrichment spec")


def spec_path(path: str | Path) -> Path:
    candidate = Path(path)
    if candidate.suffix not in (".yaml", ".yml"):
        candidate = PROJECT_ROOT / "deployments" / "enrichments" / f"{candidate}.yaml"
    elif not candidate.is_absolute() and not candidate.exists():
        candidate = PROJECT_ROOT / candidate
    return candidate.resolve()


def load_specs(folder: Path | None = None) -> list[tuple[Path, EnrichSpec]]:
    """Every spec of the folder (default `deployments/enrichments/`), in name order."""
    folder = folder or PROJECT_ROOT / "deployments" / "enrichments"
    return [(path, load_spec(path)) for path in sorted(folder.glob("*.yaml"))]
