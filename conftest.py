"""Root pytest configuration: notebooks executed by the tests (nbmake) run the quick profile.

Every experiment still runs, with short measurement windows; set LAB_PROFILE=full to override.
"""

import os
from pathlib import Path

os.environ.setdefault("LAB_PROFILE", "quick")
os.environ.setdefault("LAB_TARGET", "local")

# Notebooks that judge expectations (their source calls `lab.expect(`) run in
# tests/test_notebook_verdicts.py, which also checks every verdict they record against their own
# tables; nbmake would run them a second time. A new lesson's notebook is found here by itself.
JUDGED = sorted(
    source.with_suffix(".ipynb").name
    for source in (Path(__file__).parent / "notebooks").glob("[0-9]*.py")
    if "lab.expect(" in source.read_text()
)
collect_ignore = [f"notebooks/{name}" for name in JUDGED]
