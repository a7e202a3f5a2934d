"""`python -m servelab.loadgen ...`, the same as `python -m servelab loadgen ...`."""

import logging
import sys

from servelab.loadgen.cli import main

logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
sys.exit(main())
