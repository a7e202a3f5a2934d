"""Root pytest configuration: notebooks executed by the tests (nbmake) run the quick profile.

Every experiment still runs, with short measurement windows; set LAB_PROFILE=full to override.
"""

import os

os.environ.setdefault("LAB_PROFILE", "quick")
os.environ.setdefault("LAB_TARGET", "local")
