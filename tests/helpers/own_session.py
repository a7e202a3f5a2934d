"""pytest run as a session of its own, in a test's scratch folder, with the lab's root conftest.py
(copied there: pytest loads a conftest only from the folders of what it collects): none of this
session's servers, scratch folders or ports."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from servelab import paths

# The lab's markers are declared in its pyproject.toml, which a run in another folder does not read.
UNKNOWN_MARKS = "ignore::pytest.PytestUnknownMarkWarning"


def pytest_in(folder: Path, *arguments: str, timeout_s: float = 120, **env: str) -> subprocess.CompletedProcess:
    shutil.copy(paths.REPO_ROOT / "conftest.py", folder / "conftest.py")
    own = {name: value for name, value in os.environ.items() if not name.startswith("SERVELAB_")}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-o", "addopts=", "-W", UNKNOWN_MARKS, *arguments],
        cwd=folder,
        env={**own, "PYTHONPATH": str(paths.REPO_ROOT), **env},
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
