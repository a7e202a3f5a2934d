#!/usr/bin/env bash
# The wheels `make test-gpu` needs on a bare GPU machine, downloaded here (it needs internet) into
# .lab/wheels (git-ignored, with the rest of .lab): FastAPI, uvicorn and what they import that such a
# machine lacks. It has torch, ONNX Runtime, numpy, Pillow, httpx, aiohttp, anyio, h11, click,
# prometheus-client and pyyaml already (shared/ENVIRONMENT.md, "A bare GPU machine"). fastapi 0.165
# imports opentelemetry at import time, so its API package travels too. The versions are the lock's
# (requirements.lock), those the tests run with; every wheel is pure Python but pydantic-core's
# (Python 3.12, x86_64 Linux: PYTHON_VERSION=3.11 for another). About 3 MB. There, in the repository root:
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .lab/wheels/*.whl
#   PYTHONPATH=/tmp/site make test-gpu
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON_VERSION=${PYTHON_VERSION:-3.12}
WHEELS=(
  fastapi
  starlette
  pydantic
  pydantic-core
  annotated-types
  annotated-doc
  typing-inspection
  typing-extensions
  uvicorn
  opentelemetry-api
)

rm -rf .lab/wheels
python3 -m pip download --quiet --no-deps --only-binary=:all: --dest .lab/wheels -c requirements.lock \
  --python-version "$PYTHON_VERSION" --implementation cp \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  "${WHEELS[@]}"
ls -l .lab/wheels
du -sh .lab/wheels
