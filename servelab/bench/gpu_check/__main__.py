"""`python -m servelab.bench.gpu_check`: the GPU check's command line (servelab.bench.gpu_check.check)."""

import sys

from servelab.bench.gpu_check.check import main

sys.exit(main())
