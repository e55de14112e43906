"""The import layers of pyproject.toml's import-linter contracts, checked with the unit tests (engine below pronk's
domain, flows above tasks, the domain below flows, tasks and the CLI, nothing importing the CLI)."""

from __future__ import annotations

import os
import subprocess
import sys
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
