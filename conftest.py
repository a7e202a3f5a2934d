"""Root pytest configuration: what the tests and the notebooks they run write, and where.

Notebooks run by the tests (tests/test_notebooks.py) use the quick profile: every experiment still
runs, with short measurement windows; set LAB_PROFILE=full to override. The runs they measure are
saved to a temporary folder, not to results/, which holds what a student measured; the session's
servers keep their logs and staged files in another (SERVELAB_STACK_DIR), not in .lab/, where a
running `make up` keeps its own. Both are set here, before anything imports servelab.paths.
"""

import atexit
import os
import shutil
import tempfile

os.environ.setdefault("LAB_PROFILE", "quick")
os.environ.setdefault("LAB_SERVICES", "local")
os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")
for variable, prefix in (
    ("SERVELAB_RESULTS_DIR", "servelab-test-results-"),
    ("SERVELAB_STACK_DIR", "servelab-test-stack-"),
):
    if variable not in os.environ:
        os.environ[variable] = tempfile.mkdtemp(prefix=prefix)
        atexit.register(shutil.rmtree, os.environ[variable], ignore_errors=True)
