#!/usr/bin/env bash
# `make test-gpu` on a bare GPU machine (no internet, no lab virtualenv), from a working tree brought there
# with .lab/wheels (scripts/gpu_check_wheels.sh, run where there is internet) and .lab/artifacts (`make
# artifacts`): about 50 MB. It installs the wheels into SITE (default /tmp/site), unpacks Triton's server
# and client beside them, puts the model files where each service and Triton model loads them, and runs
# the check with the arguments given (GPU_CHECK_ARGS' syntax), e.g.:
#   bash scripts/gpu_check_there.sh --seconds 8 --out results
# GPU_CHECK_TARGET=test-gpu-notebook6 runs notebook 6's claims instead (servelab/bench/gpu_check/notebook6.py).
set -euo pipefail
cd "$(dirname "$0")/.."

SITE=${SITE:-/tmp/site}
if ! compgen -G ".lab/wheels/*.whl" >/dev/null || [ ! -f .lab/wheels/triton-server.tar.xz ]; then
  echo "No .lab/wheels here: run scripts/gpu_check_wheels.sh on a machine with internet, and bring .lab/wheels along." >&2
  exit 2
fi
if [ ! -f .lab/artifacts/manifest.json ]; then
  echo "No .lab/artifacts/manifest.json here: run \`make artifacts\` where the lab is set up, and bring .lab/artifacts along." >&2
  exit 2
fi
python3 -m pip install -q --no-index --no-deps --target "$SITE" .lab/wheels/*.whl
# Python's tarfile, not tar: a bare machine may lack xz. 'data' keeps every member inside SITE.
python3 -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter='data')" \
  .lab/wheels/triton-server.tar.xz "$SITE"
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
args=("$@")
if compgen -G ".lab/triton-numpy/*.whl" >/dev/null; then  # numpy 1.x for Triton's model alone
  python3 -m pip install -q --no-index --no-deps --target "$SITE-triton-numpy" .lab/triton-numpy/*.whl
  args+=(--triton-model-path "$SITE-triton-numpy")
fi
python3 -m servelab.stack.artifacts --place-only  # as built here: that torch may differ from the builder's
exec make "${GPU_CHECK_TARGET:-test-gpu}" GPU_CHECK_ARGS="${args[*]}"
