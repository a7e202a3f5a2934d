"""ruff keeps the style of the whole tree, notebook sources included, and mypy checks the types of the
servelab package (settings of both in pyproject.toml)."""

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


def test_mypy_finds_nothing():
    # Which files, how strictly and the cache (.mypy_cache: a second run takes seconds) come from pyproject.toml.
    found = subprocess.run([sys.executable, "-m", "mypy"], cwd=paths.REPO_ROOT, capture_output=True, text=True)
    assert found.returncode == 0, f"mypy (run `.venv/bin/mypy` to see the same):\n{found.stdout}{found.stderr}"
