"""YAML configuration files (job files, enrichment specs) read into pydantic models by one reader, so every
refusal names the file, the key and the value, whichever kind of file it is."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from pronk.pronk_error import PronkError

Model = TypeVar("Model", bound=BaseModel)


def describe(exc: ValidationError, path: Path, raw: dict[str, Any]) -> str:
    """Each problem as `<file>: key '<dotted key>' value <value>: <why>`, joined by `; `."""
    problems = []
    for err in exc.errors():
        key = ".".join(str(p) for p in err["loc"]) or "<root>"
        value: Any = raw
        for part in err["loc"]:
            value = value.get(part) if isinstance(value, dict) else None
        problems.append(f"{path}: key '{key}' value {value!r}: {err['msg']}")
    return "; ".join(problems)


def read_mapping(path: Path, error: type[PronkError], kind: str) -> dict[str, Any]:
    """`path` as one YAML mapping; an unreadable file or any other YAML value raises `error` with the file named.
    `kind` names the file in messages ("job file", "enrichment spec")."""
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise error(f"{path}: cannot read {kind}: {exc}") from exc
    if not isinstance(raw, dict):
        raise error(f"{path}: the {kind} must be a mapping, got {type(raw).__name__}")
    return raw


def load_config_file(path: Path, model: type[Model], error: type[PronkError], kind: str) -> Model:
    """Read `path` as one YAML mapping into `model` (its `name` defaults to the file's stem); any problem raises
    `error` with the file named."""
    raw = read_mapping(path, error, kind)
    raw.setdefault("name", path.stem)
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise error(describe(exc, path, raw)) from exc
