"""Root pytest configuration: notebooks executed by the tests (nbmake) run the quick profile.

Every experiment still runs, with short measurement windows; set LAB_PROFILE=full to override.
The runs the tests and notebooks measure are saved to a temporary folder, not to results/, which
holds what a student measured.
"""

import atexit
import os
import shutil
import tempfile

os.environ.setdefault("LAB_PROFILE", "quick")
os.environ.setdefault("LAB_TARGET", "local")
if "SERVELAB_RESULTS_DIR" not in os.environ:
    os.environ["SERVELAB_RESULTS_DIR"] = tempfile.mkdtemp(prefix="servelab-test-results-")
    atexit.register(shutil.rmtree, os.environ["SERVELAB_RESULTS_DIR"], ignore_errors=True)

# Notebooks that judge expectations (their source calls `lab.expect(`) run in
# tests/test_notebook_verdicts.py, which also checks every verdict they record against their own
# tables; nbmake would run them a second time. A new lesson's notebook is found here by itself.
from servelab.notebook_runs import judging  # noqa: E402 (servelab.paths reads the settings above)

JUDGED = judging()
collect_ignore = [f"notebooks/{name}" for name in JUDGED]
