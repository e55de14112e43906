"""The import layers of pyproject.toml's import-linter contracts, checked with the unit tests (engine below pronk's
domain, flows above tasks, the domain below flows, tasks and the CLI, nothing importing the CLI), and the one
top-level name pronk installs."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

from pronk.settings import PROJECT_ROOT


def test_the_import_layers_hold():
    lint_imports = Path(sys.executable).parent / "lint-imports"
    path = os.pathsep.join(p for p in (str(PROJECT_ROOT), os.environ.get("PYTHONPATH")) if p)
    checked = subprocess.run(
        [str(lint_imports), "--no-cache"],
        cwd=PROJECT_ROOT,
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "0 broken" in checked.stdout


def test_the_engine_contract_forbids_every_other_part_of_pronk():
    """pronk.engine sits inside pronk's namespace; its contract names each sibling, so a new one must be added."""
    contracts = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (engine,) = [c for c in contracts if c.get("source_modules") == ["pronk.engine"]]
    siblings = {f"pronk.{p.stem}" for p in (PROJECT_ROOT / "pronk").iterdir() if p.suffix == ".py" or p.is_dir()}
    assert siblings - {"pronk.__init__", "pronk.__pycache__", "pronk.engine"} <= set(engine["forbidden_modules"])


def test_pronk_installs_one_top_level_name_and_reaches_engine_flows_and_tasks_through_links():
    project = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())
    assert project["tool"]["setuptools"]["packages"]["find"]["include"] == ["pronk*"]
    for folder in ("engine", "flows", "tasks"):
        link = PROJECT_ROOT / "pronk" / folder
        assert link.is_symlink() and link.resolve() == (PROJECT_ROOT / folder).resolve()
