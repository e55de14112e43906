"""Enrichment specs: the shipped one loads; bad files, keys and values are refused with the file, key and value."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
import yaml

from pronk.enrich.spec import EnrichSpecError, load_spec, template_fields
from pronk.enrich.table import read_labels, read_rows
from pronk.settings import Settings

GOOD = {
    "table": "companies.csv",
    "key": "id",
    "prompt": "Company {name}: {description}",
    "outputs": {
        "sector": {"type": "string", "description": "Sector.", "enum": ["a", "b"]},
        "staff": {"type": "integer", "description": "Employees.", "minimum": 0},
        "tags": {"type": "list[string]", "description": "Tags."},
    },
    "schedule": {"cron": "0 2 * * *", "timezone": "Europe/Amsterdam"},
}


def write(folder: Path, **changes) -> Path:
    spec = {**GOOD, "table": str(folder / "companies.csv"), **changes}
    path = folder / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    pl.DataFrame({"id": [1, 2, 3], "name": ["A", "B", "C"], "description": ["x", "y", "z"]}).write_csv(
        tmp_path / "companies.csv"
    )
    return tmp_path


def test_the_shipped_spec_loads_and_its_table_fits_it():
    spec = load_spec("companies")
    assert spec.name == "companies" and spec.key == ["company_id"] and spec.schedule.cron == "0 2 * * *"
    assert spec.template_columns == ["name", "domain", "founded", "country", "industry", "description"]
    assert read_rows(spec, Settings()).height == 24
    assert len(read_labels(spec, Settings())) == 10


def test_a_good_spec_gives_the_answer_schema(folder):
    spec = load_spec(write(folder))
    assert spec.name == "spec" and spec.key == ["id"] and spec.table_format == "csv"
    schema = spec.output_schema()
    assert schema["required"] == ["sector", "staff", "tags"] and schema["additionalProperties"] is False
    assert schema["properties"]["sector"]["enum"] == ["a", "b"]
    assert schema["properties"]["staff"] == {"type": "integer", "description": "Employees.", "minimum": 0}
    assert schema["properties"]["tags"]["items"] == {"type": "string"}


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"outputs": {"when": {"type": "datetime", "description": "d"}}}, ["outputs.when.type", "'datetime'"]),
        ({"outputs": {"x": {"type": "dict[str, int]", "description": "d"}}}, ["outputs.x.type", "JSON schema"]),
        ({"outputs": {"x": {"type": "integer", "description": "d", "enum": ["1"]}}}, ["outputs.x", "enum"]),
        ({"surprise": 1}, ["surprise", "Extra inputs"]),
        ({"max_steps": 0}, ["max_steps", "0"]),
        ({"schedule": {"cron": "every night"}}, ["schedule.cron", "every night"]),
        ({"schedule": {"cron": "0 2 * * *", "timezone": "Mars/Olympus"}}, ["schedule.timezone", "Mars/Olympus"]),
        ({"prompt": "Company {name!r}"}, ["prompt", "bare column name"]),
        ({"prompt": "Company {name"}, ["prompt", "malformed"]),
        ({"outputs": {"id": {"type": "string", "description": "d"}}}, ["also key columns"]),
        ({"outputs": {"_error": {"type": "string", "description": "d"}}}, ["_error"]),
        ({"filter": "1 = 1; DROP TABLE t"}, ["filter", "no ';'"]),
    ],
)
def test_bad_values_are_refused_with_file_key_and_value(folder, changes, named):
    path = write(folder, **changes)
    with pytest.raises(EnrichSpecError) as caught:
        load_spec(path)
    message = str(caught.value)
    assert str(path) in message
    for part in named:
        assert part in message


def test_an_unreadable_or_non_mapping_file_is_refused(tmp_path):
    with pytest.raises(EnrichSpecError, match="cannot read"):
        load_spec(tmp_path / "missing.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n")
    with pytest.raises(EnrichSpecError, match="must be a mapping"):
        load_spec(tmp_path / "list.yaml")


def test_a_template_naming_a_missing_column_fails_before_any_step(folder):
    spec = load_spec(write(folder, prompt="Company {name} in {city}"))
    with pytest.raises(EnrichSpecError, match=r"prompt template names columns \['city'\]"):
        read_rows(spec, Settings())


def test_duplicate_keys_fail_naming_them(folder):
    pl.DataFrame({"id": [1, 2, 2], "name": ["A", "B", "C"], "description": ["x", "y", "z"]}).write_csv(
        folder / "companies.csv"
    )
    with pytest.raises(EnrichSpecError, match=r"duplicate keys \['id'\]: \[\(2,\)\]"):
        read_rows(load_spec(write(folder)), Settings())


def test_an_unreadable_table_fails_naming_it(folder):
    (folder / "companies.csv").write_bytes(b"\x00\x01not,a\ncsv")
    spec = load_spec(write(folder, format="parquet"))
    with pytest.raises(EnrichSpecError, match="cannot read it as parquet"):
        read_rows(spec, Settings())
    missing = load_spec(write(folder, table=str(folder / "nope.csv")))
    with pytest.raises(EnrichSpecError, match=r"nope\.csv"):
        read_rows(missing, Settings())


def test_the_filter_chooses_rows(folder):
    spec = load_spec(write(folder, filter="id >= 2"))
    assert read_rows(spec, Settings())["id"].to_list() == [2, 3]
    bad = load_spec(write(folder, filter="no_such_column > 1"))
    with pytest.raises(EnrichSpecError, match="no_such_column"):
        read_rows(bad, Settings())


def test_template_fields_in_order_of_first_use():
    assert template_fields("{b} and {a}, again {b}; {{literal}}") == ["b", "a"]
