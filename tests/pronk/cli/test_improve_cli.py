"""`pronk improve`'s set generators as a user runs them: the files they write are the shipped ones."""

from __future__ import annotations

from typer.testing import CliRunner

from pronk.cli.main import app
from pronk.improve.enrichment_sets import LABELLED


def test_enrichment_sets_writes_the_shipped_training_and_held_out_sets(tmp_path):
    result = CliRunner().invoke(app, ["improve", "enrichment-sets", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    for name in ("companies-train.jsonl", "companies-held-out.jsonl"):
        assert (tmp_path / name).read_bytes() == (LABELLED / name).read_bytes()
        assert f"wrote {tmp_path / name}" in result.output


def test_improve_without_a_command_still_runs_the_loop_and_lists_the_set_generators_in_its_help():
    result = CliRunner().invoke(app, ["improve", "--help"])
    assert result.exit_code == 0
    assert "--rounds" in result.output and "training-set" in result.output and "enrichment-sets" in result.output
