"""ruff keeps the style of the whole tree, notebook sources included (settings in pyproject.toml)."""

import subprocess
import sys
from pathlib import Path

import pytest

from servelab import paths

RUFF = Path(sys.executable).parent / "ruff"


@pytest.mark.parametrize("command", [["check", "--no-fix"], ["format", "--check"]], ids=["lint", "format"])
def test_ruff_finds_nothing(command):
    found = subprocess.run([str(RUFF), *command, "."], cwd=paths.REPO_ROOT, capture_output=True, text=True)
    assert found.returncode == 0, f"ruff {' '.join(command)} (run `make format` to fix):\n{found.stdout}{found.stderr}"
