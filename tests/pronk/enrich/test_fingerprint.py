"""Fingerprints: a row is asked again exactly when its prompt inputs, the template or the output schema change."""

from __future__ import annotations

from pronk.enrich.fingerprint import row_fingerprint, spec_fingerprint
from pronk.enrich.spec import EnrichSpec

SPEC = {
    "name": "t",
    "table": "t.csv",
    "key": "id",
    "prompt": "About {name}: {description}",
    "outputs": {"sector": {"type": "string", "description": "Sector."}},
}


def spec(**changes) -> EnrichSpec:
    return EnrichSpec.model_validate({**SPEC, **changes})


def fingerprint(s: EnrichSpec, **row) -> str:
    inputs = {"name": "Acme", "description": "robots", **row}
    return row_fingerprint(spec_fingerprint(s), {c: inputs[c] for c in s.template_columns})


def test_same_inputs_same_fingerprint():
    assert fingerprint(spec()) == fingerprint(spec())
    assert len(fingerprint(spec())) == 32


def test_a_changed_input_changes_it():
    assert fingerprint(spec(), description="drones") != fingerprint(spec())
    assert fingerprint(spec(), name=None) != fingerprint(spec(), name="")


def test_the_template_and_the_output_schema_change_it():
    base = fingerprint(spec())
    assert fingerprint(spec(prompt="Tell me about {name}: {description}")) != base
    assert fingerprint(spec(outputs={"sector": {"type": "string", "description": "Industry sector."}})) != base
    assert fingerprint(spec(outputs={"sector": {"type": "string", "description": "Sector.", "enum": ["a"]}})) != base


def test_what_the_answer_does_not_depend_on_leaves_it():
    base = fingerprint(spec())
    assert fingerprint(spec(job="other", tools=["sql"], max_steps=2, schedule={"cron": "0 3 * * *"})) == base
