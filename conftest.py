"""Root pytest configuration: notebooks executed by the tests (nbmake) run the quick profile.

Every experiment still runs, with short measurement windows; set LAB_PROFILE=full to override.
"""

import os

os.environ.setdefault("LAB_PROFILE", "quick")
os.environ.setdefault("LAB_TARGET", "local")

# The notebooks that judge expectations (4, 6, 7) run in tests/test_notebook_verdicts.py, which also
# checks every verdict they record against their own tables: nbmake would run them a second time.
collect_ignore = [
    "notebooks/4_fastapi_bench.ipynb",
    "notebooks/6_triton_bench.ipynb",
    "notebooks/7_io_vs_compute.ipynb",
]
